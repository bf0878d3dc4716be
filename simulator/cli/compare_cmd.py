"""`infersim compare`: several scenario files (or one with variants) side by side: one
table, overlaid latency CDFs, throughput and cost."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hardware_models.errors import InfersimError
from simulator.cli.options import add_output_flags, add_overrides, add_results_dir
from simulator.cli.outputs import folder_name, results_folder
from simulator.cli.run_cmd import add_workers_flag, build_each, warn_grid_not_run, warnings_named
from simulator.compare import compare_table, labelled, write_comparison
from simulator.formatting import WIDTH, sig
from simulator.results import Results
from simulator.scenario import Scenario
from simulator.simulation import run_simulation


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.description = (
        "Simulate each scenario (each variant of a file is a run named "
        "file:variant) and write comparison.csv, overlaid latency CDFs, throughput and "
        "cost plots, and each run's tables in its own folder."
    )
    parser.add_argument("scenarios", type=Path, nargs="+", help="scenario YAML files")
    add_results_dir(parser, "results/compare, or the next free results/compare-N")
    add_overrides(parser, "a field in every scenario")
    add_workers_flag(parser, "each run's cluster")
    add_output_flags(parser)
    parser.set_defaults(handler=_compare)


def _runs(
    paths: list[Path], overrides: list[str]
) -> tuple[dict[str, tuple[Path, Scenario]], dict[Path, Scenario]]:
    """label -> (folder under -o, scenario), and each file's scenario. A file is named by
    its stem (by its path when two stems clash); its variants by file:variant, or by the
    variant alone for one file."""
    stems = [p.stem for p in paths]
    files = [p.stem if stems.count(p.stem) == 1 else str(p.with_suffix("")) for p in paths]
    if len(set(files)) < len(files):
        twice = next(f for f in files if files.count(f) > 1)
        raise InfersimError(f"{twice}: the same scenario file is given twice")
    runs: dict[str, tuple[Path, Scenario]] = {}
    loaded: dict[Path, Scenario] = {}
    for path, file in zip(paths, files, strict=True):
        scenario = loaded[path] = Scenario.from_yaml(path, overrides)
        for run in scenario.expand():
            variant = [folder_name(run.name, "variant")] if scenario.variants else []
            parts = ([file] if len(paths) > 1 else []) + variant
            runs[":".join(parts)] = (Path(*parts), run)
    if len(runs) < 2:
        raise InfersimError(
            "compare needs two or more runs: give several scenario files, or one with variants"
        )
    return runs, loaded


def _compare(args: argparse.Namespace) -> int:
    runs, loaded = _runs(args.scenarios, args.overrides)
    results: dict[str, Results] = {}
    written: list[Path] = []
    with results_folder(args.output, "compare", args.overwrite) as outdir:
        for path, scenario in loaded.items():
            warn_grid_not_run(path, scenario, "compare")
        built = build_each({label: scenario for label, (_, scenario) in runs.items()})
        for label, (folder, _) in runs.items():
            with warnings_named(label):  # no summary is printed: each is a warning line
                results[label] = run_simulation(
                    built.pop(label), progress=not args.quiet, workers=args.workers
                )
            written += results[label].write(
                outdir / folder, plots=False if args.no_plots else None, overwrite=args.overwrite
            )
        print(labelled(compare_table(results)).to_string(float_format=sig, line_width=WIDTH))
        written += write_comparison(results, outdir, plots=not args.no_plots)
    print(f"\nwrote {len(written)} files to {outdir}/", file=sys.stderr)
    return 0
