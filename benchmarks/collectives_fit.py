"""Collectives alone, fitted and validated as `infersim calibrate fit` / `validate` do
(the links fitted on all-reduce rows outside the held-out half, per GPU count), without
pricing every other table: held-out MAPE per op class and GPU count, datasheet model
against the within-GPU fit.

    python benchmarks/collectives_fit.py l40s [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration.fit_links import fit_links
from hardware_models.calibration.measured_tables import COLLECTIVE_CLASSES
from hardware_models.calibration.profile_file import CalibrationProfile, ProfileMetadata
from hardware_models.calibration.sources import load_measurements
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.validate import base_link, predict_all
from hardware_models.calibration.workflow import LINK_FIT_OP
from hardware_models.efficiency import CollectiveFit
from hardware_models.presets import load_gpu


def collective_rows(
    description: str, classes: tuple[str, ...] = COLLECTIVE_CLASSES
) -> tuple[argparse.Namespace, AcceleratorSpec, pd.DataFrame]:
    """The command line (a GPU, --seed), the GPU and its public rows of `classes`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("gpu", help="a GPU with public tables: h100-sxm, a100-80gb-sxm, l40s")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    table = load_measurements(from_shared=args.gpu).table
    return args, load_gpu(args.gpu), table[table["op_class"].isin(classes)]


def main() -> None:
    args, spec, table = collective_rows(__doc__.splitlines()[0])
    held = holdout_mask(table, 0.5, args.seed)
    fitted = fit_links(table[~held], base_link(spec), LINK_FIT_OP)
    collective = {
        p: CollectiveFit(latency_us=f.latency_us, efficiency=f.efficiency)
        for p, f in fitted.items()
    }
    profile = CalibrationProfile(
        metadata=ProfileMetadata(
            source="collectives", gpu=spec.name, rows_used={}, holdout=0.5, seed=args.seed
        ),
        efficiency=spec.efficiency.model_copy(update={"collective_by_gpus": collective}),
    )
    rows = table[held]
    measured = rows["measured_s"]
    frame = rows.assign(
        uncalibrated=100 * np.abs(predict_all(rows, spec) / measured - 1),
        calibrated=100 * np.abs(predict_all(rows, spec, profile) / measured - 1),
        bias_uncalibrated=100 * (predict_all(rows, spec) / measured - 1),
    )
    columns = ["uncalibrated", "calibrated", "bias_uncalibrated"]
    print(f"{args.gpu}: held-out MAPE (%), seed {args.seed}, {len(rows)} rows")
    print(frame.groupby("op_class")[columns].mean().round(1).to_string())
    print(frame.groupby(["op_class", "num_gpus"])[columns].mean().round(1).to_string())
    for p, link in fitted.items():
        per_step = f"{link.latency_us:g} us per step"
        print(f"fitted link, {p} GPUs: {per_step}, efficiency {link.efficiency:g}")


if __name__ == "__main__":
    main()
