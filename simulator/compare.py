"""Side by side: the numbers a practitioner compares between runs of the same traffic."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from simulator.inputs import named_runs
from simulator.results import Results

# (column, path into the summary, scale) — latencies in ms.
_COLUMNS = (
    ("completed", ("counts", "completed"), 1),
    ("rejected", ("counts", "rejected"), 1),
    ("failed", ("counts", "failed"), 1),
    ("retried", ("counts", "retried"), 1),
    # Steady state (10%-90% of completions): the whole run's means also count the drain
    # after the last arrival, as long on a fast fleet as on a slow one.
    ("steady req/s", ("throughput", "steady_requests_per_s"), 1),
    ("steady out tok/s", ("throughput", "steady_output_tokens_per_s"), 1),
    ("TTFT p50 ms", ("latency", "ttft", "p50"), 1000),
    ("TTFT p99 ms", ("latency", "ttft", "p99"), 1000),
    ("TPOT p50 ms", ("latency", "tpot", "p50"), 1000),
    ("TPOT p99 ms", ("latency", "tpot", "p99"), 1000),
    ("ITL p99 ms", ("latency", "itl", "p99"), 1000),
    ("E2E p99 ms", ("latency", "e2e", "p99"), 1000),
    ("goodput req/s", ("goodput", "goodput_requests_per_s"), 1),
    ("SLO met %", ("goodput", "fraction"), 100),  # of completed requests
    ("SLO met % arrived", ("goodput", "fraction_of_arrived"), 100),  # failed ones count as misses
    ("preemptions", ("kv", "preemptions"), 1),
    ("KV max %", ("kv", "max_utilisation"), 100),
    ("prefix hit %", ("prefix_cache", "hit_rate"), 100),
    ("MFU %", ("utilisation", "mfu"), 100),
    ("$/1M out tok", ("cost", "usd_per_million_output_tokens"), 1),  # on cost.basis
    ("J/out tok", ("energy", "joules_per_output_token"), 1),
)


def _get(summary: Mapping, path: tuple[str, ...]) -> float | None:
    node = summary
    for key in path:
        if not isinstance(node, Mapping) or node.get(key) is None:
            return None
        node = node[key]
    return node


def compare_table(results: Mapping[str, Results] | Iterable[Results] | Results) -> pd.DataFrame:
    """One row per run, one column per headline metric: `results` is a dict of name ->
    Results, or a list of Results (or one) named after their scenarios."""
    results = named_runs(results, "compare_table")
    rows = {}
    for name, result in results.items():
        summary = result.summary()
        rows[name] = {
            column: None if (v := _get(summary, path)) is None else v * scale
            for column, path, scale in _COLUMNS
        }
        rows[name]["cost basis"] = summary["cost"].get("basis")
        rows[name]["overloaded"] = bool(summary.get("overloaded"))
        rows[name]["overload_verdict"] = summary.get("overload_verdict")
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "run"
    return frame


def write_comparison(
    results: Mapping[str, Results], outdir: Path, *, plots: bool = True
) -> list[Path]:
    """comparison.csv, overlaid latency CDFs and throughput / cost next to the per-run
    folders."""
    outdir.mkdir(parents=True, exist_ok=True)
    table_path = outdir / "comparison.csv"
    compare_table(results).to_csv(table_path)
    if not plots:
        return [table_path]
    from simulator.plotting import plot_latency_cdfs, plot_throughput_and_cost

    figures = {
        "comparison_latency_cdfs.png": plot_latency_cdfs(
            results, title=f"latency of {', '.join(map(str, results))}"
        ),
        "comparison_throughput_cost.png": plot_throughput_and_cost(results),
    }
    paths = [table_path]
    for name, figure in figures.items():
        figure.savefig(outdir / name, dpi=110)
        paths.append(outdir / name)
    return paths
