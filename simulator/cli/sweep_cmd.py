"""`infersim sweep`: run a scenario's sweep grid in parallel, print and write one table."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from hardware_models.errors import InfersimError
from simulator.cli.options import add_output_flags, add_overrides
from simulator.cli.outputs import folder_name, results_folder
from simulator.formatting import WIDTH, sig
from simulator.metrics.headline import labelled
from simulator.scenario import Scenario
from simulator.sweep import PER_USD, sweep

if TYPE_CHECKING:
    from distributed import Client

# Columns printed at the end (all of them are in sweep.parquet), under the headers every
# printed table uses (simulator.metrics.headline.LABELS: shares in %), short ones for the
# counts; the overload verdict rather than `overloaded`, so a point too short to judge is
# not read as stable.
_SHOWN = {
    "status": "status",
    "max_num_seqs": None,  # the batch limits it ran with: unset, vLLM's for its GPU
    "max_num_batched_tokens": None,
    "steady_output_tokens_per_s": None,  # one basis with the two costs
    "ttft_p99_ms": None,
    "tpot_p99_ms": None,
    "goodput_fraction_of_arrived": None,
    "goodput_fraction": None,
    "failed": "failed",
    "rejected": "rejected",
    "usd_per_million_output_tokens": None,
    PER_USD: None,
    "joules_per_output_token": None,
    "cost_basis": None,  # whole_run where a point had no steady state
    "overload_verdict": None,
}


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 (got {value})")
    return value


def add_executor_flags(parser: argparse.ArgumentParser, what: str, note: str = "") -> None:
    """--workers and --dask-scheduler: where `run_parallel` runs (sweep and plan)."""
    parser.add_argument(
        "--workers",
        type=_positive,
        help=f"local worker processes (default: one per CPU{note}; 1 runs in this process)",
    )
    parser.add_argument(
        "--dask-scheduler",
        metavar="tcp://host:port",
        help=f"run the {what} on this Dask cluster instead of local processes",
    )


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.description = (
        "Run every point of the scenario's sweep.grid (for each variant) in "
        "parallel; write points/<id>.json as each finishes, then sweep.parquet and plots."
    )
    parser.add_argument("scenario", type=Path, help="scenario YAML with a sweep.grid")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="results folder (default: results/<name>, or the next free results/<name>-N; "
        "with --resume, results/<name>)",
    )
    add_executor_flags(parser, "points")
    parser.add_argument(
        "--resume", action="store_true", help="keep finished points in -o, run the rest"
    )
    add_overrides(parser, "a scenario field for every point")
    add_output_flags(parser, csv="also write sweep.csv")
    parser.set_defaults(handler=_sweep)


def connect(args: argparse.Namespace) -> contextlib.AbstractContextManager[Client | None]:
    """`with connect(args) as client`: the Dask client --dask-scheduler names, or None."""
    if args.workers is not None and args.dask_scheduler:
        raise InfersimError("--workers and --dask-scheduler exclude each other")
    return _connect(args.dask_scheduler) if args.dask_scheduler else contextlib.nullcontext()


def _connect(address: str) -> Client:
    try:
        from distributed import Client
    except ImportError:
        raise InfersimError(
            "--dask-scheduler needs the distributed package: pip install 'infersim[dask]'"
        ) from None
    try:
        return Client(address)
    except (OSError, TimeoutError, ValueError) as exc:
        raise InfersimError(f"--dask-scheduler {address}: cannot connect ({exc})") from None


def _format_table(table: pd.DataFrame) -> str:
    short = {column: header for column, header in _SHOWN.items() if header}
    shown = labelled(table.set_index("name")[list(_SHOWN)]).rename(columns=short)
    shown.index.name = None
    return shown.to_string(float_format=lambda x: sig(x, 4), na_rep="-", line_width=WIDTH)


def _sweep(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    overrides += ["output.csv=true"] if args.csv else []
    overrides += ["output.plots=false"] if args.no_plots else []
    scenario = Scenario.from_yaml(args.scenario, overrides)
    resumed = Path("results") / folder_name(scenario.name) if args.resume else None
    given = args.output or resumed  # sweep() refuses a folder with results unless resumed
    with results_folder(given, scenario.name, args.overwrite, resumable=True) as outdir:
        options = {
            "outdir": outdir,
            "resume": args.resume,
            "overwrite": args.overwrite,
            "progress": not args.quiet,
        }
        with connect(args) as client:
            table = sweep(scenario, client=client, workers=args.workers, **options)
    print(_format_table(table))
    bad = table[table["status"] != "ok"]
    for row in bad.itertuples():
        print(f"{row.status}: {row.name}: {row.error}")
    ok = len(table) - len(bad)
    print(f"\n{ok} of {len(table)} points ok; wrote {outdir}/sweep.parquet", file=sys.stderr)
    if (bad["status"] == "lost").any():
        print("workers were lost: rerun with --resume to run those points", file=sys.stderr)
        return 1
    if ok == 0:  # a CI must not read a sweep that simulated nothing as a pass
        print("infersim: no sweep point ran (see the errors above)", file=sys.stderr)
        return 1
    return 0
