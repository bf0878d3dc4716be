"""Figures of a replay: latency CDFs measured against simulated, and the run second by
second against the engine's own log."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from simulator.metrics.plots import latency_cdfs
from simulator.replay.measured import MeasuredRun
from simulator.results import Results

_PANELS = (
    ("gen_tok_s", "generated tokens / s"),
    ("running", "running requests"),
    ("waiting", "waiting requests"),
    ("kv_pct", "KV cache used (%)"),
)


_COLOURS = {"measured": "C0", "simulated": "C1"}


def replay_cdfs(run: MeasuredRun, results: Results) -> Figure:
    """TTFT, TPOT, ITL and E2E CDFs, measured and simulated overlaid, in the same colours
    on every panel. A run without per-token times gives only its mean ITL, drawn as a
    vertical line."""
    gaps = {"simulated": results.itl}
    if run.itl is not None:
        gaps["measured"] = run.itl
    figure = latency_cdfs({"measured": run.requests, "simulated": results.requests}, gaps)
    itl_panel = figure.axes[2]
    if run.itl is None and run.itl_mean is not None:
        itl_panel.axvline(1000 * run.itl_mean, ls="--", label="measured (mean only)")
    for ax in figure.axes:
        for line in ax.lines:
            label = str(line.get_label()).split(" ")[0]
            if label in _COLOURS:
                line.set_color(_COLOURS[label])
    itl_panel.legend(fontsize="small")
    return figure


def timeline_figure(line: pd.DataFrame) -> Figure:
    figure = Figure(figsize=(12, 7), layout="constrained")
    for ax, (column, title) in zip(figure.subplots(2, 2).flat, _PANELS, strict=True):
        ax.plot(line["t"], line[f"measured_{column}"], label="measured (engine log)")
        ax.plot(line["t"], line[f"simulated_{column}"], label="simulated")
        ax.set_title(title)
        ax.set_xlabel("s")
    figure.axes[0].legend()
    return figure
