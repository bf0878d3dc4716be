"""The overload verdict is a growing backlog (waiting queue, or requests in the system),
whatever the run's length.

Four workloads unlike each other (a compute-bound one of long prompts, the 70B chat
traffic of the capacity-plan scenario on tp=4, a small model's mixed requests, and the
quickstart's 8B chat traffic, whose running batch absorbs the first excess), each at a
fraction of its capacity: the steady-state throughput of a burst of requests far beyond
it. No overload ever reads stable. Stable loads (50-90%) are never flagged at 200 to
5,000 requests; loads of 105-150% are flagged from the run length at which their
queue's drift beats its noise (simulator.metrics.overload: about (2.3 x cv / g)^2
arrivals for an unserved share g and inter-arrival cv: Poisson, and gamma arrivals of
cv 2 and 4).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest

from simulator.metrics.overload import (
    OVERLOADED,
    STABLE,
    TOO_SHORT,
    WARMUP_SHARE,
    _median,
    in_system_trend,
    in_system_verdict,
    queue_trend,
    ramp_end,
    trend_p_value,
    verdict,
)
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict


def _chat_lengths(prompt_max: int, output_max: int) -> dict[str, Any]:
    """Chat traffic's lognormal prompt (mean 1,000) and output (mean 250) lengths, clipped
    at the scenario's own maxima."""
    return {
        "prompt_tokens": {"kind": "lognormal", "mean": 1000, "std": 800, "min": 16,
                          "max": prompt_max},
        "output_tokens": {"kind": "lognormal", "mean": 250, "std": 200, "min": 4,
                          "max": output_max},
    }  # fmt: skip


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
        workload=_chat_lengths(prompt_max=6000, output_max=1500),
    ),
    "small-mixed": scenario_dict(),
    # scenarios/quickstart.yaml's: KV to spare, so max_num_seqs (256) takes the first
    # backlog into the running batch (TPOT rises) before the waiting queue grows
    "8b-chat": scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-8b"},
        serving={"policy": "chunked_prefill", "max_num_seqs": 256, "max_num_batched_tokens": 2048},
        workload=_chat_lengths(prompt_max=8000, output_max=2000),
    ),
}


def _at(name: str, rate: float, n: int, seed: int, cv: float = 1.0) -> dict[str, Any]:
    """A run at `rate`: Poisson arrivals for cv 1, else gamma ones of that cv (bursts)."""
    data = WORKLOADS[name]
    workload = {**data["workload"], "num_requests": n}
    workload["arrivals"] = (
        {"kind": "poisson", "rate_per_s": rate}
        if cv == 1.0
        else {"kind": "gamma", "rate_per_s": rate, "cv": cv}
    )
    return simulate(Scenario.from_dict({**data, "workload": workload, "seed": seed})).summary()


@cache
def capacity(name: str) -> float:
    """Completions per second in steady state under a burst far beyond capacity."""
    return _at(name, 1000.0, 2000, 0)["throughput"]["steady_requests_per_s"]


def verdicts(
    name: str, load: float, n: int, seeds: range, cv: float = 1.0
) -> list[tuple[bool, str]]:
    out = []
    for seed in seeds:
        summary = _at(name, load * capacity(name), n, seed, cv)
        out.append((summary["overloaded"], summary["overload_reason"]))
        # an overload never passes for stable, however short the run
        assert load <= 1.0 or summary["overload_verdict"] != STABLE, (name, load, n, seed, cv)
    return out


def _check(name: str, loads: tuple[float, ...], lengths: tuple[int, ...], seeds: range,
           expected: bool, cv: float = 1.0) -> None:  # fmt: skip
    wrong = [
        f"{load:.0%} of capacity, {n} requests, cv {cv}, seed {seed}: {reason or 'not overloaded'}"
        for load in loads
        for n in lengths
        for seed, (flagged, reason) in zip(seeds, verdicts(name, load, n, seeds, cv), strict=True)
        if flagged is not expected
    ]
    assert not wrong, "\n".join(wrong)


# ---- a representative subset, in the default run ---------------------------------------------
def test_a_stable_system_is_not_overloaded_at_any_run_length():
    _check("small-mixed", (0.5, 0.9), (200, 1000, 5000), range(2), expected=False)
    _check("long-prompts", (0.9,), (200, 1000), range(3), expected=False)  # seed 2 at 200: a swing


def test_an_overloaded_system_is_flagged():
    _check("small-mixed", (1.5,), (200, 1000), range(2), expected=True)
    _check("long-prompts", (1.2,), (1000,), range(2), expected=True)


def test_the_capacity_plan_traffic_on_one_replica_is_judged_right():
    _check("70b-chat", (0.8,), (300, 1000), range(2), expected=False)
    _check("70b-chat", (1.5,), (1000,), range(2), expected=True)


def test_bursty_arrivals_do_not_make_a_short_stable_run_overloaded():
    """Gamma arrivals: a burst late in 200 requests lifts the last blocks' queue together,
    a rise Mann-Kendall alone reads as a trend (seed 1 was flagged at cv 2 and 4)."""
    _check("small-mixed", (0.7, 0.9), (200,), range(2), expected=False, cv=4.0)
    _check("small-mixed", (0.9,), (200,), range(2), expected=False, cv=2.0)
    summary = _at("small-mixed", 0.9 * capacity("small-mixed"), 200, 1, cv=4.0)
    assert summary["overload_verdict"] == TOO_SHORT
    assert summary["load"]["detectable_unserved_share"] > 0.3  # cv 4 over 180 arrivals
    assert "too short to judge" in summary["overload_note"]
    assert summary["overload_reason"] == ""  # the reason explains `overloaded` alone


def test_a_backlog_the_running_batch_absorbs_is_never_called_stable():
    """8B chat traffic at 120% of capacity: the running batch (max_num_seqs 256) takes the
    excess first, so the waiting queue stays flat while TPOT and the requests in the system
    grow. Runs of 300 and 600 requests read `stable` when only the waiting queue was
    tested; they end within the count's ramp, so they are too short to judge, and 1,000
    requests are overloaded."""
    rate = 1.2 * capacity("8b-chat")
    for n in (300, 600):
        summary = _at("8b-chat", rate, n, 1)
        assert summary["overload_verdict"] == TOO_SHORT, n
        assert summary["load"]["in_system"]["verdict"] == TOO_SHORT
        assert not summary["load"]["in_system"]["ramp_over"]
        assert "requests in the system (waiting and running) rose" in summary["overload_note"]
    assert _at("8b-chat", rate, 1000, 1)["overload_verdict"] == OVERLOADED
    assert _at("8b-chat", 0.8 * capacity("8b-chat"), 1000, 1)["overload_verdict"] == STABLE


def test_a_bursty_overload_is_flagged_once_detectable():
    _check("small-mixed", (1.5,), (1000,), range(2), expected=True, cv=2.0)


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


@pytest.mark.slow
@pytest.mark.parametrize("cv", [2.0, 4.0])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_bursty_stable_loads_are_never_overloaded(name, cv):
    _check(name, (0.5, 0.7, 0.9), (200, 1000, 5000), range(3), expected=False, cv=cv)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_bursty_overloads_are_flagged_where_detectable(name):
    """Detectable from n = (2.3 x cv / g)^2 arrivals: g = 1/3 (150%) at cv 4 from ~800."""
    _check(name, (1.2, 1.5), (5000,), range(3), expected=True, cv=2.0)
    _check(name, (1.5,), (1000,), range(3), expected=True, cv=2.0)
    _check(name, (1.5,), (5000,), range(3), expected=True, cv=4.0)


# ---- the trend test itself ---------------------------------------------------------------------
def test_trend_p_value_is_exact():
    assert trend_p_value(np.arange(10.0)) == pytest.approx(1 / 3_628_800)  # one order in 10!
    assert trend_p_value(np.arange(10.0)[::-1]) == 1.0
    assert trend_p_value(np.array([0.0, 1.0, 2.0])) == pytest.approx(1 / 6)
    assert trend_p_value(np.array([1.0, 0.0, 2.0])) == pytest.approx(3 / 6)  # S = 1: 3 of 6
    rng = np.random.default_rng(0)
    p = np.array([trend_p_value(rng.normal(size=10)) for _ in range(4000)])
    assert np.mean(p < 0.01) == pytest.approx(0.01, abs=0.005)  # calibrated under no trend


def test_the_slopes_median_is_numpys_to_the_bit():
    """The Theil-Sen median is computed without np.median (whose NaN check imports
    numpy.ma); it gives np.median's very float, odd and even counts, ties and NaN."""
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 4, 44, 45, 1000):
        for _ in range(200):
            values = rng.normal(size=n) * 10 ** rng.uniform(-6, 6)
            values = np.round(values) if rng.random() < 0.2 else values  # ties, zeros
            assert np.float64(_median(values)).tobytes() == np.median(values).tobytes()
    assert np.isnan(_median(np.array([1.0, np.nan, 2.0])))


def test_blocks_arriving_at_one_instant_do_not_break_the_slope():
    """A burst: half the requests arrive at one instant, so blocks share a mean time."""
    arrival = np.concatenate([np.zeros(100), np.linspace(1.0, 10.0, 100)])
    trend = queue_trend(arrival, arrival + 0.01)
    assert trend is not None and np.isfinite(trend["queue_growth_per_s"])
    assert verdict(trend) != OVERLOADED


def test_a_rise_within_the_bursts_noise_is_too_short_to_judge():
    """The same significant rise: overload under Poisson arrivals, too short under cv 4."""
    trend = {"window_s": 100.0, "offered_requests_per_s": 2.0, "waiting_first": 2.0,
             "waiting_last": 40.0, "queue_growth_per_s": 0.4, "unserved_share": 0.2,
             "trend_p_value": 1e-4, "arrival_cv": 1.0,
             "detectable_unserved_share": 2.3 / np.sqrt(200)}  # fmt: skip
    assert verdict(trend) == "overloaded"
    bursty = {**trend, "arrival_cv": 4.0, "detectable_unserved_share": 2.3 * 4 / np.sqrt(200)}
    assert verdict(bursty) == TOO_SHORT


def test_the_requests_in_the_system_tell_a_batch_that_keeps_growing():
    """No request waits (each is scheduled on arrival), but each stays longer than the one
    before, as TPOT rises with the batch: the requests in the system grow by a quarter of
    the arrivals. The waiting queue sees nothing; the in-system count is overload."""
    rng = np.random.default_rng(0)
    arrival = np.cumsum(rng.exponential(0.1, 5000))  # 10 req/s for ~500 s
    finish = arrival + rng.exponential(5.0, 5000) + 0.25 * arrival
    assert verdict(queue_trend(arrival, arrival)) == STABLE
    trend = in_system_trend(arrival, finish)
    assert trend is not None and trend["ramp_over"]
    assert trend["unserved_share"] == pytest.approx(0.2, abs=0.03)  # 0.25 / (1 + 0.25)
    assert in_system_verdict(trend) == OVERLOADED
    steady = in_system_trend(arrival, arrival + rng.exponential(5.0, 5000))
    assert steady is not None and in_system_verdict(steady) == STABLE
    # the same growth in a run that ends within its ramp is too short, not overload
    short = in_system_trend(arrival[:300], finish[:300])
    assert short is not None and not short["ramp_over"]
    assert in_system_verdict(short) == TOO_SHORT


def test_the_in_system_block_describes_the_window_its_trend_covers():
    """`from_s`, `arrivals` and `window_s` are those of the arrivals the trend was taken
    over: after the ramp once it is over, after the warm-up (ramp included) before; the
    ramp's end is `ramp_end_s` either way. A run ending within its ramp read `arrivals: 0`
    and `from_s` the ramp's end while its figures covered the window from the warm-up."""
    rng = np.random.default_rng(1)
    arrival = np.cumsum(rng.exponential(0.1, 5000))
    finish = arrival + rng.exponential(5.0, 5000)
    for n, over in ((300, False), (5000, True)):
        times, trend = arrival[:n], in_system_trend(arrival[:n], finish[:n])
        assert trend is not None and trend["ramp_over"] is over
        window = times[times >= trend["from_s"]]
        assert trend["arrivals"] == len(window) > 0
        assert trend["from_s"] + trend["window_s"] == pytest.approx(times[-1])
        if over:
            assert len(window) == np.count_nonzero(times >= trend["ramp_end_s"])
        else:
            assert trend["from_s"] < trend["ramp_end_s"]
            assert trend["arrivals"] == n - int(n * WARMUP_SHARE)


def test_the_ramp_ends_when_the_first_arrivals_have_spent_95_percent_of_their_time():
    """One long request among the first arrivals does not set the ramp; the bulk does."""
    arrival = np.arange(1000) * 0.1  # the first 100 arrive by 9.9 s
    stay = np.ones(1000)
    assert ramp_end(arrival, arrival + stay) == pytest.approx(9.9 + 1.0)
    stay[0] = 3.0  # 102 s of stay, 2 s past 1 s: within 5%
    assert ramp_end(arrival, arrival + stay) == pytest.approx(9.9 + 1.0)
    stay[0] = 50.0  # 149 s, 49 past 1 s: the long one is the ramp
    assert ramp_end(arrival, arrival + stay) == pytest.approx(9.9 + 50.0)


def test_the_notebook_view_shows_the_too_short_note():
    """The HTML view says what the terminal says: a run too short to judge shows its note."""
    from simulator.display import summary_html

    summary = simulate(Scenario.from_dict(scenario_dict(workload={"num_requests": 60})),
                       progress=False).summary()  # fmt: skip
    summary["overload_note"] = "too short to judge overload: the queue rose"
    assert "<b>Note:</b> too short to judge overload" in summary_html(summary)


@pytest.mark.slow
def test_the_8b_chat_verdicts_by_load_and_length():
    """docs/METRICS.md's table (seeds 0-2): a batch that absorbs the excess makes 120%
    detectable from 1,000 requests, not 200, and no overload ever reads stable."""
    expected = {
        (0.5, 200): {STABLE: 1, TOO_SHORT: 2},
        (0.7, 200): {STABLE: 1, TOO_SHORT: 2},
        (0.9, 200): {TOO_SHORT: 3},
        (1.05, 200): {TOO_SHORT: 3},
        (1.05, 1000): {TOO_SHORT: 3},
        (1.2, 200): {TOO_SHORT: 3},
        (1.5, 200): {TOO_SHORT: 3},
    }
    for load in (0.5, 0.7, 0.9, 1.05, 1.2, 1.5):
        for n in (200, 1000, 5000):
            got: dict[str, int] = {}
            for seed in range(3):
                judged = _at("8b-chat", load * capacity("8b-chat"), n, seed)["overload_verdict"]
                got[judged] = got.get(judged, 0) + 1
            default = {STABLE: 3} if load < 1 else {OVERLOADED: 3}
            assert got == expected.get((load, n), default), (load, n, got)
