"""`infersim schema`: the scenario file's schema, as JSON Schema or a markdown reference."""

from __future__ import annotations

import argparse
import json
import sys

from simulator.schema_docs import scenario_reference, scenario_schema


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.add_argument(
        "--format",
        choices=("json", "markdown"),
        default="json",
        help="json: JSON Schema for editors and tools (default); markdown: the field "
        "reference kept in docs/SCENARIO_REFERENCE.md",
    )
    parser.set_defaults(handler=_schema)


def _schema(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        sys.stdout.write(scenario_reference())
    else:
        sys.stdout.write(json.dumps(scenario_schema(), indent=2) + "\n")
    return 0
