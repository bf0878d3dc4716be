"""`infersim run --trace-out / --bench-json`: a run's files in other tools' formats."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hardware_models.errors import InfersimError
from hardware_models.warning_scope import warn
from simulator.cli.outputs import writable_file
from simulator.formats.chrome_trace import MAX_EVENTS, chrome_trace
from simulator.metrics.writer import write_whole
from simulator.results import Results
from simulator.scenario import Scenario


def add_export_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace-out",
        type=Path,
        metavar="TRACE.json",
        help="write a Chrome/Perfetto trace of every replica's steps and requests",
    )
    parser.add_argument(
        "--trace-max-events",
        type=int,
        default=MAX_EVENTS,
        metavar="N",
        help=f"most events in the trace (default {MAX_EVENTS:,}); a longer run's trace "
        "keeps its beginning and says where it stops",
    )
    parser.add_argument(
        "--bench-json",
        type=Path,
        metavar="RESULT.json",
        help="write the run as vLLM `bench serve --save-result --save-detailed` saves one",
    )


def check_exports(args: argparse.Namespace, scenario: Scenario, variants: list[str]) -> None:
    """Refuse before simulating what could not be written afterwards: each file the run
    writes (one per variant where there are `variants`)."""
    if args.trace_out is not None and not scenario.output.step_table:
        raise InfersimError(
            "--trace-out needs the run's per-step table; set output.step_table: true "
            "(e.g. --set output.step_table=true)"
        )
    if args.trace_max_events < 1:
        raise InfersimError(f"--trace-max-events must be >= 1, got {args.trace_max_events}")
    exports = (("--trace-out", args.trace_out), ("--bench-json", args.bench_json))
    for flag, path in ((flag, path) for flag, path in exports if path is not None):
        for variant in variants or [None]:
            writable_file(flag, _for_variant(path, variant), args.overwrite)


def write_exports(
    result: Results, args: argparse.Namespace, variant: str | None = None
) -> list[Path]:
    """Write the files asked for; with several variants each gets its name in the file's."""
    written = []
    if args.trace_out is not None:
        trace = chrome_trace(result, max_events=args.trace_max_events)
        path = _for_variant(args.trace_out, variant)
        _dump(path, trace.document)
        if trace.dropped:
            warn(
                f"{path}: trace cut at {trace.cut_s:,.3f} s of simulated time: "
                f"{trace.dropped:,} later events left out (--trace-max-events "
                f"{args.trace_max_events:,})"
            )
        written.append(path)
    if args.bench_json is not None:
        from simulator.formats.vllm_bench import bench_result  # only for this file

        path = _for_variant(args.bench_json, variant)
        _dump(path, bench_result(result))
        written.append(path)
    return written


def _for_variant(path: Path, variant: str | None) -> Path:
    return path if variant is None else path.with_name(f"{path.stem}-{variant}{path.suffix}")


def _dump(path: Path, document: dict) -> None:
    def dump(partial: Path) -> None:
        with partial.open("w") as f:
            json.dump(document, f, allow_nan=False)  # NaN or Infinity is not JSON

    write_whole(path, dump)
