"""Reliability, parts 3 and 4: overload and infeasible configurations.

Overload: ~10x the cluster's capacity for an hour of simulated time (a billion tokens of
offered load) keeps memory linear in the requests and steps stored as array rows, says
`overloaded: true` with its reason, and loses no request: the backlog is in flight.
Infeasible: a model that does not fit, a KV cache smaller than one request or one block, a
tensor-parallel group larger than the node, are explained with the breakdown.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from hardware_models.errors import InfeasibleError, InfersimError
from simulator.build import build_replica
from simulator.cli.main import main
from simulator.metrics import summary_table
from simulator.scenario import Scenario
from simulator.simulation import simulate
from simulator.workload import generate_requests
from tests.conftest import scenario_dict
from tests.test_reliability_properties import check_invariants

ROOT = Path(__file__).resolve().parents[1]
PROMPT, OUTPUT = 8000, 200
CAPACITY = 3.6  # req/s: what llama-3.1-8b on one H100 serves of these requests (measured)
RATE = 34.0  # ~10x capacity


def overload(duration_s: float) -> dict[str, Any]:
    """Llama-3.1-8B on one H100 offered ~10x what it can serve: 8,000-token prompts."""
    return scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-8b"},
        serving={"policy": "chunked_prefill", "max_num_seqs": 256, "max_num_batched_tokens": 2048},
        workload={
            "arrivals": {"kind": "poisson", "rate_per_s": RATE},
            "prompt_tokens": {"kind": "fixed", "tokens": PROMPT},
            "output_tokens": {"kind": "fixed", "tokens": OUTPUT},
            "num_requests": None,
            "duration_s": duration_s,
        },
    )


# A fresh interpreter per horizon: its peak memory is the run's alone. tracemalloc counts
# every Python and numpy allocation; gc-tracked objects left over show per-request objects.
MEASURE = textwrap.dedent(
    """
    import gc, json, resource, sys, time, tracemalloc
    from simulator.scenario import Scenario
    from simulator.simulation import simulate
    scenario = Scenario.from_dict(json.loads(sys.argv[1]))
    gc.collect()
    objects = len(gc.get_objects())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    started = time.perf_counter()
    results = simulate(scenario, progress=False)
    summary = results.summary()
    wall = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    gc.collect()
    print(json.dumps({
        "wall_s": wall,
        "peak_bytes": peak,
        "rss_growth_bytes": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) * 1024,
        "objects": len(gc.get_objects()) - objects,
        "steps": len(results.steps),
        "summary": summary,
    }))
    """
)


def measure(duration_s: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(overload(duration_s))],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.mark.slow  # 40 s: two subprocess runs under tracemalloc
def test_ten_times_capacity_for_an_hour_keeps_memory_linear_and_loses_nothing():
    short, long = measure(900.0), measure(3600.0)
    for run in (short, long):
        summary = run["summary"]
        counts = summary["counts"]
        # overloaded, with its reason, and nothing lost: the backlog is in flight, queued
        assert summary["overloaded"] is True
        assert "waiting queue grew" in summary["overload_reason"]
        assert "of the offered load" in summary["overload_reason"]
        assert summary["load"]["unserved_share"] > 0.85
        assert counts["completed"] + counts["in_flight"] == counts["arrived"]
        assert counts["rejected"] == counts["failed"] == 0
        assert counts["in_flight_queued"] > 0.8 * counts["arrived"]
        assert summary["throughput"]["requests_per_s"] < 1.1 * CAPACITY
    for name, run in (("1/4 hour", short), ("1 hour", long)):
        c, load = run["summary"]["counts"], run["summary"]["load"]
        print(
            f"\n{name}: offered {c['arrived'] * (PROMPT + OUTPUT):.3g} tokens "
            f"({load['offered_requests_per_s']:.1f} req/s, "
            f"{load['unserved_share']:.0%} unserved); arrived {c['arrived']:,} = completed "
            f"{c['completed']:,} + in flight {c['in_flight']:,} ({c['in_flight_queued']:,} "
            f"queued); {run['steps']:,} steps; peak {run['peak_bytes'] / 1e6:.1f} MB traced, "
            f"RSS +{run['rss_growth_bytes'] / 1e6:.0f} MB, {run['objects']} new gc objects; "
            f"{run['wall_s']:.1f} s wall (under tracemalloc)"
        )
    arrived = long["summary"]["counts"]["arrived"]
    assert arrived * (PROMPT + OUTPUT) > 1e9  # a billion tokens of offered load
    # (its wall time is printed, not asserted: speed is the benchmarks' business)
    # Memory grows with what is stored as rows (requests, steps), at a bounded cost per row,
    # and the 4x longer run costs ~4x, not more: no per-request or per-step Python objects.
    rows = {id(r): r["summary"]["counts"]["arrived"] + r["steps"] for r in (short, long)}
    per_row = long["peak_bytes"] / rows[id(long)]
    print(f"{per_row:.0f} B per stored row (request or step)")
    assert per_row < 600, f"{per_row:.0f} B per stored row"
    growth = long["peak_bytes"] / short["peak_bytes"]
    expected = rows[id(long)] / rows[id(short)]
    assert 0.7 * expected < growth < 1.3 * expected, (growth, expected)
    assert long["objects"] < 5000 and abs(long["objects"] - short["objects"]) < 500
    assert long["rss_growth_bytes"] < 400e6


def test_overloaded_run_accounts_for_every_generated_request():
    scenario = Scenario.from_dict(overload(300.0))
    results = simulate(scenario)
    check_invariants(results, scenario)
    req = results.requests
    assert len(req) == len(generate_requests(scenario.workload, scenario.seed))
    queued = (req["outcome"] == "in_flight") & req["first_scheduled"].isna()
    assert queued.sum() == results.summary()["counts"]["in_flight_queued"] > 5000
    assert (req.loc[queued, "generated"] == 0).all()


def test_a_full_waiting_queue_is_overload_with_rejections_counted():
    data = overload(120.0)
    data["serving"]["max_waiting"] = 50
    results = simulate(Scenario.from_dict(data))
    summary = results.summary()
    counts = summary["counts"]
    assert summary["overloaded"] is True and "waiting queue full" in summary["overload_reason"]
    assert counts["rejected_by_reason"]["queue_full"] == counts["rejected"] > 1000
    assert counts["completed"] + counts["rejected"] + counts["in_flight"] == counts["arrived"]
    assert counts["in_flight_queued"] <= 50


def test_a_served_load_is_not_overloaded():
    data = overload(900.0)
    data["workload"]["arrivals"]["rate_per_s"] = CAPACITY / 3
    summary = simulate(Scenario.from_dict(data)).summary()
    assert summary["overloaded"] is False and summary["overload_reason"] == ""


# ---- run-to-completion batches cut by the horizon --------------------------------------------
@pytest.mark.parametrize("policy", ["static", "dynamic", "continuous", "chunked_prefill"])
def test_no_step_is_counted_past_the_horizon(policy):
    data = scenario_dict(
        serving={"policy": policy, "max_num_batched_tokens": 2048, "max_model_len": 2048},
        workload={
            "arrivals": {"kind": "poisson", "rate_per_s": 30.0},
            "num_requests": None,
            "duration_s": 10.0,
        },
    )
    results = simulate(Scenario.from_dict(data))
    steps, horizon = results.steps, results.context.duration_s
    assert (steps["start"] < horizon).all()
    assert ((steps["start"] + steps["duration"]) <= horizon + 1e-9).all()
    assert results.summary()["utilisation"]["gpu_busy_fraction"] <= 1.0


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_a_request_done_before_the_horizon_is_completed_in_a_cut_batch(tmp_path, policy):
    trace = tmp_path / "t.csv"  # both arrive at once: one wants 1 token, the other 2000
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,1\n0,10,2000\n")
    data = scenario_dict(
        serving={"policy": policy, "max_num_seqs": 2},
        workload={
            "arrivals": {"kind": "trace", "path": str(trace)},
            "prompt_tokens": None,
            "output_tokens": None,
            "num_requests": None,
            "duration_s": 2.0,
        },
    )
    req = simulate(Scenario.from_dict(data)).requests
    assert req["outcome"].tolist() == ["completed", "in_flight"]
    assert req.loc[1, "generated"] > 1  # tokens decoded before the horizon are counted


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_a_batch_cut_in_its_prefill_has_produced_nothing(tmp_path, policy):
    trace = tmp_path / "t.csv"  # the second batch's 3000-token prefill outlasts the horizon
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,2\n0.49,3000,2\n")
    data = scenario_dict(
        serving={"policy": policy, "max_num_seqs": 1},
        workload={
            "arrivals": {"kind": "trace", "path": str(trace)},
            "prompt_tokens": None,
            "output_tokens": None,
            "num_requests": None,
            "duration_s": 0.5,
        },
    )
    req = simulate(Scenario.from_dict(data)).requests
    assert req["outcome"].tolist() == ["completed", "in_flight"]
    assert pd.isna(req.loc[1, "first_token"]) and req.loc[1, "generated"] == 0


# ---- infeasible configurations, explained ------------------------------------------------------
def _one_line_error(tmp_path: Path, capsys, data: dict[str, Any]) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    rc = main(["run", str(path), "-o", str(tmp_path / "out"), "--quiet", "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("infersim: error: "), (rc, err)
    assert err.count("\n") == 1, f"not one line: {err!r}"
    assert str(path) in err
    return err


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "hint"),
    [
        ("llama-2-70b", "a100-80gb-sxm", 1, "cheapest layout that fits is parallelism.tp=2 "),
        ("llama-3.1-405b", "l4", 1, "parallelism.tp=1 with parallelism.pp=43 (43 GPUs"),
        ("llama-3.1-405b", "h100-sxm", 4, "parallelism.tp=8 with parallelism.pp=2 (16 GPUs"),
        ("mixtral-8x7b", "rtx-4090", 1, "parallelism.tp=1 with parallelism.pp=5"),
    ],
)
def test_a_model_that_does_not_fit_gives_the_memory_breakdown(tmp_path, capsys, model, gpu, tp,
                                                              hint):  # fmt: skip
    data = scenario_dict(model={"name": model}, hardware={"gpu": gpu}, parallelism={"tp": tp})
    with pytest.raises(InfeasibleError) as exc:
        build_replica(Scenario.from_dict(data))
    message = str(exc.value)
    for part in (model, gpu, f"tp={tp}", "does not fit", "weights", "GB + activations",
                 "overhead", "> usable", hint):  # fmt: skip
        assert part in message, (part, message)
    err = _one_line_error(tmp_path, capsys, data)
    assert "does not fit" in err and "weights" in err


def test_a_kv_cache_smaller_than_one_request_rejects_it_with_the_reason():
    data = scenario_dict(
        serving={"num_gpu_blocks": 4, "block_size": 16},  # 64 tokens of KV in all
        workload={
            "prompt_tokens": {"kind": "uniform", "low": 8, "high": 120},
            "output_tokens": {"kind": "fixed", "tokens": 8},
            "num_requests": 100,
        },
    )
    scenario = Scenario.from_dict(data)
    results = simulate(scenario)
    check_invariants(results, scenario)
    req = results.requests
    too_long = req["prompt"] + req["output"] - 1 > 64
    assert too_long.any() and (~too_long).any()
    assert (req.loc[too_long, "outcome"] == "rejected").all()
    assert (
        req.loc[too_long, "reason"] == "prompt + output exceed the replica's whole KV cache"
    ).all()
    assert (req.loc[~too_long, "outcome"] == "completed").all()
    counts = results.summary()["counts"]
    assert counts["rejected_by_reason"] == {"exceeds_kv_cache": int(too_long.sum())}


def test_a_kv_cache_of_one_block_still_serves_what_fits():
    # 16.35% of an A100-80GB leaves room for exactly one 256-token block (341 tokens) after
    # the weights; vLLM starts only with a max_model_len one block holds
    data = scenario_dict(
        serving={"gpu_memory_utilization": 0.1635, "block_size": 256, "max_model_len": 256},
        workload={"num_requests": 60},
    )
    scenario = Scenario.from_dict(data)
    assert build_replica(scenario).config.total_blocks == 1
    results = simulate(scenario)
    check_invariants(results, scenario)
    outcome = results.requests["outcome"].astype(str)
    assert set(outcome) == {"completed", "rejected"}


NO_BLOCK = scenario_dict(serving={"gpu_memory_utilization": 0.1625, "block_size": 256})


def test_a_kv_cache_smaller_than_one_block_is_infeasible_with_the_breakdown():
    # the logits of the profile run are max_num_seqs (64) wide, not 256
    with pytest.raises(InfeasibleError) as exc:
        build_replica(Scenario.from_dict(NO_BLOCK))
    message = str(exc.value)
    for part in ("smaller than one block of 256 tokens", "weights", "activations",
                 "framework overhead", "KV capacity", "179 tokens"):  # fmt: skip
        assert part in message


def test_a_kv_cache_smaller_than_one_block_is_one_line_in_the_cli(tmp_path, capsys):
    err = _one_line_error(tmp_path, capsys, NO_BLOCK)
    assert "smaller than one block" in err and "KV capacity" in err


@pytest.mark.parametrize(
    ("gpu", "parallelism", "needles"),
    [
        ("l4", {"tp": 2}, ["parallelism.tp=2", "l4-single node has 1", "no inter-node link"]),
        ("h100-pcie", {"tp": 8}, ["h100-pcie-single node has 1", "no inter-node link"]),
        ("h100-sxm", {"tp": 12}, ["spans nodes of 8 GPUs unevenly", "multiple of 8"]),
        ("a100-80gb-sxm", {"tp": 8, "replicas": 3, "nodes": 2},
         ["3 replicas x tp=8 x pp=1 need 24 GPUs", "2 x dgx-a100 = 16"]),
        ("h100-sxm", {"pp": 33}, ["pp=33 exceeds", "32 layers"]),
    ],
)  # fmt: skip
def test_a_placement_the_topology_cannot_hold_is_explained(tmp_path, capsys, gpu, parallelism,
                                                          needles):  # fmt: skip
    data = scenario_dict(hardware={"gpu": gpu}, model={"name": "llama-3.1-8b"},
                         parallelism=parallelism)  # fmt: skip
    with pytest.raises(InfeasibleError) as exc:
        build_replica(Scenario.from_dict(data))
    for needle in needles:
        assert needle in str(exc.value)
    err = _one_line_error(tmp_path, capsys, data)
    assert needles[0] in err


def test_tp_across_nodes_with_an_inter_node_link_runs():
    data = scenario_dict(hardware={"gpu": "h100-sxm"}, model={"name": "llama-3.1-405b"},
                         parallelism={"tp": 16}, workload={"num_requests": 20})  # fmt: skip
    scenario = Scenario.from_dict(data)
    results = simulate(scenario)
    check_invariants(results, scenario)
    assert (results.requests["outcome"] == "completed").all()
    assert results.context.replicas[0].gpus == 16


def test_the_summary_table_renders_figures_that_are_missing():
    """summary.json holds None for what is undefined or non-finite (a run whose clock ran
    to infinity); the terminal table shows '-' instead of failing."""
    summary = simulate(Scenario.from_dict(scenario_dict(workload={"num_requests": 5}))).summary()
    summary["run"] = {**summary["run"], "duration_s": None}
    assert "- s simulated" in summary_table(summary)


def test_infeasible_errors_are_infersim_errors():
    assert issubclass(InfeasibleError, InfersimError)
