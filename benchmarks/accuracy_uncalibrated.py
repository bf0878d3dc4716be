"""Operator accuracy of the uncalibrated cost model against public GPU measurements.

Prices every row of the measured H100 SXM and A100 SXM tables (GEMMs in every dtype the
chip supports, vLLM flash-attention prefill and decode, NCCL collectives) with the preset
defaults, and writes error tables (CSV + markdown) and a predicted-vs-measured plot.

    python benchmarks/accuracy_uncalibrated.py [--data DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from hardware_models.calibration import (
    big_gemm_mask,
    error_table,
    load_measured,
    plot_predicted_vs_measured,
    predict,
    resolve_measured_dir,
    supported_mask,
    to_markdown,
)
from hardware_models.errors import InfersimError
from hardware_models.presets import load_gpu

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "accuracy_uncalibrated"
BIG_GEMM_MNK = 2**30
TARGET_MAPE = 0.20


def _log(start: float, text: str) -> None:
    print(f"[{time.perf_counter() - start:6.1f}s] {text}", flush=True)


def build_tables(table: pd.DataFrame, predicted: pd.Series) -> dict[str, pd.DataFrame]:
    collectives = table["nbytes"].notna()
    big = big_gemm_mask(table, BIG_GEMM_MNK)
    return {
        "headline_big_bf16_gemm": error_table(table[big], predicted[big], by=["gpu"]),
        "by_class": error_table(table, predicted, by=["gpu", "op_class"]),
        "by_class_dtype": error_table(table, predicted, by=["gpu", "op_class", "source_dtype"]),
        "by_size_bucket": error_table(
            table, predicted, by=["gpu", "op_class", "source_dtype"], bucket_width=4
        ),
        "collectives_by_gpus": error_table(
            table[collectives], predicted[collectives], by=["gpu", "op_class", "num_gpus"]
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="measured/ directory")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        data_dir = resolve_measured_dir(args.data)
        _log(start, f"reading {data_dir}")
        table = load_measured(data_dir)
    except InfersimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = table.groupby(["gpu", "op_class"]).size()
    _log(start, f"{len(table)} measured rows:\n{counts.to_string()}")

    ok = supported_mask(table, load_gpu)
    skipped = table[~ok].groupby(["gpu", "op_class", "source_dtype"]).size()
    if len(skipped):
        _log(start, f"skipping {int((~ok).sum())} rows whose dtype the preset lacks:")
        print(skipped.to_string())
    else:
        _log(start, "no rows skipped: every dtype is supported by its preset")

    predicted = predict(table, progress=lambda line: _log(start, line))
    tables = build_tables(table, predicted)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    markdown = ["# Operator accuracy, uncalibrated\n"]
    for name, frame in tables.items():
        frame.to_csv(out / f"{name}.csv", index=False, float_format="%.5g")
        markdown += [f"\n## {name}\n\n", to_markdown(frame)]
    if len(skipped):
        markdown += ["\n## skipped (dtype not supported by the preset)\n\n", skipped.to_string()]
    (out / "errors.md").write_text("".join(markdown))
    _log(start, "plotting")
    plot = plot_predicted_vs_measured(table, out / "predicted_vs_measured.png", predicted)
    _log(start, f"wrote {out}/{{*.csv, errors.md}} and {plot.name}")

    print("\nHeadline: bf16 GEMMs with m*n*k >= 2^30 (target MAPE <= 20%)")
    for row in tables["headline_big_bf16_gemm"].itertuples():
        verdict = "ok" if row.mape <= TARGET_MAPE else "MISSES TARGET"
        print(
            f"  {row.gpu:<14} n={row.n:<6} MAPE {100 * row.mape:5.1f}%  "
            f"bias {100 * row.bias:+5.1f}%  error of mean {100 * row.mean_error:+5.1f}%  {verdict}"
        )
    print("\nPer op class (all rows):")
    print(to_markdown(tables["by_class"]))
    print("Per op class and source dtype:")
    print(to_markdown(tables["by_class_dtype"]))
    _log(start, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
