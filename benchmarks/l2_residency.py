"""How fast GEMMs that only stream their weights (m <= 8, bf16) move their operands, by
operand size and by the bytes the benchmark's loop cycles through (six weight copies:
calibration/benchmark_loops.py), on each GPU of the public tables: where a chip beats its
device memory, the operands were resident in L2 (benchmarks/README.md, "Calibration for
any GPU").

    python benchmarks/l2_residency.py [--data ../shared/data/measured]
"""

from __future__ import annotations

import argparse

import pandas as pd

from hardware_models.calibration.benchmark_loops import gemm_loop_bytes
from hardware_models.calibration.measured_tables import (
    gpu_folders,
    load_measured,
    resolve_measured_dir,
)

MIB_EDGES = [0, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128, float("inf")]
LOOP_MIB_EDGES = [0, 24, 48, 72, 84, 96, 108, 120, 144, 192, 384, float("inf")]


def rates(data: str | None, by_loop: bool = False) -> pd.DataFrame:
    """Median (and max) GB/s per operand-size bucket (or loop-size bucket), one row per
    GPU."""
    root = resolve_measured_dir(data)
    out = {}
    for gpu in sorted(set(gpu_folders(root).values())):
        rows = load_measured(root, gpus=[gpu], op_classes=["gemm"])
        rows = rows[(rows["dtype"] == "bf16") & (rows["m"] <= 8)].drop_duplicates(["m", "n", "k"])
        operands = (rows["m"] * rows["k"] + rows["k"] * rows["n"]) * 2
        gbs = operands / rows["measured_s"] / 1e9
        if by_loop:
            bucket = pd.cut(gemm_loop_bytes(rows, "bf16") / 2**20, LOOP_MIB_EDGES)
        else:
            bucket = pd.cut(operands / 2**20, MIB_EDGES)
        stats = gbs.groupby(bucket, observed=True).agg(["median", "max"]).round(0)
        out[gpu] = (
            stats["median"].astype(int).astype(str)
            + " ("
            + stats["max"].astype(int).astype(str)
            + ")"
        )
    return pd.DataFrame(out).T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a measured/ folder (default: ../shared/data/measured)")
    data = parser.parse_args().data
    print("by operand MiB:")
    print(rates(data).to_string())
    print("by MiB the benchmark's loop cycles through (six weight copies, input, output):")
    print(rates(data, by_loop=True).to_string())


if __name__ == "__main__":
    main()
