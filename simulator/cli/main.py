"""Entry point: parse the subcommand, run it, and turn input errors into one line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from hardware_models.errors import InfersimError
from simulator.cli import (
    calibrate_cmd,
    compare_cmd,
    estimate_cmd,
    hardware_cmd,
    plan_cmd,
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
    _accept_debug_anywhere(sub)
    return parser


def _accept_debug_anywhere(sub: argparse._SubParsersAction) -> None:
    """`--debug` after the subcommand too (`infersim run x.yaml --debug`); SUPPRESS keeps
    a subcommand from resetting the flag given before it."""
    for parser in sub.choices.values():
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                            help="show tracebacks on errors")  # fmt: skip
        for action in parser._actions:  # nested subcommands (`hardware show`)
            if isinstance(action, argparse._SubParsersAction):
                _accept_debug_anywhere(action)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except InfersimError as exc:
        if args.debug:
            raise
        print(f"infersim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("infersim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`infersim hardware list | head`)
        # Python flushes stdout again at exit; point it at nothing so that is quiet too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
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
