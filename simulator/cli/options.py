"""Options several subcommands share, defined once so they read and behave the same."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_overrides(parser: argparse.ArgumentParser, what: str = "a scenario field") -> None:
    """--set KEY.PATH=VALUE, repeatable, collected in args.overrides."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help=f"override {what}, e.g. --set serving.max_num_seqs=64 (repeatable)",
    )


def add_results_dir(parser: argparse.ArgumentParser, default: str) -> None:
    """-o/--output: the folder results go to, and what it is when not given."""
    parser.add_argument("-o", "--output", type=Path, help=f"results folder (default: {default})")


def add_output_flags(parser: argparse.ArgumentParser, *, csv: str | None = None) -> None:
    """--no-plots, --overwrite, --quiet (and --csv when `csv` describes what it adds)."""
    if csv:
        parser.add_argument("--csv", action="store_true", help=csv)
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--overwrite", action="store_true", help="replace existing results")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def add_hardware_flags(parser: argparse.ArgumentParser) -> None:
    """--gpu, --node, --calibration: the scenario's hardware section from the command line."""
    parser.add_argument("--gpu", help="GPU preset name or YAML path (`infersim hardware list`)")
    parser.add_argument("--node", help="node preset or YAML path (default: the GPU's)")
    add_calibration_flag(parser)


def add_calibration_flag(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """--calibration: the efficiency profile that prices operators, as a scenario's
    `hardware.calibration` names it."""
    parser.add_argument(
        "--calibration",
        default=default,
        help="calibration profile: 'auto' (the GPU's own or nearest measured chip's), a "
        "shipped profile's name, a YAML path, or 'none' (datasheet efficiencies)"
        + (f"; default: {default}" if default else ""),
    )
