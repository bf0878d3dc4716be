"""`infersim roofline`: price one operator from flags, or a CSV of them, and plot them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from hardware_models.calibration_lookup import (
    AUTO,
    SIZE_RANGE_SLACK,
    choose_calibration,
    outside_fitted_sizes,
    profile_metadata,
)
from hardware_models.errors import InfersimError
from hardware_models.node import NodeSpec
from hardware_models.op_request import OperatorRequest, parse_request, price_rows
from hardware_models.presets import list_nodes, load_gpu, load_node
from hardware_models.warning_scope import warn
from simulator.cli.options import add_calibration_flag
from simulator.cli.outputs import writable_file
from simulator.formatting import sig

_INT_FLAGS = ("m", "n", "k", "batch", "q_len", "kv_len", "context", "heads", "kv_heads")
_INT_FLAGS += ("head_dim", "window", "tokens", "hidden", "gpus")


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.description = (
        "Price one operator from flags, or many from --input CSV (columns named "
        "after the flags, e.g. op,m,n,k,dtype)."
    )
    parser.add_argument("--gpu", required=True, help="GPU preset name or YAML path")
    parser.add_argument("--node", help="node preset for collectives (default: the GPU's)")
    add_calibration_flag(parser, default=AUTO)  # as a run's hardware.calibration
    parser.add_argument("--op", default="gemm", help="gemm, attention_prefill, ...")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--kv-dtype")
    for flag in _INT_FLAGS:
        parser.add_argument(f"--{flag.replace('_', '-')}", type=int)
    parser.add_argument("--bytes", type=float, help="collective buffer size in bytes")
    parser.add_argument("--input", type=Path, help="CSV of operators, one per row")
    parser.add_argument("--output", type=Path, help="write the priced table (CSV)")
    parser.add_argument("--plot", type=Path, help="draw the roofline with the operators (PNG)")
    parser.set_defaults(handler=_run)


def _default_node(gpu_name: str) -> NodeSpec | None:
    """The first node preset built from this GPU, for pricing collectives."""
    for name in list_nodes():
        node = load_node(name)
        if node.gpu == gpu_name:
            return node
    return None


def _flag_request(args: argparse.Namespace) -> OperatorRequest:
    fields = {"op": args.op, "dtype": args.dtype, "kv_dtype": args.kv_dtype, "bytes": args.bytes}
    fields |= {flag: getattr(args, flag) for flag in _INT_FLAGS}
    return parse_request(fields, "roofline")


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise InfersimError(f"{path}: no such file")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InfersimError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    if frame.empty:
        raise InfersimError(f"{path}: no operator rows")
    return frame


def _run(args: argparse.Namespace) -> int:
    for flag, path in (("--output", args.output), ("--plot", args.plot)):
        if path is not None:  # replaced when there: roofline tables are cheap to remake
            writable_file(flag, path, overwrite=True)
    spec = load_gpu(args.gpu)
    try:
        calibration = choose_calibration(spec, args.calibration)
    except InfersimError as exc:
        raise InfersimError(f"--calibration: {exc}") from None
    gpu = calibration.gpu
    node = load_node(args.node) if args.node else _default_node(gpu.name)
    if args.input:
        rows = _read_csv(args.input)
        costs = price_rows(rows, gpu, node, str(args.input))
    else:
        rows = pd.DataFrame(index=[0])
        costs = [_flag_request(args).price(gpu, node)]
    priced = pd.DataFrame([c.as_dict() for c in costs])
    table = pd.concat([rows.drop(columns=["op"], errors="ignore"), priced], axis=1)
    shown = table[["op", "seconds", "flops", "dram_bytes", "bound"]].copy()
    shown["us"] = shown.pop("seconds") * 1e6
    shown["tflop_s"] = [c.achieved_flops / 1e12 for c in costs]
    print(f"{gpu.display_name}, calibration {calibration.note}")
    shown.index += 1  # numbered as the plot's labels and the CSV's data rows
    print(shown.to_string(float_format=lambda x: sig(x, 4)))
    if calibration.profile is not None:
        metadata = profile_metadata(calibration.profile)
        far = [outside_fitted_sizes(metadata, c.name, c.flops) for c in costs]
        rows_far = [f"{i}" for i, why in enumerate(far, 1) if why]
        if rows_far:
            first = next(why for why in far if why)
            warn(
                f"row {', '.join(rows_far)} priced by extrapolation ({first}; "
                f"beyond {SIZE_RANGE_SLACK:g}x either way)"
            )
    if args.output:
        table.to_csv(args.output, index=False)
        print(f"wrote {args.output}")
    if args.plot:
        from hardware_models.roofline_plot import plot_roofline

        plot_roofline(gpu, costs).savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    return 0
