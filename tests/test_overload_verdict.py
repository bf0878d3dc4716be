"""The overload verdict is a growing waiting queue, whatever the run's length.

Three workloads unlike each other (a compute-bound one of long prompts, the 70B chat
traffic of the capacity-plan scenario on tp=4, a small model's mixed requests), each at a
fraction of its capacity: the steady-state throughput of a burst of requests far beyond
it. Stable loads (50-90%) are never flagged at 200 to 5,000 requests; loads of 105-150%
are flagged from the run length at which their queue's drift beats its noise
(simulator.metrics.overload: about (2.3 / g)^2 arrivals for an unserved share g).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

from simulator.metrics.overload import is_growing, queue_trend, trend_p_value
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict

WORKLOADS: dict[str, dict[str, Any]] = {
    "long-prompts": scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-8b"},
        serving={"policy": "chunked_prefill", "max_num_seqs": 256, "max_num_batched_tokens": 2048},
        workload={
            "prompt_tokens": {"kind": "fixed", "tokens": 8000},
            "output_tokens": {"kind": "fixed", "tokens": 200},
        },
    ),
    "70b-chat": scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-70b", "weight_dtype": "bf16"},
        parallelism={"tp": 4},
        serving={"policy": "chunked_prefill", "max_num_seqs": 256, "max_num_batched_tokens": 2048},
        workload={
            "prompt_tokens": {
                "kind": "lognormal",
                "mean": 1000,
                "std": 800,
                "min": 16,
                "max": 6000,
            },
            "output_tokens": {"kind": "lognormal", "mean": 250, "std": 200, "min": 4, "max": 1500},
        },
    ),
    "small-mixed": scenario_dict(),
}


def _at(name: str, rate: float, n: int, seed: int) -> dict[str, Any]:
    data = WORKLOADS[name]
    workload = {**data["workload"], "num_requests": n}
    workload["arrivals"] = {"kind": "poisson", "rate_per_s": rate}
    return simulate(Scenario.from_dict({**data, "workload": workload, "seed": seed})).summary()


@cache
def capacity(name: str) -> float:
    """Completions per second in steady state under a burst far beyond capacity."""
    return _at(name, 1000.0, 2000, 0)["throughput"]["steady_requests_per_s"]


def verdicts(name: str, load: float, n: int, seeds: range) -> list[tuple[bool, str]]:
    out = []
    for seed in seeds:
        summary = _at(name, load * capacity(name), n, seed)
        out.append((summary["overloaded"], summary["overload_reason"]))
    return out


def _check(name: str, loads: tuple[float, ...], lengths: tuple[int, ...], seeds: range,
           expected: bool) -> None:  # fmt: skip
    wrong = [
        f"{load:.0%} of capacity, {n} requests, seed {seed}: {reason or 'not overloaded'}"
        for load in loads
        for n in lengths
        for seed, (flagged, reason) in zip(seeds, verdicts(name, load, n, seeds), strict=True)
        if flagged is not expected
    ]
    assert not wrong, "\n".join(wrong)


# ---- a representative subset, in the default run ---------------------------------------------
def test_a_stable_system_is_not_overloaded_at_any_run_length():
    _check("small-mixed", (0.5, 0.9), (200, 1000, 5000), range(2), expected=False)
    _check("long-prompts", (0.9,), (200, 1000), range(2), expected=False)


def test_an_overloaded_system_is_flagged():
    _check("small-mixed", (1.5,), (200, 1000), range(2), expected=True)
    _check("long-prompts", (1.2,), (1000,), range(2), expected=True)


def test_the_capacity_plan_traffic_on_one_replica_is_judged_right():
    _check("70b-chat", (0.8,), (300, 1000), range(2), expected=False)
    _check("70b-chat", (1.5,), (1000,), range(2), expected=True)


# ---- the whole matrix --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_stable_loads_are_never_overloaded(name):
    _check(name, (0.5, 0.7, 0.8, 0.9), (200, 1000, 5000), range(3), expected=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_overloads_are_flagged_once_the_queue_outgrows_its_noise(name):
    _check(name, (1.05, 1.1, 1.2, 1.5), (5000,), range(3), expected=True)
    _check(name, (1.2, 1.5), (1000,), range(3), expected=True)


# ---- the trend test itself ---------------------------------------------------------------------
def test_trend_p_value_is_exact():
    assert trend_p_value(np.arange(10.0)) == pytest.approx(1 / 3_628_800)  # one order in 10!
    assert trend_p_value(np.arange(10.0)[::-1]) == 1.0
    assert trend_p_value(np.array([0.0, 1.0, 2.0])) == pytest.approx(1 / 6)
    assert trend_p_value(np.array([1.0, 0.0, 2.0])) == pytest.approx(3 / 6)  # S = 1: 3 of 6
    rng = np.random.default_rng(0)
    p = np.array([trend_p_value(rng.normal(size=10)) for _ in range(4000)])
    assert np.mean(p < 0.01) == pytest.approx(0.01, abs=0.005)  # calibrated under no trend


def test_blocks_arriving_at_one_instant_do_not_break_the_slope():
    """A burst: half the requests arrive at one instant, so blocks share a mean time."""
    arrival = np.concatenate([np.zeros(100), np.linspace(1.0, 10.0, 100)])
    trend = queue_trend(arrival, arrival + 0.01)
    assert trend is not None and np.isfinite(trend["queue_growth_per_s"])
    assert not is_growing(trend)
