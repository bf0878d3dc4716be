"""Sweeps: one scenario run over every combination of its `sweep.grid`, in parallel, each
point reduced to one row of headline numbers.

Points run on local processes (a ProcessPoolExecutor) or on a Dask cluster (a
`distributed.Client`). A worker receives a plain scenario dict and sends back the summary
dict and the point's warnings as text (raised again here, each naming its point), never
DataFrames, so a point costs kilobytes to ship. Each finished point is written
at once to <outdir>/points/<id>.json (atomically), so an interrupted sweep loses nothing and
`resume` runs only the points without a file. A point that raises (the model does not
fit, ...) is a row with status 'failed' and its one-line error, and the others carry on.
A local worker that dies (SIGKILL, out of memory) breaks its pool: the points it left are
rerun on a fresh one, and a point that kills its worker on every try ends 'failed' with
that reason. A point Dask gives up on is a row with status 'lost' and no file, so
`resume` reruns it; resume refuses point files of another scenario or another build of
infersim (`simulator.build_id`). Every point uses the scenario's seed: its summary is the
same whichever worker runs it. `run_parallel` (simulator/executors.py), the executor, also runs
the capacity planner's candidates and the shards of one big run.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from pydantic import ValidationError
from tqdm import tqdm

from hardware_models.errors import InfersimError
from hardware_models.warning_scope import recording, warn
from simulator.build_id import build_id
from simulator.executors import JobError, job_error, run_parallel
from simulator.metrics.headline import COUNTS, HEADLINE, PER_USD, headline_row
from simulator.metrics.headline import get as _get
from simulator.metrics.writer import write_whole
from simulator.progress import bar_options
from simulator.provenance import input_files, named_from
from simulator.scenario import (
    BATCH_LIMITS,
    Scenario,
    SLOSection,
    describe_errors,
    fields_overlap,
    override_key,
    set_path,
)
from simulator.simulation import run_simulation
from simulator.ways_out import option

if TYPE_CHECKING:
    from distributed import Client
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

RATE_AXIS = "workload.arrivals.rate_per_s"
PLOT_FILES = ("sweep_latency.png", "sweep_throughput.png")
_UNSWEPT = ("name", "sweep", "variants", "base_dir")
# Fields that do not change a point's numbers: left out when resume checks a point file.
_NOT_RESULTS = ("name", "description", "output", "base_dir")
# The headline columns, named and scaled as compare and plan tables name them.
METRICS = HEADLINE
_COUNTS = COUNTS
# The batch limits each point ran with, from its summary's provenance: unset, they are
# vLLM's defaults for the point's GPU, so a sweep over GPUs runs each with its own.
_RAN_WITH = ("provenance", "scenario", "serving")


@dataclass(frozen=True)
class SweepPoint:
    """One combination of grid values (on one variant): `data` is the validated scenario
    as the dict a worker receives; `id` hashes only the variant and the values, so it names
    the same point across reruns."""

    id: str
    name: str
    variant: str | None
    values: dict[str, Any]
    data: dict[str, Any]

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a point file must match to be reused by resume."""
        return {k: v for k, v in self.data.items() if k not in _NOT_RESULTS}


# ---- the grid -------------------------------------------------------------------------------
def expand_grid(scenario: Scenario) -> list[SweepPoint]:
    """Every combination of sweep.grid, for each variant when there are variants. Each point
    is validated now, so a bad key or value stops the sweep before any point runs."""
    where = scenario.name
    if scenario.sweep is None:
        raise InfersimError(
            f"{where}: no sweep.grid to run; add sweep: {{grid: {{field.path: [values]}}}}"
        )
    grid = scenario.sweep.grid
    for key, values in grid.items():
        root = key.split(".")[0]
        if root in _UNSWEPT:
            raise InfersimError(f"{where}: sweep.grid.{key}: {root} cannot be swept")
        if not values:
            raise InfersimError(f"{where}: sweep.grid.{key}: needs at least one value")
        if twice := [v for i, v in enumerate(values) if v in values[:i]]:
            raise InfersimError(f"{where}: sweep.grid.{key}: {twice[0]!r} appears twice")
        if fixed := [o for o in scenario.overrides if fields_overlap(override_key(o), key)]:
            raise InfersimError(
                f"{where}: --set {fixed[0]} fixes a field sweep.grid.{key} sweeps; to sweep "
                f"other values give them as --set 'sweep.grid.{key}=[...]'"
            )
    short = _short_names(list(grid))
    return [
        _point(base, base.name if scenario.variants else None, values, short, where)
        for base in scenario.expand()
        for values in (dict(zip(grid, c, strict=True)) for c in itertools.product(*grid.values()))
    ]


def _short_names(keys: list[str]) -> dict[str, str]:
    """The last path component names an axis, unless two axes share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: s if last.count(s) == 1 else k for k, s in zip(keys, last, strict=True)}


def _text(value: Any) -> str:
    return str(value) if isinstance(value, str | int | float | bool) else json.dumps(value)


def _point(
    base: Scenario, variant: str | None, values: dict[str, Any], short: dict[str, str], where: str
) -> SweepPoint:
    label = " ".join(f"{short[k]}={_text(v)}" for k, v in values.items())
    name = f"{variant}: {label}" if variant else label
    data = base.model_dump(mode="json", exclude={"variants", "sweep"})
    data |= {"base_dir": base.base_dir, "name": name}
    data["output"] = {**data["output"], "progress": False}
    for key, value in values.items():
        set_path(data, key, value, f"{where}: sweep.grid.{key}")
    try:
        point = Scenario.model_validate(data)
    except ValidationError as exc:
        raise InfersimError(_grid_error(exc, values, name, where)) from None
    # a misspelt GPU, node or model in the grid stops the sweep now, not as failed points
    point._check_preset_names(f"{where}: sweep point {name!r}")
    identity = json.dumps({"variant": variant, "values": values}, sort_keys=True, default=str)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return SweepPoint(digest, name, variant, values, data)


def _blame(key: str, loc: tuple) -> int:
    """How much of a grid key an error location covers (union tags and indices skipped)."""
    parts = key.split(".")
    path = [str(p) for p in loc if str(p) in parts]
    return len(path) if path == parts[: len(path)] else 0


def _grid_error(exc: ValidationError, values: Mapping[str, Any], name: str, where: str) -> str:
    message = describe_errors(exc, Scenario)
    score, key = max((_blame(k, e["loc"]), k) for e in exc.errors() for k in values)
    if score == 0:
        return f"{where}: sweep point {name!r}: {message}"
    return f"{where}: sweep.grid.{key}: {message.removeprefix(f'{key}: ')}"


# ---- one point, in a worker -----------------------------------------------------------------
POINT_SOURCE = "sweep point"  # what a point's load warnings name, as its scenario's source


def run_point(data: dict[str, Any], overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """Simulate one point wherever it is sent; `overrides` are the sweep's --set, recorded
    in the point's provenance (the point's data already has them applied). Never raises:
    any exception becomes a failed outcome, so one bad point costs one row, not the sweep.
    Its warnings name files by their full paths, as printed (_write_point names them from
    the scenario's folder)."""
    started, cpu = time.perf_counter(), time.process_time()
    with recording() as caught:  # carried back, not shown here; per thread (Dask's)
        try:
            scenario = Scenario.from_dict(data, source=POINT_SOURCE, overrides=overrides)
            summary = run_simulation(scenario, progress=False).summary()
        except Exception as exc:
            return {**_failure("failed", exc, time.perf_counter() - started),
                    "warnings": warning_texts(caught)}  # fmt: skip
    run = {k: v for k, v in summary["run"].items() if k != "wall"}  # the only varying part
    return {
        "status": "ok",
        "error": None,
        "detail": None,
        "warnings": warning_texts(caught),
        "wall_s": time.perf_counter() - started,
        # CPU seconds of the worker: below wall_s when workers outnumber free cores.
        "cpu_s": time.process_time() - cpu,
        "summary": {**summary, "run": run},
    }


def warning_texts(caught: list[warnings.WarningMessage]) -> list[str]:
    """A job's recorded InfersimWarnings as the text a worker sends back, each once."""
    return list(dict.fromkeys(str(w.message) for w in caught))


def warn_named(name: str, texts: Iterable[str] | None) -> None:
    """A job's warnings (`warning_texts`), raised where the sweep or plan runs, each
    naming its job (`point NAME`, `candidate GPU tpN`)."""
    for text in texts or ():
        warn(f"{name}: {text}", stacklevel=3)


def _said_on_loading(text: str, loaded: Sequence[str]) -> bool:
    """A point's load warning (`sweep point: ...`) that loading the swept scenario already
    raised (`<its file>: ...`, Scenario.load_warnings): the same words over the same
    fields."""
    body = text.removeprefix(f"{POINT_SOURCE}: ")
    return body != text and any(said.endswith(f": {body}") for said in loaded)


def _warn_in_point_order(
    points: Sequence[SweepPoint], records: Mapping[str, dict[str, Any]], loaded: Sequence[str]
) -> None:
    """The points' warnings in grid order, not in the order they finished (which changes
    from run to run); one every point raised (a build warning of the scenario's) once,
    and none that loading the scenario raised already (`loaded`, its load_warnings): they
    stay in each point's summary, but the terminal shows them once."""
    new = {
        p.id: [
            text
            for text in records[p.id].get("warnings") or []
            if not _said_on_loading(text, loaded)
        ]
        for p in points
        if p.id in records
    }
    texts = list(new.values())
    common = set.intersection(*map(set, texts)) if len(texts) > 1 else set()
    if common:
        warn_named("every point", [text for text in texts[0] if text in common])
    for point in points:
        if point.id in new:
            own = [text for text in new[point.id] if text not in common]
            warn_named(f"point {point.name}", own)


def _failure(status: str, exc: BaseException, wall_s: float | None) -> dict[str, Any]:
    return _outcome(job_error(status, exc), wall_s)


def _outcome(error: JobError, wall_s: float | None = None) -> dict[str, Any]:
    """A point that did not simulate, as the record fields of one that did."""
    return {"status": error.status, "error": error.error, "detail": error.detail,
            "warnings": [], "wall_s": wall_s, "cpu_s": None, "summary": None}  # fmt: skip


# ---- point files ----------------------------------------------------------------------------
def _point_file(outdir: Path, point_id: str) -> Path:
    return outdir / "points" / f"{point_id}.json"


def _write_point(outdir: Path, record: Mapping[str, Any], folder: str) -> None:
    """Write then rename, so a sweep killed mid-write leaves no half file for resume. Its
    warnings name files from the scenario's `folder`, as its summary does (a resumed
    point prints them so)."""
    kept = {**record, "warnings": [named_from(folder, w) for w in record["warnings"]]}
    text = json.dumps(kept, sort_keys=True, indent=2, allow_nan=False) + "\n"
    write_whole(_point_file(outdir, record["id"]), lambda path: path.write_text(text))


def _first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            if found := _first_difference(a.get(key), b.get(key), f"{prefix}{key}."):
                return found
        return None
    return None if a == b else prefix.rstrip(".") or "(top level)"


def _load_done(outdir: Path, points: Iterable[SweepPoint]) -> dict[str, dict[str, Any]]:
    """Point files of this grid written earlier; one written for another scenario is an
    error, not a silent mix of two sweeps."""
    done = {}
    for point in points:
        path = _point_file(outdir, point.id)
        if not path.is_file():
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InfersimError(f"{path}: unreadable point file ({exc}); delete it") from None
        way_out = f"pass {option('overwrite=True', '--overwrite')} or {_another_outdir()}"
        if (changed := _first_difference(record.get("scenario"), point.fingerprint)) is not None:
            raise InfersimError(
                f"{path} was written for a different scenario ({changed} differs); {way_out}"
            )
        if (edited := _edited_input(record, point)) is not None:
            raise InfersimError(
                f"{path} was run on other contents of {edited}: its numbers may differ; {way_out}"
            )
        if (written_by := record.get("build")) != build_id():
            raise InfersimError(
                f"{path} was written by infersim {written_by or 'of an earlier version'}, "
                f"this is {build_id()}: its numbers may differ from this build's; {way_out}"
            )
        done[point.id] = record
    return done


def _edited_input(record: dict[str, Any], point: SweepPoint) -> str | None:
    """The first file the point reads (a trace, a profile: provenance.inputs) whose
    contents are not those its point file ran on, or None; a failed point ran on none."""
    if not (summary := record.get("summary")):
        return None
    ran_on = summary.get("provenance", {}).get("inputs", [])
    now = input_files(Scenario.model_validate(point.data))
    for before, after in itertools.zip_longest(ran_on, now):
        if before != after:
            return f"{(after or before)['field']} ({(after or before)['path']})"
    return None


def _another_outdir() -> str:
    return f"another {option('outdir', '-o')}"


def _prepare(outdir: Path, *, resume: bool, overwrite: bool) -> None:
    """Same rule as `run`: existing results are replaced only when asked to."""
    if resume and overwrite:
        raise InfersimError("resume and overwrite exclude each other")
    if outdir.exists() and not outdir.is_dir():
        raise InfersimError(f"{outdir} exists and is not a directory; choose {_another_outdir()}")
    points = outdir / "points"
    if outdir.is_dir() and any(outdir.iterdir()):
        if resume and not points.is_dir():
            raise InfersimError(
                f"{outdir} holds no sweep points to resume; choose {_another_outdir()}"
            )
        if not resume and not overwrite:
            flags = option("overwrite=True, resume=True", "--overwrite, --resume")
            raise InfersimError(
                f"{outdir} already has results; pass {flags} or {_another_outdir()}"
            )
        if overwrite:  # remove only what a sweep writes
            for path in points.glob("*") if points.is_dir() else ():
                path.unlink()
            for name in ("sweep.parquet", "sweep.csv", *PLOT_FILES):
                (outdir / name).unlink(missing_ok=True)
    points.mkdir(parents=True, exist_ok=True)


# ---- the table ------------------------------------------------------------------------------
def _cell(value: Any) -> Any:
    """Grid values as table cells: scalars as they are, lists and mappings as JSON."""
    return value if value is None or isinstance(value, str | int | float | bool) else _text(value)


def sweep_table(points: Sequence[SweepPoint], records: Mapping[str, Mapping]) -> pd.DataFrame:
    """One row per point, in grid order: grid values, status, error, headline metrics."""
    rows = []
    for point in points:
        record = records[point.id]
        summary = record.get("summary")
        row: dict[str, Any] = {"point": point.id, "name": point.name}
        if point.variant is not None:
            row["variant"] = point.variant
        row |= {key: _cell(value) for key, value in point.values.items()}
        row |= {"status": record["status"], "error": record["error"]}
        row |= {name: _get(summary, (*_RAN_WITH, name)) for name in BATCH_LIMITS}
        row |= headline_row(summary, tuple(c for c, _, _ in METRICS))
        # at the steady state, as the printed throughput and $/1M output tokens: not the
        # whole run's mean, which counts the drain (None without a steady state)
        steady, per_hour = row["steady_output_tokens_per_s"], row["usd_per_hour"]
        row[PER_USD] = steady / per_hour if steady is not None and per_hour else None
        row["cost_basis"] = _get(summary, ("cost", "basis"))
        row["overloaded"] = _get(summary, ("overloaded",))
        row["overload_verdict"] = _get(summary, ("overload_verdict",))
        row["wall_s"] = record.get("wall_s")
        row["cpu_s"] = record.get("cpu_s")
        rows.append(row)
    table = pd.DataFrame(rows)
    floats = [c for c, _, _ in METRICS if c not in _COUNTS] + [PER_USD, "wall_s", "cpu_s"]
    table[floats] = table[floats].astype(float)
    table[[*_COUNTS, *BATCH_LIMITS]] = table[[*_COUNTS, *BATCH_LIMITS]].astype("Int64")
    table["overloaded"] = table["overloaded"].astype("boolean")
    return table


# ---- plots ----------------------------------------------------------------------------------
def sweep_axes(scenario: Scenario) -> list[str]:
    """The table columns a sweep varies: the variant, when there are variants, and the grid
    keys."""
    grid = scenario.sweep.grid if scenario.sweep is not None else {}
    return (["variant"] if scenario.variants else []) + list(grid)


def load_axis(table: pd.DataFrame, axes: Sequence[str]) -> str | None:
    """The rate-like axis plots put on x: the arrival rate, else the first numeric axis."""
    if RATE_AXIS in axes:
        return RATE_AXIS
    for axis in axes:
        column = table[axis]
        if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
            return axis
    return None


def _configurations(
    table: pd.DataFrame, axes: Sequence[str]
) -> tuple[str, list[tuple[str, pd.DataFrame]]]:
    """The x column and, per configuration of the other axes, its successful points."""
    ok = table[table["status"] == "ok"]
    load = load_axis(table, axes)
    if load is None:
        return "name", [("", ok)]
    others = [a for a in axes if a != load]
    if not others:
        return load, [("", ok.sort_values(load))]
    short = _short_names(others)
    groups = ok.groupby(others, sort=False, dropna=False)
    return load, [
        (" ".join(f"{short[a]}={v}" for a, v in zip(others, key, strict=True)), g.sort_values(load))
        for key, g in groups
    ]


def _draw(ax: Axes, x: str, groups: list[tuple[str, pd.DataFrame]], column: str) -> None:
    """One line per configuration; overloaded points crossed out; log y over wide spans."""
    marked = False
    for label, frame in groups:
        ax.plot(frame[x], frame[column], marker="o", ls="none" if x == "name" else "-",
                label=label or None)  # fmt: skip
        over = frame[frame["overloaded"].fillna(False).astype(bool)]
        ax.plot(over[x], over[column], ls="none", marker="x", color="black", ms=10)
        marked |= not over.empty
    if marked:
        ax.plot([], [], ls="none", marker="x", color="black", label="overloaded")
    values = pd.concat([g[column] for _, g in groups]).dropna()
    positive = values[values > 0]
    if len(positive) and positive.max() > 30 * positive.min():
        ax.set_yscale("log")
    ax.set_xlabel(x)
    if x == "name":
        ax.tick_params(axis="x", labelrotation=30)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def latency_figure(
    table: pd.DataFrame, axes: Sequence[str], slo: SLOSection | None = None
) -> Figure:
    """p99 TTFT and p99 TPOT against load, one line per configuration: where each knees."""
    x, groups = _configurations(table, axes)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5), layout="constrained")
    ttft, tpot = fig.subplots(1, 2)
    for ax, column, title, bound in (
        (ttft, "ttft_p99_ms", "p99 TTFT (ms)", slo and slo.ttft_ms),
        (tpot, "tpot_p99_ms", "p99 TPOT (ms)", slo and slo.tpot_ms),
    ):
        if bound:
            ax.axhline(bound, color="C3", ls="--", lw=1, label=f"SLO {bound:g} ms")
        _draw(ax, x, groups, column)
        ax.set_title(title)
    return fig


def throughput_figure(table: pd.DataFrame, axes: Sequence[str]) -> Figure:
    """Steady-state output tokens/s, and per $/h, against load, per configuration."""
    x, groups = _configurations(table, axes)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5), layout="constrained")
    tokens, per_usd = fig.subplots(1, 2)
    _draw(tokens, x, groups, "steady_output_tokens_per_s")
    tokens.set_title("output tokens/s (steady state)")
    _draw(per_usd, x, groups, PER_USD)
    per_usd.set_title("output tokens/s per $/h (steady state)")
    return fig


def _write_outputs(
    table: pd.DataFrame, outdir: Path, scenario: Scenario, axes: Sequence[str]
) -> None:
    table.to_parquet(outdir / "sweep.parquet", index=False)
    if scenario.output.csv:
        table.to_csv(outdir / "sweep.csv", index=False)
    if scenario.output.plots and (table["status"] == "ok").any():
        figures = (latency_figure(table, axes, scenario.slo), throughput_figure(table, axes))
        for name, figure in zip(PLOT_FILES, figures, strict=True):
            figure.savefig(outdir / name, dpi=110)


# ---- the sweep ------------------------------------------------------------------------------
def sweep(
    scenario: Scenario,
    *,
    client: Client | None = None,
    workers: int | None = None,
    outdir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> pd.DataFrame:
    """Run every point of the scenario's sweep grid and return one row per point.

    Points run on `workers` local processes (default: one per CPU), or on the Dask cluster
    of `client`, whose workers must have infersim installed and see the files the scenario
    names. With `outdir`, each point is written as it finishes, then sweep.parquet and the
    plots; `resume` reuses the point files already there. The progress bar shows on a
    terminal and in a notebook (simulator.progress), nowhere else.
    """
    if client is not None and workers is not None:
        raise InfersimError("workers: give a worker count or a Dask client, not both")
    if workers is not None and workers < 1:
        raise InfersimError(f"workers: expected at least 1 (got {workers})")
    points = expand_grid(scenario)
    records: dict[str, dict[str, Any]] = {}
    if outdir is not None:
        outdir = Path(outdir)
        _prepare(outdir, resume=resume, overwrite=overwrite)
        records = _load_done(outdir, points)  # a resumed point still says what bent it
    elif resume:
        raise InfersimError("resume: needs the outdir of the sweep to continue")
    pending = [p for p in points if p.id not in records]
    job = functools.partial(run_point, overrides=scenario.overrides)
    results = run_parallel(job, [p.data for p in pending], workers=workers, client=client)
    options = bar_options(progress) or {"disable": True}
    with tqdm(total=len(points), initial=len(records), desc=scenario.name, unit="point",
              **options) as bar:  # fmt: skip
        for index, result in results:
            point = pending[index]
            outcome = _outcome(result) if isinstance(result, JobError) else result
            record = {
                "id": point.id,
                "name": point.name,
                "variant": point.variant,
                "values": point.values,
                "scenario": point.fingerprint,
                "build": build_id(),
                **outcome,
            }
            if outdir is not None and outcome["status"] != "lost":
                _write_point(outdir, record, point.data.get("base_dir", "."))
            records[point.id] = record
            bar.update()
    _warn_in_point_order(points, records, scenario.load_warnings)
    table = sweep_table(points, records)
    if outdir is not None:
        _write_outputs(table, outdir, scenario, sweep_axes(scenario))
    return table
