"""Entry point: parse the subcommand, run it, and turn input errors into one line."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from hardware_models.errors import InfersimError, InfersimWarning
from simulator.cli import (
    calibrate_cmd,
    compare_cmd,
    estimate_cmd,
    hardware_cmd,
    plan_cmd,
    replay_cmd,
    roofline_cmd,
    run_cmd,
    schema_cmd,
    sweep_cmd,
)

COMMANDS = (
    run_cmd,
    sweep_cmd,
    compare_cmd,
    plan_cmd,
    hardware_cmd,
    estimate_cmd,
    roofline_cmd,
    schema_cmd,
    calibrate_cmd,
    replay_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infersim",
        description="Discrete-event simulator of GPU inference clusters.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """An InfersimWarning as one line on stderr; any other warning as Python shows it."""
    if issubclass(category, InfersimWarning):
        print(f"infersim: warning: {message}", file=sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default", InfersimWarning)
            warnings.showwarning = _show_warning
            return int(args.handler(args) or 0)
    except InfersimError as exc:
        if args.debug:
            raise
        print(f"infersim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("infersim: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: one line, and how to see more
        if args.debug:
            raise
        print(
            f"infersim: internal error: {type(exc).__name__}: {exc} "
            "(rerun with --debug for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
