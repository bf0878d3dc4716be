"""Measured against simulated: the latency table, the run second by second against the
engine's own log, and the two checks that separate the cost model from the scheduler
(the decode step where nothing prefills; the prefills before the KV cache first fills)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.metrics.summary import latency_stats
from simulator.replay.measured import MeasuredRun
from simulator.results import Results

METRICS = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")


def _error_pct(measured: float | None, simulated: float | None) -> float | None:
    if measured is None or simulated is None or measured == 0:
        return None
    return 100 * (simulated - measured) / measured


def _measured_stats(run: MeasuredRun, metric: str) -> dict[str, float | None]:
    if metric != "itl":
        return latency_stats(run.requests[metric].to_numpy())
    if run.itl is not None:
        return latency_stats(run.itl["seconds"].to_numpy(), run.itl["weight"].to_numpy())
    return {"mean": run.itl_mean}  # percentiles need every gap, which the run lacks


def latency_table(run: MeasuredRun, results: Results) -> list[dict[str, object]]:
    """One row per metric and statistic: measured and simulated seconds, signed error in
    percent of the measured value (None where the run does not give the figure)."""
    simulated = results.summary()["latency"]  # the same statistics the summary reports
    rows = []
    for metric in METRICS:
        measured = _measured_stats(run, metric)
        for stat in STATS:
            m, s = measured.get(stat), simulated[metric][stat]
            rows.append(
                {
                    "metric": metric,
                    "stat": stat,
                    "measured_s": m,
                    "simulated_s": s,
                    "error_pct": _error_pct(m, s),
                }
            )
    return rows


def timeline(log: pd.DataFrame, results: Results) -> pd.DataFrame:
    """Per engine-log tick, measured and simulated side by side, each as vLLM logs it:
    prompt tokens counted when a request's first token comes out, generated tokens, and
    running / waiting / KV use sampled at the tick."""
    ticks = log["t"].to_numpy()
    requests, steps = results.requests, results.steps
    first = requests["first_token"].to_numpy()
    ends = (steps["start"] + steps["duration"]).to_numpy()
    running, waiting, kv_used = _sampled(steps, ticks)
    total_blocks = sum(replica.kv_total_blocks for replica in results.context.replicas)
    edges = np.concatenate(([ticks[0] - 1], ticks))
    generated = np.histogram(ends, edges, weights=steps["decode_tokens"])[0]
    generated += np.histogram(first, edges)[0]  # each request's first token
    return pd.DataFrame(
        {
            "t": ticks,
            "measured_prompt_tok_s": log["prompt_throughput"],
            "simulated_prompt_tok_s": np.histogram(first, edges, weights=requests["prompt"])[0],
            "measured_gen_tok_s": log["gen_throughput"],
            "simulated_gen_tok_s": generated,
            "measured_running": log["running"],
            "simulated_running": running,
            "measured_waiting": log["waiting"],
            "simulated_waiting": waiting,
            "measured_kv_pct": log["kv_cache_pct"],
            "simulated_kv_pct": 100 * kv_used / total_blocks,
            "simulated_prefill_tok_s": np.histogram(ends, edges, weights=steps["prefill_tokens"])[
                0
            ],
        }
    )


def _sampled(steps: pd.DataFrame, ticks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Running, waiting and KV blocks used at each tick, summed over the replicas (a DP
    run's ranks, as the engine's log sums its engines): each replica's last step started
    by then."""
    totals = [np.zeros(len(ticks)) for _ in range(3)]
    for _, own in steps.groupby("replica", sort=True):
        at = np.clip(np.searchsorted(own["start"].to_numpy(), ticks, side="right") - 1, 0, None)
        for total, column in zip(totals, ("batch_size", "waiting", "kv_blocks_used"), strict=True):
            total += own[column].to_numpy()[at]
    return tuple(totals)


def decode_only_step(line: pd.DataFrame) -> dict[str, float] | None:
    """Mean decode step time (ms) implied by running / generated tokens per second,
    measured and simulated, over the ticks in which neither prefilled anything: the
    memory-bound side of the cost model apart from scheduling. None without such ticks."""
    quiet = (
        (line["measured_prompt_tok_s"] == 0)
        & (line["simulated_prefill_tok_s"] == 0)
        & (line["measured_running"] > 0)
    )
    line = line[quiet]
    generated = (line["measured_gen_tok_s"].sum(), line["simulated_gen_tok_s"].sum())
    if not quiet.any() or min(generated) <= 0:
        return None
    measured = 1000 * line["measured_running"].sum() / generated[0]
    simulated = 1000 * line["simulated_running"].sum() / generated[1]
    return {
        "ticks": int(quiet.sum()),
        "measured_ms": float(measured),
        "simulated_ms": float(simulated),
        "error_pct": _error_pct(measured, simulated),
    }


def before_cache_fills(
    run: MeasuredRun, log: pd.DataFrame, results: Results
) -> dict[str, float] | None:
    """The requests whose first token came before the engine log first shows the KV cache
    99% full, and when the last of them got it, measured and simulated: prefill steps
    with next to no preemption, the compute-bound side apart from the scheduler. Those
    the simulation did not serve are left out of both sides and counted. None when the
    cache never fills or nothing came before."""
    tick = float(log.loc[log["kv_cache_pct"] >= 99, "t"].min())
    first = run.first_token_at.to_numpy()
    simulated = results.requests.sort_values("arrival", kind="stable", ignore_index=True)
    simulated_first = simulated["first_token"].to_numpy()
    early = first < tick  # all False when tick is NaN
    served = early & ~np.isnan(simulated_first)
    if not served.any():
        return None
    measured_s = float(first[served].max())
    simulated_s = float(simulated_first[served].max())
    return {
        "requests": int(served.sum()),
        "not_simulated": int(early.sum() - served.sum()),
        "tick_s": tick,
        "measured_s": measured_s,
        "simulated_s": simulated_s,
        "error_pct": _error_pct(measured_s, simulated_s),
    }
