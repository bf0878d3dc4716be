"""Block-scaled low-precision GEMMs by GPU family: fp8_block on Hopper (CUDA-core
rescaling, stores after the k loop), nvfp4 and mxfp4 as formats of their own (scale
bytes, a quantisation pass, Blackwell's rates), datacenter Blackwell (tcgen05, 2-SM
clusters, overlapped epilogue) against workstation Blackwell (warp MMAs like Ada), and
where vLLM runs 4-bit weights at all. No Blackwell is measured here: the tests check the
structure the kernels' sources give, not fitted figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hardware_models.block_scaling import (
    BLACKWELL_DATACENTER,
    BLACKWELL_WORKSTATION,
    MXFP4,
    NVFP4,
    gemm_family,
    scales_on_cuda_cores,
    serving_rule,
    stored_bytes,
    weight_support,
)
from hardware_models.calibration.benchmark_loops import EAGER_RUNS, eager_seconds, timed_eagerly
from hardware_models.calibration.measured_tables import predict
from hardware_models.calibration.operator_terms import gemm_terms
from hardware_models.efficiency import MOE_FORMATS
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_launches, gemm_parts
from hardware_models.op_request import parse_request
from hardware_models.presets import load_gpu, load_node
from simulator.engine.moe_layer import moe_format
from simulator.engine.step_cost import StepCostModel
from simulator.memory_planner import plan_memory, weight_bytes_per_param
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from tests.conftest import scenario_dict

B200, RTX, H100 = load_gpu("b200"), load_gpu("rtx-pro-6000"), load_gpu("h100-sxm")


def test_blackwell_is_two_gemm_families():
    assert gemm_family(B200) == BLACKWELL_DATACENTER
    assert gemm_family(RTX) == BLACKWELL_WORKSTATION
    assert gemm_family(H100) == "hopper"


def test_fp4_on_b200_is_twice_fp8_at_large_shapes_less_the_scale_overhead():
    m = n = k = 8192
    fp4, fp8 = gemm_parts(B200, m, n, k, "nvfp4"), gemm_parts(B200, m, n, k, "fp8")
    # The datasheet rates: 9 PF dense fp4, 4.5 PF fp8; the tiles fill the same waves.
    assert fp4.math_s / fp8.math_s == pytest.approx(0.5, rel=1e-9)
    # Scale bytes and the quantisation pass (2.56 bytes per activation, against fp8's 3)
    # keep the whole call above half.
    assert 0.5 < fp4.seconds / fp8.seconds < 0.7


def test_datacenter_blackwell_overlaps_its_stores_and_pairs_sms():
    m, n, k = 4096, 4096, 512
    b200, rtx = gemm_parts(B200, m, n, k, "nvfp4"), gemm_parts(RTX, m, n, k, "nvfp4")
    assert b200.epilogue_s == 0.0  # tensor-memory accumulators, drained under the next MMA
    assert rtx.epilogue_s > 0.0  # registers: stores after each tile's k loop, as on Ada
    big = serving_rule(B200, "nvfp4").tiles[-1]
    assert big.cluster_m == 2 and big.tile == (128, 256)  # a 2-SM 256 x 256 UMMA
    assert {b.cluster_m for b in serving_rule(RTX, "nvfp4").tiles} == {1}
    # A 2-SM cluster launches whole: 257 rows compute four 128-row tiles, not three.
    t256, t257 = (gemm_parts(B200, rows, 16384, 8192, "nvfp4").math_s for rows in (256, 257))
    assert t257 == pytest.approx(2 * t256)


def test_only_fp8_blocks_are_rescaled_on_the_cuda_cores():
    assert scales_on_cuda_cores(H100, "fp8_block")
    assert scales_on_cuda_cores(RTX, "fp8_block")  # fp32 block scales: no hardware format
    assert not scales_on_cuda_cores(B200, "fp8_block")  # DeepGEMM's e8m0 block-scaled MMA
    assert not any(scales_on_cuda_cores(g, f) for g in (B200, RTX) for f in ("nvfp4", "mxfp4"))


def test_hoppers_block_scaled_fp8_stores_after_its_k_loop():
    assert gemm_parts(H100, 4096, 4096, 512, "fp8_block").epilogue_s > 0.0
    assert gemm_parts(H100, 4096, 4096, 512, "fp8").epilogue_s == 0.0


def test_mxfp4_and_nvfp4_differ_by_their_scale_bytes():
    assert NVFP4.weight_bytes == 0.5 + 1 / 16 and MXFP4.weight_bytes == 0.5 + 1 / 32
    assert stored_bytes("fp4") == MXFP4.weight_bytes  # a plain fp4 is MXFP4
    n = k = 8192
    nv, mx = gemm_parts(B200, 1, n, k, "nvfp4"), gemm_parts(B200, 1, n, k, "mxfp4")
    # B's scales, the row's in the GEMM, and the row's written by the quantisation pass.
    scales = (1 / 16 - 1 / 32) * (n * k + 2 * k)
    assert nv.dram_bytes - mx.dram_bytes == pytest.approx(scales, rel=1e-6)
    assert nv.memory_s > mx.memory_s


def test_a_gpu_without_fp4_tensor_cores_has_no_fp4_gemm():
    with pytest.raises(InfersimError, match="h100-sxm has no tensor-core support for fp4"):
        gemm_parts(H100, 64, 4096, 4096, "nvfp4")


def test_where_vllm_runs_4_bit_weights():
    mi300x = load_gpu("mi300x")
    assert weight_support(B200, "nvfp4") == weight_support(RTX, "mxfp4") == "native"
    assert weight_support(H100, "nvfp4") == "dequantised"  # Marlin W4A16
    assert weight_support(mi300x, "mxfp4") == "dequantised"
    assert weight_support(mi300x, "nvfp4") is None
    with pytest.raises(InfersimError) as err:
        plan_memory(load_model("llama-3.1-8b"), mi300x, weight_dtype="nvfp4")
    assert str(err.value).startswith("model.weight_dtype: mi300x (CDNA3) has no kernels")
    assert "4-bit formats it runs: mxfp4" in str(err.value)


def test_nvfp4_weights_are_stored_with_their_scales():
    assert weight_bytes_per_param("nvfp4") == pytest.approx(0.5625)
    assert weight_bytes_per_param("mxfp4") == pytest.approx(0.53125)
    # The experts run Marlin's W4A16 kernels, reading the same bytes.
    for fmt in ("nvfp4", "mxfp4"):
        assert MOE_FORMATS[moe_format(fmt)].weight_bytes == weight_bytes_per_param(fmt)
    arch = load_model("llama-3.1-8b")
    nv, mx = (plan_memory(arch, B200, weight_dtype=f).weights for f in ("nvfp4", "mxfp4"))
    assert nv > mx


def test_the_engine_runs_nvfp4_natively_on_blackwell_and_dequantised_on_hopper():
    arch = load_model("llama-3.1-8b")
    native = StepCostModel(arch, B200, load_node("hgx-b200"), weight_dtype="nvfp4")
    assert native.gemm_dtypes("qkv") == ("nvfp4", "nvfp4")
    hopper = StepCostModel(arch, H100, load_node("dgx-h100"), weight_dtype="nvfp4")
    assert hopper.gemm_dtypes("qkv")[0] == "bf16"
    data = scenario_dict(model={"name": "llama-3.1-8b", "weight_dtype": "mxfp4"})
    assert Scenario.from_dict(data).model.weight_dtype == "mxfp4"


def test_fp8_block_rows_of_the_public_table_are_priced_as_timed_eagerly():
    """aiconfigurator's vLLM collector ran fp8_block GEMMs without a CUDA graph up to
    vLLM 0.24 (kernel-naming rows included): a row takes at least its kernels' host
    launches; graphed rows, later collectors and other tables do not."""
    rows = pd.DataFrame(
        {
            "gpu": "h100-sxm",
            "op_class": "gemm",
            "m": [5.0, 5.0, 5.0],
            "n": 128.0,
            "k": 128.0,
            "dtype": ["fp8", "fp8", "fp8"],
            "source_dtype": ["fp8_block", "fp8", "fp8_block"],
            "source": ["/x/h100_sxm/gemm_perf.parquet:VLLM==0.19.0:vllm_default"] * 2
            + ["mine.csv"],
        }
    )
    assert timed_eagerly(rows).tolist() == [True, False, False]
    # vLLM 0.24.0's collector names the kernel it selected and still runs it eagerly.
    named = rows.assign(
        source="/x/l40s/gemm_perf.parquet:VLLM==0.24.0:TritonFp8BlockScaledMMKernel"
    )
    assert timed_eagerly(named).tolist() == [True, False, True]
    graphed = rows.assign(source="/x/b300/gemm_perf.parquet:VLLM==0.25.0:SomeKernel")
    assert not timed_eagerly(graphed).any()
    unknown_collector = rows.assign(source="/x/h100_sxm/gemm_perf.parquet:vllm_default")
    assert not timed_eagerly(unknown_collector).any()
    priced = predict(rows, gpu_resolver=lambda _name: H100).to_numpy()
    launches = gemm_launches(H100, np.array([5.0]), "fp8_block")[0]
    assert launches == 3  # quantisation, the padding copy (5 rows), the matmul
    launch = H100.efficiency.launch_overhead_eager_us * 1e-6
    device = priced[2]  # the same GEMM, not timed eagerly
    # Host-bound: six calls' launches, then the last call's kernels.
    assert priced[0] == pytest.approx(launches * launch + device / EAGER_RUNS)
    # GPU-bound (a long GEMM): the device time, plus the first launch over six calls.
    long = eager_seconds(np.array([1e-3]), np.array([3]), launch)[0]
    assert long == pytest.approx(1e-3 + launch / EAGER_RUNS)


def test_the_fit_prices_eager_rows_as_validation_does_and_learns_no_curve_from_host_bound_ones():
    rows = pd.DataFrame(
        {
            "gpu": "h100-sxm",
            "op_class": "gemm",
            "m": [4.0, 8192.0],
            "n": [128.0, 8192.0],
            "k": [128.0, 8192.0],
            "dtype": "fp8",
            "source_dtype": "fp8_block",
            "source": "/x/h100_sxm/gemm_perf.parquet:VLLM==0.19.0:vllm_default",
        }
    )
    terms = gemm_terms(H100, rows, "fp8_block")
    priced = predict(rows, gpu_resolver=lambda _name: H100).to_numpy()
    assert terms.seconds == pytest.approx(priced)
    curves = terms.curves.values()
    assert not any(c.binds[0] for c in curves)  # host-bound: the launches set its time
    assert any(c.binds[1] for c in curves)  # GPU-bound: the math does
    assert terms.floor_s[0] == pytest.approx(terms.seconds[0])


def test_the_roofline_request_takes_block_scaled_gemm_dtypes_only_for_gemms():
    gemm = parse_request({"op": "gemm", "dtype": "NVFP4", "m": 64, "n": 4096, "k": 4096}, "x")
    assert gemm.price(B200).seconds == gemm_parts(B200, 64, 4096, 4096, "nvfp4").seconds
    with pytest.raises(InfersimError, match="dtype mxfp4 is a block-scaled GEMM format"):
        parse_request({"op": "embedding", "dtype": "mxfp4", "tokens": 8, "hidden": 64}, "x")
    with pytest.raises(InfersimError, match="for gemm also fp8_block, nvfp4, mxfp4"):
        parse_request({"op": "gemm", "dtype": "fp7", "m": 1, "n": 1, "k": 1}, "x")


@pytest.mark.parametrize(("gpu", "kernel"), [(H100, "fp8_block"), (B200, "nvfp4")])
def test_the_fit_reads_the_memory_curve_at_the_bytes_pricing_moves(gpu, kernel):
    """gemm_terms' memory-curve size is gemm.py's: operands with their block scales, so
    a curve is fitted at the x pricing reads it at."""
    rows = pd.DataFrame(
        {
            "gpu": gpu.name,
            "op_class": "gemm",
            "m": [1.0, 4.0],
            "n": 2048.0,
            "k": 2048.0,
            "dtype": kernel,
            "source_dtype": kernel,
            "source": "mine.csv",  # priced cold, operands L2-resident: no wave traffic
        }
    )
    term = gemm_terms(gpu, rows, kernel).curves[("gemm_memory_by_dtype", kernel)]
    curve = gpu.efficiency.gemm_terms(kernel)[1]
    rate = gpu.memory_bandwidth * np.array([curve.at(x) for x in term.size])
    assert term.seconds == pytest.approx(term.size / rate, rel=1e-12)
