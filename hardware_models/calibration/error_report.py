"""Predicted-vs-measured error tables and plots.

Errors are relative to the measurement: e = (predicted - measured) / measured, so e = +0.2
means the model is 20% slow (over-predicts the time). Per group:

- `mape`: mean |e|; `median_ape`: median |e|; `p90_ape`: 90th percentile of |e|
- `bias`: mean e (signed; > 0 = the model predicts too long on average)
- `mean_error`: signed error of the mean, (mean predicted - mean measured) / mean measured,
  which is what a sum of many such operators (a whole step) would be off by.

All are fractions (0.2 = 20%).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.errors import InfersimError

METRICS: tuple[str, ...] = ("n", "mape", "median_ape", "p90_ape", "bias", "mean_error")
PREDICTED = "predicted_s"
MEASURED = "measured_s"


def summarise_errors(measured: Sequence[float], predicted: Sequence[float]) -> dict[str, float]:
    """The METRICS of one group; rows where either value is NaN are left out."""
    m = np.asarray(measured, dtype=float)
    p = np.asarray(predicted, dtype=float)
    keep = np.isfinite(m) & np.isfinite(p) & (m > 0)
    m, p = m[keep], p[keep]
    if len(m) == 0:
        return {"n": 0, **{k: float("nan") for k in METRICS[1:]}}
    e = (p - m) / m
    ape = np.abs(e)
    return {
        "n": len(m),
        "mape": float(ape.mean()),
        "median_ape": float(np.median(ape)),
        "p90_ape": float(np.quantile(ape, 0.9)),
        "bias": float(e.mean()),
        "mean_error": float((p.mean() - m.mean()) / m.mean()),
    }


def size_bucket(size: pd.Series | np.ndarray, width: int = 4) -> pd.Series:
    """Label each size with its log2 bucket of `width` octaves: '2^28-2^32' holds
    2^28 <= size < 2^32. Returned as an ordered categorical so tables sort by size."""
    s = np.asarray(size, dtype=float)
    lo = np.floor(np.log2(np.maximum(s, 1.0)) / width).astype(int) * width
    labels = np.array([f"2^{a}-2^{a + width}" for a in lo], dtype=object)
    order = [f"2^{a}-2^{a + width}" for a in sorted(set(lo.tolist()))]
    index = size.index if isinstance(size, pd.Series) else None
    return pd.Series(pd.Categorical(labels, categories=order, ordered=True), index=index)


def add_errors(table: pd.DataFrame, predicted: pd.Series | None = None) -> pd.DataFrame:
    """A copy of `table` with `predicted_s` and the signed relative `error` of each row."""
    out = table.copy()
    if predicted is not None:
        out[PREDICTED] = predicted
    if PREDICTED not in out:
        raise InfersimError(f"no {PREDICTED} column and no predictions given")
    out["error"] = (out[PREDICTED] - out[MEASURED]) / out[MEASURED]
    return out


def error_table(
    table: pd.DataFrame,
    predicted: pd.Series | None = None,
    by: Sequence[str] = ("gpu", "op_class"),
    bucket_width: int | None = None,
) -> pd.DataFrame:
    """One row of METRICS per group of `by` (plus a `size_bucket` of `bucket_width` octaves
    of the `size` column when given). Rows without a prediction (NaN) are not counted."""
    frame = add_errors(table, predicted)
    keys = list(by)
    if bucket_width is not None:
        frame["size_bucket"] = size_bucket(frame["size"], bucket_width)
        keys.append("size_bucket")
    rows = []
    if not keys:
        return pd.DataFrame([summarise_errors(frame[MEASURED], frame[PREDICTED])])
    for key, group in frame.groupby(keys, sort=True, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        stats = summarise_errors(group[MEASURED], group[PREDICTED])
        if stats["n"]:
            rows.append({**dict(zip(keys, key, strict=True)), **stats})
    out = pd.DataFrame(rows, columns=[*keys, *METRICS])
    out["n"] = out["n"].astype(int)
    return out


def to_markdown(table: pd.DataFrame, percent: Sequence[str] = METRICS[1:]) -> str:
    """A GitHub markdown table; the `percent` columns are shown as signed/unsigned %."""
    cols = list(table.columns)
    signed = {"bias", "mean_error"}

    def cell(col: str, value: object) -> str:
        if col in percent and isinstance(value, int | float | np.floating):
            if not np.isfinite(value):
                return ""
            return f"{100 * value:+.1f}%" if col in signed else f"{100 * value:.1f}%"
        return str(value)

    lines = [
        "| " + " | ".join(cols) + " |",
        "|" + "|".join("---:" if c in percent or c == "n" else "---" for c in cols) + "|",
    ]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(cell(c, v) for c, v in zip(cols, row, strict=True)) + " |")
    return "\n".join(lines) + "\n"


def plot_predicted_vs_measured(
    table: pd.DataFrame,
    path: str | Path,
    predicted: pd.Series | None = None,
    max_points_per_panel: int = 20000,
    seed: int = 0,
) -> Path:
    """Log-log scatter of predicted against measured seconds, one panel per op class,
    colour per GPU, with the y = x line and +/-20% bands. Large panels are subsampled
    (deterministically) to `max_points_per_panel` points."""
    import matplotlib as mpl
    from matplotlib.figure import Figure

    frame = add_errors(table, predicted)
    frame = frame[np.isfinite(frame[PREDICTED]) & (frame[PREDICTED] > 0)]
    classes = list(dict.fromkeys(frame["op_class"]))
    if not classes:
        raise InfersimError("nothing to plot: no row has a prediction")
    cols = min(4, len(classes))
    rows = int(np.ceil(len(classes) / cols))
    fig = Figure(figsize=(4.2 * cols, 4.0 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    # Draw the GPU with more rows first so the smaller set stays visible on top.
    gpus = list(frame["gpu"].value_counts().index)
    palette = mpl.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = dict(zip(sorted(gpus), palette, strict=False))
    for ax, op in zip(axes.flat, classes, strict=False):
        sub = frame[frame["op_class"] == op]
        if len(sub) > max_points_per_panel:
            sub = sub.sample(max_points_per_panel, random_state=seed)
        for gpu in gpus:
            g = sub[sub["gpu"] == gpu]
            if len(g):
                stats = summarise_errors(g[MEASURED], g[PREDICTED])
                ax.scatter(
                    g[MEASURED] * 1e3,
                    g[PREDICTED] * 1e3,
                    s=3,
                    alpha=0.3,
                    color=colours.get(gpu),
                    label=f"{gpu} (MAPE {100 * stats['mape']:.0f}%)",
                    rasterized=True,
                )
        lo = float(min(sub[MEASURED].min(), sub[PREDICTED].min()) * 1e3)
        hi = float(max(sub[MEASURED].max(), sub[PREDICTED].max()) * 1e3)
        line = np.array([lo, hi])
        ax.plot(line, line, "k-", lw=1)
        ax.plot(line, line * 1.2, "k:", lw=0.8)
        ax.plot(line, line / 1.2, "k:", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("measured (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.legend(fontsize=7, loc="upper left", markerscale=3)
    for ax in list(axes.flat)[len(classes) :]:
        ax.axis("off")
    fig.suptitle("Predicted vs measured operator time (dotted: ±20%)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
