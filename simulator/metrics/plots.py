"""Figures of one run or several overlaid: latency CDFs, throughput and queue over time,
KV cache and batch over time.

Figures are built with matplotlib's object API (no pyplot), so they work under any
backend, leave no global state behind, and are freed once unreferenced; notebooks still
display a returned Figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from simulator.metrics.summary import weighted_percentile
from simulator.metrics.writer import PLOT_FILES

Frames = pd.DataFrame | Mapping[str, pd.DataFrame] | Sequence[pd.DataFrame]
LOG_SPAN = 1000  # a latency axis spanning more than this ratio is drawn in log scale
_CDF_POINTS = np.linspace(0, 100, 801)
_LATENCIES = (
    ("ttft", "TTFT"),
    ("tpot", "TPOT (completed)"),
    ("itl", "ITL (per token)"),
    ("e2e", "E2E (completed)"),
)


def _named(frames: Frames | None, labels: Sequence[str] | None) -> dict[str, pd.DataFrame]:
    """One frame, a sequence of frames or a name->frame mapping, as a name->frame dict."""
    if frames is None:
        return {}
    if isinstance(frames, Mapping):
        return dict(frames)
    items = [frames] if isinstance(frames, pd.DataFrame) else list(frames)
    names = list(labels) if labels is not None else ["run"] if len(items) == 1 else None
    if names is None:
        names = [f"run {i}" for i in range(len(items))]
    if len(names) != len(items):
        raise ValueError(f"{len(names)} labels for {len(items)} frames")
    return dict(zip(names, items, strict=True))


def _cdf(ax: Axes, values: np.ndarray, weights: np.ndarray | None, label: str) -> np.ndarray:
    """Plot the CDF in ms from 801 quantiles (enough for the eye, cheap for 10^6 rows);
    returns the quantiles drawn (empty when there were no samples)."""
    ms = 1000 * weighted_percentile(values, weights, _CDF_POINTS)
    if np.isnan(ms).all():
        return np.empty(0)
    ax.plot(ms, _CDF_POINTS / 100, label=label, drawstyle="steps-post")
    return ms


def run_title(summary: Mapping[str, Any]) -> str:
    """'scenario: model on replicas x GPU tp/pp' from a run's summary, for figure titles."""
    run = summary["run"]
    config = run.get("configuration")
    if config is None:
        return f"{run['scenario']}: {run['gpus']} x {'/'.join(run['gpu_types'])}"
    layout = ", ".join(
        f"{p['replicas']} x {p['gpu']} tp={p['tp']}" + (f" pp={p['pp']}" if p["pp"] > 1 else "")
        for p in config["pools"]
    )
    return f"{run['scenario']}: {config['model']} on {layout}"


def latency_cdfs(
    requests: Frames,
    itl: Frames | None = None,
    labels: Sequence[str] | None = None,
    *,
    title: str = "",
    slo_s: Mapping[str, float | None] | None = None,
) -> Figure:
    """TTFT, TPOT, ITL and E2E CDFs in ms; several runs overlay when `requests` (and
    `itl`, with the same names) are a mapping or sequence. `labels` names the runs of a
    single frame or sequence. `slo_s` (as the summary's goodput.slo: ttft_s, tpot_s,
    e2e_s) draws each bound that is set as a vertical line."""
    runs = _named(requests, labels)
    gaps = _named(itl, labels if not isinstance(itl, Mapping) else None)
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    if title:
        fig.suptitle(title)
    axes = fig.subplots(2, 2)
    for ax, (column, title) in zip(axes.flat, _LATENCIES, strict=True):
        drawn = [np.empty(0)]
        for name, frame in runs.items():
            if column != "itl":
                drawn.append(_cdf(ax, frame[column].to_numpy(), None, name))
            elif (samples := gaps.get(name)) is not None:
                values, weights = samples["seconds"].to_numpy(), samples["weight"].to_numpy()
                drawn.append(_cdf(ax, values, weights, name))
        ms = np.concatenate(drawn)
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
        for p in (0.5, 0.99):
            ax.axhline(p, color="grey", lw=0.6, ls=":")
        if not len(ms):
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
            continue
        bound = (slo_s or {}).get(f"{column}_s")
        if bound is not None:
            ax.axvline(1000 * bound, color="crimson", lw=1, ls="--",
                       label=f"SLO {1000 * bound:g} ms")  # fmt: skip
            ms = np.append(ms, 1000 * bound)
        positive = ms[ms > 0]
        if len(positive) and positive.max() > LOG_SPAN * positive.min():
            ax.set_xscale("log")
        if len(runs) > 1 or bound is not None:
            ax.legend(fontsize="small")
    return fig


def _bins(ax: Axes, ts: pd.DataFrame, values: pd.Series | np.ndarray, **style) -> None:
    """Draw per-bin values as flat steps spanning each bin, the last one included."""
    ax.grid(alpha=0.3)
    if ts.empty:
        return
    edges = np.append(ts["t_start"].to_numpy(), ts["t_end"].to_numpy()[-1:])
    values = np.asarray(values, dtype=np.float64)
    ax.stairs(values, edges, baseline=None, **style)


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def throughput_and_queue(ts: pd.DataFrame, title: str = "") -> Figure:
    """Token rates, request rates in and out, and the waiting queue, per time bin."""
    fig = Figure(figsize=(11, 8), layout="constrained")
    if title:
        fig.suptitle(title)
    tokens, reqs, queue = fig.subplots(3, 1, sharex=True)
    span = (ts["t_end"] - ts["t_start"]).to_numpy()
    _bins(tokens, ts, ts["output_tokens_per_s"], label="output")
    _bins(tokens, ts, ts["prefill_tokens_per_s"], label="prefill")
    tokens.set_ylabel("tokens/s")
    _legend(tokens)
    _bins(reqs, ts, ts["arrivals"] / span, label="arrivals")
    _bins(reqs, ts, ts["completions"] / span, label="completions")
    reqs.set_ylabel("requests/s")
    _legend(reqs)
    _bins(queue, ts, ts["waiting"], color="C3")
    queue.set_ylabel("waiting requests (mean)")
    queue.set_xlabel("simulated time (s)")
    return fig


def kv_and_batch(ts: pd.DataFrame, title: str = "") -> Figure:
    """KV cache utilisation, running batch size and busy fraction (the time a step of
    any batch size ran), per time bin."""
    fig = Figure(figsize=(11, 8), layout="constrained")
    if title:
        fig.suptitle(title)
    kv, batch, busy = fig.subplots(3, 1, sharex=True)
    _bins(kv, ts, 100 * ts["kv_utilisation"], color="C2")
    kv.set_ylabel("KV blocks used (%)")
    kv.set_ylim(0, 105)
    _bins(batch, ts, ts["batch_size"], color="C0")
    batch.set_ylabel("batch size")
    _bins(busy, ts, 100 * ts["busy_fraction"], color="C1")
    # a step running, of any batch size: 100% at light load too (not saturation)
    busy.set_ylabel("time running a step (%)")
    busy.set_ylim(0, 105)
    busy.set_xlabel("simulated time (s)")
    return fig


def save_run_plots(
    requests: pd.DataFrame,
    itl: pd.DataFrame,
    ts: pd.DataFrame,
    outdir: str | Path,
    summary: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write latency_cdfs.png, throughput_queue.png and kv_batch.png; returns their paths.
    With the run's `summary`, each is titled with the scenario and hardware and the
    latency CDFs carry the SLO bounds."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    title = run_title(summary) if summary else ""
    slo = summary["goodput"]["slo"] if summary else None
    figures = (
        latency_cdfs(requests, itl, title=title, slo_s=slo),
        throughput_and_queue(ts, title),
        kv_and_batch(ts, title),
    )
    paths = []
    for name, fig in zip(PLOT_FILES, figures, strict=True):
        path = outdir / name
        fig.savefig(path, dpi=110)
        fig.clear()
        paths.append(path)
    return paths
