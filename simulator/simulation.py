"""Run a scenario: the entry points (`simulate`, `run_simulation`), the run resolved into its
`Results`, and each run's warnings passed on once. Building the replicas is build.py's job,
the event loop run_loop.py's."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import hardware_models
from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.warning_scope import distinct, pass_on, recording, warn, warn_at
from simulator.api_server import ClientView
from simulator.build import BuiltScenario, ReplicaBuild
from simulator.caveats import ignores, static_fill_warning
from simulator.engine.step_log import ClosedLog
from simulator.inputs import shown
from simulator.metrics.context import SLO, RunContext
from simulator.metrics.step_totals import StepTotals
from simulator.provenance import assumed_links, named_from, provenance
from simulator.results import Results
from simulator.run_loop import Run
from simulator.scenario import BATCH_LIMITS, Scenario
from simulator.sharding import Workers, run_in_shards, shards_for


def _as_run(scenario: Scenario, builds: list[tuple[str, ReplicaBuild]]) -> Scenario:
    """The scenario as it ran, so summary.json names it: an unset model.weight_dtype is the
    checkpoint's format the replicas were built with (resolve_weight_dtype); unset batch
    limits are vLLM's defaults for the GPU (one the policy ignores stays unset), an unset
    enable_prefix_caching the policy's engine's default, a block size vLLM forced is
    the forced one, where every pool got the same, and expert parallelism asked of a
    dense model (vLLM ignores it, build_replica) is off."""
    if not builds:
        return scenario
    update = {}
    par = scenario.parallelism
    if par.enable_expert_parallel and not builds[0][1].arch.is_moe:
        update["parallelism"] = par.model_copy(update={"enable_expert_parallel": False})
    if scenario.model.weight_dtype is None:
        used = builds[0][1].memory.weight_dtype
        update["model"] = scenario.model.model_copy(update={"weight_dtype": used})
    chosen = {
        name: {getattr(build.config, name) for _, build in builds}
        for name in BATCH_LIMITS
        if getattr(scenario.serving, name) is None and not ignores(scenario.serving.policy, name)
    }
    if scenario.serving.enable_prefix_caching is None:
        chosen["enable_prefix_caching"] = {build.config.prefix_caching for _, build in builds}
    sizes = {build.config.block_size for _, build in builds}
    if sizes != {scenario.serving.block_size}:  # vLLM forced one (_at_vllm_block_size)
        chosen["block_size"] = sizes
    agreed = {name: values.pop() for name, values in chosen.items() if len(values) == 1}
    if agreed:
        update["serving"] = scenario.serving.model_copy(update=agreed)
    return scenario.model_copy(update=update)


def _serving_defaults(builds: list[tuple[str, ReplicaBuild]]) -> list[str]:
    """What vLLM's defaults chose for each pool's unset serving settings, and why."""
    named = len(builds) > 1
    return [
        f"[{pool}] {line}" if named else line for pool, build in builds for line in build.defaults
    ]


# infersim's own code: simulate passes a warning on at the first line outside it.
_PACKAGE_DIRS = tuple(
    os.path.dirname(path) + os.sep for path in (hardware_models.__file__, __file__)
)


def simulate(
    scenario: Scenario | BuiltScenario | Mapping[str, Any] | str | os.PathLike[str],
    *,
    progress: bool | None = None,
    summary_warnings: bool = True,
    workers: Workers = 1,
) -> Results:
    """Run one scenario (a Scenario, a dict of its fields, the scenario file at a path,
    or a scenario build_scenario built already) to its stop condition and return its
    results, as `run_simulation` does (`workers` as there). Each InfersimWarning is raised once, as
    `scenario NAME: ...` and at the caller's line: a notebook that runs many scenarios
    one by one gets each warning with the run it belongs to (simulate cannot tell one run
    from the fiftieth of a loop, so it always names it)."""
    for argument, value, allowed in (
        ("progress", progress, (bool, type(None))),
        ("summary_warnings", summary_warnings, (bool,)),
    ):
        if not isinstance(value, allowed):
            also = ", False or None" if type(None) in allowed else " or False"
            raise InfersimError(f"simulate: {argument}: expected True{also}, got {shown(value)}")
    name: str | None = None
    caught: list[warnings.WarningMessage] = []
    try:
        with recording() as caught:  # each once, by _pass_on_named
            loaded = _scenario_of(scenario)
            name = (loaded.scenario if isinstance(loaded, BuiltScenario) else loaded).name
            return run_simulation(
                loaded, progress=progress, summary_warnings=summary_warnings, workers=workers
            )
    finally:  # also when the run stops with an error: what it raised until then holds
        _pass_on_named(caught, name)


def _scenario_of(given: Any) -> Scenario | BuiltScenario:
    """What simulate was given, as a Scenario (or the BuiltScenario itself)."""
    if isinstance(given, Scenario | BuiltScenario):
        return given
    if isinstance(given, Mapping):
        return Scenario.from_dict(dict(given))
    if isinstance(given, str | os.PathLike):
        return Scenario.from_yaml(os.fspath(given))
    raise InfersimError(
        "simulate: scenario: expected a Scenario, a dict of its fields or a scenario file's "
        f"path, got {shown(given)}"
    )


def _pass_on_named(caught: list[warnings.WarningMessage], name: str | None) -> None:
    """Each distinct recorded InfersimWarning to the caller's filters once, named by its
    scenario and raised at the first line outside infersim (the caller's cell or script,
    whatever depth of infersim raised it)."""
    frame = sys._getframe(0)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIRS):
        frame = frame.f_back
    for text in (str(recorded.message) for recorded in distinct(caught).values()):
        warn_at(text if name is None else f"scenario {name}: {text}", frame)


def run_simulation(
    scenario: Scenario | BuiltScenario,
    *,
    progress: bool | None = None,
    summary_warnings: bool = True,
    workers: Workers = 1,
) -> Results:
    """Run one scenario (or a scenario build_scenario built already) to its stop
    condition and return its results. Every warning goes to the caller's filters once,
    unnamed: for callers that name their runs themselves (sweep, plan, the command line);
    analysts call `simulate`. With `summary_warnings` off, those only the finished run's
    figures show (KV cache short, batch capped, rejections) stay in its summary alone:
    for callers that run loads past capacity by design and judge them from the summary
    (the planner's probes). `workers`: processes for a cluster whose replicas are
    independent (round robin or random routing of an open loop; simulator/sharding.py),
    "auto" for one per core when the run is big enough to pay for their start-up; the
    results are the same either way. Default 1: a library call starts no processes
    unasked (a script calling it with more needs an `if __name__ == "__main__":` guard)."""

    built = scenario if isinstance(scenario, BuiltScenario) else None
    if built is not None:
        scenario = built.scenario
    show = scenario.output.progress if progress is None else progress
    with warnings_passed_on_once() as caught:
        run = Run(scenario, show, built)
        shards = shards_for(run, workers)
        started = time.perf_counter()
        if len(shards) > 1:
            end, logs, totals = run_in_shards(run, shards, caught)
        else:
            end = run.advance()
            logs = [replica.log.close(end) for replica in run.replicas]
            totals = [replica.log.totals for replica in run.replicas]
        run.wrap_up()
        wall = time.perf_counter() - started
        if scenario.serving.policy == "static" and (fill := _static_fill(run, end)):
            warn(fill, stacklevel=2)
        raised = [msg for kind, msg in distinct(caught) if issubclass(kind, InfersimWarning)]
        results = _results(scenario, run, end, wall, raised, (logs, totals, max(len(shards), 1)))
        for text in results.summary()["warnings"] if summary_warnings else ():
            if text not in results.context.warnings:  # the ones the run's figures show
                warn(text, stacklevel=2)
    return results


def _static_fill(run: Run, end: float) -> str | None:
    """The static batches' wait for a full batch, where it inflated TTFT (caveats)."""
    req = run.requests
    return static_fill_warning(
        run.builds[0][1].config.max_num_seqs,
        sum(replica.batch_fill_idle_s for replica in run.replicas),
        sum(replica.batch_fill_wait_s for replica in run.replicas),
        len(run.replicas),
        end,
        req.first_token[: req.size] - req.arrival[: req.size],
    )


@contextlib.contextmanager
def warnings_passed_on_once() -> Iterator[list[warnings.WarningMessage]]:
    """Record every InfersimWarning raised within (the list it gives), then pass each
    distinct one on to the caller's filters, also when the block stops with an error:
    what it raised until then still holds. Per thread (hardware_models.warning_scope)."""
    caught: list[warnings.WarningMessage] = []
    try:
        with recording() as caught:
            yield caught
    finally:
        pass_on(caught)


def _results(
    scenario: Scenario,
    run: Run,
    end: float,
    wall: float,
    raised: list[str],
    closed: tuple[list[ClosedLog], list[StepTotals], int],
) -> Results:
    """The finished run's results, from each replica's `closed` log and step totals and
    the count of processes that ran it; its summary holds the warnings raised so far in
    the order they were raised, as stderr shows them: the scenario's loading ones, its
    build's and configuration's, the run's. With the API server modelled, the request table and
    gaps are the client's and the run lasts until the client has seen every token."""
    logs, totals, processes = closed
    frontend = None
    duration = end
    if scenario.frontend.modelled:
        view = ClientView(
            scenario.frontend, run.requests, run.client_arrival, run.engine_arrival,
            [gaps for _, gaps, _ in logs],
        )  # fmt: skip
        view.apply()
        duration = max(end, view.last_seen())
        frontend = view.summary(duration)
    slo = scenario.slo
    folder = scenario.base_dir  # warnings name its files from it, as the scenario does
    ctx = RunContext(
        scenario=scenario.name,
        seed=scenario.seed,
        duration_s=duration,
        replicas=tuple(run.infos),
        slo=SLO(
            ttft_s=None if slo.ttft_ms is None else slo.ttft_ms / 1000,
            tpot_s=None if slo.tpot_ms is None else slo.tpot_ms / 1000,
            e2e_s=None if slo.e2e_ms is None else slo.e2e_ms / 1000,
        ),
        pue=scenario.cost.pue,
        host_w_per_gpu=scenario.cost.host_w_per_gpu,
        usd_per_kwh=scenario.cost.usd_per_kwh,
        priority_names=tuple(run.class_names),
        wall_seconds=wall,
        provenance=provenance(
            _as_run(scenario, run.builds),
            _serving_defaults(run.builds),
            processes,
            assumed_links(run.builds),
        ),
        warnings=tuple(
            dict.fromkeys(named_from(folder, w) for w in (*scenario.load_warnings, *raised))
        ),
        frontend=frontend,
    )
    memory = "\n".join(f"[{pool}] {build.memory.table()}" for pool, build in run.builds)
    return Results.from_run(scenario, memory, ctx, run.requests, totals, logs)
