"""How fast GEMMs that only stream their weights (m <= 8, bf16) move their operands, by
operand size, on each GPU of the public tables: where a chip beats its device memory,
the operands were resident in L2 (benchmarks/README.md, "Calibration for any GPU").

    python benchmarks/l2_residency.py [--data ../shared/data/measured]
"""

from __future__ import annotations

import argparse

import pandas as pd

from hardware_models.calibration.measured_tables import (
    gpu_folders,
    load_measured,
    resolve_measured_dir,
)

MIB_EDGES = [0, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96, 128, float("inf")]


def rates(data: str | None) -> pd.DataFrame:
    """Median (and max) GB/s per operand-size bucket, one row per GPU."""
    root = resolve_measured_dir(data)
    out = {}
    for gpu in sorted(set(gpu_folders(root).values())):
        rows = load_measured(root, gpus=[gpu], op_classes=["gemm"])
        rows = rows[(rows["dtype"] == "bf16") & (rows["m"] <= 8)].drop_duplicates(["m", "n", "k"])
        operands = (rows["m"] * rows["k"] + rows["k"] * rows["n"]) * 2
        gbs = operands / rows["measured_s"] / 1e9
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
    print(rates(parser.parse_args().data).to_string())


if __name__ == "__main__":
    main()
