import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware_models.errors import InfersimError
from hardware_models.power import PowerModel
from simulator.display import summary_html
from simulator.engine.requests import Outcome, RejectReason, RequestTable
from simulator.engine.step_cost import StepBound
from simulator.formatting import sig
from simulator.metrics import (
    SLO,
    ReplicaInfo,
    RunContext,
    nice_bin_width,
    summarize,
    summary_json,
    summary_table,
    timeseries,
    weighted_percentile,
    write_run,
)
from simulator.metrics.plots import latency_cdfs, save_run_plots
from simulator.metrics.run_tables import request_table
from simulator.metrics.summary import percentile_sorted_by

ROOT = Path(__file__).resolve().parents[1]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Per GPU: 100 W idle, 50 W more while a step runs, 700 W more at the full tensor rate and
# 200 W at full DRAM bandwidth, capped at 700 W.
POWER = PowerModel(idle_w=100.0, busy_w=50.0, tensor_w=700.0, memory_w=200.0, tdp_w=700.0)


def replica(**fields) -> ReplicaInfo:
    base = {
        "gpu": "H100",
        "gpus": 2,
        "peak_flops": 1e15,
        "peak_bandwidth": 1e12,
        "kv_total_blocks": 100,
        "power": POWER,
        "usd_per_gpu_hour": 2.0,
    }
    return ReplicaInfo(**(base | fields))


def context(duration: float = 10.0, replicas: int = 1, **fields) -> RunContext:
    base = {
        "scenario": "test",
        "seed": 0,
        "duration_s": duration,
        "replicas": tuple(replica() for _ in range(replicas)),
    }
    return RunContext(**(base | fields))


def requests(n: int, names: tuple[str, ...] = ("default",), **columns) -> pd.DataFrame:
    """A per-request frame as the engine builds it; unset columns keep engine defaults."""
    table = RequestTable(n)
    zeros = np.zeros(n, dtype=np.int64)
    table.add(
        np.asarray(columns.pop("arrival", np.zeros(n)), dtype=np.float64),
        np.asarray(columns.pop("prompt", zeros + 100)),
        np.asarray(columns.pop("output", zeros + 10)),
        np.asarray(columns.pop("priority", zeros)),
    )
    for name, values in columns.items():
        getattr(table, name)[:n] = values
    return request_table(table, names).to_pandas()


def completed(arrival, first_token, finish, generated, **columns) -> pd.DataFrame:
    n = len(arrival)
    return requests(
        n,
        arrival=arrival,
        first_scheduled=arrival,
        first_token=first_token,
        last_token=finish,
        finish=finish,
        generated=generated,
        replica=np.zeros(n),
        outcome=Outcome.COMPLETED,
        **columns,
    )


def steps(**columns) -> pd.DataFrame:
    n = len(columns["start"])
    base = {
        "start": np.zeros(n),
        "duration": np.zeros(n),
        "batch_size": np.ones(n, np.int32),
        "decode_tokens": np.zeros(n, np.int32),
        "prefill_tokens": np.zeros(n, np.int32),
        "kv_blocks_used": np.zeros(n, np.int64),
        "waiting": np.zeros(n, np.int32),
        "flops": np.zeros(n),
        "dram_bytes": np.zeros(n),
        "bound": np.zeros(n, np.int8),
        "replica": np.zeros(n, np.int32),
    }
    return pd.DataFrame({k: np.asarray(columns.get(k, v)) for k, v in base.items()})


NO_STEPS = steps(start=[])
NO_ITL = pd.DataFrame({"seconds": np.zeros(0), "weight": np.zeros(0, np.int32)})


def has_nan(value) -> bool:
    if isinstance(value, dict):
        return any(has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(has_nan(v) for v in value)
    return isinstance(value, float) and not math.isfinite(value)


# ---- weighted percentile -----------------------------------------------------------------


def test_weighted_percentile_matches_numpy_on_expanded_samples():
    rng = np.random.default_rng(1)
    values = rng.lognormal(size=300)
    weights = rng.integers(0, 20, size=300)
    q = np.array([0, 1, 25, 50, 90, 99, 99.9, 100])
    expected = np.percentile(np.repeat(values, weights), q)
    np.testing.assert_allclose(weighted_percentile(values, weights, q), expected, rtol=1e-12)


def test_weighted_percentile_ignores_nan_and_handles_empty():
    assert weighted_percentile([np.nan, 2.0, 4.0], None, 50) == 3.0
    assert np.isnan(weighted_percentile([], None, 50))


@given(
    st.lists(st.floats(0, 1e3), min_size=1, max_size=40),
    st.lists(st.integers(1, 50), min_size=40, max_size=40),
    st.floats(0, 100),
    st.floats(0, 100),
)
def test_weighted_percentile_monotone_and_bounded(values, weights, q1, q2):
    values = np.asarray(values)
    weights = np.asarray(weights[: len(values)])
    lo, hi = sorted((q1, q2))
    a, b = weighted_percentile(values, weights, [lo, hi])
    assert values.min() <= a <= b <= values.max()


def _stable_percentile(values, weights, q):
    """weighted_percentile with a stable sort throughout, as it was: the oracle."""
    return percentile_sorted_by(values, np.asarray(weights, np.float64), q, "stable")


@given(
    st.lists(st.sampled_from([-0.0, 0.0, 0.5, 1.0, 2.5, -1.0]), min_size=1, max_size=60),
    st.lists(st.integers(1, 9), min_size=60, max_size=60),
    st.lists(st.floats(0, 100), min_size=1, max_size=6),
)
def test_weighted_percentile_of_whole_weights_is_the_stable_sorts_to_the_bit(values, weights, q):
    """Whole weights take numpy's unstable sort: the same floats as a stable sort, for
    runs of equal values and zeros of both signs (+0.0 and -0.0 compare equal)."""
    values = np.asarray(values)
    weights = np.asarray(weights[: len(values)], np.float64)
    for w in (weights, np.ones_like(values)):
        got = weighted_percentile(values, None if w is not weights else w, q)
        want = _stable_percentile(values, w, q)
        assert got.tobytes() == want.tobytes()


def test_weighted_percentile_of_fractional_weights_keeps_the_stable_order():
    values = np.array([1.0, 1.0, 1.0, 2.0])
    weights = np.array([0.1, 0.2, 0.3, 0.4])
    q = np.linspace(0, 100, 11)
    assert weighted_percentile(values, weights, q).tobytes() == (
        _stable_percentile(values, weights, q).tobytes()
    )


# ---- summary ------------------------------------------------------------------------------


def test_counts_and_in_flight_split():
    frame = requests(
        5,
        first_scheduled=[0.0, 0.0, np.nan, 1.0, np.nan],
        first_token=[1.0, np.nan, np.nan, 2.0, np.nan],
        finish=[2.0, 0.0, np.nan, np.nan, np.nan],
        generated=[10, 0, 0, 3, 0],
        outcome=[
            Outcome.COMPLETED,
            Outcome.REJECTED,
            Outcome.IN_FLIGHT,
            Outcome.IN_FLIGHT,
            Outcome.FAILED,
        ],
        reason=[0, RejectReason.EXCEEDS_KV_CACHE, 0, 0, RejectReason.REPLICA_FAILED],
    )
    c = summarize(frame, NO_STEPS, NO_ITL, context())["counts"]
    assert c == {
        "arrived": 5,
        "completed": 1,
        "rejected": 1,
        "rejected_by_reason": {"exceeds_kv_cache": 1},
        "failed": 1,
        "failed_by_reason": {"replica_failed": 1},
        "retried": 0,
        "retries": 0,
        "in_flight": 2,
        "in_flight_queued": 1,
        "in_flight_running": 1,
    }


def test_throughput_over_duration():
    frame = completed([0, 1, 2], [0.5, 1.5, 2.5], [3, 4, 5], [10, 20, 30], prompt=[100, 100, 100])
    queued = requests(1, arrival=[3.0], prompt=[50])
    s = summarize(pd.concat([frame, queued]), NO_STEPS, NO_ITL, context(duration=10.0))
    assert s["throughput"] == pytest.approx(
        {"requests_per_s": 0.3, "input_tokens_per_s": 30.0, "output_tokens_per_s": 6.0,
         "steady_window_s": None, "steady_requests_per_s": None,
         "steady_input_tokens_per_s": None, "steady_output_tokens_per_s": None}
        # too few completions to tell
    )  # fmt: skip


def test_steady_state_throughput_leaves_out_ramp_up_and_drain():
    """100 completions, one a second from t = 10 s (each with 5 output tokens), after a 10 s
    ramp-up and before a 40 s drain: the steady rate is 1/s, the whole run's 100 / 150."""
    n = 100
    finish = 10.0 + np.arange(n)
    frame = completed(finish - 5, finish - 4, finish, np.full(n, 5))
    s = summarize(frame, NO_STEPS, NO_ITL, context(duration=150.0))["throughput"]
    assert s["requests_per_s"] == pytest.approx(n / 150)
    assert s["steady_window_s"] == [20.0, 99.0]  # the 10th and the 90th completion
    # Tokens made in [20, 99] s: the first tokens of the 80 requests whose first token
    # came then (finishing at 24..103 s), and 4 more tokens a second, each request
    # spreading its later 4 over the 4 s before it finishes; the requests that serves are
    # of 5 tokens each, with their 100-token prompts.
    output = (80 + 4 * 79) / 79
    assert s["steady_output_tokens_per_s"] == pytest.approx(output)
    assert s["steady_requests_per_s"] == pytest.approx(output / 5)
    assert s["steady_input_tokens_per_s"] == pytest.approx(output / 5 * 100)


def test_an_offline_batch_counts_its_prompts_and_its_long_requests_in_the_steady_state():
    """An offline batch: every prompt prefilled at t = 0-1 s, before the window; the short
    requests (10 output tokens, half of them) finish early, the long ones (90) late. The
    window's completions are mostly short ones, so counting them overstates the request
    rate; the steady rates follow the tokens made, in the requests' own proportions, and a
    request costs its mean output tokens at the steady price of one."""
    n = 100
    output = np.where(np.arange(n) % 2 == 0, 10, 90)
    first = np.linspace(0.0, 1.0, n)
    frame = completed(np.zeros(n), first, first + output / 10, output, prompt=np.full(n, 200))
    summary = summarize(frame, NO_STEPS, NO_ITL, context(duration=10.0))
    t, cost = summary["throughput"], summary["cost"]
    assert t["steady_input_tokens_per_s"] == pytest.approx(t["steady_requests_per_s"] * 200)
    assert t["steady_requests_per_s"] == pytest.approx(t["steady_output_tokens_per_s"] / 50)
    mean_output = 50
    assert cost["usd_per_request"] == pytest.approx(
        cost["usd_per_million_output_tokens"] * mean_output / 1e6
    )
    assert cost["usd_per_million_total_tokens"] == pytest.approx(
        cost["usd_per_million_output_tokens"] * 50 / 250
    )


def test_latency_blocks_and_weighted_itl():
    frame = completed([0, 0], [0.1, 0.3], [1.1, 2.3], [11, 11])
    itl = pd.DataFrame({"seconds": [0.01, 0.05], "weight": [3, 1]})
    lat = summarize(frame, NO_STEPS, itl, context())["latency"]
    assert lat["ttft"]["mean"] == pytest.approx(0.2)
    assert lat["ttft"]["max"] == pytest.approx(0.3)
    assert lat["tpot"]["p50"] == pytest.approx(0.15)
    assert lat["e2e"]["count"] == 2
    assert lat["itl"]["count"] == 4
    assert lat["itl"]["mean"] == pytest.approx((3 * 0.01 + 0.05) / 4)
    assert lat["itl"]["p50"] == pytest.approx(0.01)
    assert lat["queueing"]["max"] == 0.0


def test_a_long_latency_mean_does_not_depend_on_the_blas_thread_count():
    """Dask workers run with OPENBLAS_NUM_THREADS=1; a mean taken with a threaded BLAS dot
    product differed from a local run's in the last bit (a retried sweep point then no longer
    matched its undisturbed run)."""
    code = (
        "import numpy as np; from simulator.metrics.summary import latency_stats; "
        "rng = np.random.default_rng(1); v = rng.random(400_000) * 0.02; "
        "print(repr(latency_stats(v, rng.integers(1, 5, v.size).astype(float))['mean']))"
    )
    means = {
        threads: subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads},
        ).stdout
        for threads in ("1", "2")
    }
    assert means["1"] == means["2"], means


def test_goodput_counts_requests_meeting_every_bound():
    # ttft 0.2/0.8/0.2/0.3; tpot 0.05/0.05/0.2/undefined (one token).
    frame = completed([0, 0, 0, 0], [0.2, 0.8, 0.2, 0.3], [0.65, 1.25, 2.0, 0.3], [10, 10, 10, 1])
    ctx = context(duration=4.0, slo=SLO(ttft_s=0.5, tpot_s=0.1))
    g = summarize(frame, NO_STEPS, NO_ITL, ctx)["goodput"]
    assert g["requests_meeting_slo"] == 2
    assert g["fraction"] == pytest.approx(0.5)
    assert g["goodput_requests_per_s"] == pytest.approx(0.5)
    assert g["slo"] == {"ttft_s": 0.5, "tpot_s": 0.1, "e2e_s": None}
    no_slo = summarize(frame, NO_STEPS, NO_ITL, context(duration=4.0))["goodput"]
    assert no_slo["requests_meeting_slo"] == 4


def test_steady_goodput_is_on_the_steady_throughputs_basis():
    """The 100 requests above (ramp 10 s, drain 40 s): all meeting the SLO, goodput in
    steady state is the steady request rate, where over the whole run it is n / 150 (the
    review's 12.71 beside 16.15 steady req/s with every request meeting it). Misses
    inside the steady window count; misses in the ramp or the drain do not."""
    n = 100
    finish = 10.0 + np.arange(n)
    e2e = np.full(n, 5.0)
    e2e[[0, 1, 95, 99]] = 9.0  # finish at 10, 11, 105, 109 s: outside [20, 99] s
    e2e[[30, 40]] = 9.0  # finish at 40 and 50 s: inside
    frame = completed(finish - e2e, finish - e2e + 1, finish, np.full(n, 5))
    ctx = context(duration=150.0, slo=SLO(e2e_s=6.0))
    s = summarize(frame, NO_STEPS, NO_ITL, ctx)
    steady = s["throughput"]["steady_requests_per_s"]
    g = s["goodput"]
    assert g["goodput_requests_per_s"] == pytest.approx(94 / 150)  # whole run, as before
    assert g["steady_goodput_requests_per_s"] == pytest.approx(steady * 78 / 80)
    everyone = summarize(frame, NO_STEPS, NO_ITL, context(duration=150.0))
    assert everyone["goodput"]["steady_goodput_requests_per_s"] == pytest.approx(steady)
    few = summarize(frame.iloc[:10], NO_STEPS, NO_ITL, ctx)  # no steady state
    assert few["goodput"]["steady_goodput_requests_per_s"] is None


def test_the_summaries_show_steady_goodput_first_and_say_what_busy_means():
    """Review 13, defects 4 and 14: goodput beside the steady throughput on its basis, and
    `busy` (99.5% at 8 req/s with MFU 13%) explained where it is shown, after MFU/MBU."""
    n = 100
    finish = 10.0 + np.arange(n)
    frame = completed(finish - 5, finish - 4, finish, np.full(n, 5))
    s = summarize(frame, NO_STEPS, NO_ITL, context(duration=150.0, slo=SLO(e2e_s=6.0)))
    steady = sig(s["throughput"]["steady_requests_per_s"])
    text = summary_table(s)
    assert f"goodput     {steady} req/s (0.667 req/s whole run) meet" in text
    utilisation = text[text.index("utilisation") :]
    assert utilisation.index("MFU") < utilisation.index("busy 0.0% (time a step ran")
    html = summary_html(s)
    assert f"<td>{steady} req/s (0.667 req/s whole run) meet" in html
    busy = html.index("<td>busy 0.0% (time a step ran, at any batch size: not saturation)</td>")
    assert html.index(">utilisation<") < busy < html.index(">kv cache<")


def test_mfu_mbu_busy_and_bound_share():
    ctx = context(duration=10.0, replicas=2)
    log = steps(
        start=[0.0, 0.0, 5.0],
        duration=[2.0, 1.0, 2.0],
        flops=[1e15, 0.5e15, 0.5e15],
        dram_bytes=[1e12, 2e12, 0.0],
        bound=[StepBound.COMPUTE, StepBound.MEMORY, StepBound.MEMORY],
        replica=[0, 1, 1],
    )
    u = summarize(requests(0), log, NO_ITL, ctx)["utilisation"]
    assert u["gpu_busy_fraction"] == pytest.approx((0.2 + 0.3) / 2)
    assert u["mfu"] == pytest.approx(2e15 / (2e15 * 10))
    assert u["mbu"] == pytest.approx(3e12 / (2e12 * 10))
    assert u["mfu_busy"] == pytest.approx(2e15 / (1e15 * 2 + 1e15 * 3))
    assert u["mbu_busy"] == pytest.approx(3e12 / (1e12 * 5))
    assert u["bound_share"]["compute"] == pytest.approx(0.4)
    assert u["bound_share"]["memory"] == pytest.approx(0.6)
    assert u["bound_share"]["host"] == 0.0


def test_bound_given_as_names_like_results_frames():
    log = steps(start=[0.0, 1.0], duration=[1.0, 3.0])
    log["bound"] = pd.Categorical.from_codes([0, 3], categories=[b.name.lower() for b in StepBound])
    share = summarize(requests(0), log, NO_ITL, context())["utilisation"]["bound_share"]
    assert share["compute"] == pytest.approx(0.25)
    assert share["host"] == pytest.approx(0.75)


def test_kv_utilisation_is_time_weighted():
    log = steps(start=[0.0, 1.0], duration=[1.0, 3.0], kv_blocks_used=[10, 50])
    frame = requests(3, preemptions=[0, 2, 1])
    kv = summarize(frame, log, NO_ITL, context())["kv"]
    assert kv["mean_utilisation"] == pytest.approx((0.1 * 1 + 0.5 * 3) / 4)
    assert kv["max_utilisation"] == pytest.approx(0.5)
    assert kv["preemptions"] == 3
    assert kv["requests_preempted"] == 2


def test_cost_per_million_tokens_of_a_run_too_short_for_a_steady_state():
    # 2 replicas x 2 GPUs x $2/h = $8/h; half an hour costs $4. Two completions are too few
    # for a steady state: per-request and per-token costs are the whole run's, and say so.
    frame = completed([0, 0], [1, 1], [2, 2], [500_000, 500_000], prompt=[500_000, 500_000])
    cost = summarize(frame, NO_STEPS, NO_ITL, context(duration=1800.0, replicas=2))["cost"]
    note = cost.pop("note")
    assert note.startswith("fewer than 20 completions for a steady state")
    assert cost == pytest.approx(
        {
            "usd_per_hour": 8.0,
            "usd_total": 4.0,
            "basis": "whole_run",
            "usd_per_request": 2.0,
            "usd_per_million_output_tokens": 4.0,
            "usd_per_million_total_tokens": 2.0,
            "run_usd_per_million_output_tokens": 4.0,
        }
    )
    assert "whole run" in summary_table(summarize(frame, NO_STEPS, NO_ITL, context(1800.0)))


def test_cost_per_million_tokens_is_the_steady_states_whatever_the_drain():
    """One completion a second with 5 output tokens and 100 prompt tokens on $4/h: 1M
    output tokens cost $4/3600 x 10^6 / (the tokens a second made in the steady window),
    and a request 5 of them, however long the run goes on after its last arrival; only
    the run's own total (and its per-token figure) grows with the drain."""
    n = 100
    finish = 10.0 + np.arange(n)
    frame = completed(finish - 5, finish - 4, finish, np.full(n, 5))
    costs = [
        summarize(frame, NO_STEPS, NO_ITL, context(duration=d))["cost"] for d in (150.0, 600.0)
    ]
    for cost in costs:
        assert cost["basis"] == "steady_state" and cost["note"] == ""
        assert cost["usd_per_hour"] == pytest.approx(4.0)
        output = (80 + 4 * 79) / 79  # tokens/s in the steady window
        assert cost["usd_per_request"] == pytest.approx(4.0 / 3600 * 5 / output)
        assert cost["usd_per_million_output_tokens"] == pytest.approx(4.0 / 3600 * 1e6 / output)
        assert cost["usd_per_million_total_tokens"] == pytest.approx(
            4.0 / 3600 * 1e6 / (output * 105 / 5)
        )
    short, long = costs
    assert long["usd_total"] == pytest.approx(4 * short["usd_total"])
    assert short["run_usd_per_million_output_tokens"] == pytest.approx(4.0 * 150 / 3600 * 2e3)
    text = summary_table(summarize(frame, NO_STEPS, NO_ITL, context(duration=150.0)))
    assert "(steady state)" in text and "drain included" in text


def test_energy_of_an_idle_run_is_idle_power_times_duration_and_pue_only_at_the_facility():
    ctx = context(duration=3600.0, pue=1.5, usd_per_kwh=0.2)
    e = summarize(requests(0), NO_STEPS, NO_ITL, ctx)["energy"]
    gpu_kwh = 2 * 100.0 * 3600 / 3.6e6
    assert e["gpu_energy_kwh"] == pytest.approx(gpu_kwh)
    assert e["energy_kwh"] == pytest.approx(gpu_kwh * 1.5)  # the facility's
    assert e["average_power_w"] == pytest.approx(100.0)
    assert e["usd_energy"] == pytest.approx(gpu_kwh * 1.5 * 0.2)
    assert e["joules_per_output_token"] is None


def test_host_power_is_it_load_in_the_facility_figures_not_the_gpu_ones():
    """Host CPUs, memory and NICs are IT load beside the GPUs (PUE then covers cooling and
    conversion): cost.host_w_per_gpu adds to energy_kwh, usd_energy and the facility J
    per token, never to the GPU figures ML.ENERGY-style measurements compare with."""
    frame = completed([0, 0], [1, 1], [2, 2], [1000, 1000])
    ctx = context(duration=3600.0, pue=1.5, host_w_per_gpu=50.0)
    e = summarize(frame, NO_STEPS, NO_ITL, ctx)["energy"]
    gpu_kwh, host_kwh = 2 * 100.0 / 1000, 2 * 50.0 / 1000
    assert (e["gpu_energy_kwh"], e["host_energy_kwh"]) == pytest.approx((gpu_kwh, host_kwh))
    assert e["energy_kwh"] == pytest.approx((gpu_kwh + host_kwh) * 1.5)
    assert e["joules_per_output_token"] == pytest.approx(2 * 100 * 3600 / 2000)
    assert e["facility_joules_per_output_token"] == pytest.approx(1.5 * 2 * 150 * 3600 / 2000)


def test_power_is_idle_plus_busy_plus_tensor_and_dram_parts_capped_at_tdp():
    """A step at full DRAM bandwidth and no FLOPs (a batch-1 decode) draws idle + busy +
    the DRAM part, far below TDP (the old activity model put it at TDP); a mixed step pays
    both parts (their sum, not the larger); a step at full tensor rate holds the cap."""
    ctx = context(duration=12.0)
    log = steps(
        start=[0.0, 4.0, 8.0],
        duration=[4.0, 4.0, 4.0],
        flops=[0.0, 1e15, 4e15],  # the replica's peak is 1e15 FLOP/s
        dram_bytes=[4e12, 2e12, 0.0],  # and 1e12 B/s
    )
    e = summarize(completed([0], [1], [11], [1000]), log, NO_ITL, ctx)["energy"]
    memory_bound = 100 + 50 + 200
    mixed = 100 + 50 + 700 * 0.25 + 200 * 0.5
    capped = 700
    assert e["average_power_w"] == pytest.approx((memory_bound + mixed + capped) / 3)
    assert e["power_capped_share"] == pytest.approx(1 / 3)


def test_energy_per_token_and_request_are_the_steady_states_whatever_the_drain():
    """J per token and per request are the steady window's GPU power over its token and
    request rates, as the costs are: an overloaded or truncated run's drain, or the
    requests it leaves unfinished, do not inflate them; the whole run's stay under run_."""
    n = 100
    finish = 10.0 + np.arange(n)
    frame = completed(finish - 5, finish - 4, finish, np.full(n, 5))
    # one 1 s step a second at the replica's full DRAM bandwidth
    log = steps(start=finish - 5, duration=np.ones(n), dram_bytes=np.full(n, 1e12))
    energies = [
        summarize(frame, log, NO_ITL, context(duration=d, pue=1.5))["energy"]
        for d in (150.0, 600.0)
    ]
    output = (80 + 4 * 79) / 79  # tokens/s in the steady window (the cost test's)
    fleet_w = 2 * (100 + 50 + 200)  # both GPUs, busy every second of the window
    for e in energies:
        assert e["basis"] == "steady_state"
        assert e["steady_power_w"] == pytest.approx(fleet_w / 2)
        assert e["joules_per_output_token"] == pytest.approx(fleet_w / output)
        assert e["facility_joules_per_output_token"] == pytest.approx(1.5 * fleet_w / output)
        assert e["joules_per_request"] == pytest.approx(fleet_w / (output / 5))
    short, long = energies
    assert long["run_joules_per_output_token"] > 2 * short["run_joules_per_output_token"]
    assert "steady state" in summary_table(summarize(frame, log, NO_ITL, context(150.0)))


def test_energy_per_token_of_a_run_too_short_for_a_steady_state_is_the_whole_runs():
    frame = completed([0, 0], [1, 1], [2, 2], [1000, 1000])
    e = summarize(frame, NO_STEPS, NO_ITL, context(duration=10.0))["energy"]
    assert e["basis"] == "whole_run" and e["note"].startswith("fewer than 20 completions")
    assert e["joules_per_output_token"] == pytest.approx(2 * 100 * 10 / 2000)
    assert e["joules_per_request"] == pytest.approx(2 * 100 * 10 / 2)
    assert e["steady_power_w"] is None


def overload_frame(service_fraction: float) -> pd.DataFrame:
    """200 arrivals at 2/s; a FIFO server admits one every 0.5 s / `service_fraction`
    (not before it arrives) and finishes it 1 s later; those not admitted by the end of
    the arrivals stay queued."""
    arrival = np.arange(200) * 0.5
    admit = np.maximum(arrival, np.arange(200) * 0.5 / service_fraction)
    served = admit <= arrival[-1]
    finish = np.where(served, admit + 1.0, np.nan)
    return requests(
        200,
        arrival=arrival,
        first_scheduled=np.where(served, admit, np.nan),
        first_token=np.where(served, admit + 0.1, np.nan),
        finish=finish,
        generated=np.where(served, 10, 0),
        outcome=np.where(served, Outcome.COMPLETED, Outcome.IN_FLIGHT),
    )


def test_overload_detected_when_the_waiting_queue_grows():
    s = summarize(overload_frame(0.5), NO_STEPS, NO_ITL, context(duration=100.0))
    assert s["overloaded"]
    assert "50% of the offered load" in s["overload_reason"]
    assert s["load"]["offered_requests_per_s"] == pytest.approx(2.0, rel=0.01)
    assert s["load"]["unserved_share"] == pytest.approx(0.5, rel=0.05)
    assert s["load"]["trend_p_value"] < 1e-6
    assert "OVERLOADED" in summary_table(s)


def test_no_overload_when_keeping_up_even_with_a_drain_tail():
    s = summarize(overload_frame(1.0), NO_STEPS, NO_ITL, context(duration=150.0))
    assert not s["overloaded"]
    assert s["overload_reason"] == ""
    assert "OVERLOADED" not in summary_table(s)


def test_queue_full_rejections_mean_overload():
    frame = requests(
        10,
        arrival=np.arange(10.0),
        outcome=[Outcome.REJECTED] + [Outcome.IN_FLIGHT] * 9,
        reason=[RejectReason.QUEUE_FULL] + [0] * 9,
    )
    s = summarize(frame, NO_STEPS, NO_ITL, context())
    assert s["overloaded"]
    assert "queue full" in s["overload_reason"]


def _two_classes(**columns) -> pd.DataFrame:
    """One interactive request and two batch ones, finished at 1, 2 and 3 s."""
    return requests(
        3,
        names=("interactive", "batch"),
        priority_class=[0, 1, 1],
        first_scheduled=[0, 0, 0],
        first_token=[0.1, 0.2, 0.3],
        last_token=[1, 2, 3],
        finish=[1, 2, 3],
        generated=[5, 5, 5],
        **columns,
    )


def test_per_class_and_per_replica_blocks():
    frame = _two_classes(replica=[0, 1, 1], outcome=Outcome.COMPLETED)
    ctx = context(duration=10.0, replicas=2, priority_names=("interactive", "batch"))
    s = summarize(frame, NO_STEPS, NO_ITL, ctx)
    classes = s["priority_classes"]
    assert list(classes) == ["interactive", "batch"]
    assert classes["batch"]["completed"] == 2
    assert classes["batch"]["ttft"]["mean"] == pytest.approx(0.25)
    assert [r["completed"] for r in s["per_replica"]] == [1, 2]
    assert s["per_replica"][1]["output_tokens_per_s"] == pytest.approx(1.0)
    table = summary_table(s)
    assert "class batch" in table
    assert "replica 1" in table


def test_a_class_meets_its_slo_of_arrived_and_of_completed_requests():
    """A class's rejected request is a miss of its arrivals, not of its completions: both
    shares are given and the terminal row names which is which (as goodput does)."""
    frame = _two_classes(outcome=[Outcome.COMPLETED, Outcome.COMPLETED, Outcome.REJECTED])
    summary = summarize(frame, NO_STEPS, NO_ITL, context(priority_names=("interactive", "batch")))
    batch = summary["priority_classes"]["batch"]
    assert (batch["arrived"], batch["completed"], batch["rejected"]) == (2, 1, 1)
    assert batch["slo_fraction"] == 1.0 and batch["slo_fraction_of_arrived"] == 0.5
    assert "meets SLO 50.0% of arrived, 100.0% of completed" in summary_table(summary)
    html = summary_html(summary)
    assert "meets SLO 50.0% of arrived, 100.0% of completed" in html


def test_single_class_single_replica_have_no_breakdown():
    s = summarize(completed([0], [1], [2], [3]), NO_STEPS, NO_ITL, context())
    assert "priority_classes" not in s
    assert "per_replica" not in s


def test_summary_is_json_without_nan_even_when_empty():
    for frame in (requests(0), completed([0], [1], [2], [1])):
        s = summarize(frame, NO_STEPS, NO_ITL, context(wall_seconds=0.5))
        json.dumps(s, allow_nan=False)
        assert not has_nan(s)
        assert s["run"]["wall"]["seconds"] == 0.5
        summary_table(s)


def test_summary_table_shows_key_numbers():
    frame = completed([0, 0], [0.1, 0.3], [1.1, 2.3], [11, 11])
    s = summarize(frame, NO_STEPS, NO_ITL, context(duration=10.0, slo=SLO(ttft_s=0.2)))
    table = summary_table(s)
    assert "completed 2" in table
    assert "0.200 req/s" in table
    assert "200.0" in table  # mean TTFT in ms
    assert (
        "goodput     0.100 req/s (whole run) meet ttft <= 200.0 ms: 1 of 2 arrived (50.0%), "
        "50.0% of 2" in table  # no steady state in two completions: the whole run's alone
    )
    assert "busy 0.0% (time a step ran, at any batch size: not saturation)" in table
    assert "$4.00/h" in table
    assert "e-0" not in table and "e+0" not in table  # no scientific notation
    assert max(len(line) for line in table.splitlines()) <= 100


def test_summary_table_names_what_ran_and_its_warnings(make_scenario):
    from simulator.simulation import simulate

    scenario = make_scenario(
        serving={"num_gpu_blocks": 200},
        workload={"arrivals": {"kind": "poisson", "rate_per_s": 20.0}, "num_requests": 200},
    )
    summary = simulate(scenario).summary()
    table = summary_table(summary)
    assert table.splitlines()[1:3] == [
        "  llama-2-7b (weights bf16, KV bf16, activations bf16) on 1 replica x 1 a100-80gb-sxm "
        "(tp=1 pp=1)",
        "  chunked_prefill: 64 seqs, 512 tokens/step; poisson 20 req/s, 200 requests",
    ]
    assert summary["warnings"] and "the KV cache is short for this load" in summary["warnings"][0]
    assert "warning: the KV cache is short" in table
    assert max(len(line) for line in table.splitlines()) <= 100


def test_the_header_counts_gpus_per_replica_and_says_what_bounds_a_whole_batch():
    """The leading number counts replicas, each of tp x pp GPUs; a static or dynamic batch
    holds whole prompts, so the token budget does not bound its steps."""
    from simulator.provenance import header_lines

    pools = [{"pool": "default", "gpu": "h100-sxm", "tp": 4, "pp": 1, "replicas": 2}]
    config = {"model": "m", "weight_dtype": "bf16", "kv_dtype": "bf16",
              "activation_dtype": "bf16", "pools": pools, "policy": "static",
              "max_num_seqs": 32, "max_num_batched_tokens": 4096, "max_queue_delay_ms": 10.0,
              "load": "poisson"}  # fmt: skip
    first, second = header_lines(config)
    assert first.endswith("on 2 replicas x 4 h100-sxm (tp=4 pp=1)")
    assert second.startswith("static: batches of up to 32 seqs whose KV fits, whole prompts")
    assert "4,096" not in second
    assert "or after 10 ms" in header_lines({**config, "policy": "dynamic"})[1]
    assert "32 seqs, 4,096 tokens/step" in header_lines({**config, "policy": "continuous"})[1]


# ---- time series --------------------------------------------------------------------------


def test_nice_bin_width():
    assert nice_bin_width(100.0) == 0.5
    assert nice_bin_width(600.0) == 5.0
    assert nice_bin_width(1000.0) == 5.0
    assert nice_bin_width(1001.0) == 10.0
    assert nice_bin_width(0.3) == 0.002


def test_timeseries_bins_sum_to_totals():
    frame = overload_frame(0.5)
    ts = timeseries(frame, NO_STEPS, context(duration=100.0))
    assert len(ts) == 200
    assert ts["arrivals"].sum() == 200
    assert ts["completions"].sum() == (frame["outcome"] == "completed").sum()
    assert ts["t_end"].iloc[-1] == 100.0
    assert (ts["busy_fraction"] == 0).all()
    assert ts["batch_size"].isna().all()


def test_timeseries_splits_steps_across_bins_exactly():
    log = steps(
        start=[0.5, 2.0],
        duration=[1.0, 0.5],
        batch_size=[4, 8],
        kv_blocks_used=[20, 60],
        decode_tokens=[4, 8],
        prefill_tokens=[100, 0],
    )
    frame = completed([0.0], [1.5], [2.5], [2])
    ts = timeseries(frame, log, context(duration=3.0), bin_s=1.0)
    np.testing.assert_allclose(ts["busy_fraction"], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(ts["batch_size"], [4, 4, 8])
    np.testing.assert_allclose(ts["kv_utilisation"], [0.2, 0.2, 0.6])
    np.testing.assert_allclose(ts["output_tokens_per_s"], [0, 4 + 1, 8])
    np.testing.assert_allclose(ts["prefill_tokens_per_s"], [0, 100, 0])
    assert ts["completions"].tolist() == [0, 0, 1]


def test_timeseries_waiting_counts_requests_from_arrival_to_first_scheduling():
    """Exact from the request table, whatever the steps logged: one request waits
    0.5-2.0 s, one is rejected at once, one never scheduled waits to the run's end."""
    frame = requests(
        3,
        arrival=[0.5, 1.0, 2.5],
        first_scheduled=[2.0, np.nan, np.nan],
        finish=[2.8, 1.0, np.nan],
        outcome=[Outcome.COMPLETED, Outcome.REJECTED, Outcome.IN_FLIGHT],
    )
    log = steps(start=[0.0, 2.0], duration=[2.0, 1.0], waiting=[0, 0])
    ts = timeseries(frame, log, context(duration=3.0), bin_s=1.0)
    np.testing.assert_allclose(ts["waiting"], [0.5, 1.0, 0.5])


def test_a_run_s_waiting_series_obeys_little_s_law(make_scenario):
    """Requests that arrive during a step and are admitted at the next never show in a
    step's `waiting` (the queue after admission); the series still counts them: its time
    average is the total queueing time over the run's duration."""
    from simulator.simulation import simulate

    sc = make_scenario(workload={"arrivals": {"kind": "poisson", "rate_per_s": 8.0}})
    result = simulate(sc)
    ts, rq = result.timeseries, result.requests
    mean_waiting = (ts["waiting"] * (ts["t_end"] - ts["t_start"])).sum() / ts["t_end"].iloc[-1]
    assert rq["queueing"].sum() > 0
    assert mean_waiting == pytest.approx(rq["queueing"].sum() / ts["t_end"].iloc[-1], rel=1e-9)


def test_timeseries_partial_last_bin_and_empty_run():
    log = steps(start=[0.0], duration=[2.5], decode_tokens=[10])
    ts = timeseries(requests(0), log, context(duration=2.5), bin_s=1.0)
    assert ts["t_end"].tolist() == [1.0, 2.0, 2.5]
    np.testing.assert_allclose(ts["busy_fraction"], [1, 1, 1])
    np.testing.assert_allclose(ts["output_tokens_per_s"], [0, 0, 20])
    assert timeseries(requests(0), NO_STEPS, context(duration=0.0)).empty


def test_timeseries_of_a_million_steps_spread_over_many_bins():
    """Steps far shorter than the bins, folded in one go (the speed of folding is the
    perf_1m_cluster benchmark's business, not a unit test's)."""
    n = 1_000_000
    durations = np.full(n, 0.001)
    log = steps(
        start=np.cumsum(durations) - durations,
        duration=durations,
        batch_size=np.full(n, 32),
        decode_tokens=np.full(n, 32),
        kv_blocks_used=np.full(n, 50),
        waiting=np.zeros(n),
    )
    ctx = context(duration=1000.0)
    ts = timeseries(requests(0), log, ctx)
    np.testing.assert_allclose(ts["busy_fraction"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(ts["batch_size"], 32.0, rtol=1e-6)
    assert ts["output_tokens_per_s"].sum() * 5.0 == pytest.approx(32 * n)


# ---- files and plots ----------------------------------------------------------------------


def small_run():
    frame = overload_frame(1.0)
    log = steps(start=[0.0, 10.0], duration=[5.0, 5.0], decode_tokens=[4, 4])
    itl = pd.DataFrame({"seconds": [0.01, 0.02], "weight": [5, 2]})
    ctx = context(duration=100.0, wall_seconds=1.25)
    return frame, log, itl, ctx


def test_write_run_writes_files_and_refuses_to_overwrite(tmp_path: Path):
    frame, log, itl, ctx = small_run()
    s = summarize(frame, log, itl, ctx)
    ts = timeseries(frame, log, ctx)
    out = tmp_path / "run"
    paths = write_run(out, s, frame, log, ts, itl, csv=True, plots=False)
    names = {p.name for p in paths}
    for table in ("requests", "steps", "timeseries", "itl"):
        assert {f"{table}.parquet", f"{table}.csv"} <= names
    assert json.loads((out / "summary.json").read_text()) == s
    back = pd.read_parquet(out / "requests.parquet")
    assert len(back) == len(frame)
    with pytest.raises(InfersimError, match="already has results"):
        write_run(out, s, frame, log, ts, itl)
    paths = write_run(out, s, frame, log, ts, itl, overwrite=True, plots=False)
    assert not (out / "requests.csv").exists()  # a stale CSV does not outlive its run


def test_a_run_folder_without_summary_json_is_one_whose_writing_stopped(tmp_path, monkeypatch):
    """summary.json is written last and each table under a partial name: a write that
    fails (disk full) leaves neither a summary that looks complete nor a half table."""
    import errno

    import simulator.metrics.parquet

    frame, log, itl, ctx = small_run()
    s = summarize(frame, log, itl, ctx)
    ts = timeseries(frame, log, ctx)
    out = tmp_path / "run"
    paths = write_run(out, s, frame, log, ts, itl, plots=False)
    assert paths[-1] == out / "summary.json"

    def full(table, path):
        Path(path).write_bytes(b"PAR1")  # begun, then the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(simulator.metrics.parquet, "write_parquet", full)
    for again in (out, tmp_path / "fresh"):
        with pytest.raises(OSError) as caught:
            write_run(again, s, frame, log, ts, itl, plots=False, overwrite=True)
        assert caught.value.filename == str(again / "requests.parquet")  # names the file
        assert list(again.iterdir()) == []  # the earlier run's summary went first


def test_writing_a_run_twice_from_python_names_the_python_argument(make_scenario, tmp_path):
    """The way out fits the caller: `overwrite=True` to Python, `--overwrite` to a shell."""
    from simulator.simulation import simulate

    result = simulate(make_scenario(workload={"num_requests": 20}))
    result.write(tmp_path / "run", plots=False)
    with pytest.raises(InfersimError) as caught:
        result.write(tmp_path / "run", plots=False)
    assert str(caught.value).endswith(
        "already has results; pass overwrite=True or choose another outdir"
    )
    result.write(tmp_path / "run", plots=False, overwrite=True)


def test_summary_json_is_byte_identical_and_can_drop_wall_time():
    frame, log, itl, ctx = small_run()
    a = summary_json(summarize(frame, log, itl, ctx))
    b = summary_json(summarize(frame, log, itl, ctx))
    assert a == b
    assert '"wall"' in a
    stripped = summary_json(summarize(frame, log, itl, ctx), include_wall_time=False)
    assert '"wall"' not in stripped
    other_wall = summarize(frame, log, itl, context(duration=100.0, wall_seconds=9.0))
    assert summary_json(other_wall, include_wall_time=False) == stripped


def test_plots_are_written_as_png(tmp_path: Path):
    frame, log, itl, ctx = small_run()
    paths = save_run_plots(frame, itl, timeseries(frame, log, ctx), tmp_path)
    assert [p.name for p in paths] == ["latency_cdfs.png", "throughput_queue.png", "kv_batch.png"]
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_latency_cdfs_overlays_variants_and_survives_no_samples(tmp_path: Path):
    frame, _, itl, _ = small_run()
    fig = latency_cdfs({"a": frame, "b": overload_frame(0.5)}, {"a": itl})
    assert len(fig.axes) == 4
    assert len(fig.axes[0].get_lines()) == 2 + 2  # two runs + the p50/p99 guides
    assert len(fig.axes[2].get_lines()) == 1 + 2  # ITL only for "a"
    empty = latency_cdfs(requests(0), None)
    empty.savefig(tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes()[:8] == PNG_MAGIC


def test_plots_of_an_empty_run(tmp_path: Path):
    ts = timeseries(requests(0), NO_STEPS, context(duration=0.0))
    for path in save_run_plots(requests(0), NO_ITL, ts, tmp_path):
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_short_run_of_long_requests_is_not_overloaded():
    """Requests take 40 s, arrivals span 20 s, none ever waits: nothing completes in the
    second half of the arrivals, which must not read as overload."""
    arrival = np.arange(200) * 0.1
    frame = completed(arrival, arrival + 0.1, arrival + 40.0, np.full(200, 10))
    s = summarize(frame, NO_STEPS, NO_ITL, context(duration=60.0))
    assert s["load"]["queue_growth_per_s"] == pytest.approx(0.0)
    assert not s["overloaded"]


def test_growing_queue_is_overload_even_in_a_short_run():
    """The server admits one request per second of 2 offered: queueing grows at 1 s/s."""
    arrival = np.arange(200) * 0.5
    scheduled = np.arange(200) * 1.0
    served = scheduled + 40.0 <= 110.0
    finish = np.where(served, scheduled + 40.0, np.nan)
    s = summarize(
        requests(200, arrival=arrival, first_scheduled=scheduled, first_token=scheduled + 0.1,
                 finish=finish, generated=np.full(200, 10),
                 outcome=np.where(served, Outcome.COMPLETED, Outcome.IN_FLIGHT)),
        NO_STEPS, NO_ITL, context(duration=110.0),
    )  # fmt: skip
    assert s["overloaded"]
    assert s["load"]["unserved_share"] == pytest.approx(0.5, rel=0.05)
    assert "the waiting queue grew" in s["overload_reason"]


def test_notebook_html_names_what_ran_and_its_warnings(make_scenario):
    from simulator.simulation import simulate

    load = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}}
    scenario = make_scenario(serving={"num_gpu_blocks": 200}, workload=load)
    html = simulate(scenario)._repr_html_()
    assert (
        "llama-2-7b (weights bf16, KV bf16, activations bf16) on 1 replica x 1 a100-80gb-sxm"
        in html
    )
    assert "<b>Warning:</b> the KV cache is short for this load" in html
    assert "(steady state: 10%-90% of completions)" in html and "e+0" not in html


def test_the_notebook_html_shows_every_row_the_terminal_shows(make_scenario):
    """Review 14, item 8: the HTML summary was a second copy of the terminal's and had
    drifted (no bound-by, MFU while busy, steady output tok/s, W/GPU, J/request, $/1M output
    tok under KV pressure); both now render the same rows, so neither can lose one."""
    from html import escape

    from simulator.metrics.terminal import breakdown_rows, notes, summary_rows
    from simulator.simulation import simulate

    load = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}}
    results = simulate(make_scenario(serving={"num_gpu_blocks": 200}, workload=load))
    summary = results.summary()
    html, text = summary_html(summary), " ".join(summary_table(summary).split())
    rows = [*notes(summary), *summary_rows(summary), *(r[:2] for r in breakdown_rows(summary))]
    assert len(rows) > 12
    for _, row in rows:
        assert f"{escape(row)}</" in html
        assert " ".join(row.split()) in text
    for shown in ("bound by", "while busy)", "tok/s  (steady state", "W/GPU", "J/request",
                  "/1M output tok"):  # fmt: skip
        assert shown in html


def test_the_series_counts_every_output_token_with_recompute_preemptions(make_scenario):
    """A request preempted by recompute samples its next token when its second prefill
    ends: an output token (the summary's) that is neither a step's decode nor a first
    token, which the series used to miss, one per preemption."""
    from simulator.simulation import simulate

    sc = make_scenario(
        serving={"policy": "chunked_prefill", "num_gpu_blocks": 400, "max_num_seqs": 256},
        workload={
            "arrivals": {"kind": "poisson", "rate_per_s": 80.0},
            "prompt_tokens": {"kind": "fixed", "tokens": 200},
            "output_tokens": {"kind": "fixed", "tokens": 400},
            "num_requests": 100,
        },
    )
    result = simulate(sc)
    ts, rq = result.timeseries, result.requests
    assert rq["preemptions"].sum() > 0 and (rq["outcome"] == "completed").all()
    made = (ts["output_tokens_per_s"] * (ts["t_end"] - ts["t_start"])).sum()
    assert made == pytest.approx(rq["generated"].sum(), rel=1e-12)
    duration = ts["t_end"].iloc[-1]
    summary = result.summary()["throughput"]["output_tokens_per_s"]
    assert made / duration == pytest.approx(summary, rel=1e-9)


def test_a_run_without_a_steady_state_prints_its_whole_run_power_and_its_few_watt_hours(
    make_scenario,
):
    """Three requests: no steady state, so the per-token line's power is the whole run's
    (the figure it is on the basis of), and a few watt-hours show their digits."""
    from simulator.simulation import simulate

    summary = simulate(make_scenario(workload={"num_requests": 3}), progress=False).summary()
    energy = summary["energy"]
    assert energy["steady_power_w"] is None and energy["gpu_energy_kwh"] < 5e-4
    lines = summary_table(summary).splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("energy"))
    watts = f"{energy['average_power_w']:,.0f} W/GPU"
    assert f"GPUs {sig(energy['gpu_energy_kwh'], 4)} kWh, {watts} (whole run)" in lines[first]
    assert "GPUs 0.000 kWh" not in lines[first]
    assert f"J/request  {watts}  (whole run;" in lines[first + 1]
