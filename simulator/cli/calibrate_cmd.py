"""`infersim calibrate run | fit | validate`: measure a device, fit a profile, check it."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from hardware_models.errors import InfersimError
from hardware_models.warning_scope import warn
from simulator.cli.outputs import writable_file


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.description = (
        "Calibrate the operator cost model against measurements: `run` times "
        "micro-benchmarks with PyTorch, `fit` writes a profile YAML, `validate` reports "
        "predicted vs measured on held-out shapes."
    )
    steps = parser.add_subparsers(dest="step", required=True)

    run = steps.add_parser("run", help="time GEMMs, copies, attention, NCCL and one layer")
    run.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    run.add_argument("-o", "--out", type=Path, required=True, help="folder for the tables")
    run.add_argument("--quick", action="store_true", help="a few shapes only (smoke test)")
    run.set_defaults(handler=_run)

    fit = steps.add_parser("fit", help="fit a calibration profile to measurements")
    _inputs(fit)
    fit.add_argument("-o", "--out", type=Path, required=True, help="profile YAML to write")
    fit.add_argument("--overwrite", action="store_true", help="replace an existing profile")
    fit.add_argument("--holdout", type=float, default=0.5, help="fraction of shapes kept out")
    fit.add_argument("--seed", type=int, default=0, help="seed of the holdout split")
    fit.add_argument(
        "--curves-only",
        action="store_true",
        help="fit only the efficiency curves and keep the preset's fixed costs, kernel "
        "choices and links (for tables of large shapes only, e.g. published TFLOPS figures)",
    )
    fit.set_defaults(handler=_fit)

    val = steps.add_parser("validate", help="predicted vs measured with and without a profile")
    _inputs(val)
    val.add_argument(
        "--profile", type=Path, required=True, help="profile YAML from `fit`, or a shipped name"
    )
    val.add_argument("-o", "--out", type=Path, help="report folder (default: beside profile)")
    val.set_defaults(handler=_validate)


def _inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "folder",
        nargs="?",
        type=Path,
        help="a `calibrate run` folder, or a CSV of GEMM timings (m, n, k, dtype, and "
        "measured_s, latency_ms, latency_us or tflops; optional gpu, source)",
    )
    parser.add_argument(
        "--measured",
        type=Path,
        help="a folder of tables in the aiconfigurator layout (any name; its GPU is --gpu; "
        "Parquet or .txt, directly or in <backend>/<version>/ subfolders), or a measured/ "
        "folder of such folders named after their GPUs",
    )
    parser.add_argument(
        "--from-shared", metavar="GPU", help="public tables by GPU: h100-sxm, a100-80gb-sxm, l40s"
    )
    parser.add_argument(
        "--shared-data",
        type=Path,
        metavar="DIR",
        help="where --from-shared looks (a data/ or measured/ folder; default: "
        "$INFERSIM_SHARED_DATA, else shared/data in the working folder or up to 4 folders "
        "above it, else beside the checkout)",
    )
    parser.add_argument("--gpu", help="accelerator preset or YAML (default: from the input)")
    parser.add_argument(
        "--force-gpu",
        action="store_true",
        help="price the rows on --gpu even where the measurements name another GPU",
    )
    parser.add_argument(
        "--node",
        help="node preset or YAML whose GPU-to-GPU link the collectives ran over "
        "(default: the node preset built from the GPU)",
    )


def _clock() -> Callable[[str], None]:
    start = time.perf_counter()
    return lambda line: print(f"[{time.perf_counter() - start:6.1f}s] {line}", flush=True)


def _run(args: argparse.Namespace) -> int:
    from hardware_models.calibration.harness import run_harness

    run_harness(args.device, args.out, quick=args.quick, progress=_clock())
    return 0


def _fit(args: argparse.Namespace) -> int:
    from hardware_models.calibration.profile_file import write_profile
    from hardware_models.calibration.sources import (
        harness_metadata,
        load_measurements,
        resolve_spec,
    )
    from hardware_models.calibration.workflow import fit_measurements

    if not 0.0 <= args.holdout < 1.0:
        raise InfersimError(f"--holdout must be in [0, 1), got {args.holdout}")
    writable_file("-o", args.out, args.overwrite)  # before reading and fitting: minutes
    log = _clock()
    measurements = load_measurements(
        args.folder, args.measured, args.from_shared, args.gpu, args.shared_data
    )
    spec = resolve_spec(measurements, args.gpu, force_gpu=args.force_gpu)
    log(f"{len(measurements.table)} rows from {measurements.source}; fitting against {spec.name}")
    for part, error in harness_metadata(measurements.folder).get("errors", {}).items():
        warn(f"the run could not time {part} ({error}): the profile has no fit for it")
    profile = fit_measurements(
        measurements,
        spec,
        args.holdout,
        args.seed,
        progress=log,
        curves_only=args.curves_only,
        node=args.node,
    )
    for fitted in profile.links:
        log(
            f"link for {fitted.num_gpus} GPUs: latency {fitted.link.latency_us} us, "
            f"efficiency {fitted.link.efficiency}"
        )
    log(f"wrote {write_profile(profile, args.out)}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from hardware_models.calibration.profile_file import read_profile
    from hardware_models.calibration.sources import load_measurements, resolve_spec
    from hardware_models.calibration.workflow import validate_measurements, write_report
    from hardware_models.presets import calibration_path

    log = _clock()
    path = calibration_path(args.profile)
    profile = read_profile(path)
    measurements = load_measurements(
        args.folder, args.measured, args.from_shared, args.gpu, args.shared_data
    )
    spec = resolve_spec(
        measurements, args.gpu, fallback=profile.metadata.gpu, force_gpu=args.force_gpu
    )
    result = validate_measurements(measurements, spec, profile, args.node)
    # A shipped profile's report goes to the working folder, not into the package.
    beside = path.parent if path == args.profile else Path()
    out = args.out or beside / f"{path.stem}-validation-{spec.name}"
    title = f"Calibration of {spec.name} with {path.name}"
    paths = write_report(result, out, title)
    for line in result.usable.lines():
        log(line)
    log(f"{spec.name}: {len(result.rows)} rows, {result.which_rows}")
    print(_summary(result.tables["by_class"]).to_string(index=False))
    targets = result.tables["targets"]
    for row in targets.itertuples(index=False):
        verdict = "met" if row.met else f"MISSED by {100 * (row.mape - row.target):.1f} points"
        limit = f"MAPE <= {100 * row.target:.0f}%:"
        print(f"  target {row.op_class:<18} {limit} {100 * row.mape:5.1f}%  {verdict}")
    advice = (
        "this transfer should not be used for it"
        if result.transfer
        else "use the shipped profile (auto) or refit on more shapes for it"
    )
    for row in result.tables["worse_than_uncalibrated"].itertuples(index=False):
        print(
            f"  WORSE than uncalibrated: {row.op_class} {100 * row.mape_uncalibrated:.1f}% -> "
            f"{100 * row.mape_calibrated:.1f}% ({advice})"
        )
    log(f"wrote {len(paths)} files to {out}")
    return 0


def _summary(by_class: pd.DataFrame) -> pd.DataFrame:
    """One line per op class: n, MAPE before and after, bias after."""
    wide = by_class.pivot(index="op_class", columns="stage", values=["n", "mape", "bias"])
    return pd.DataFrame(
        {
            "op_class": wide.index,
            "n": wide[("n", "calibrated")].astype(int).to_numpy(),
            "mape uncalibrated": [f"{100 * v:.1f}%" for v in wide[("mape", "uncalibrated")]],
            "mape calibrated": [f"{100 * v:.1f}%" for v in wide[("mape", "calibrated")]],
            "bias calibrated": [f"{100 * v:+.1f}%" for v in wide[("bias", "calibrated")]],
        }
    )
