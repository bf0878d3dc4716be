"""Entry point: parse the subcommand, run it, and turn input errors into one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hardware_models.errors import InfersimError
from simulator.cli import estimate_cmd, hardware_cmd, roofline_cmd, run_cmd

COMMANDS = (run_cmd, hardware_cmd, estimate_cmd, roofline_cmd)


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


if __name__ == "__main__":
    sys.exit(main())
