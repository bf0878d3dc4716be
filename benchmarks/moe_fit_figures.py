"""Refit the MoE classes alone and print their held-out errors: the quick loop for the
MoE cost model (a full `infersim calibrate fit` refits every class and takes minutes).

Starts from a shipped profile with its MoE fields cleared (what the full fit sees when it
reaches the MoE classes), fits each weight format on the fit half of the GPU's moe_perf
rows, and prints the MAPE per source dtype on the held-out half (seed 0), the same with
the preset's uncalibrated efficiencies, and the fitted profile on every A100 MoE row
(the transfer), also split into tensor- and expert-parallel rows (the A100's EP rows
were timed by an older collector: benchmarks/README.md, "Transfer pass"). Writes the
fitted efficiencies as JSON.

    python benchmarks/moe_fit_figures.py [--gpu h100-sxm] [-o /tmp/moe/fit.json]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from hardware_models.calibration import holdout_mask, load_measured, predict
from hardware_models.calibration.fit import class_fits, fit_class
from hardware_models.calibration.profile_file import read_profile
from hardware_models.efficiency import EfficiencyProfile
from hardware_models.presets import calibration_path, load_gpu

TRANSFER_GPU = "a100-80gb-sxm"


def mape_line(
    gpu: str, efficiency: EfficiencyProfile, rows: pd.DataFrame, by: str = "source_dtype"
) -> str:
    """MAPE over `rows` priced on `gpu` with `efficiency`, then per value of `by`."""
    spec = load_gpu(gpu).with_efficiency(efficiency)
    predicted = predict(rows, gpu_resolver=lambda _name: spec).to_numpy()
    error = np.abs(predicted - rows["measured_s"].to_numpy()) / rows["measured_s"].to_numpy()
    by_dtype = pd.Series(error).groupby(rows[by].to_numpy()).mean()
    parts = "  ".join(f"{name} {value:.2%}" for name, value in by_dtype.items())
    return f"n {len(rows)}  all {error.mean():.2%}  |  {parts}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("-o", "--out", default=None, help="write the fitted efficiencies (JSON)")
    args = parser.parse_args()
    shipped = read_profile(calibration_path(args.gpu))
    table = load_measured(gpus=[args.gpu], op_classes=["moe"])
    held = holdout_mask(table, shipped.metadata.holdout, shipped.metadata.seed)
    moe_fields = [name for name in EfficiencyProfile.model_fields if name.startswith("moe_")]
    cleared = {
        n: {} if isinstance(getattr(shipped.efficiency, n), dict) else None for n in moe_fields
    }
    efficiency = shipped.efficiency.model_copy(update=cleared)
    spec = load_gpu(args.gpu).with_efficiency(efficiency)
    start = time.perf_counter()
    for fit in class_fits(table[~held]):
        efficiency = fit_class(spec, efficiency, fit, shipped.metadata.seed)
    print(f"fitted the MoE classes in {time.perf_counter() - start:.0f} s")
    if args.out:
        with open(args.out, "w") as out:
            out.write(efficiency.model_dump_json())
    print(f"{args.gpu} held-out, calibrated:   {mape_line(args.gpu, efficiency, table[held])}")
    uncalibrated = load_gpu(args.gpu).efficiency
    print(f"{args.gpu} held-out, uncalibrated: {mape_line(args.gpu, uncalibrated, table[held])}")
    if args.gpu != TRANSFER_GPU:
        rows = load_measured(gpus=[TRANSFER_GPU], op_classes=["moe"])
        print(f"on every {TRANSFER_GPU} row:   {mape_line(TRANSFER_GPU, efficiency, rows)}")
        rows = rows.assign(parallel=np.where(rows["ep"] > 1, "EP", "TP"))
        print(f"  by parallelism:  {mape_line(TRANSFER_GPU, efficiency, rows, 'parallel')}")


if __name__ == "__main__":
    main()
