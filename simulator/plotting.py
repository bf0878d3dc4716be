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
from simulator.inputs import named_runs
from simulator.metrics.headline import LABELS, other_name, readable
from simulator.metrics.plots import LOG_SPAN, latency_cdfs
from simulator.results import Results

Runs = pd.DataFrame | Mapping[str, Results] | Sequence[Results]
COST = "usd_per_million_output_tokens"
LATENCY = "ttft_p99_ms"
KNEE_METRICS = ("ttft_p99_ms", "tpot_p99_ms")
MAX_LABELS = 30  # label every point of a Pareto plot up to this many, else the front's
STABLE, OVERLOADED = "stable", "overloaded"

__all__ = [
    "as_table",
    "judgement",
    "pareto_front",
    "plot_knee",
    "plot_latency_cdfs",
    "plot_pareto",
    "plot_roofline",
    "plot_rooflines",
]


def as_table(runs: Runs, where: str = "as_table") -> pd.DataFrame:
    """A compare table (`compare_table`'s columns) from a table, a name -> Results
    mapping, or a list of Results named after their scenarios (names must differ)."""
    if isinstance(runs, pd.DataFrame):
        return runs
    return compare_table(named_runs(runs, where))


def _with_columns(table: pd.DataFrame, *asked: tuple[str, str]) -> pd.DataFrame:
    """`table` holding every column `asked` ((what asked for it, column) pairs) under the name
    asked: a column's printed header (`TTFT p99 ms`, `KV max %`) is read from the column
    it labels and back, in the asked name's unit (simulator.metrics.headline). A missing
    column is an error naming what asked for it and the columns the table has."""
    added = {}
    for what, column in asked:
        if column in table or column in added:
            continue
        values = readable(table, column)
        if values is None:
            alias = other_name(column)
            also = f" (nor {alias!r})" if alias else ""
            raise InfersimError(
                f"{what}: no column {column!r}{also} in the table; it has "
                + ", ".join(repr(str(c)) for c in table.columns)
            )
        added[column] = values
    return table.assign(**added) if added else table


def _not_empty(table: pd.DataFrame | Mapping | Sequence | Results, what: str) -> None:
    if not isinstance(table, Results) and len(table) == 0:
        raise InfersimError(f"{what}: nothing to plot (no runs given)")


def _axis_label(column: str) -> str:
    """The printed header of a column where it has the column's unit (`$/1M out tok`
    for usd_per_million_output_tokens; not `KV max %` for a fraction), else the name."""
    label, scale = LABELS.get(column, (column, 1))
    return label if scale == 1 else column


def judgement(table: pd.DataFrame) -> pd.Series:
    """Per row: `stable`, `overloaded`, or `unjudged` (too short to tell, or not judged
    at all) from the table's `overload_verdict` and `overloaded`; `stable` for every row
    of a table with neither column, which cannot say."""
    out = pd.Series(STABLE, index=table.index, name="judgement")
    if "overload_verdict" in table:
        out[table["overload_verdict"].astype(object).ne(STABLE).to_numpy()] = "unjudged"
        out[table["overload_verdict"].astype(object).eq(OVERLOADED).to_numpy()] = OVERLOADED
    if "overloaded" in table:
        out[table["overloaded"].to_numpy(dtype=bool, na_value=False)] = OVERLOADED
    return out


def _misses(table: pd.DataFrame, slo: Mapping[str, float]) -> np.ndarray:
    """True for the rows over any bound of `slo` (column -> bound; higher is worse)."""
    over = np.zeros(len(table), dtype=bool)
    for column, bound in slo.items():
        over |= table[column].astype(float).to_numpy() > bound
    return over


def _cost_latency(
    table: pd.DataFrame, cost: str, latency: str, slo: Mapping[str, float]
) -> pd.DataFrame:
    """`table` with the columns a Pareto plot reads, under the names asked."""
    return _with_columns(table, ("cost", cost), ("latency", latency), *(("slo", c) for c in slo))


def pareto_front(
    table: pd.DataFrame,
    cost: str = COST,
    latency: str = LATENCY,
    slo: Mapping[str, float] | None = None,
) -> pd.Series:
    """True for the rows no other row beats on both columns (lower is better for both):
    the runs worth choosing between. Only runs judged stable compete: an overloaded run's
    latency says how long it ran, and one too short to judge may be, so neither is on
    the front nor pushes a run off it; nor is a run over a bound of `slo` (column ->
    bound), nor one missing either value."""
    slo = dict(slo or {})
    table = _cost_latency(table, cost, latency, slo)
    x = table[cost].astype(float).to_numpy()
    y = table[latency].astype(float).to_numpy()
    eligible = np.isfinite(x) & np.isfinite(y) & (judgement(table) == STABLE).to_numpy()
    eligible &= ~_misses(table, slo)
    no_worse = (x[None, :] <= x[:, None]) & (y[None, :] <= y[:, None])
    better = (x[None, :] < x[:, None]) | (y[None, :] < y[:, None])
    dominated = (no_worse & better & eligible[None, :]).any(axis=1)
    return pd.Series(eligible & ~dominated, index=table.index, name="pareto")


def _bound(slo: Mapping[str, float], metric: str) -> float | None:
    """`metric`'s bound in `slo`, given under its name or its other one (`TTFT p99 ms`
    for ttft_p99_ms), in `metric`'s unit."""
    for name, bound in slo.items():
        if (value := readable(pd.DataFrame({name: [bound]}), metric)) is not None:
            return float(value.iloc[0])
    return None


def _log_if_wide(ax: Axes, values: np.ndarray) -> None:
    positive = values[np.isfinite(values) & (values > 0)]
    if len(positive) and positive.max() > LOG_SPAN / 10 * positive.min():
        ax.set_yscale("log")


# judgement -> how its points are ringed, and the legend's words for it
_RINGS = {
    OVERLOADED: ({"edgecolors": "red", "marker": "o"}, "overloaded"),
    "unjudged": ({"edgecolors": "darkorange", "marker": "s", "linestyles": "--"},
                 "not judged (too short to tell)"),
}  # fmt: skip


def _mark_judgement(ax: Axes, table: pd.DataFrame, x: str, y: str) -> None:
    """Ring the runs that could not keep up (their latencies grow with the run length)
    and, differently, those too short to tell whether they kept up."""
    judged = judgement(table)
    for kind, (style, words) in _RINGS.items():
        rows = table[(judged == kind).to_numpy()]
        if len(rows):
            ax.scatter(rows[x], rows[y], s=120, facecolors="none", zorder=4, label=words, **style)


def plot_pareto(
    runs: Runs,
    cost: str = COST,
    latency: str = LATENCY,
    slo_ms: float | None = None,
    title: str = "",
    slo: Mapping[str, float] | None = None,
) -> Figure:
    """Cost against latency, one point per run, each labelled (the front's alone past
    MAX_LABELS points), the Pareto front of the stable runs that meet the SLO drawn as a
    staircase. `slo_ms` draws the latency objective; `slo` maps more columns to bounds
    (`{"tpot_p99_ms": 100}`). Overloaded runs are ringed red, runs too short to judge
    orange, runs over a bound crossed: none of them is on the front. A sweep or plan
    table works too, and a column's printed header reads its column (`TTFT p99 ms`)."""
    table = as_table(runs, "plot_pareto")
    _not_empty(table, "plot_pareto")
    bounds = dict(slo or {}) | ({latency: slo_ms} if slo_ms is not None else {})
    front = pareto_front(table, cost, latency, bounds)
    table = _cost_latency(table, cost, latency, bounds)
    # a run without both values (a plan's infeasible candidate) has no point
    plotted = (table[cost].astype(float).notna() & table[latency].astype(float).notna()).to_numpy()
    table, front = table[plotted], front[plotted]
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.subplots()
    ax.scatter(table[cost], table[latency], color="C0", alpha=0.5, label="run")
    best = table[front].sort_values(cost)
    ax.plot(best[cost], best[latency], color="C1", marker="o", drawstyle="steps-post",
            label="Pareto front (stable, within the SLO)")  # fmt: skip
    shown = table if len(table) <= MAX_LABELS else best
    labels = [
        ax.annotate(name, (row[cost], row[latency]), fontsize=8, xytext=(4, 4),
                    textcoords="offset points", arrowprops=LEADER)
        for name, (_, row) in zip(_run_names(shown), shown.iterrows(), strict=True)
    ]  # fmt: skip
    _mark_judgement(ax, table, cost, latency)
    if (missed := _misses(table, bounds)).any():
        ax.scatter(table[cost][missed], table[latency][missed], marker="x", s=60,
                   color="black", zorder=5, label="misses the SLO")  # fmt: skip
    if slo_ms is not None:
        ax.axhline(slo_ms, color="grey", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
    _log_if_wide(ax, table[latency].astype(float).to_numpy())
    ax.set_xlabel(_axis_label(cost))
    ax.set_ylabel(_axis_label(latency))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.suptitle(title or f"{_axis_label(latency)} against {_axis_label(cost)}, "
                 f"{len(table)} runs ({len(best)} on the front)")  # fmt: skip
    spread_labels(fig, labels)
    return fig


def _run_names(table: pd.DataFrame) -> list[str]:
    """A label per row: a sweep point's `name`, a plan candidate's GPU, tp and replicas,
    else the index (a compare table's run names)."""
    if "name" in table:
        return [str(n) for n in table["name"]]
    if {"gpu", "tp", "replicas"} <= set(table.columns):
        # counts read back from plan.csv are floats where a row (infeasible) has none
        return [f"{r.gpu} tp{int(r.tp)} x{int(r.replicas)}" for r in table.itertuples()]
    return [str(n) for n in table.index]


def plot_knee(
    table: pd.DataFrame,
    load: str,
    metrics: Sequence[str] = KNEE_METRICS,
    by: str | None = None,
    slo: Mapping[str, float] | None = None,
    title: str = "",
) -> Figure:
    """Each metric against a swept load column, one line per value of `by`: where the
    curve turns up is the load a configuration can carry. `slo` maps a metric column to
    its bound (a dashed line); overloaded runs are ringed red, runs too short to judge
    orange (simulator.metrics.overload: their latencies may still be climbing). A
    column's printed header reads its column (`TTFT p99 ms` for ttft_p99_ms)."""
    _not_empty(table, "plot_knee")
    table = _with_columns(
        table, ("load", load), *([("by", by)] if by is not None else []),
        *(("slo", m) for m in slo or {}), *(("metrics", m) for m in metrics),
    )  # fmt: skip
    fig = Figure(figsize=(5.5 * len(metrics), 4.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(metrics)))
    groups = [(None, table)] if by is None else list(table.groupby(by, sort=False))
    for ax, metric in zip(axes, metrics, strict=True):
        for i, (name, frame) in enumerate(groups):
            frame = frame.sort_values(load)
            ax.plot(frame[load], frame[metric], marker="o", color=f"C{i % 10}",
                    label=None if by is None else f"{by}={name}")  # fmt: skip
        _mark_judgement(ax, table, load, metric)
        if (bound := _bound(slo or {}, metric)) is not None:
            ax.axhline(bound, color="grey", ls="--", lw=1, label=f"SLO {bound:g}")
        _log_if_wide(ax, table[metric].astype(float).to_numpy())
        ax.set_xlabel(_axis_label(load))
        ax.set_ylabel(_axis_label(metric))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(title or f"{', '.join(map(_axis_label, metrics))} against "
                 f"{_axis_label(load)}" + (f" by {by}" if by else ""))  # fmt: skip
    return fig


def plot_latency_cdfs(runs: Mapping[str, Results] | Sequence[Results], title: str = "") -> Figure:
    """TTFT, TPOT, ITL and E2E CDFs of several runs overlaid, one line per name, with the
    SLO bounds when every run has the same; titled with the runs' names unless `title`
    says otherwise. A list of Results is named after their scenarios."""
    _not_empty(runs, "plot_latency_cdfs")
    runs = named_runs(runs, "plot_latency_cdfs")
    slos = [r.summary()["goodput"]["slo"] for r in runs.values()]
    return latency_cdfs(
        {name: r.requests for name, r in runs.items()},
        {name: r.itl for name, r in runs.items()},
        title=title or f"latency of {', '.join(map(str, runs))}",
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


def plot_throughput_and_cost(results: Mapping[str, Results] | Sequence[Results]) -> Figure:
    """Output tokens/s over simulated time overlaid, then each run's mean output tokens/s
    and $ per 1M output tokens as bars (a list of Results named after their scenarios)."""
    _not_empty(results, "plot_throughput_and_cost")
    results = named_runs(results, "plot_throughput_and_cost")
    fig = Figure(figsize=(11, 8), layout="constrained")
    fig.suptitle(f"throughput and cost of {', '.join(map(str, results))}")
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
        ("tokens", "steady_output_tokens_per_s", "output tokens/s (steady state)"),
        ("cost", COST, "$ per 1M output tokens (steady state; whole run if none)"),
    ):
        colors = [f"C{i % 10}" for i in range(len(names))]  # as the lines above
        axes[key].barh(names, table[column].astype(float).fillna(0), color=colors)
        axes[key].invert_yaxis()
        axes[key].set_title(title)
    for ax in axes.values():
        ax.grid(alpha=0.3)
    return fig
