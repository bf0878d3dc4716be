"""Best square bf16 GEMM throughput: each profile's prediction against published figures.

The published figures are the community table of `torch.mm` throughput at n = 1024 ..
10240 (https://github.com/zzc0721/torch-performance-test-data, `database.md`: each card's
best over those sizes, bf16, one row per contributor). None of them went into a fit; they
check the RTX 4090 profile (fitted to other published rows) and, on the H100 and A100,
whether such community figures agree with the aiconfigurator tables the other profiles
were fitted to.

    python benchmarks/published_peaks.py

The profiles are the shipped ones (`hardware_models/presets/calibrations/`).
"""

from __future__ import annotations

import statistics
import sys

from hardware_models.gemm import gemm_cost
from hardware_models.presets import load_gpu

SIZES = (1024, 2048, 4096, 8192, 10240)
# database.md rows for these cards (24 GB RTX 4090s only; the 48 GB rebuilds are left out).
PUBLISHED_TFLOPS = {
    "rtx-4090": (170.06, 173.31, 162.39, 163.09),
    "h100-sxm": (789.24, 783.66),
    "a100-80gb-sxm": (264.53,),
}


def best_square_tflops(gpu_name: str, calibration: str | None) -> float:
    gpu = load_gpu(gpu_name, calibration=calibration)
    return max(2 * s**3 / gemm_cost(gpu, s, s, s, "bf16").seconds / 1e12 for s in SIZES)


def main() -> int:
    print(f"{'gpu':<15}{'published (median)':>20}{'uncalibrated':>14}{'profile':>10}{'error':>8}")
    for gpu_name, figures in PUBLISHED_TFLOPS.items():
        published = statistics.median(figures)
        plain = best_square_tflops(gpu_name, None)
        fitted = best_square_tflops(gpu_name, gpu_name)
        error = 100 * (fitted - published) / published
        print(f"{gpu_name:<15}{published:>20.1f}{plain:>14.1f}{fitted:>10.1f}{error:>+7.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
