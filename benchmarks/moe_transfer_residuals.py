"""Where the H100 MoE profile misses on the A100's MoE rows (issue 14's transfer): the
residuals by parallelism and token count, by whether vLLM 0.14 had a tuned Triton
configuration file for the rank's shape, the points of the MAPE each group carries,
and the small-read floor of both chips' one-token rows. A diagnostic: it changes no
cost model (benchmarks/README.md, "Transfer pass", twelfth session).

    python benchmarks/moe_transfer_residuals.py [--profile h100-sxm]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from hardware_models.calibration import load_measured, predict
from hardware_models.calibration.profile_file import read_profile
from hardware_models.presets import calibration_path, load_gpu

TRANSFER_GPU = "a100-80gb-sxm"
# (local experts E, width per rank N) with a bf16 file
# fused_moe/configs/E=..,N=..,device_name=NVIDIA_A100-SXM4-80GB.json in vLLM's tree: each
# of the A100 table's 102 shapes looked up (benchmarks/README.md, "Transfer pass",
# eleventh session). Every other shape ran vLLM 0.14's get_default_config.
A100_TUNED_SHAPES = frozenset(
    {(1, 14336), (8, 1792), (8, 2048), (8, 3584), (8, 4096), (8, 7168), (16, 2688), (128, 192)}
)
TOKEN_GROUPS = [0, 2, 16, 256, 4096, np.inf]


def priced_rows(profile: str) -> pd.DataFrame:
    """Every A100 MoE row with the profile's prediction, its signed error and its groups."""
    rows = load_measured(gpus=[TRANSFER_GPU], op_classes=["moe"])
    efficiency = read_profile(calibration_path(profile)).efficiency
    spec = load_gpu(TRANSFER_GPU).with_efficiency(efficiency)
    predicted = predict(rows, gpu_resolver=lambda _name: spec).to_numpy()
    local = -(-rows["num_experts"].astype(int) // rows["ep"].astype(int))
    width = rows["k"].astype(int) // rows["tp"].astype(int)
    return rows.assign(
        predicted_s=predicted,
        error=(predicted - rows["measured_s"]) / rows["measured_s"],
        parallel=np.where(rows["ep"] > 1, "EP", "TP"),
        tokens=pd.cut(rows["m"], TOKEN_GROUPS),
        config=[
            "tuned" if shape in A100_TUNED_SHAPES else "default"
            for shape in zip(local, width, strict=True)
        ],
        large=np.where(rows["m"] > 4096, "> 4096 tokens", "<= 4096 tokens"),
    )


def split(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """n, MAPE, median bias and the points of the whole MAPE each group carries."""
    ape = rows["error"].abs()
    grouped = rows.assign(ape=ape).groupby(keys, observed=True)
    out = grouped.agg(n=("ape", "size"), mape=("ape", "mean"), bias=("error", "median"))
    out["points"] = grouped["ape"].sum() / len(rows) * 100
    out[["mape", "bias"]] *= 100
    return out.round(2)


def same_model(rows: pd.DataFrame, num_experts: int, hidden: int, by: str) -> pd.DataFrame:
    """One model's power_law_1.01 rows at 16,384 and 65,536 tokens across its EP or TP
    degrees: the rank's work halves at each step, the configuration file may not."""
    pick = rows[
        (rows["num_experts"] == num_experts)
        & (rows["n"] == hidden)
        & (rows["routing"] == "power_law_1.01")
        & rows["m"].isin([16384, 65536])
        & (rows[by] > 1 if by == "ep" else rows["ep"] == 1)
    ]
    out = pick.assign(measured_us=pick["measured_s"] * 1e6, predicted_us=pick["predicted_s"] * 1e6)
    out["error"] *= 100
    columns = ["m", by, "config", "measured_us", "predicted_us", "error"]
    return out.sort_values(["m", by])[columns].round(1).set_index(["m", by])


def operand_rates(rows: pd.DataFrame) -> pd.DataFrame:
    """TFLOPS and the L2-to-SM operand traffic it implies (TB/s) of the tensor-parallel
    power_law_1.01 rows at 16,384 tokens and more, per shape: a default-config row moves
    (64 + 64) x 2 bytes a k step for 2 x 64 x 64 FLOPs (vLLM 0.14's 64 x 64 x 32 tile),
    a tuned one is taken as 128 x 128 (Mixtral's E=8, N=7168 A100 file from 1,536 tokens:
    128 x 128 x 64; the other files not read), twice the FLOPs a byte."""
    pick = rows[(rows["ep"] == 1) & (rows["m"] >= 16384) & (rows["routing"] == "power_law_1.01")]
    width = pick["k"] // pick["tp"]
    tflops = 2 * pick["m"] * pick["topk"] * 3 * pick["n"] * width / pick["measured_s"] / 1e12
    flops_per_byte = np.where(pick["config"] == "tuned", 64.0, 32.0)
    out = pick.assign(width=width, tflops=tflops, operand_tbs=tflops / flops_per_byte)
    keys = ["num_experts", "n", "width", "config"]
    return out.groupby(keys)[["tflops", "operand_tbs"]].median().round(2)


def one_token_floor(gpu: str) -> str:
    """Least squares of the one-token tensor-parallel bf16 rows' latency over the weight
    bytes they read (top-k experts' slices): the fixed part and the rate."""
    rows = load_measured(gpus=[gpu], op_classes=["moe"])
    rows = rows[(rows["m"] == 1) & (rows["ep"] == 1) & (rows["dtype"] == "bf16")]
    experts = np.minimum(rows["topk"], rows["num_experts"])
    weight_mb = experts * 3 * rows["n"] * (rows["k"] // rows["tp"]) * 2 / 1e6
    design = np.vstack([np.ones(len(rows)), weight_mb]).T
    (fixed_us, us_per_mb), *_ = np.linalg.lstsq(design, rows["measured_s"] * 1e6, rcond=None)
    return (
        f"{gpu}: {len(rows)} rows, latency = {fixed_us:.1f} us + MB / "
        f"{1e3 / us_per_mb:.0f} GB/s; least {rows['measured_s'].min() * 1e6:.1f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h100-sxm", help="shipped profile to price with")
    args = parser.parse_args()
    rows = priced_rows(args.profile)
    pd.set_option("display.width", 200)
    print(f"{args.profile} profile on {len(rows)} {TRANSFER_GPU} MoE rows: ", end="")
    print(f"MAPE {rows['error'].abs().mean():.2%}")
    for keys in (["parallel"], ["parallel", "tokens"], ["parallel", "config", "large"]):
        print(split(rows, keys), end="\n\n")
    print(same_model(rows, 256, 7168, "ep"), end="\n\n")  # DeepSeek-V3's layer
    print(same_model(rows, 8, 4096, "tp"), end="\n\n")  # Mixtral-8x7B's layer
    print(operand_rates(rows).to_string(), end="\n\n")
    for gpu in ("h100-sxm", TRANSFER_GPU):
        print(one_token_floor(gpu))


if __name__ == "__main__":
    main()
