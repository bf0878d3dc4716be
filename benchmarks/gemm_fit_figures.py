"""Refit the GEMM classes of chosen dtypes alone and print their held-out errors: the quick
loop for a GPU family's GEMM kernels (a full `infersim calibrate fit` refits every class).

Reads a GPU's public tables (`--from-shared`), keeps the usable GEMM rows (the screen of
`calibrate fit`), splits them as `calibrate fit` does (half held out, seed 0), prints the
uncalibrated MAPE per kernel dtype on the held-out half, then fits the named dtypes'
classes from the preset's efficiencies on the other half and prints their held-out MAPE
with the kernel each chose, and the fitted error by bucket of m (mean, mean absolute).

    python benchmarks/gemm_fit_figures.py l40s fp8 [fp8_block ...]
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

from hardware_models.calibration.fit import class_fits, fit_class
from hardware_models.calibration.measured_tables import gemm_kernel_dtype, predict
from hardware_models.calibration.sources import load_measurements
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.workflow import usable_rows
from hardware_models.efficiency import dtype_key
from hardware_models.presets import load_gpu

M_BUCKETS = [0, 16, 32, 64, 128, 256, 1024, float("inf")]


def errors(rows: pd.DataFrame, spec) -> pd.Series:
    """Signed relative error of every row priced on `spec`."""
    predicted = predict(rows, gpu_resolver=lambda _name: spec)
    return predicted / rows["measured_s"] - 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu", help="a GPU with public tables (--from-shared)")
    parser.add_argument("dtypes", nargs="*", help="kernel dtypes whose GEMM class to fit")
    args = parser.parse_args()
    spec = load_gpu(args.gpu)
    rows = usable_rows(load_measurements(from_shared=args.gpu), spec).rows
    rows = rows[rows["op_class"] == "gemm"]
    held = holdout_mask(rows, 0.5, 0)
    test = rows[held]
    keys = gemm_kernel_dtype(test).map(dtype_key)
    error = errors(test, spec).abs()
    parts = "  ".join(f"{k} {error[keys == k].mean():.1%}" for k in sorted(set(keys)))
    print(f"{args.gpu} held-out, uncalibrated: all {error.mean():.1%}  |  {parts}")
    if not args.dtypes:
        return
    efficiency = spec.efficiency
    start = time.perf_counter()
    for fit in class_fits(rows[~held], spec):
        if fit.name.removeprefix("gemm/") in args.dtypes:
            efficiency = fit_class(spec, efficiency, fit, 0)
    fitted = spec.with_efficiency(efficiency)
    print(f"fitted {', '.join(args.dtypes)} in {time.perf_counter() - start:.0f} s")
    for key in args.dtypes:
        sub = test[keys == key]
        error = errors(sub, fitted)
        kernel = efficiency.gemm_kernel(key)[0]
        print(f"{key} held-out, fitted: {error.abs().mean():.1%}  kernel {kernel!r}")
        by_m = error.groupby(pd.cut(sub["m"], M_BUCKETS), observed=True)
        for bucket, value in by_m:
            print(f"  m in {bucket}: {value.mean():+.0%} ({value.abs().mean():.0%}) n {len(value)}")


if __name__ == "__main__":
    main()
