"""Write one run's results to a directory: summary.json, Parquet tables (optional CSV
copies) and plots. Refuses to write into a directory that already holds results unless
told to overwrite, so a rerun never silently replaces numbers someone is looking at.
Each table is written under a temporary name and renamed, and summary.json comes last:
a folder without summary.json holds a run that was interrupted or failed while writing."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hardware_models.errors import InfersimError
from simulator.metrics.manifest import clear, record
from simulator.metrics.table import Table
from simulator.ways_out import option

if TYPE_CHECKING:
    import pandas as pd

TABLES = ("requests", "steps", "timeseries", "itl")
PLOT_FILES = ("latency_cdfs.png", "throughput_queue.png", "kv_batch.png")


def summary_json(summary: Mapping[str, Any], *, include_wall_time: bool = True) -> str:
    """Sorted, indented JSON: identical summaries give identical bytes. Wall-clock figures
    (run.wall) are the only part that varies between identical runs; leave them out with
    include_wall_time=False."""
    data = dict(summary)
    if not include_wall_time and "wall" in data.get("run", {}):
        data["run"] = {k: v for k, v in data["run"].items() if k != "wall"}
    return json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n"


def run_files() -> list[str]:
    """The names of the files a run may write into its folder."""
    names = ["summary.json", *PLOT_FILES]
    for table in TABLES:
        names += [f"{table}.parquet", f"{table}.csv"]
    return names


def _prepare(outdir: Path, overwrite: bool) -> None:
    another = f"choose another {option('outdir', '-o')}"
    if outdir.exists() and not outdir.is_dir():
        raise InfersimError(f"{outdir} exists and is not a directory; {another}")
    if outdir.is_dir() and any(outdir.iterdir()):
        if not overwrite:
            raise InfersimError(
                f"{outdir} already has results; pass {option('overwrite=True', '--overwrite')}"
                f" or {another}"
            )
        # Remove only what infersim wrote (a run's files; a sweep's its MANIFEST lists),
        # so no stale CSV, plot or sweep point outlives its run.
        clear(outdir, run_files())
    outdir.mkdir(parents=True, exist_ok=True)


def _columns(name: str, table: Table | pd.DataFrame) -> Table:
    """A Table as it is; a DataFrame as the Table of its columns, refused when its index
    is not 0, 1, 2, ... (a filtered or re-indexed frame), which the file would lose."""
    if isinstance(table, Table):
        return table
    import pandas as pd  # loaded already: `table` is a DataFrame

    if not table.index.equals(pd.RangeIndex(len(table))):
        raise InfersimError(
            f"the {name} table's index is not 0, 1, 2, ...: the file keeps columns only; "
            "reset_index() it first (keeping the index as a column, or drop=True)"
        )
    return Table.from_pandas(table)


def write_run(
    outdir: str | Path,
    summary: Mapping[str, Any],
    requests: Table | pd.DataFrame,
    steps: Table | pd.DataFrame | None,
    timeseries: Table | pd.DataFrame,
    itl: Table | pd.DataFrame,
    *,
    csv: bool = False,
    plots: bool = True,
    overwrite: bool = False,
    include_wall_time: bool = True,
) -> list[Path]:
    """Write summary.json, <table>.parquet (and .csv when `csv`) for requests, steps
    (unless None: the run kept none), timeseries and itl, and the run plots when
    `plots`, then summary.json; returns the paths written. Parquet is written from the numpy columns
    (simulator.metrics.parquet); CSV and plots go through pandas, imported only then."""
    from simulator.metrics.parquet import write_parquet

    outdir = Path(outdir)
    _prepare(outdir, overwrite)
    written = []
    given = zip(TABLES, (requests, steps, timeseries, itl), strict=True)
    tables = {name: _columns(name, table) for name, table in given if table is not None}
    for name, table in tables.items():
        written.append(write_whole(outdir / f"{name}.parquet", partial(write_parquet, table)))
        if csv:
            to_csv = partial(table.to_pandas().to_csv, index=name == "requests")
            written.append(write_whole(outdir / f"{name}.csv", to_csv))
    if plots:
        from simulator.metrics.plots import save_run_plots

        frames = [tables[name].to_pandas() for name in ("requests", "itl", "timeseries")]
        written += save_run_plots(*frames, outdir, summary)
    # last: a folder without summary.json is a run not (completely) written
    text = summary_json(summary, include_wall_time=include_wall_time)
    written.append(write_whole(outdir / "summary.json", lambda path: path.write_text(text)))
    record(outdir, (path.name for path in written))  # what a later overwrite removes
    return written


def write_whole(path: Path, write: Callable[[Path], object]) -> Path:
    """`write(partial_path)`, then rename it to `path`: an interrupted or failed write
    (disk full) leaves no file under the final name, and none half-written under the
    partial one. An error from writing names `path` where the system's did not."""
    partial_path = path.with_name(f"{path.name}.partial")
    try:
        write(partial_path)
        partial_path.replace(path)
    except BaseException as exc:
        partial_path.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None and exc.strerror:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return path
