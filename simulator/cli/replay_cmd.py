"""`infersim replay`: simulate a measured serving run and compare, figure by figure."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulator.cli.options import (
    add_hardware_flags,
    add_output_flags,
    add_overrides,
    add_results_dir,
)
from simulator.cli.outputs import results_folder
from simulator.replay import ReplayOptions, read_run, replay, report_text


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.description = (
        "Replay a measured serving run (a folder with meta.json, requests.jsonl "
        "and optionally timeseries.csv, or the JSON of `vllm bench serve --save-result "
        "--save-detailed`) with its own arrivals, lengths and engine settings, vLLM's "
        "defaults for its version where it is silent; print simulated against measured "
        "TTFT, TPOT, ITL and E2E; write replay.json, CDFs and the timeline."
    )
    parser.add_argument("run", type=Path, help="run folder or vLLM bench serve JSON")
    add_results_dir(parser, "results/replay-<run>, or the next free results/replay-<run>-N")
    parser.add_argument("--model", help="catalog name or config.json (default: the run's)")
    add_hardware_flags(parser)
    parser.add_argument(
        "--vllm-version",
        help="vLLM version whose defaults fill what the run does not record "
        "(default: the run's meta.json vllm_version)",
    )
    add_overrides(parser)
    add_output_flags(parser)
    parser.set_defaults(handler=_replay)


def _replay(args: argparse.Namespace) -> int:
    run = read_run(args.run)
    options = ReplayOptions(
        model=args.model,
        gpu=args.gpu,
        node=args.node,
        calibration=args.calibration,
        vllm_version=args.vllm_version,
        overrides=tuple(args.overrides),
    )
    name = f"replay-{run.name}"
    with results_folder(args.output, name, args.overwrite) as outdir:
        result = replay(run, outdir, options, progress=not args.quiet)
        print(report_text(result))
        written = result.write(outdir, plots=not args.no_plots)
    print(f"\nwrote {len(written)} files to {outdir}/", file=sys.stderr)
    return 0
