"""`infersim run`: simulate one scenario, print its summary, write its tables and plots."""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.warning_scope import pass_on, warn
from simulator.build import BuiltScenario, build_scenario
from simulator.cli.options import add_output_flags, add_overrides, add_results_dir
from simulator.cli.outputs import folder_name, results_folder
from simulator.cli.run_exports import add_export_flags, check_exports, write_exports
from simulator.formatting import WIDTH, sig
from simulator.scenario import Scenario
from simulator.sharding import AUTO_MIN_REQUESTS, Workers
from simulator.simulation import run_simulation

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping


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


def warn_grid_not_run(path: Path, scenario: Scenario, command: str) -> None:
    """Say that `infersim COMMAND` runs the scenario in `path` as the file sets it, not
    its sweep.grid; called once the run goes ahead (results folder taken), not before a
    refusal."""
    if scenario.sweep is not None:
        warn(
            f"{path}: sweep.grid is not run by `infersim {command}`, which runs the scenario "
            f"as the file sets it; `infersim sweep {path}` runs the grid"
        )


def build_each(runs: Mapping[str, Scenario]) -> dict[str, BuiltScenario]:
    """Every run built before any simulates: one that cannot start (the model does not
    fit) stops the command before the others have run and written their results; each
    run's warnings come when it runs (`run_simulation` raises those of its build)."""
    built = {}
    for label, scenario in runs.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built[label] = build_scenario(scenario)
        except InfersimError as exc:
            raise InfersimError(f"{label}: {exc}") from None
    return built


def _run(args: argparse.Namespace) -> int:
    scenario = Scenario.from_yaml(args.scenario, args.overrides)
    runs = scenario.expand()
    variants = [folder_name(run.name, "variant") for run in runs] if len(runs) > 1 else []
    check_exports(args, scenario, variants)
    results = {}
    written: list[Path] = []
    with results_folder(args.output, scenario.name, args.overwrite) as outdir:
        warn_grid_not_run(args.scenario, scenario, "run")
        todo: Mapping[str, Scenario | BuiltScenario] = {str(args.scenario): runs[0]}
        if variants:  # each variant writes to a subfolder
            todo = build_each({f"{args.scenario}: variant {run.name}": run for run in runs})
        for (where, job), name in zip(todo.items(), variants or [None], strict=True):
            try:  # each warning on stderr, as every command says it (a variant's named)
                with warnings_named(name) if name else contextlib.nullcontext():
                    result = run_simulation(job, progress=not args.quiet, workers=args.workers)
            except InfersimError as exc:  # say which scenario (and variant) the problem is in
                raise InfersimError(f"{where}: {exc}") from None
            results[name] = result
            print(result.summary_table())
            written += result.write(
                outdir / name if name else outdir,
                csv=args.csv or None,
                plots=False if args.no_plots else None,
                overwrite=args.overwrite,
            )
            written += write_exports(result, args, name)
        if variants:
            from simulator.compare import compare_table, labelled, write_comparison  # pandas

            print()
            print(labelled(compare_table(results)).to_string(float_format=sig, line_width=WIDTH))
            written += write_comparison(results, outdir, plots=not args.no_plots)
    print(f"\nwrote {len(written)} files to {outdir}/", file=sys.stderr)
    return 0
