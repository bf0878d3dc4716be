"""Fit and validate the attention classes of one GPU's public tables alone: what
`infersim calibrate fit` and `validate` do for them, without the GEMM, MoE and collective
classes (seconds instead of minutes; the attention fit does not depend on the others).
Prints the held-out MAPE (half of the shapes, seed 0), uncalibrated and fitted, per
class and cache dtype.

    python benchmarks/attention_fit.py l40s [--out PROFILE.yaml]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from hardware_models.calibration.fit import fit_profile
from hardware_models.calibration.profile_file import (
    CalibrationProfile,
    ProfileMetadata,
    write_profile,
)
from hardware_models.calibration.sources import load_measurements
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.validate import predict_all
from hardware_models.calibration.workflow import usable_rows
from hardware_models.presets import load_gpu

CLASSES = ("attention_prefill", "attention_decode")


def _mape(predicted, measured) -> str:
    return f"{100 * np.mean(np.abs(predicted - measured) / measured):.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu", help="public tables by GPU: h100-sxm, a100-80gb-sxm, l40s")
    parser.add_argument("--out", help="write the fitted profile here")
    args = parser.parse_args()
    gpu = load_gpu(args.gpu)
    measured = load_measurements(from_shared=args.gpu)
    attention = measured.table[measured.table["op_class"].isin(CLASSES)]
    rows = usable_rows(replace(measured, table=attention), gpu).rows
    held = holdout_mask(rows, 0.5, 0)
    efficiency = fit_profile(gpu, rows[~held], seed=0)
    if args.out:
        used = rows[~held].groupby("op_class").size()
        metadata = ProfileMetadata(
            source=f"{measured.source}, attention classes",
            gpu=gpu.name,
            rows_used={str(k): int(v) for k, v in used.items()},
            holdout=0.5,
            seed=0,
            curves_only=False,
        )
        write_profile(CalibrationProfile(metadata=metadata, efficiency=efficiency), args.out)
    test = rows[held].assign(
        before=predict_all(rows[held], gpu),
        after=predict_all(rows[held], gpu.with_efficiency(efficiency)),
    )
    print(f"{gpu.name}, held-out half (seed 0): uncalibrated -> fitted")
    for op_class, sub in test.groupby("op_class"):
        print(f"{op_class} (n={len(sub)}): {_mape(sub.before, sub.measured_s)} -> "
              f"{_mape(sub.after, sub.measured_s)}")  # fmt: skip
        for dtype, part in sub.groupby("source_dtype"):
            print(f"  {dtype} (n={len(part)}): {_mape(part.before, part.measured_s)} -> "
                  f"{_mape(part.after, part.measured_s)}")  # fmt: skip


if __name__ == "__main__":
    main()
