"""Side by side: the numbers a practitioner compares between runs of the same traffic."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from simulator.inputs import named_runs
from simulator.metrics.headline import headline_row, labelled
from simulator.results import Results

__all__ = ["COLUMNS", "compare_table", "labelled", "write_comparison"]

# The headline columns a comparison shows (simulator.metrics.headline names each once,
# for sweep and plan tables too): steady-state throughput, goodput and cost side by side.
COLUMNS = (
    "completed",
    "rejected",
    "failed",
    "retried",
    "steady_requests_per_s",
    "steady_output_tokens_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p99_ms",
    "e2e_p99_ms",
    "steady_goodput_requests_per_s",
    "run_goodput_requests_per_s",
    "goodput_fraction",
    "goodput_fraction_of_arrived",
    "preemptions",
    "kv_max_utilisation",
    "prefix_hit_rate",
    "mfu",
    "usd_per_million_output_tokens",  # on cost_basis
    "joules_per_output_token",
)


def compare_table(results: Mapping[str, Results] | Iterable[Results] | Results) -> pd.DataFrame:
    """One row per run, one column per headline metric (`COLUMNS`, named and scaled as
    sweep and plan tables name them; `labelled(table)` gives the printed headers):
    `results` is a dict of name -> Results, or a list of Results (or one) named after
    their scenarios."""
    results = named_runs(results, "compare_table")
    rows = {}
    for name, result in results.items():
        summary = result.summary()
        rows[name] = headline_row(summary, COLUMNS)
        rows[name]["cost_basis"] = summary["cost"].get("basis")
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
        "comparison_latency_cdfs.png": plot_latency_cdfs(results),
        "comparison_throughput_cost.png": plot_throughput_and_cost(results),
    }
    paths = [table_path]
    for name, figure in figures.items():
        figure.savefig(outdir / name, dpi=110)
        paths.append(outdir / name)
    return paths
