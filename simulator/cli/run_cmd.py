"""`infersim run`: simulate one scenario, print its summary, write its tables and plots."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from hardware_models.errors import InfersimError, InfersimWarning
from simulator.cli.options import add_output_flags, add_overrides, add_results_dir
from simulator.cli.run_exports import add_export_flags, check_exports, write_exports
from simulator.formatting import WIDTH, sig
from simulator.provenance import named_from
from simulator.scenario import Scenario
from simulator.sharding import AUTO_MIN_REQUESTS, Workers
from simulator.simulation import pass_on, run_simulation

if TYPE_CHECKING:
    from collections.abc import Iterator

    from simulator.results import Results


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.add_argument("scenario", type=Path, help="scenario YAML")
    add_results_dir(parser, "results/<name>, or the next free results/<name>-N")
    add_overrides(parser)
    add_workers_flag(parser)
    add_output_flags(parser, csv="also write CSV tables")
    add_export_flags(parser)
    parser.set_defaults(handler=_run)


def add_workers_flag(parser: argparse.ArgumentParser, cluster: str = "a cluster") -> None:
    """--workers of a simulation run (run, and compare for each of its runs)."""
    parser.add_argument(
        "--workers",
        type=_workers,
        default="auto",
        help=f"processes for {cluster} whose replicas are independent (round robin "
        "or random routing of an open loop); same results. Default auto: one per core for "
        f"a run of at least {AUTO_MIN_REQUESTS:,} requests, else 1",
    )


def _workers(text: str) -> Workers:
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a count of at least 1 or 'auto' (got {text!r})")
    return value


def folder_name(name: str, what: str = "name") -> str:
    """A scenario or variant name as a folder below the results folder: refused when it
    would land elsewhere (absolute, empty, or with '.' or '..' parts)."""
    parts = PurePath(name).parts
    if not parts or PurePath(name).is_absolute() or any(p in (".", "..") for p in parts):
        raise InfersimError(
            f"{what} {name!r} cannot name a results folder (it would not be a folder "
            "inside it); rename it or pass -o"
        )
    return name


def free_results_dir(name: str, root: Path = Path("results")) -> Path:
    """results/<name>, or results/<name>-2, -3, ...: earlier results are never replaced."""
    candidate = root / folder_name(name)
    n = 2
    while candidate.exists() and any(candidate.iterdir()):
        candidate = root / f"{name}-{n}"
        n += 1
    return candidate


def simulate_warning_once(scenario: Scenario, *, progress: bool, workers: Workers = 1) -> Results:
    """simulate(), each warning shown once: one the printed summary holds (its `warning:`
    lines) is not also printed as an `infersim: warning:` line."""
    caught: list[warnings.WarningMessage] = []
    in_summary: set[str] = set()  # none when the run stops with an error: all are shown
    try:
        with warnings.catch_warnings(record=True) as caught:  # the caller's filters stay
            result = run_simulation(scenario, progress=progress, workers=workers)
        in_summary = set(result.summary()["warnings"])
        return result
    finally:
        pass_on(caught, lambda w: named_from(scenario.base_dir, str(w.message)) not in in_summary)


@contextlib.contextmanager
def warnings_named(where: str) -> Iterator[None]:
    """Each InfersimWarning raised inside passed on as `where: message` (`where` names a
    compared run), also when the block stops with an error; other warnings as they are."""
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:  # the caller's filters stay
            yield
    finally:
        for shown in caught:
            if issubclass(shown.category, InfersimWarning):
                warnings.warn(f"{where}: {shown.message}", shown.category, stacklevel=3)
        pass_on(caught, lambda shown: not issubclass(shown.category, InfersimWarning))


def results_dir(given: Path | None, name: str, overwrite: bool) -> Path:
    """The folder given (refused when it is a file, or holds results and `overwrite` is
    off), else the next free results/<name>: checked before simulating, not after."""
    outdir = given or free_results_dir(name)
    if outdir.exists() and not outdir.is_dir():
        raise InfersimError(f"{outdir} exists and is not a directory; choose another -o")
    if given and not overwrite and outdir.exists() and any(outdir.iterdir()):
        raise InfersimError(f"{outdir} already has results; pass --overwrite or another -o")
    return outdir


def _run(args: argparse.Namespace) -> int:
    scenario = Scenario.from_yaml(args.scenario, args.overrides)
    outdir = results_dir(args.output, scenario.name, args.overwrite)
    check_exports(args, scenario)
    runs = scenario.expand()
    for run in runs if len(runs) > 1 else ():  # each variant writes to a subfolder
        folder_name(run.name, "variant")
    results = {}
    written: list[Path] = []
    for run in runs:
        try:
            result = simulate_warning_once(run, progress=not args.quiet, workers=args.workers)
        except InfersimError as exc:  # say which scenario (and variant) the problem is in
            where = f"{args.scenario}: variant {run.name}" if len(runs) > 1 else args.scenario
            raise InfersimError(f"{where}: {exc}") from None
        results[run.name] = result
        print(result.summary_table())
        target = outdir / run.name if len(runs) > 1 else outdir
        written += result.write(
            target,
            csv=args.csv or None,
            plots=False if args.no_plots else None,
            overwrite=args.overwrite,
        )
        written += write_exports(result, args, run.name if len(runs) > 1 else None)
    if len(runs) > 1:
        from simulator.compare import compare_table, labelled, write_comparison  # pandas: only here

        print()
        print(labelled(compare_table(results)).to_string(float_format=sig, line_width=WIDTH))
        written += write_comparison(results, outdir, plots=not args.no_plots)
    print(f"\nwrote {len(written)} files to {outdir}/", file=sys.stderr)
    return 0
