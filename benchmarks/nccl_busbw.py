"""NCCL bus bandwidth of a GPU's public collective table, by message size, op and group
size, beside the large-message rate the datasheet link model gives each GPU: where the
measured rate falls with the group and the model's does not.

    python benchmarks/nccl_busbw.py l40s [--dtype fp16]

Bus bandwidth is nccl-tests' definition: bytes each GPU moves over the call's time,
2(p-1)/p x the buffer for all-reduce, (p-1)/p x it for the others.
"""

from __future__ import annotations

import argparse

import pandas as pd

from hardware_models.calibration.measured_tables import COLLECTIVE_CLASSES
from hardware_models.calibration.sources import load_measurements
from hardware_models.calibration.validate import base_link
from hardware_models.collectives import collective_cost
from hardware_models.presets import load_gpu

MODEL_BYTES = 512 * 2**20  # a message large enough that latency is negligible


def _moved(op: str, p: float) -> float:
    """Fraction of the buffer each GPU moves (nccl-tests' bus-bandwidth factor)."""
    return 2 * (p - 1) / p if op == "all_reduce" else (p - 1) / p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu", help="a GPU with public tables: l40s, h100-sxm, a100-80gb-sxm")
    parser.add_argument("--dtype", default="fp16", help="the rows' dtype (fp16 or int8)")
    args = parser.parse_args()
    table = load_measurements(from_shared=args.gpu).table
    rows = table[table["op_class"].isin(COLLECTIVE_CLASSES) & (table["dtype"] == args.dtype)]
    moved = [_moved(op, p) for op, p in zip(rows["op_class"], rows["num_gpus"], strict=True)]
    rows = rows.assign(
        busbw=pd.Series(moved, index=rows.index) * rows["nbytes"] / rows["measured_s"] / 1e9
    )
    pivot = rows.pivot_table(index="nbytes", columns=["num_gpus", "op_class"], values="busbw")
    pd.set_option("display.width", 250)
    print(f"{args.gpu} {args.dtype}: measured bus bandwidth, GB/s")
    print(pivot.round(2).to_string())
    link = base_link(load_gpu(args.gpu))
    print(f"\ndatasheet link model, {MODEL_BYTES >> 20} MiB, GB/s of bus bandwidth:")
    for p in sorted(rows["num_gpus"].unique()):
        rates = {
            op: _moved(op, p)
            * MODEL_BYTES
            / collective_cost(op, MODEL_BYTES, int(p), link).seconds
            / 1e9
            for op in sorted(rows["op_class"].unique())
        }
        print(f"  {int(p)} GPUs: " + ", ".join(f"{op} {r:.2f}" for op, r in rates.items()))


if __name__ == "__main__":
    main()
