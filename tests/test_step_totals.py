"""Step totals folded as the run goes: the same summary and time series as a step table,
with memory that does not grow with the number of steps."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from hardware_models.errors import InfersimError
from simulator.engine import step_log
from simulator.metrics import latency_stats, nice_bin_width, timeseries
from simulator.metrics.log_histogram import RELATIVE_WIDTH, LogHistogram
from simulator.metrics.step_totals import FINE_BINS, StepTotals
from simulator.scenario import Scenario
from simulator.simulation import simulate

CASES = {
    "chunked, two replicas, a failure": dict(
        parallelism={"replicas": 2, "router": "least_outstanding"},
        faults={"events": [{"replica": 1, "at_s": 20.0, "recover_at_s": 35.0}]},
    ),
    "static batches, a failure, gaps cut": dict(
        serving={"policy": "static", "max_num_seqs": 16},
        faults={"events": [{"replica": 0, "at_s": 15.0, "recover_at_s": 25.0}]},
    ),
    "dynamic, stopped at a horizon": dict(
        serving={"policy": "dynamic", "max_num_seqs": 16, "max_queue_delay_ms": 50},
        workload={"num_requests": None, "duration_s": 30.0},
    ),
}


def _flat(block, prefix=""):
    items = block.items() if isinstance(block, dict) else enumerate(block)
    out = {}
    for key, value in items:
        if isinstance(value, dict | list):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("case", CASES)
def test_totals_without_a_table_match_the_table(make_scenario, monkeypatch, case):
    """Folding every 16 rows (so through failures, padded batches and the end of the run)
    gives the summary a step table gives; only ITL percentiles move, within a bin."""
    monkeypatch.setattr(step_log, "CHUNK_ROWS", 16)
    kept = simulate(make_scenario(**CASES[case]))
    folded = simulate(make_scenario(**CASES[case], output={"step_table": False}))
    pd.testing.assert_frame_equal(kept.requests, folded.requests)
    assert len(kept.steps) > 100  # many folds happened

    exact, binned = _flat(kept.summary()), _flat(folded.summary())
    assert exact.keys() == binned.keys()
    for key, value in exact.items():
        if key.startswith(("run.wall", "provenance.scenario.output.step_table")):
            continue
        if key.startswith("latency.itl.") and isinstance(value, float):
            assert binned[key] == pytest.approx(value, rel=RELATIVE_WIDTH / 2), key
        elif isinstance(value, float):
            assert binned[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
        else:
            assert binned[key] == value, key
    pd.testing.assert_frame_equal(kept.timeseries, folded.timeseries)

    # The online totals equal totals of the finished table, and so does the time series.
    table = StepTotals.from_table(kept.steps, kept.context)
    for name in ("steps", "busy", "flops", "dram_bytes", "joules", "capped", "kv_time",
                 "budget_full", "seqs_full"):  # fmt: skip
        np.testing.assert_allclose(getattr(folded.totals, name), getattr(table, name), rtol=1e-12)
    np.testing.assert_allclose(folded.totals.bound_time, table.bound_time, rtol=1e-12)
    from_table = timeseries(kept.requests, kept.steps, kept.context, resampled=kept.resampled)
    pd.testing.assert_frame_equal(from_table, folded.timeseries, rtol=1e-9)


@pytest.mark.parametrize("step_table", [True, False])
def test_summary_does_not_depend_on_when_steps_are_folded(monkeypatch, step_table):
    """Multi-step and step-by-step runs log the same step rows but fold them at other
    SimPy times (a replica running ahead has more steps in flight): the summary's float
    sums must still be bit for bit the same. Pipeline-parallel's light TP8 variant at 150
    requests (8,192-row chunks) used to differ in the last bits of its busy fraction, MFU,
    MBU, bound shares and mean KV use; 40 requests folded every 64 rows show it too."""
    monkeypatch.setattr(step_log, "CHUNK_ROWS", 64)
    runs = []
    for multi_step in (True, False):
        sets = ["workload.num_requests=40", f"engine.multi_step={str(multi_step).lower()}",
                f"output.step_table={str(step_table).lower()}"]  # fmt: skip
        scenario = Scenario.from_yaml("scenarios/pipeline-parallel.yaml", sets)
        light = next(s for s in scenario.expand() if s.name == "tp8_light")
        runs.append(simulate(light, progress=False))
    fast, slow = runs
    assert fast.totals.steps.sum() > 20 * 64  # many folds happened
    got, expected = _flat(fast.summary()), _flat(slow.summary())
    assert got.keys() == expected.keys()
    skipped = ("provenance.", "run.wall")
    differ = [f"{k}: {got[k]!r} vs {v!r}" for k, v in expected.items()
              if got[k] != v and not k.startswith(skipped)]  # fmt: skip
    assert not differ
    pd.testing.assert_frame_equal(fast.timeseries, slow.timeseries, check_exact=True)


def test_a_run_without_a_table_says_so_and_writes_none(make_scenario, tmp_path):
    results = simulate(make_scenario(output={"step_table": False}))
    with pytest.raises(InfersimError, match=r"output\.step_table: false"):
        results.steps  # noqa: B018
    written = {p.name for p in results.write(tmp_path / "run")}
    assert "steps.parquet" not in written
    assert {"summary.json", "requests.parquet", "timeseries.parquet", "itl.parquet"} <= written


def test_log_histogram_percentiles_within_half_a_bin():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.lognormal(-4, 1.5, 20_000), np.zeros(30)])
    weights = rng.integers(1, 64, len(values))
    parts = [LogHistogram(), LogHistogram()]
    for part, half in zip(parts, np.array_split(np.arange(len(values)), 2), strict=True):
        part.add(values[half], weights[half])
    parts[0].merge(parts[1])
    rows = parts[0].rows()
    assert len(rows) < 20_000 and rows["weight"].sum() == weights.sum()
    exact = latency_stats(values, weights)
    binned = latency_stats(rows["seconds"], rows["weight"])
    assert binned["count"] == exact["count"] and binned["max"] == exact["max"]
    for key in ("mean", "p50", "p90", "p95", "p99"):
        assert binned[key] == pytest.approx(exact[key], rel=RELATIVE_WIDTH / 2), key


def test_fine_bins_merge_into_any_width_the_series_picks():
    """A run of any length ends with bins that every nice series width is a multiple of,
    and a step crossing many of them is split exactly."""
    for duration in (0.37, 9.0, 123.4, 86_400.0 * 3):
        totals = StepTotals([1e15], [1e12], [100])
        rows = pd.DataFrame(
            {
                "start": [0.0, duration / 3],
                "duration": [duration / 3, duration * 2 / 3],
                "batch_size": [2, 4],
                "decode_tokens": [1, 1],
                "prefill_tokens": [0, 0],
                "kv_blocks_used": [10, 50],
                "waiting": [0, 1],
                "flops": [0.0, 0.0],
                "dram_bytes": [0.0, 0.0],
                "bound": [1, 1],
                "replica": [0, 0],
            }
        )
        totals.fold(rows)
        assert FINE_BINS * totals.bin_width > duration
        width = nice_bin_width(duration)
        edges = np.minimum(np.arange(math.ceil(duration / width) + 1) * width, duration)
        busy = totals.binned(edges)[2]  # the two steps cover the run without a gap
        np.testing.assert_allclose(busy, np.diff(edges), rtol=1e-9)


def test_runs_gaps_binned_from_their_step_ends_as_one_by_one(monkeypatch):
    """Without a table a run's step ends are kept and their differences binned a chunk at
    a time: the same histogram, to the count, as logging each gap as it comes."""
    monkeypatch.setattr(step_log, "CHUNK_ROWS", 64)  # bin several times
    rng = np.random.default_rng(3)
    logs = [step_log.StepLog(0, StepTotals([1.0], [1.0], [1.0]), lambda: 0.0, keep_rows=False)
            for _ in range(2)]  # fmt: skip
    t = 0.0
    for size in rng.integers(1, 20, 200):
        ends = (t + np.cumsum(rng.uniform(0.005, 0.02, size))).tolist()
        weight = int(rng.integers(1, 128))
        logs[0].run_gaps(ends, weight)
        for before, after in itertools.pairwise(ends):
            logs[1].gap(after, after - before, weight)
        logs[0].gap(ends[-1], 0.5, 3)  # gaps logged one at a time in between
        logs[1].gap(ends[-1], 0.5, 3)
        t = ends[-1] + 0.1
    binned, one_by_one = (log.close(t)[1] for log in logs)
    np.testing.assert_array_equal(binned, one_by_one)
    assert binned["weight"].sum() > 10_000
