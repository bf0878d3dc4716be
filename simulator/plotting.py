"""Figures that compare runs: cost against latency, latency against load, rooflines.

The single-run figures are methods of `Results` (`plot_latency_cdfs`, ...); this module
draws what a capacity question needs across many runs. Every function returns a
matplotlib Figure built without pyplot, as `simulator.metrics.plots` does, so nothing
global is left behind; in Jupyter run `%matplotlib inline` once and a returned Figure
displays itself. Importing this module imports matplotlib, which is why `simulator`
does not import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.errors import InfersimError
from hardware_models.op_cost import OpCost
from hardware_models.plot_labels import LEADER, spread_labels
from hardware_models.roofline_plot import plot_roofline
from simulator.compare import compare_table
from simulator.metrics.plots import LOG_SPAN, latency_cdfs
from simulator.results import Results

Runs = pd.DataFrame | Mapping[str, Results] | Sequence[Results]
COST = "$/1M out tok"
LATENCY = "TTFT p99 ms"
KNEE_METRICS = ("TTFT p99 ms", "TPOT p99 ms")
# The defaults' names in sweep and plan tables (simulator.sweep.METRICS, plan_capacity),
# which name their columns apart from compare tables (simulator.compare).
_SWEEP_NAMES = {
    COST: "usd_per_million_output_tokens",
    LATENCY: "ttft_p99_ms",
    "TPOT p99 ms": "tpot_p99_ms",
}

__all__ = [
    "as_table",
    "pareto_front",
    "plot_knee",
    "plot_latency_cdfs",
    "plot_pareto",
    "plot_roofline",
    "plot_rooflines",
]


def as_table(runs: Runs) -> pd.DataFrame:
    """A compare table (`compare_table`'s columns) from a table, a name -> Results
    mapping, or a list of Results named after their scenarios (names must differ)."""
    if isinstance(runs, pd.DataFrame):
        return runs
    if isinstance(runs, Mapping):
        return compare_table(runs)
    named = {r.scenario.name: r for r in runs}
    if len(named) != len(runs):
        raise ValueError("runs share scenario names; pass a mapping of name -> Results")
    return compare_table(named)


def _column_of(table: pd.DataFrame, column: str, what: str) -> str:
    """`column` as `table` names it: a compare table's name (COST, LATENCY, ...) is read
    under its sweep and plan name when only that is there. A missing column is an error
    naming `what` asked for it and the columns the table has."""
    if column in table:
        return column
    alias = _SWEEP_NAMES.get(column)
    if alias in table:
        return alias
    also = f" (nor {alias!r})" if alias else ""
    raise InfersimError(
        f"{what}: no column {column!r}{also} in the table; it has "
        + ", ".join(repr(str(c)) for c in table.columns)
    )


def pareto_front(table: pd.DataFrame, cost: str = COST, latency: str = LATENCY) -> pd.Series:
    """True for the rows no other row beats on both columns (lower is better for both):
    the runs worth choosing between. Rows missing either value are never on the front."""
    cost = _column_of(table, cost, "cost")
    latency = _column_of(table, latency, "latency")
    x = table[cost].astype(float).to_numpy()
    y = table[latency].astype(float).to_numpy()
    valid = np.isfinite(x) & np.isfinite(y)
    no_worse = (x[None, :] <= x[:, None]) & (y[None, :] <= y[:, None])
    better = (x[None, :] < x[:, None]) | (y[None, :] < y[:, None])
    dominated = (no_worse & better & valid[None, :]).any(axis=1)
    return pd.Series(valid & ~dominated, index=table.index, name="pareto")


def _log_if_wide(ax: Axes, values: np.ndarray) -> None:
    positive = values[np.isfinite(values) & (values > 0)]
    if len(positive) and positive.max() > LOG_SPAN / 10 * positive.min():
        ax.set_yscale("log")


def _mark_overloaded(ax: Axes, table: pd.DataFrame, x: str, y: str, label: bool) -> None:
    """Ring the runs that could not keep up: their latencies grow with the run length."""
    if "overloaded" not in table:
        return
    over = table[table["overloaded"].to_numpy(dtype=bool, na_value=False)]
    ax.scatter(
        over[x], over[y], s=110, facecolors="none", edgecolors="red", zorder=4,
        label="overloaded" if label and len(over) else None,
    )  # fmt: skip


def plot_pareto(
    runs: Runs,
    cost: str = COST,
    latency: str = LATENCY,
    slo_ms: float | None = None,
    title: str = "",
) -> Figure:
    """Cost against latency, one point per run, the Pareto front drawn as a staircase
    and labelled; `slo_ms` draws the latency objective. Overloaded runs are ringed. A
    sweep or plan table works too: the default columns are read under its names."""
    table = as_table(runs)
    cost, latency = _column_of(table, cost, "cost"), _column_of(table, latency, "latency")
    front = pareto_front(table, cost, latency)
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.subplots()
    ax.scatter(table[cost], table[latency], color="C0", alpha=0.5, label="run")
    best = table[front].sort_values(cost)
    ax.plot(best[cost], best[latency], color="C1", marker="o", drawstyle="steps-post",
            label="Pareto front")  # fmt: skip
    labels = [
        ax.annotate(name, (row[cost], row[latency]), fontsize=8, xytext=(4, 4),
                    textcoords="offset points", arrowprops=LEADER)
        for name, (_, row) in zip(_run_names(best), best.iterrows(), strict=True)
    ]  # fmt: skip
    _mark_overloaded(ax, table, cost, latency, label=True)
    if slo_ms is not None:
        ax.axhline(slo_ms, color="grey", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
    _log_if_wide(ax, table[latency].astype(float).to_numpy())
    ax.set_xlabel(cost)
    ax.set_ylabel(latency)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    spread_labels(fig, labels)
    return fig


def _run_names(table: pd.DataFrame) -> list[str]:
    """A label per row: a sweep point's `name`, a plan candidate's GPU, tp and replicas,
    else the index (a compare table's run names)."""
    if "name" in table:
        return [str(n) for n in table["name"]]
    if {"gpu", "tp", "replicas"} <= set(table.columns):
        return [f"{r.gpu} tp{r.tp} x{r.replicas}" for r in table.itertuples()]
    return [str(n) for n in table.index]


def plot_knee(
    table: pd.DataFrame,
    load: str,
    metrics: Sequence[str] = KNEE_METRICS,
    by: str | None = None,
    slo: Mapping[str, float] | None = None,
) -> Figure:
    """Each metric against a swept load column, one line per value of `by`: where the
    curve turns up is the load a configuration can carry. `slo` maps a metric column to
    its bound (a dashed line); overloaded runs are ringed. The default metrics are read
    under a sweep table's names when it has those instead."""
    load = _column_of(table, load, "load")
    if by is not None:
        by = _column_of(table, by, "by")
    slo = {_column_of(table, m, "slo"): bound for m, bound in (slo or {}).items()}
    metrics = [_column_of(table, m, "metrics") for m in metrics]
    fig = Figure(figsize=(5.5 * len(metrics), 4.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    groups = [(None, table)] if by is None else list(table.groupby(by, sort=False))
    for ax, metric in zip(axes, metrics, strict=True):
        for i, (name, frame) in enumerate(groups):
            frame = frame.sort_values(load)
            ax.plot(frame[load], frame[metric], marker="o", color=f"C{i % 10}",
                    label=None if by is None else f"{by}={name}")  # fmt: skip
        _mark_overloaded(ax, table, load, metric, label=True)
        if metric in slo:
            ax.axhline(slo[metric], color="grey", ls="--", lw=1, label=f"SLO {slo[metric]:g}")
        _log_if_wide(ax, table[metric].astype(float).to_numpy())
        ax.set_xlabel(load)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    return fig


def plot_latency_cdfs(runs: Mapping[str, Results], title: str = "") -> Figure:
    """TTFT, TPOT, ITL and E2E CDFs of several runs overlaid, one line per name, with the
    SLO bounds when every run has the same."""
    slos = [r.summary()["goodput"]["slo"] for r in runs.values()]
    return latency_cdfs(
        {name: r.requests for name, r in runs.items()},
        {name: r.itl for name, r in runs.items()},
        title=title,
        slo_s=slos[0] if slos and all(s == slos[0] for s in slos) else None,
    )


def plot_rooflines(
    gpus: Sequence[AcceleratorSpec],
    costs: Callable[[AcceleratorSpec], Sequence[OpCost]] | None = None,
    ncols: int = 3,
) -> Figure:
    """One roofline per chip on shared axes, so slopes and ceilings compare at a glance.
    `costs(gpu)` returns the operators to place on that chip, priced for it."""
    nrows = -(-len(gpus) // ncols)
    fig = Figure(figsize=(5.5 * ncols, 4.2 * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False))
    for ax, gpu in zip(axes.flat, gpus, strict=False):
        plot_roofline(gpu, costs(gpu) if costs else (), ax=ax)
    for ax in axes.flat[len(gpus) :]:
        ax.set_visible(False)
    return fig


def plot_throughput_and_cost(results: Mapping[str, Results]) -> Figure:
    """Output tokens/s over simulated time overlaid, then each run's mean output tokens/s
    and $ per 1M output tokens as bars."""
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplot_mosaic([["time", "time"], ["tokens", "cost"]])
    for name, result in results.items():
        ts = result.timeseries
        if not ts.empty:
            edges = np.append(ts["t_start"].to_numpy(), ts["t_end"].to_numpy()[-1:])
            axes["time"].stairs(ts["output_tokens_per_s"].to_numpy(), edges, label=name,
                                baseline=None)  # fmt: skip
    axes["time"].set(title="output tokens/s", xlabel="simulated time (s)")
    axes["time"].legend(fontsize="small")
    table = compare_table(results)
    names = [str(n) for n in table.index]
    for key, column, title in (
        ("tokens", "steady out tok/s", "output tokens/s (steady state)"),
        ("cost", "$/1M out tok", "$ per 1M output tokens (steady state; whole run if none)"),
    ):
        colors = [f"C{i % 10}" for i in range(len(names))]  # as the lines above
        axes[key].barh(names, table[column].astype(float).fillna(0), color=colors)
        axes[key].invert_yaxis()
        axes[key].set_title(title)
    for ax in axes.values():
        ax.grid(alpha=0.3)
    return fig
