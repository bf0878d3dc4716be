"""Every warning a run raises reaches the caller once: Python's warnings for library users
(also the ones only the summary computes, and also when the run stops with an error), one
`infersim: warning:` line per warning on the command line, naming the compared run or the
sweep point it belongs to."""

from __future__ import annotations

import inspect
import warnings

import pytest
import yaml

from hardware_models.errors import InfersimError, InfersimWarning
from simulator.cli.main import main
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict

# Llama-2-13B pipelined over two A100s with 0.5 GiB of swap space: each of the two batches in
# flight gets 40 of its 81 blocks, a swap-out needs more, and the run stops at t=56 s. Swap is
# vLLM v0's: the prefill-first policy, whose budget covers the 4,096-token context.
SWAP_STOP = {
    "name": "swapstop",
    "seed": 11,
    "hardware": {"gpu": "a100-80gb-sxm"},
    "model": {"name": "llama-2-13b"},
    "parallelism": {"pp": 2},
    "serving": {"policy": "continuous", "max_num_seqs": 128, "max_num_batched_tokens": 4096,
                "preemption": "swap", "swap_space_gb": 0.5, "num_gpu_blocks": 1500},
    "workload": {
        "arrivals": {"kind": "poisson", "rate_per_s": 1.5},
        "prompt_tokens": {"kind": "lognormal", "mean": 3000, "std": 1000, "min": 500, "max": 3800},
        "output_tokens": {"kind": "lognormal", "mean": 300, "std": 200, "min": 16, "max": 800},
        "max_total_tokens": 4096,
        "num_requests": 300,
    },
    "output": {"plots": False, "progress": False},
}  # fmt: skip
SWAP_WARNING = (
    "serving.swap_space_gb holds 40 KV blocks of host swap space per pipelined batch (2 share "
    "it), fewer than one 4,096-token sequence needs (256)"
)
V0_SWAP = {"policy": "continuous", "max_num_batched_tokens": 4096, "preemption": "swap"}
SPLIT_WARNING = "serving.max_num_seqs=128 is split as [64, 64]"
# 14 of 30 requests are longer than 600 tokens: a warning only the summary computes.
REJECTING = {"serving": {"max_model_len": 600}, "workload": {"num_requests": 30}}
REJECTED = "were rejected because prompt + output exceed max_model_len"


def _recorded(call) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in seen if issubclass(w.category, InfersimWarning)]


def test_warnings_raised_before_a_run_stops_with_an_error_are_passed_on():
    """The swap-space warning (built before the run) and the pp split warning (raised
    building the engines) reach the caller although the run raises at its swap-out."""

    def run():
        with pytest.raises(InfersimError, match="has 40 of 40 free"):
            simulate(Scenario.from_dict(SWAP_STOP))

    seen = _recorded(run)
    assert [SWAP_WARNING in w for w in seen] == [True, False]
    assert SPLIT_WARNING in seen[1]


def test_run_prints_the_warnings_then_the_error_when_it_stops(tmp_path, capsys):
    path = tmp_path / "swap.yaml"
    path.write_text(yaml.safe_dump(SWAP_STOP))
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"infersim: warning: {SWAP_WARNING}")
    assert err[1].startswith("infersim: warning: parallelism.pp=2: " + SPLIT_WARNING)
    assert err[2].startswith("infersim: error: ") and "40 of 40 free" in err[2]


def test_the_swap_warning_counts_the_whole_swap_space_without_pipelining():
    data = scenario_dict(serving={**V0_SWAP, "swap_space_gb": 0.5},
                         workload={"num_requests": 10})  # fmt: skip
    (warning,) = _recorded(lambda: simulate(Scenario.from_dict(data)))
    # 0.5 GiB (vLLM's --swap-space unit) of Llama-2-7B's 8 MiB blocks
    assert warning.startswith("scenario test: serving.swap_space_gb holds 64 KV blocks of host ")


def test_a_warning_only_the_summary_computes_is_an_infersim_warning_once():
    data = scenario_dict(**REJECTING)
    results: list = []
    seen = _recorded(lambda: results.append(simulate(Scenario.from_dict(data))))
    assert len(seen) == 1 and REJECTED in seen[0]
    assert seen == [f"scenario test: {text}" for text in results[0].summary()["warnings"]]


def test_run_says_each_warning_on_stderr_as_every_command_does(tmp_path, capsys):
    """On stderr, where compare, sweep and plan say theirs (a CI reads them there); the
    printed summary lists it too, as summary.json does."""
    path = tmp_path / "rejecting.yaml"
    path.write_text(yaml.safe_dump(scenario_dict(**REJECTING)))
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out.count(REJECTED) == 1
    (line,) = [line for line in err.splitlines() if line.startswith("infersim: warning:")]
    assert line.startswith("infersim: warning: 14 of 30 requests") and REJECTED in line


def test_compare_prints_each_runs_warnings_once_named_by_run(tmp_path, capsys):
    data = scenario_dict(**REJECTING)
    data["variants"] = {"short": {}, "longer": {"serving": {"max_model_len": 700}}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["compare", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert [line.split(" requests")[0] for line in lines] == [
        "infersim: warning: longer: 12 of 30",
        "infersim: warning: short: 14 of 30",
    ]
    assert all(REJECTED in line for line in lines)


@pytest.mark.parametrize("workers", [1, 2])
def test_sweep_prints_each_points_warnings_once_named_by_point(tmp_path, capfd, workers):
    """Workers carry their points' warnings back; the sweep prints one line each (none
    raw from a worker), the ones only the summary computes included."""
    data = scenario_dict(**REJECTING)
    data["sweep"] = {"grid": {"serving.max_model_len": [600, 700]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    args = ["sweep", str(path), "-o", str(tmp_path / "out"), "--workers", str(workers)]
    assert main([*args, "--quiet"]) == 0
    lines = [line for line in capfd.readouterr().err.splitlines() if "arning" in line]
    assert sorted(line.split(" requests")[0] for line in lines) == [
        "infersim: warning: point max_model_len=600: 14 of 30",
        "infersim: warning: point max_model_len=700: 12 of 30",
    ]


def test_a_plan_probe_leaves_its_load_warnings_in_its_summary():
    """The planner probes overloaded rates by design: a probe's summary-only warnings are
    not printed for each probe; what its layout bends still is."""
    from simulator.planner import _run

    data = scenario_dict(**REJECTING)
    data["serving"] |= {**V0_SWAP, "swap_space_gb": 0.1}
    summary: dict = {}
    seen = _recorded(lambda: summary.update(_run(Scenario.from_dict(data))))
    assert len(seen) == 1 and seen[0].startswith("serving.swap_space_gb holds 12 KV blocks")
    assert any(REJECTED in w for w in summary["warnings"])


def test_a_scenario_built_beforehand_runs_as_built_and_raises_its_build_warnings():
    """simulate(build_scenario(s)) runs the replicas built once (replay's and compare's
    checks), with the warnings building them raised counted as the run's own."""
    from simulator.build import build_scenario

    model = {"name": "gpt-oss-20b", "weight_dtype": "bf16"}  # an upcast checkpoint: a warning
    data = scenario_dict(model=model, hardware={"gpu": "b200", "calibration": "none"})
    scenario = Scenario.from_dict({**data, "workload": {**data["workload"], "num_requests": 20}})
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        built = build_scenario(scenario)
    assert not shown and any("stored in fp4" in str(w.message) for w in built.raised)
    with pytest.warns(InfersimWarning, match="stored in fp4"):
        results = simulate(built)
    assert any("stored in fp4" in text for text in results.summary()["warnings"])


def test_simulate_names_the_scenario_and_points_at_the_callers_line():
    """A notebook runs many scenarios: each warning says which, and is raised at the
    caller's line (here), not inside infersim, whatever depth raised it."""
    data = scenario_dict(**REJECTING)
    configured = scenario_dict(serving={**V0_SWAP, "swap_space_gb": 0.5},
                               workload={"num_requests": 10}, name="swapping")  # fmt: skip
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        simulate({**data, "name": "short-context"})
        simulate(configured)
    said = [w for w in seen if issubclass(w.category, InfersimWarning)]
    assert [str(w.message).split(" requests")[0].split(" holds")[0] for w in said] == [
        "scenario short-context: 14 of 30",
        "scenario swapping: serving.swap_space_gb",
    ]
    assert {w.filename for w in said} == {__file__}
    assert said[0].lineno == line and said[1].lineno == line + 1


def test_sweep_and_plan_name_their_runs_their_own_way():
    """The runs a sweep or a plan makes are named by point or candidate alone."""
    from simulator.sweep import run_point

    record = run_point(scenario_dict(**REJECTING))
    assert record["warnings"][0].startswith("14 of 30 requests")


def test_a_run_repeated_at_one_line_says_its_warnings_each_time():
    """Python's default filter shows a warning once per line; a run's warnings are shown
    again when the same line runs the scenario again (a loop, a notebook cell rerun), as
    each run's are its own."""
    scenario = Scenario.from_dict({**scenario_dict(**REJECTING), "name": "again"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        for _ in range(2):
            simulate(scenario, progress=False)
    said = [str(w.message) for w in seen if REJECTED in str(w.message)]
    assert len(said) == 2 and said[0] == said[1] and said[0].startswith("scenario again: ")
