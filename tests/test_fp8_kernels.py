"""Uncalibrated 8-bit GEMMs priced as the serving engine's kernels run them: vLLM's
CUTLASS fp8 path on Hopper (a quantisation kernel, then tiles by m) and on Ada (CUTLASS
2.x tiles by m and n), and block-scaled fp8's accumulator rescaling on the CUDA cores
where the tensor cores do not scale."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hardware_models.block_scaling import FP8_BLOCK, SERVING_GEMM_KERNELS, serving_rule
from hardware_models.calibration.fit import _own_kernel, class_fits, gemm_kernel_choices
from hardware_models.calibration.sources import load_measurements
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.validate import predict_all
from hardware_models.calibration.workflow import usable_rows
from hardware_models.efficiency import EfficiencyCurve
from hardware_models.gemm import (
    _setup,
    candidate_layouts,
    gemm_cost,
    gemm_parts,
    gemm_parts_many,
    shared_memory_share,
)
from hardware_models.presets import load_gpu
from tests.conftest import SHARED_DATA, needs_shared_data

H100 = load_gpu("h100-sxm")
L40S = load_gpu("l40s")


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


@pytest.mark.parametrize(
    ("m", "n", "tile"),
    [
        (1, 4096, (16, 64)),
        (16, 12288, (16, 128)),
        (16, 20480, (32, 64)),  # next_pow_2(n) = 32768, over the source's 24576
        (17, 12288, (32, 128)),  # next_pow_2(n) = 16384
        (32, 20480, (32, 64)),
        (48, 8192, (64, 64)),
        (48, 12288, (64, 128)),
        (100, 8192, (64, 128)),
        (100, 12288, (128, 128)),
        (100, 20480, (128, 64)),
        (200, 4096, (64, 128)),
        (200, 5120, (128, 128)),
        (300, 4096, (128, 128)),
        (300, 8192, (256, 128)),
        (300, 16384, (128, 128)),
    ],
)
def test_ada_fp8_runs_vllms_sm89_tiles_by_m_and_n(m: int, n: int, tile: tuple) -> None:
    setup = _setup(L40S, "fp8", None)
    assert setup.kernel.quantize_activations and setup.kernel.dispatch == "fixed"
    (layout,) = candidate_layouts(setup.kernel, m, n, setup.fixed_tiles)
    assert (layout.tile, layout.split, layout.cluster_m) == (tile, 1, 1)


def test_ada_fp8_array_pricing_matches_one_shape_at_a_time() -> None:
    m = np.array([1, 17, 33, 65, 129, 257, 4096, 8, 100, 300])
    n = np.array([4096, 12288, 20480, 8192, 4096, 8192, 16384, 20480, 12288, 4096])
    k = np.array([4096, 1024, 8192, 256, 4096, 2048, 4096, 64, 8192, 512])
    many = gemm_parts_many(L40S, m, n, k, "fp8").seconds
    one = [gemm_parts(L40S, *shape, "fp8").seconds for shape in zip(m, n, k, strict=True)]
    assert many.tolist() == pytest.approx(one, rel=1e-12)


def test_a_tile_named_with_its_warps_is_capped_by_their_shared_memory_reads() -> None:
    # vLLM's sm89 64 x 128 tile runs two 64 x 64 warps: fewer re-reads of A than
    # the four 32 x 64 warps of the rule of thumb, so a cap no lower.
    args = (64, 128, 1.0, 1.0, 4096.0, 128.0)
    assert shared_memory_share(*args, warp=(64, 64)) > shared_memory_share(*args)


def test_a_fit_may_choose_the_gpu_familys_own_serving_kernel() -> None:
    ada = serving_rule(L40S, "fp8").kernel
    ((_, options),) = gemm_kernel_choices("fp8", ada)
    assert ada in options
    ((_, plain),) = gemm_kernel_choices("fp8")
    assert ada not in plain and len(options) == len(plain) + 1
    # Hopper's serving kernel is one of the generic choices already: nothing added.
    hopper = serving_rule(H100, "fp8").kernel
    assert len(gemm_kernel_choices("fp8", hopper)[0][1]) == len(plain)


@needs_shared_data
@pytest.mark.shared_data
def test_ada_dispatch_brings_uncalibrated_l40s_fp8_gemms_within_25_percent() -> None:
    measurements = load_measurements(from_shared="l40s", shared_data=SHARED_DATA)
    rows = usable_rows(measurements, L40S).rows
    rows = rows[(rows["op_class"] == "gemm") & (rows["source_dtype"] == "fp8")]
    rows = rows[holdout_mask(rows, 0.5, 0)]
    predicted = predict_all(rows, L40S)
    error = (predicted - rows["measured_s"]).abs() / rows["measured_s"]
    # 46.9% with Hopper's tiles (benchmarks/README.md, "Calibration for any GPU").
    assert error.mean() < 0.25


def _with(gpu, **fields):
    return gpu.with_efficiency(gpu.efficiency.model_copy(update=fields))


def test_a_per_token_quantiser_costs_its_time_per_row_of_m() -> None:
    fitted = _with(L40S, gemm_quant_row_ns_by_dtype={"fp8": 5.0})
    for m in (1, 4096):
        extra = (
            gemm_parts(fitted, m, 32, 32, "fp8").fixed_s
            - gemm_parts(L40S, m, 32, 32, "fp8").fixed_s
        )
        assert extra == pytest.approx(m * 5e-9, rel=1e-9)
    # fp8_block's kernel is another one: it does not inherit fp8's entry.
    block = gemm_parts(fitted, 64, 4096, 4096, "fp8_block").fixed_s
    assert block == gemm_parts(L40S, 64, 4096, 4096, "fp8_block").fixed_s
    # bf16 runs no quantiser: nothing added.
    plain = _with(L40S, gemm_quant_row_ns_by_dtype={"bf16": 5.0})
    assert gemm_cost(plain, 4096, 32, 32).seconds == gemm_cost(L40S, 4096, 32, 32).seconds


def test_a_kernels_own_store_rate_prices_its_serial_epilogue_warm_or_cold() -> None:
    m, n, k = 4096, 8192, 32
    share = 0.2
    fitted = _with(L40S, gemm_store_bandwidth_by_dtype={"fp8": share})
    store_s = m * n * 2 / (L40S.memory_bandwidth * share)  # bf16 output
    for loop in (None, 80e6):  # cold, and a loop the L40S's L2 keeps warm
        assert gemm_parts(fitted, m, n, k, "fp8", loop_bytes=loop).epilogue_s == pytest.approx(
            store_s, rel=1e-9
        )
    many = gemm_parts_many(fitted, np.array([m]), np.array([n]), np.array([k]), "fp8")
    assert many.seconds[0] == pytest.approx(gemm_parts(fitted, m, n, k, "fp8").seconds, rel=1e-12)


def test_only_a_familys_own_kernel_gets_the_quantiser_and_store_searches() -> None:
    assert _own_kernel(L40S, "fp8") == serving_rule(L40S, "fp8").kernel
    assert _own_kernel(H100, "fp8") is None and _own_kernel(L40S, "bf16") is None
    table = pd.DataFrame(
        {"op_class": "gemm", "dtype": "fp8", "source_dtype": "fp8", "m": np.arange(1, 5),
         "n": 64, "k": 64, "measured_s": 1e-5}
    )  # fmt: skip
    for gpu, searched in ((L40S, True), (H100, False)):
        (fit,) = class_fits(table, gpu)
        names = {s.loc[0] for s in fit.scalars}
        assert {"gemm_quant_row_ns_by_dtype", "gemm_store_bandwidth_by_dtype"} <= names
        own = _own_kernel(gpu, "fp8")
        profile = gpu.efficiency.model_copy(
            update={"gemm_kernel_by_dtype": {"fp8": own or serving_rule(gpu, "fp8").kernel}}
        )
        applied = {s.loc[0] for s in fit.scalars if s.applies(profile)}
        assert ("gemm_quant_row_ns_by_dtype" in applied) is searched
        assert ("gemm_store_bandwidth_by_dtype" in applied) is searched


def test_the_compute_curve_is_read_at_the_work_the_tiles_do() -> None:
    # A steep curve: a curve read at the useful FLOPs would price m = 1 far slower than
    # m = 16, though both run one 16-row tile through the same k loop.
    steep = EfficiencyCurve(sizes=[1e5, 1e7, 1e9], values=[0.01, 0.3, 0.9])
    fitted = _with(L40S, gemm_compute_by_dtype={"fp8": steep})
    one, sixteen = (gemm_parts(fitted, m, 32, 1024, "fp8") for m in (1, 16))
    assert one.work_flops == sixteen.work_flops == 2.0 * 16 * 64 * 1024  # one 16 x 64 tile
    assert one.math_s == sixteen.math_s
    assert one.flops == sixteen.flops / 16
    m = np.array([1, 16, 17, 300])
    many = gemm_parts_many(fitted, m, m * 0 + 32, m * 0 + 1024, "fp8")
    one_by_one = [gemm_parts(fitted, int(x), 32, 1024, "fp8") for x in m]
    assert many.work_flops.tolist() == [p.work_flops for p in one_by_one]
    assert many.seconds.tolist() == pytest.approx([p.seconds for p in one_by_one], rel=1e-12)
