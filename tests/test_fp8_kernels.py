"""Uncalibrated 8-bit GEMMs priced as the serving engine's kernels run them: vLLM's
CUTLASS fp8 path on Hopper (a quantisation kernel, then tiles by m), and block-scaled
fp8's accumulator rescaling on the CUDA cores where the tensor cores do not scale."""

from __future__ import annotations

import pytest

from hardware_models.block_scaling import FP8_BLOCK, SERVING_GEMM_KERNELS
from hardware_models.gemm import gemm_cost, gemm_parts
from hardware_models.presets import load_gpu

H100 = load_gpu("h100-sxm")


def test_hopper_fp8_runs_vllms_kernels_with_a_launch_floor_each() -> None:
    kernels = {key: rule.kernel for key, rule in SERVING_GEMM_KERNELS["hopper"].items()}
    assert kernels["fp8"].dispatch == "by_m" and kernels["fp8"].quantize_activations
    assert kernels["fp8_block"].align_m == 4
    cost = gemm_cost(H100, 1, 4096, 4096, "fp8")
    assert cost.kernels == 2
    # Two launch floors: the quantisation kernel's and the GEMM's.
    assert cost.overhead_seconds >= 2 * H100.efficiency.kernel_floor_us * 1e-6
    # A profile that fitted its own kernel and floor keeps them.
    fitted = load_gpu("h100-sxm", calibration="h100-sxm")
    assert fitted.efficiency.gemm_floor_fitted("fp8")


def test_block_scales_cost_cuda_core_time_where_the_tensor_cores_do_not_apply_them():
    m = n = k = 8192
    block = gemm_parts(H100, m, n, k, "fp8_block").math_s
    plain = gemm_parts(H100, m, n, k, "fp8").math_s
    # One FMA per output element per 128-deep block of k, in series with the tensor math.
    per_flop = 1 / H100.peak_flops("fp8") + 1 / (FP8_BLOCK.block_k * H100.peak_vector_flops())
    assert block / plain == pytest.approx(per_flop * H100.peak_flops("fp8"), rel=1e-9)
