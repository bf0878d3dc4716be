"""Capacity planning: the cheapest cluster that meets the SLOs for a traffic level.

For every candidate (GPU type, tp, pp, batching policy) the planner
1. drops it if the model does not fit (the memory planner says why);
2. finds one replica's capacity: the highest arrival rate at which it still meets the
   SLO bounds at the chosen percentile (bisection over simulated runs);
3. sizes the fleet: replicas = ceil(target x (1 + headroom) / capacity);
4. verifies the fleet by simulating it at target x (1 + headroom) behind a
   least-outstanding router, adding replicas until the SLOs hold.

Every candidate keeps the scenario's parallelism.dp (data-parallel ranks in a replica,
as vLLM's --data-parallel-size): a replica has tp x pp x dp GPUs, and the table's `dp`
column says so; its `ep` column is the expert-parallel size, tp x dp with
parallelism.enable_expert_parallel (as vLLM's), else 1.

A probe meets the SLOs when every request completed, the run is not overloaded (its
waiting queue does not grow, simulator.metrics.overload) and each bound holds at the
percentile. Each probe is run long enough for a steady state where it can be (see
`_probe`); a fleet whose verifying probe still could not be judged (too_short_to_judge)
is `unverified`, not `ok`, and ranks after every verified fleet. An infeasible candidate
says what it missed ('TPOT p99 7.8 ms > 5 ms').

With `plan.disaggregation` it also tries the candidate as a prefill pool and a decode pool
(Splitwise / DistServe). The two pools load different resources (prompts: compute and
TTFT; decodes: memory bandwidth and TPOT), so each is sized on its own: both pools start
at the colocated fleet's size, which is ample for either (neither phase slows the other
any more), doubling if not; then the decode pool is bisected down with the prefill pool
kept ample, and the prefill pool bisected down with that decode pool. Every size reported
was simulated as a whole fleet at the target rate and met the SLOs.

Survivors are ranked by $/hour, equal prices by $ per 1M output tokens and then the
latencies. The latencies are the verifying probe's, at target x (1 + headroom), the load
the fleet was verified at; the price per token is at the planned rate (target), what the
planned traffic pays: the fleet's $/hour over that rate's output tokens. Candidates run in parallel
through the sweep's executor, on local processes or a Dask cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from hardware_models.errors import InfersimError
from hardware_models.file_memo import per_file_version
from hardware_models.plot_labels import LEADER, spread_labels
from hardware_models.warning_scope import recording, warn
from simulator.executors import JobError, run_parallel
from simulator.formatting import sig
from simulator.memory_planner import PLAN_SETTINGS, DoesNotFit, MaxModelLenRefused
from simulator.metrics.overload import (
    MIN_IN_SYSTEM_ARRIVALS,
    OVERLOADED,
    RAMPS_TO_JUDGE,
    STABLE,
    TOO_SHORT,
    WARMUP_SHARE,
    judged_long_enough,
    verdict,
)
from simulator.metrics.summary import FRONTEND_BUSY
from simulator.progress import Progress
from simulator.scenario import (
    BATCH_LIMITS,
    PlanSection,
    Scenario,
    check_preset_name,
    fields_overlap,
    override_key,
    replica_gpus,
)
from simulator.sweep import warning_texts
from simulator.workload.config import TraceArrivals

if TYPE_CHECKING:
    from distributed import Client
    from matplotlib.figure import Figure

BISECTION_STEPS = 7
VERIFY_ATTEMPTS = 4
STEADY_TURNOVERS = 5
MAX_PROBE_REQUESTS = 20_000
LENGTHENINGS = 2
# A fleet whose verifying probe is too short to judge overload met the SLOs but may still
# be overloaded: it is `unverified`, ranked after every verified one.
FEASIBLE = ("ok", "unverified")
# Policies that hand a request over step by step (static and dynamic run whole batches).
DISAGGREGATED_POLICIES = ("continuous", "chunked_prefill")
# Doubling both pools must improve the tightest SLO margin by this factor to go on: below
# it the bound is under the latency floor and more replicas cannot reach it.
MIN_GAIN = 1.05

Fleet = int | tuple[int, int]  # replicas, or (prefill replicas, decode replicas)


@dataclass(frozen=True)
class Candidate:
    gpu: str
    tp: int
    pp: int
    policy: str

    @property
    def name(self) -> str:
        """`h100-sxm tp4 continuous`, `h100-sxm tp4 pp2 static`: how its warnings name it."""
        pp = f" pp{self.pp}" if self.pp > 1 else ""
        return f"{self.gpu} tp{self.tp}{pp} {self.policy}"


# A probe replays a trace's first rows; where their rate and the whole trace's differ by
# more than this factor, the probes do not see the trace's pattern (a quiet start, a
# burst later) and the plan warns.
WINDOW_RATE_FACTOR = 1.5
# A probe's note where the trace's length, not the planner, held it short.
WHOLE_TRACE = "(the whole trace)"


@dataclass(frozen=True)
class TraceTimes:
    """A trace's arrival times (seconds from its earliest, sorted) and file name."""

    name: str
    times: np.ndarray

    def __len__(self) -> int:
        return len(self.times)

    def rate(self, n: int | None = None) -> float:
        """Arrival rate at time_scale 1 of the first n rows (the whole trace by default):
        what a probe of n requests replays (workload.num_requests takes the first rows)."""
        times = self.times[: n or len(self.times)]
        span = float(times[-1] - times[0]) if len(times) else 0.0
        if len(times) < 2 or span <= 0:
            raise InfersimError(
                f"plan: {self.name}: its first {len(times):,} arrivals span no time; a plan "
                "scales a trace's rate by its arrival times (give poisson, gamma or "
                "constant arrivals)"
            )
        return (len(times) - 1) / span

    def least_representative(self, shortest: int) -> tuple[int, float]:
        """Of the windows a probe may replay (the first n rows, n from `shortest` to the
        whole trace), the one whose rate is furthest from the whole trace's: (n, rate)."""
        n = np.arange(max(shortest, 2), len(self.times) + 1)
        with np.errstate(divide="ignore"):
            rates = (n - 1) / (self.times[n - 1] - self.times[0])
        apart = np.maximum(rates / self.rate(), self.rate() / rates)
        worst = int(np.argmax(apart))
        return int(n[worst]), float(rates[worst])


@per_file_version
def _trace_arrivals(path: Path, columns: str) -> TraceTimes:
    """A trace's arrival times; read once per version of the file (an edited trace is
    read again, as docs/API.md promises of every file a scenario names)."""
    from simulator.workload.config import TraceColumns
    from simulator.workload.traces import read_trace

    layout = TraceColumns.model_validate_json(columns).layout() if columns != "null" else None
    times = read_trace(path, arrivals=True, layout=layout).arrived_at
    assert times is not None
    trace = TraceTimes(path.name, times)
    trace.rate()  # a trace whose arrivals span no time cannot be scaled: say so now
    return trace


def _trace(scenario: Scenario) -> TraceTimes | None:
    """The scenario's arrival trace; None without."""
    arrivals = scenario.workload.arrivals
    if not isinstance(arrivals, TraceArrivals):
        return None
    columns = arrivals.columns.model_dump_json() if arrivals.columns else "null"
    return _trace_arrivals(scenario.resolve_path(arrivals.path).resolve(), columns)


def _base_rate(scenario: Scenario) -> float:
    """The workload's own rate: its arrivals' rate_per_s, or a trace's mean rate at its
    time_scale."""
    arrivals = scenario.workload.arrivals
    if (trace := _trace(scenario)) is not None:
        return trace.rate() / arrivals.time_scale
    rate = getattr(arrivals, "rate_per_s", None)
    if rate is None:
        raise InfersimError(
            f"plan: workload.arrivals.kind {arrivals.kind!r} has no rate to scale; use "
            "poisson, gamma, constant or trace arrivals (lengths may still come from a trace)"
        )
    return float(rate)


def planned_rate(scenario: Scenario) -> float:
    """The traffic the plan serves, before headroom: plan.target_rate_per_s, else the
    workload's own rate."""
    assert scenario.plan is not None
    return scenario.plan.target_rate_per_s or _base_rate(scenario)


def _max_requests(scenario: Scenario) -> int:
    """The most requests a probe runs: MAX_PROBE_REQUESTS, or a trace's length."""
    trace = _trace(scenario)
    return MAX_PROBE_REQUESTS if trace is None else min(MAX_PROBE_REQUESTS, len(trace))


def _misstated_by(scenario: Scenario) -> tuple[int, float, float] | None:
    """Where a probe's trace window misstates the trace: a probe replays its first rows
    scaled to the rate it names, so a window whose rate is WINDOW_RATE_FACTOR or more from
    the whole trace's (a quiet start before a burst) shows a pattern the trace does not
    have. (rows, their rate, the whole trace's), or None."""
    trace, plan = _trace(scenario), scenario.plan
    if trace is None or plan is None:
        return None
    n, rate = trace.least_representative(min(plan.requests_per_probe, len(trace)))
    whole = trace.rate()
    return (n, rate, whole) if max(rate / whole, whole / rate) >= WINDOW_RATE_FACTOR else None


def _least_probe(scenario: Scenario) -> int:
    """The fewest requests a probe replays: the whole trace (up to MAX_PROBE_REQUESTS)
    where its first rows misstate it, so a bursty trace is judged by its bursts."""
    trace = _trace(scenario)
    return _max_requests(scenario) if trace is not None and _misstated_by(scenario) else 0


def _check_trace_window(scenario: Scenario) -> None:
    """Say where the probes' trace windows misstate the trace (each probe then replays the
    whole trace, up to MAX_PROBE_REQUESTS), and where a trace shorter than
    plan.requests_per_probe caps every probe."""
    trace, plan = _trace(scenario), scenario.plan
    if trace is None or plan is None:
        return
    if len(trace) < plan.requests_per_probe:
        warn(
            f"plan: {trace.name} has {len(trace):,} requests, fewer than "
            f"plan.requests_per_probe ({plan.requests_per_probe:,}): every probe replays at "
            "most the whole trace, and a fleet it is too short to judge stays unverified",
            stacklevel=3,
        )
    misstated = _misstated_by(scenario)
    if misstated is not None:
        n, rate, whole = misstated
        most = _max_requests(scenario)
        replayed = (
            f"every probe replays the whole trace ({most:,} requests)"
            if most >= len(trace)
            else f"every probe replays its first {most:,} requests (MAX_PROBE_REQUESTS), "
            "which may still miss its pattern: check the plan with `infersim run` of the "
            "whole trace on the fleet"
        )
        warn(
            f"plan: {trace.name}: its first {n:,} requests arrive at {sig(rate)} req/s, the "
            f"whole trace's {len(trace):,} at {sig(whole)} req/s "
            f"({max(rate / whole, whole / rate):.1f}x apart, over {WINDOW_RATE_FACTOR:g}x): "
            f"a probe of its first rows would not see its quiet spells and bursts, so "
            f"{replayed}",
            stacklevel=3,
        )


def _size(fleet: Fleet) -> int:
    return fleet if isinstance(fleet, int) else sum(fleet)


def _at(scenario: Scenario, candidate: Candidate, rate: float, fleet: Fleet, n: int) -> Scenario:
    """`scenario` as one probe: this candidate as `fleet`, this rate, n requests."""
    data = scenario.model_dump(mode="json", exclude={"plan", "sweep", "variants", "pools"})
    data["base_dir"] = scenario.base_dir
    hardware = {**(data.pop("hardware", None) or {}), "gpu": candidate.gpu, "node": None}
    shape = {"tp": candidate.tp, "pp": candidate.pp}
    data["parallelism"] = {**data["parallelism"], **shape, "router": "least_outstanding"}
    if isinstance(fleet, int):
        data["hardware"] = hardware
        data["parallelism"]["replicas"] = fleet
    else:
        data["pools"] = [
            {"name": role, "hardware": hardware, **shape, "replicas": replicas, "role": role}
            for role, replicas in zip(("prefill", "decode"), fleet, strict=True)
        ]
    data["serving"] = {**data["serving"], "policy": candidate.policy}
    data["workload"] = {**data["workload"], "num_requests": n, "duration_s": None}
    trace = _trace(scenario)
    # a trace is replayed faster or slower: the mean rate of the n rows replayed becomes
    # `rate` (the whole trace's mean would offer a quiet start at a fraction of it)
    pace = {"rate_per_s": rate} if trace is None else {"time_scale": trace.rate(n) / rate}
    data["workload"]["arrivals"] = {**data["workload"]["arrivals"], **pace}
    data["output"] = {"plots": False, "csv": False, "progress": False}
    return Scenario.from_dict(data, source="plan")


# Fields each probe sets from the search (see _at), and what decides them instead.
_SEARCHED = {
    "hardware.gpu": "give GPUs as plan.gpus",
    "hardware.node": "probes run each GPU on its default node",
    "pools": "give GPUs as plan.gpus (plan.disaggregation for prefill/decode pools)",
    "parallelism.tp": "give degrees as plan.tp",
    "parallelism.pp": "give degrees as plan.pp",
    "parallelism.replicas": "the search sizes the fleet (up to plan.max_replicas)",
    "parallelism.router": "probes route least_outstanding",
    "serving.policy": "give policies as plan.policies",
}
# The workload's stop condition: what `infersim run` of the scenario runs; each probe sets
# its own length (plan.requests_per_probe, more where a verdict needs), so a --set of it,
# like the file's, is accepted and said to leave the probes alone.
STOP_FIELDS = ("workload.num_requests", "workload.duration_s")
PROBE_LENGTH = (
    "each probe runs plan.requests_per_probe requests (more where a verdict needs them), "
    "whatever the workload's stop condition (num_requests, duration_s), which is what "
    "`infersim run` of this scenario runs"
)


def _check_overrides(scenario: Scenario) -> None:
    """A --set of a field the search decides would be silently replaced: refuse it; one of
    the stop condition is accepted, as the file's is, and said not to size the probes."""
    for item in scenario.overrides:
        if any(fields_overlap(override_key(item), field) for field in STOP_FIELDS):
            warn(f"plan: --set {item}: {PROBE_LENGTH}", stacklevel=3)
        for field, instead in _SEARCHED.items():
            if fields_overlap(override_key(item), field):
                raise InfersimError(
                    f"plan: --set {item}: every probe sets {field} from the search; {instead}"
                )


def _margins(summary: dict[str, Any], scenario: Scenario, pct: str) -> dict[str, float]:
    """Bound / achieved at the percentile, per SLO: >= 1 means it holds."""
    slo, out = scenario.slo, {}
    for metric, bound_ms in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2e", slo.e2e_ms)):
        if bound_ms is None:
            continue
        achieved = (summary["latency"][metric] or {}).get(pct)
        out[metric] = 0.0 if not achieved else bound_ms / 1000 / achieved
    return out


def _frontend_busy(summary: dict[str, Any]) -> float | None:
    """The API server processes' busy share where they were saturated (FRONTEND_BUSY or
    more: they, not the GPUs, capped the throughput), else None."""
    busy = (summary.get("frontend") or {}).get("utilisation") or 0.0
    return busy if busy >= FRONTEND_BUSY else None


def _meets(summary: dict[str, Any], scenario: Scenario, pct: str) -> bool:
    """Every request completed, no overload (a saturated front end is one: its queue of
    tokens grows though the GPUs keep up) and every SLO bound holds at the percentile."""
    counts = summary["counts"]
    if counts["completed"] < counts["arrived"] or summary.get("overloaded"):
        return False
    if _frontend_busy(summary) is not None:
        return False
    return all(m >= 1.0 for m in _margins(summary, scenario, pct).values())


def _ramp_over(summary: dict[str, Any]) -> bool:
    """Whether the run watched the requests in the system past their ramp (over
    RAMPS_TO_JUDGE ramps' time): a `stable` verdict before that saw no steady state."""
    system = (summary.get("load") or {}).get("in_system")
    return bool(system and system["ramp_over"])


def _run(scenario: Scenario) -> dict[str, Any]:
    """A probe's summary. What its load bent (KV cache short, batch capped, rejections)
    stays in the summary: the planner probes overloaded rates by design and its verdict
    says so. The rest is passed on."""
    from simulator.simulation import run_simulation

    return run_simulation(scenario, progress=False, summary_warnings=False).summary()


@dataclass(frozen=True)
class Probe:
    """One simulated probe: whether it met the SLOs, its summary, and what bent the
    verdict (a probe held at MAX_PROBE_REQUESTS), for the plan table's `note`."""

    ok: bool
    summary: dict[str, Any]
    note: str = ""
    whole_trace: bool = False

    @property
    def verified(self) -> bool:
        """Met the SLOs and judged stable past its ramp: a probe too short to judge may
        have met them only because its queue had not yet grown. A probe that replayed a
        whole trace is the workload itself, not a window of a steady state: meeting the
        SLOs over all of it, not overloaded, is the verdict (only where the trace's first
        rows misstate it, `_least_probe`: a short steady trace still needs a longer one)."""
        if self.whole_trace:
            return self.ok and self.summary["overload_verdict"] != OVERLOADED
        return self.ok and self.summary["overload_verdict"] == STABLE and _ramp_over(self.summary)


def _past_the_ramp(ramp_end_s: float, rate: float, n: int) -> int:
    """Requests for a run of T s to watch the requests in the system over RAMPS_TO_JUDGE
    ramps after theirs. The ramp ends a time in system tau after the first WARMUP_SHARE
    of arrivals, so it lengthens with the run: T - (W T + tau) >= R (W T + tau) needs
    T >= (1 + R) tau / (1 - (1 + R) W) (overload.in_system_trend)."""
    tau = max(ramp_end_s - WARMUP_SHARE * n / rate, 0.0)
    runs = 1 + RAMPS_TO_JUDGE
    return math.ceil(1.1 * rate * runs * tau / (1 - runs * WARMUP_SHARE))


def _requests_needed(summary: dict[str, Any], rate: float, n: int) -> int:
    """Requests a steady-state verdict needs: STEADY_TURNOVERS turnovers of what the fleet
    holds at once (Little's law: rate x median time in system), and, where the queue rose
    by a share this length could not judge, enough arrivals for that share to be
    detectable (the detectable share falls as 1 / sqrt(arrivals))."""
    time_in_system = summary["latency"]["e2e"]["p50"] or 0.0
    needed = math.ceil(STEADY_TURNOVERS * rate * time_in_system)
    load, system = summary["load"], summary["load"]["in_system"]
    if system and not system["ramp_over"]:
        needed = max(needed, _past_the_ramp(system["ramp_end_s"], rate, n))
    if summary["overload_verdict"] != TOO_SHORT:
        return needed
    within_noise = [load] if load["unserved_share"] and verdict(load) == TOO_SHORT else []
    if system["verdict"] == TOO_SHORT and judged_long_enough(system):
        within_noise.append(system)
    elif system["verdict"] == TOO_SHORT:
        # arrivals over the ramp, then over RAMPS_TO_JUDGE ramps and MIN_IN_SYSTEM_ARRIVALS
        # (overload.in_system_verdict)
        ramp = rate * system["ramp_end_s"]
        after = max(RAMPS_TO_JUDGE * ramp, MIN_IN_SYSTEM_ARRIVALS)
        needed = max(needed, math.ceil(ramp + after))
    for trend in within_noise:
        ratio = trend["detectable_unserved_share"] / trend["unserved_share"]
        needed = max(needed, math.ceil(n * ratio**2))
    return needed


def _probe(
    scenario: Scenario, c: Candidate, rate: float, fleet: Fleet, n: int | None = None
) -> Probe:
    """Simulate the fleet at `rate`. A fleet gets requests_per_probe per replica, up to 8
    replicas' worth, and is run again longer when that is too few for a verdict on a
    steady state (`_requests_needed`), up to LENGTHENINGS times and MAX_PROBE_REQUESTS
    requests (or a trace's length); a probe held short of what it needs says so in its
    note."""
    plan = scenario.plan
    assert plan is not None
    most = _max_requests(scenario)
    n = min(max(n or plan.requests_per_probe * min(_size(fleet), 8), _least_probe(scenario)), most)
    summary = _run(_at(scenario, c, rate, fleet, n))
    needed = _requests_needed(summary, rate, n)
    note = ""
    for _ in range(LENGTHENINGS):  # a longer run can show a longer ramp: judge it again
        if needed <= n or n >= most:
            break
        n = min(needed, most)
        summary = _run(_at(scenario, c, rate, fleet, n))
        needed = max(needed, _requests_needed(summary, rate, n))
    trace = _trace(scenario)
    # a trace whose windows misstate it is replayed whole and judged as the workload it is
    if trace is not None and n >= len(trace) and _misstated_by(scenario) is not None:
        return Probe(_meets(summary, scenario, plan.percentile), summary, "", whole_trace=True)
    if needed > n:
        whole = f" {WHOLE_TRACE}" if trace is not None and n >= most else ""
        note = f"verified with {n:,} requests{whole} where a steady-state verdict needs {needed:,}"
    if summary["overload_verdict"] == TOO_SHORT:
        note = "; ".join(filter(None, (note, summary["overload_note"])))
    elif summary["overload_verdict"] == STABLE and not _ramp_over(summary):
        ramp = summary["load"]["in_system"]["ramp_end_s"]
        short = (
            f"too short to judge overload: the requests in the system were still filling up "
            f"(to {ramp:,.0f} s) and a verdict needs {RAMPS_TO_JUDGE} times that long of "
            "arrivals after it"
        )
        note = "; ".join(filter(None, (note, short)))
    return Probe(_meets(summary, scenario, plan.percentile), summary, note)


@dataclass(frozen=True)
class Capacity:
    """One replica's capacity within the SLOs: `rps`, the highest rate verified (0 if
    none); `capped` when that was the planned rate itself, the first rate probed, so
    that `rps` is a lower bound; `unjudged`, the lowest rate above it that met the SLOs
    in a probe too short to judge overload (0 if none): the capacity may be up to there,
    a lower bound too, or, with no rate verified, unknown. `missed` is the failing probe
    at the lowest rate tried when none met them."""

    rps: float
    capped: bool
    unjudged: float = 0.0
    missed: Probe | None = None
    missed_rate: float = 0.0

    @property
    def sizing_rps(self) -> float:
        """What the fleet is sized from: the verified capacity, else the unjudged rate."""
        return self.rps or self.unjudged

    def note(self) -> str:
        """What the row says where the capacity is a lower bound or unknown."""
        if not self.unjudged:
            return ""
        if not self.rps:
            return (
                f"replica capacity unknown: probes up to {sig(self.unjudged)} req/s met the "
                "SLOs but were too short to judge overload; sized from that rate"
            )
        return (
            f"replica capacity at least {sig(self.rps)} req/s: a probe at "
            f"{sig(self.unjudged)} req/s met the SLOs but was too short to judge overload"
        )


def _replica_capacity(scenario: Scenario, c: Candidate, plan: PlanSection, hi: float) -> Capacity:
    """Highest rate one replica serves within the SLOs, bisected below `hi`; a probe too
    short to judge overload is no pass (its queue may not have grown yet), so the
    bisection goes below it and the capacity says it is a lower bound."""
    n = plan.requests_per_probe
    lo, unjudged = 0.0, 0.0
    missed = _probe(scenario, c, hi, 1, n)
    if missed.verified:
        return Capacity(hi, capped=True)
    missed_rate = hi
    if missed.ok:
        unjudged = hi
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2 if lo else hi / 2 ** (BISECTION_STEPS // 2)
        probe = _probe(scenario, c, mid, 1, n)
        if probe.verified:
            lo = mid
        elif probe.ok:
            hi = unjudged = mid
        else:
            hi = mid
            missed, missed_rate = probe, mid
        if lo and hi / lo < 1.08:
            break
    if lo or unjudged:
        return Capacity(lo, capped=False, unjudged=unjudged)
    return Capacity(0.0, False, missed=missed, missed_rate=missed_rate)


def _misses(probe: Probe, scenario: Scenario, pct: str) -> str:
    """What a failing probe missed: the SLOs with what was achieved, unfinished requests,
    an overload ('TPOT p99 7.8 ms > 5 ms')."""
    summary, slo, out = probe.summary, scenario.slo, []
    counts = summary["counts"]
    if counts["completed"] < counts["arrived"]:
        out.append(f"{counts['arrived'] - counts['completed']:,} of {counts['arrived']:,} "
                   "requests did not complete")  # fmt: skip
    if summary.get("overloaded"):
        out.append(f"overloaded ({summary['overload_reason']})")
    if (busy := _frontend_busy(summary)) is not None:
        out.append(f"API server processes {busy:.0%} busy (frontend.api_server_count)")
    bounds = {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms, "e2e": slo.e2e_ms}
    for metric, margin in _margins(summary, scenario, pct).items():
        if margin < 1.0:
            achieved = (summary["latency"][metric] or {}).get(pct)
            got = "none measured" if not achieved else f"{sig(1000 * achieved)} ms"
            out.append(f"{metric.upper()} {pct} {got} > {bounds[metric]:g} ms")
    return "; ".join(out)


def _colocated(
    scenario: Scenario, c: Candidate, plan: PlanSection, target: float, capacity: Capacity
) -> tuple[int, Probe]:
    """The verified fleet of colocated replicas, starting from the capacity estimate."""
    if capacity.missed is not None:
        raise InfersimError(
            f"one replica misses the SLO even at the lowest probed rate "
            f"({sig(capacity.missed_rate)} req/s): "
            f"{_misses(capacity.missed, scenario, plan.percentile)}"
        )
    replicas = math.ceil(target / capacity.sizing_rps)
    probe = None
    for _ in range(VERIFY_ATTEMPTS):
        if replicas > plan.max_replicas:
            raise InfersimError(f"needs more than {plan.max_replicas} replicas")
        probe = _probe(scenario, c, target, replicas)
        if probe.ok:
            return replicas, probe
        replicas += max(1, replicas // 10)
    assert probe is not None
    raise InfersimError(f"fleet never met the SLO: {_misses(probe, scenario, plan.percentile)}")


def _smallest(probe: Callable[[int], Probe], hi: int, passed: Probe) -> tuple[int, Probe]:
    """The fewest replicas in 1..hi that pass `probe`, given that hi passes (`passed`);
    bisection, so it assumes more replicas never hurt."""
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = probe(mid)
        if found.ok:
            hi, passed = mid, found
        else:
            lo = mid
    return hi, passed


def _disaggregated(
    scenario: Scenario, c: Candidate, plan: PlanSection, target: float, start: int
) -> tuple[tuple[int, int], Probe]:
    """The smallest verified (prefill, decode) pools; see the module docstring."""
    ample, tightest = max(1, start), 0.0
    while True:
        probe = _probe(scenario, c, target, (ample, ample))
        if probe.ok:
            break
        margin = min(_margins(probe.summary, scenario, plan.percentile).values())
        if 4 * ample > plan.max_replicas:
            raise InfersimError(f"needs more than {plan.max_replicas} replicas")
        if tightest and margin < MIN_GAIN * tightest:
            raise InfersimError(
                f"{2 * ample} replicas miss the SLO and doubling the pools did not help: "
                f"{_misses(probe, scenario, plan.percentile)}"
            )
        ample, tightest = 2 * ample, margin
    decode, probe = _smallest(lambda d: _probe(scenario, c, target, (ample, d)), ample, probe)
    prefill, probe = _smallest(lambda p: _probe(scenario, c, target, (p, decode)), ample, probe)
    return (prefill, decode), probe


def _layouts(plan: PlanSection, candidate: Candidate) -> list[str]:
    disaggregated = plan.disaggregation and candidate.policy in DISAGGREGATED_POLICIES
    return ["colocated", "disaggregated"] if disaggregated else ["colocated"]


def _token_price(summary: dict[str, Any], rate: float) -> float | None:
    """$ per 1M output tokens of the probe's fleet serving `rate` req/s: its $/hour over
    rate x the output tokens of a request (the probe's mean). A fleet that meets the SLOs
    at a probe's higher rate serves `rate` in full, so this is what the planned traffic
    pays per token; the probe's own figure, at target x (1 + headroom), would understate it
    by that headroom."""
    throughput = summary["throughput"]
    if not throughput["requests_per_s"]:
        return None
    tokens_per_request = throughput["output_tokens_per_s"] / throughput["requests_per_s"]
    return summary["cost"]["usd_per_hour"] / 3600 * 1e6 / (rate * tokens_per_request)


def _row(scenario: Scenario, candidate: Candidate, fleet: Fleet, probe: Probe) -> dict[str, Any]:
    """A feasible fleet's row: its size, cost per output token at the planned rate
    (`_token_price`), latency at the verified load (target x (1 + headroom)), and the
    probe's verdict and note; `unverified` when the probe was too short to judge
    overload."""
    summary = probe.summary
    plan = scenario.plan
    assert plan is not None
    pct = plan.percentile
    split = {} if isinstance(fleet, int) else dict(zip(("prefill", "decode"), fleet, strict=True))
    return {
        "status": "ok" if probe.verified else "unverified",
        "replicas": _size(fleet),
        "prefill_replicas": split.get("prefill"),
        "decode_replicas": split.get("decode"),
        "gpus": _size(fleet) * replica_gpus(candidate.tp, candidate.pp, scenario.parallelism.dp),
        "usd_per_hour": summary["cost"]["usd_per_hour"],
        "usd_per_million_output_tokens": _token_price(summary, planned_rate(scenario)),
        f"ttft_{pct}_ms": 1000 * summary["latency"]["ttft"][pct],
        f"tpot_{pct}_ms": 1000 * summary["latency"]["tpot"][pct],
        # the probe's, on the steady basis of compare and sweep tables
        "steady_goodput_requests_per_s": summary["goodput"]["steady_goodput_requests_per_s"],
        # the probe's GPU energy per output token, at the verified load as the latencies:
        # the GPUs draw less at the planned rate but not in proportion (idle power)
        "joules_per_output_token": summary["energy"]["joules_per_output_token"],
        **{f"{k}_margin": v for k, v in _margins(summary, scenario, pct).items()},
        "overload_verdict": summary["overload_verdict"],
        "note": probe.note,
        "reason": "",
    }


def _batch_limits(scenario: Scenario, candidate: Candidate, rate: float) -> dict[str, Any]:
    """The batch limits the candidate's replicas run with: vLLM's defaults differ by GPU
    (1024/8192 on an H100, 256/2048 on an A100), so the table says which each ran."""
    from simulator.build import batch_limits_of

    try:
        n = min(scenario.plan.requests_per_probe, _max_requests(scenario))
        return batch_limits_of(_at(scenario, candidate, rate, 1, n))
    except InfersimError:  # the candidate's own row says why it cannot run
        return dict.fromkeys(BATCH_LIMITS)


def _reason(exc: InfersimError) -> str:
    """Why a candidate is infeasible, in one line; a refusal names the plan's own
    settings (plan.tp, plan.pp), which the search sets the probes' from."""
    if isinstance(exc, MaxModelLenRefused | DoesNotFit):
        exc = exc.named(PLAN_SETTINGS)
    return str(exc).splitlines()[0]


def evaluate(scenario: Scenario, candidate: Candidate) -> list[dict[str, Any]]:
    """The candidate's rows of the plan table, one per layout (colocated, and
    disaggregated when planned); an infeasible one has status 'infeasible' and the reason."""
    plan = scenario.plan
    assert plan is not None
    target = planned_rate(scenario) * (1 + plan.headroom)
    par = scenario.parallelism
    # the scenario's dp, every probe's; ep: the experts spread over tp x dp GPUs, else 1
    ep = candidate.tp * par.dp if par.enable_expert_parallel else 1
    base = {**asdict(candidate), "dp": par.dp, "ep": ep}
    base["calibration"] = calibration_source(scenario, candidate.gpu)
    base |= _batch_limits(scenario, candidate, target)
    rows = []
    start = 1  # where the disaggregated search starts: the colocated size, when known
    try:
        capacity = _replica_capacity(scenario, candidate, plan, target)
        start = math.ceil(target / capacity.sizing_rps) if capacity.sizing_rps else 1
        replicas, probe = _colocated(scenario, candidate, plan, target, capacity)
        start = replicas
        row = {
            "replica_capacity_rps": capacity.rps or float("nan"),
            "capacity_capped": capacity.capped,
            **_row(scenario, candidate, replicas, probe),
        }
        row["note"] = "; ".join(filter(None, (capacity.note(), row["note"])))
    except InfersimError as exc:
        row = {"status": "infeasible", "reason": _reason(exc)}
    rows.append({**base, "layout": "colocated", **row})
    if "disaggregated" in _layouts(plan, candidate):
        try:
            start = min(start, max(1, plan.max_replicas // 2))
            pools, probe = _disaggregated(scenario, candidate, plan, target, start)
            row = _row(scenario, candidate, pools, probe)
        except InfersimError as exc:
            row = {"status": "infeasible", "reason": _reason(exc)}
        rows.append({**base, "layout": "disaggregated", **row})
    return rows


# What calibration_source calls a GPU priced on its own measured kernels.
FITTED = "fitted"


def calibration_source(scenario: Scenario, gpu: str) -> str:
    """Where `gpu`'s efficiencies come from as the scenario's hardware.calibration picks
    them (build.resolve_calibration): `fitted` (a profile fitted on this GPU), `from
    <gpu>` (a profile fitted on another chip, transferred), `datasheet` (no profile), or
    `profile` (one that names no GPU). A plan that ranks fitted GPUs against the others
    compares measured kernels with assumed ones."""
    from hardware_models.calibration_lookup import profile_metadata
    from simulator.build import resolve_calibration

    hardware = scenario.hardware.model_copy(update={"gpu": gpu, "node": None})
    try:
        choice = resolve_calibration(scenario.model_copy(update={"hardware": hardware}))
    except InfersimError:  # the candidate's own row says why
        return ""
    if choice.profile is None:
        return "datasheet"
    fitted_on = profile_metadata(choice.profile).get("gpu")
    if fitted_on is None:
        return "profile"
    return FITTED if fitted_on == choice.gpu.name else f"from {fitted_on}"


def _check_gpu_names(plan: PlanSection) -> None:
    """A misspelt plan.gpus preset is refused before any probe runs: as a candidate it
    would only be ranked infeasible, below the GPUs that were meant."""
    from hardware_models.presets import load_gpu

    for i, gpu in enumerate(plan.gpus):
        check_preset_name(f"plan.gpus.{i}", load_gpu, gpu)


def candidates(plan: PlanSection) -> list[Candidate]:
    return [
        Candidate(gpu, tp, pp, policy)
        for gpu in plan.gpus
        for tp in plan.tp
        for pp in plan.pp
        for policy in plan.policies
    ]


def _evaluated(scenario: Scenario, candidate: Candidate) -> dict[str, Any]:
    """The candidate's rows and the warnings its probes raised (each once), carried back
    as text so they show where the plan runs, naming the candidate, whichever process
    ran it (a worker's own display would print them raw, and once per worker, not per
    candidate)."""
    with recording() as caught:  # per thread: a threaded Dask worker runs several
        rows = evaluate(scenario, candidate)
    return {"rows": rows, "warnings": warning_texts(caught)}


def _evaluate_packed(args: tuple[dict[str, Any], Candidate]) -> dict[str, Any]:
    data, candidate = args
    return _evaluated(Scenario.model_validate(data), candidate)


def plan_capacity(
    scenario: Scenario,
    *,
    workers: int | None = None,
    client: Client | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """The ranked plan table: feasible candidates cheapest first, then the rest.

    Candidates run on `workers` local processes (default: one per CPU; 1 runs them in this
    process) or on the Dask cluster of `client`, as sweep points do. `progress` shows a bar
    of finished candidates, as a sweep does: on a terminal or in a notebook, nowhere else
    (simulator.progress); a plan runs many probes and takes minutes.
    """
    if scenario.plan is None:
        raise InfersimError(f"{scenario.name}: no `plan:` section to search")
    if not any((scenario.slo.ttft_ms, scenario.slo.tpot_ms, scenario.slo.e2e_ms)):
        raise InfersimError("plan: give at least one SLO bound (slo.ttft_ms, tpot_ms, e2e_ms)")
    if client is not None and workers is not None:
        raise InfersimError("workers: give a worker count or a Dask client, not both")
    if workers is not None and workers < 1:
        raise InfersimError(f"workers: expected at least 1 (got {workers})")
    with recording() as caught:
        _base_rate(scenario)
        _check_overrides(scenario)
        _check_trace_window(scenario)
    _check_gpu_names(scenario.plan)
    said = warning_texts(caught)  # the plan's own, said once: not again per candidate
    for text in said:
        warn(text, stacklevel=2)
    plan, todo = scenario.plan, candidates(scenario.plan)
    data = scenario.model_dump(mode="json")
    data["base_dir"] = scenario.base_dir
    payloads = [(data, c) for c in todo]
    # workers=1 runs in this process (run_parallel), the same path as the pool's
    finished = run_parallel(_evaluate_packed, payloads, workers=workers, client=client)
    bar = Progress(len(todo), enabled=progress, label=f"plan {scenario.name}", unit="candidate")
    results = []
    for done, item in enumerate(finished, start=1):
        results.append(item)
        bar.update(done)
    bar.close()
    rows: list[dict[str, Any]] = []
    raised: dict[str, list[str]] = {}
    for index, result in sorted(results):
        candidate = todo[index]
        if isinstance(result, JobError):  # its worker died on every try, or Dask lost it
            rows.extend(
                {**asdict(candidate), "layout": layout, "status": result.status,
                 "reason": result.error}
                for layout in _layouts(plan, candidate)
            )  # fmt: skip
            continue
        for text in result["warnings"]:
            if text not in said:  # the plan's own (reading its trace): said above
                raised.setdefault(text, []).append(candidate.name)
        rows.extend(result["rows"])
    _warn_once(raised, len(todo))
    return _ranked(pd.DataFrame(rows), plan.percentile)


def _warn_once(raised: dict[str, list[str]], candidates: int) -> None:
    """Each distinct warning of the candidates' probes once, naming the candidates that
    raised it (`every candidate` where all did): the same caveat on every candidate
    would otherwise fill the screen."""
    for text, names in raised.items():
        if len(names) == candidates > 1:
            who = "every candidate"
        else:
            who = f"candidate{'s' if len(names) > 1 else ''} {', '.join(names)}"
        warn(f"{who}: {text}", stacklevel=3)


def _ranked(table: pd.DataFrame, pct: str) -> pd.DataFrame:
    """Verified fleets first, then unverified ones, each cheapest first: by $/hour, then
    by $ per 1M output tokens and the latencies (equal prices are common: one GPU count
    of one type), then GPU, tp and layout; the infeasible last, unranked."""
    table = table.astype({name: "Int64" for name in BATCH_LIMITS if name in table})
    for name in ("replicas", "prefill_replicas", "decode_replicas", "gpus"):
        if name in table:
            table[name] = table[name].astype("Int64")
    for name in ("usd_per_hour", "usd_per_million_output_tokens", f"tpot_{pct}_ms",
                 f"ttft_{pct}_ms"):  # fmt: skip
        if name not in table:  # nothing feasible
            table[name] = float("nan")
    order = table["status"].map({status: i for i, status in enumerate(FEASIBLE)})
    # Prices compared to the cent: 6 x $7.16 and 3 x $14.32 differ in the last bit.
    cents = table["usd_per_hour"].round(2)
    keys = ["_cents", "usd_per_million_output_tokens", f"tpot_{pct}_ms", f"ttft_{pct}_ms"]
    table = table.assign(_order=order, _cents=cents).sort_values(
        ["_order", *keys, "gpu", "tp", "layout"], na_position="last", kind="stable"
    )
    feasible = table["_order"].notna().to_numpy()
    table["rank"] = pd.array(
        [i + 1 if ok else None for i, ok in enumerate(feasible)], dtype="Int64"
    )
    return table.drop(columns=["_order", "_cents"]).reset_index(drop=True)


_MARKERS = {"colocated": "o", "disaggregated": "^"}


def _point_label(row: pd.Series) -> str:
    """GPU, tp (and pp, dp) and replicas of a plan row, e.g. 'h100-sxm tp4 x2'."""
    pp = f" pp{row['pp']}" if row["pp"] > 1 else ""
    pp += f" dp{row['dp']}" if row["dp"] > 1 else ""
    if row["layout"] == "disaggregated":
        fleet = f"{int(row['prefill_replicas'])}P+{int(row['decode_replicas'])}D"
    else:
        fleet = f"x{int(row['replicas'])}"
    return f"{row['gpu']} tp{row['tp']}{pp} {fleet}"


def _label_groups(rows: pd.DataFrame, column: str) -> dict[tuple[float, float], list[str]]:
    """Point labels gathered into one block per cluster of points within 6% of the axes'
    spans of each other, so labels of near-identical candidates do not overprint."""
    x, y = rows[column].to_numpy(float), rows["usd_per_hour"].to_numpy(float)
    sx, sy = max(np.ptp(x), 1e-9), max(np.ptp(y), 1e-9)
    groups: dict[tuple[float, float], list[str]] = {}
    for xi, yi, (_, row) in zip(x, y, rows.iterrows(), strict=True):
        near = next(
            (k for k in groups if abs(k[0] - xi) < 0.06 * sx and abs(k[1] - yi) < 0.06 * sy),
            (xi, yi),
        )
        groups.setdefault(near, []).append(_point_label(row))
    return groups


def pareto_figure(
    table: pd.DataFrame,
    percentile: str = "p99",
    *,
    title: str = "",
    slo_ms: dict[str, float | None] | None = None,
) -> Figure:
    """$/hour against the latency percentile per feasible candidate (colour: GPU; marker:
    colocated or disaggregated, hollow when unverified), each point labelled with its GPU,
    tp and replicas; the Pareto front (nothing both cheaper and faster) is joined by a
    line, and the SLO bound (`slo_ms`, by metric) drawn where one is set."""
    from matplotlib.figure import Figure

    ok = table[table["status"].isin(FEASIBLE)]
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    placements: list[list[Any]] = []
    colours = {gpu: f"C{i}" for i, gpu in enumerate(sorted(ok["gpu"].unique()))}
    for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
        column = f"{metric}_{percentile}_ms"
        if ok.empty or column not in ok:
            ax.text(0.5, 0.5, "no feasible candidate", ha="center", transform=ax.transAxes)
            continue
        for (gpu, layout, status), group in ok.groupby(["gpu", "layout", "status"]):
            kind = ", ".join(k for k in (layout, status) if k not in ("colocated", "ok"))
            label = f"{gpu} ({kind})" if kind else gpu
            face = colours[gpu] if status == "ok" else "none"
            ax.scatter(group[column], group["usd_per_hour"], label=label, s=30,
                       edgecolors=colours[gpu], facecolors=face,
                       marker=_MARKERS[layout])  # fmt: skip
        ordered = ok.sort_values([column, "usd_per_hour"])
        texts = [
            ax.annotate("\n".join(labels), (x, y), xytext=(5, 4), textcoords="offset points",
                        fontsize=7, va="bottom", arrowprops=LEADER)
            for (x, y), labels in _label_groups(ordered, column).items()
        ]  # fmt: skip
        placements.append(texts)
        front = ordered[ordered["usd_per_hour"] <= ordered["usd_per_hour"].cummin()]
        ax.plot(front[column], front["usd_per_hour"], color="black", lw=1, ls="--")
        bound = (slo_ms or {}).get(metric)
        if bound is not None:
            ax.axvline(bound, color="crimson", lw=1, ls=":", label=f"SLO {bound:g} ms")
        ax.set_xlabel(f"{metric.upper()} {percentile} (ms)")
        ax.set_ylabel("$ / hour")
        ax.grid(alpha=0.3)
        ax.margins(x=0.15, y=0.1)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    name = f"{title}: " if title else ""
    fig.suptitle(f"Capacity plan {name}cost against latency (dashed: Pareto front)")
    for texts in placements:
        spread_labels(fig, texts)
    return fig
