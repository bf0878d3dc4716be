"""gpt-oss's MXFP4 experts priced with the kernel vLLM runs on each GPU family
(hardware_models.mxfp4_moe), within physical bounds, and said by the run."""

from __future__ import annotations

import warnings

import pytest

import simulator as sim
from hardware_models.dtypes import Dtype
from hardware_models.efficiency import MOE_FORMATS
from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.moe import MoeLayer, MoeShape, matmul_ogs_block_m, upcast_s
from hardware_models.mxfp4_moe import (
    FLASHINFER_TRTLLM_BF16,
    MARLIN,
    TRITON,
    mxfp4_moe_backend,
)
from hardware_models.presets import load_gpu
from simulator.build import build_replica
from simulator.engine.moe_layer import ExpertLayout, moe_format, routed_experts_cost
from simulator.memory_planner import plan_memory
from simulator.scenario import Scenario
from simulator.vllm_defaults import EMULATED_VLLM_VERSION

V19, V10 = (0, 19, 0), (0, 10, 1)


@pytest.mark.parametrize(
    ("gpu", "backend"),
    [
        ("a100-80gb-sxm", MARLIN),  # Ampere
        ("l40s", MARLIN),  # Ada: the L40S table's vllm_gptossmxfp4moe_marlin rows
        ("rtx-4090", MARLIN),
        ("rtx-pro-6000", MARLIN),  # sm_120: outside triton_kernels' sm_90-sm_10x
        ("h100-sxm", TRITON),  # Hopper: matmul_ogs, bundled from 0.12
        ("h200-sxm", TRITON),
        ("b200", FLASHINFER_TRTLLM_BF16),  # sm_100: FlashInfer's TRT-LLM MoE
        ("mi300x", TRITON),  # ROCm: matmul_ogs too
    ],
)
def test_each_family_runs_the_backend_vllm_picks(gpu, backend):
    assert mxfp4_moe_backend(load_gpu(gpu), V19) == backend
    assert moe_format("mxfp4", load_gpu(gpu)) == backend.moe_format
    assert moe_format("fp4", load_gpu(gpu)) == backend.moe_format  # plain fp4 is MXFP4


def test_hopper_ran_marlin_before_vllm_bundled_triton_kernels():
    """vllm#23278 (0.10.1, H100): Marlin's padded weights; triton_kernels ships from 0.12."""
    h100 = load_gpu("h100-sxm")
    assert mxfp4_moe_backend(h100, V10) == MARLIN
    assert mxfp4_moe_backend(h100, (0, 12, 0)) == TRITON
    assert mxfp4_moe_backend(load_gpu("b200"), V10) == FLASHINFER_TRTLLM_BF16


def test_other_formats_and_no_gpu_keep_their_kernels():
    h100 = load_gpu("h100-sxm")
    assert moe_format("fp8", h100) == "fp8" and moe_format("int4", h100) == "int4_wo"
    assert moe_format("mxfp4") == "w4a16_mxfp4"  # no GPU named: the checkpoint's Marlin
    # Every backend reads the same 4.25-bit weights.
    widths = {MOE_FORMATS[b.moe_format].weight_bytes for b in (MARLIN, TRITON)}
    assert widths == {0.5 + 1 / 32} == {MOE_FORMATS[FLASHINFER_TRTLLM_BF16.moe_format].weight_bytes}


def _moe_8192(gpu_name: str, calibration: str | None = None):
    arch = sim.load_model("gpt-oss-20b")
    gpu = load_gpu(gpu_name, calibration=calibration) if calibration else load_gpu(gpu_name)
    layout = ExpertLayout.of(arch, 1, False)
    return routed_experts_cost(arch, gpu, 8192, layout, weight_dtype="fp4"), gpu


@pytest.mark.parametrize(("gpu", "calibration"), [("h100-sxm", None), ("h100-sxm", "h100-sxm")])
def test_gpt_oss_20b_experts_at_8192_tokens_are_within_physical_bounds(gpu, calibration):
    """Not faster than the bf16 FLOPs at the tensor peak (the MMA is bf16), and not 3x
    slower: priced as Marlin every Hopper step took 4.5x (178 ms over 24 layers)."""
    cost, spec = _moe_8192(gpu, calibration)
    floor = cost.flops / spec.peak_flops(Dtype.BF16)
    assert floor < cost.seconds < 3 * floor


def test_b200_prefill_experts_are_bound_by_widening_each_128_row_tile():
    """On the B200 the bf16 math of a 128-row tile is a third of what widening its
    weights costs the CUDA cores (MXFP4_UPCAST_INSTRUCTIONS), so at 8,192 tokens
    (1,024 rows an expert, 8 tiles each) the widening binds, and little else adds."""
    cost, b200 = _moe_8192("b200")
    tiles = 32 * (8192 * 4 // 32 // 128)  # 32 experts of 1,024 rows, 8 tiles each
    widening = sum(upcast_s(b200, tiles, n, k) for n, k in ((2 * 2880, 2880), (2880, 2880)))
    floor = cost.flops / b200.peak_flops(Dtype.BF16)
    assert widening > 2.5 * floor
    assert widening < cost.seconds < 1.15 * widening


def test_h100_matmul_ogs_binds_on_widening_its_weights_and_beats_marlin_at_prefill():
    """At 8,192 tokens (1,024 rows an expert, 128-row tiles) the widened weights feed
    the warpgroup MMA, and matmul_ogs takes under half Marlin's time; at 8 tokens each
    active expert's weights are widened once and that, not their 4.25-bit bytes, binds:
    slower than Marlin there, as vllm#27523 measured (benchmarks/README.md)."""
    h100 = load_gpu("h100-sxm")
    layer = MoeLayer(h100, MoeShape(2880, 2880, 4, 32, moe_format="w4a16_mxfp4_triton"))
    marlin = MoeLayer(h100, MoeShape(2880, 2880, 4, 32, moe_format="w4a16_mxfp4"))
    big, small = layer.cost(8192), layer.cost(8)
    assert big.bound == "compute" and small.bound == "compute"
    assert big.seconds < marlin.cost(8192).seconds / 2
    assert small.seconds > marlin.cost(8).seconds


def test_matmul_ogs_block_m_follows_triton_kernels_rule():
    """Rows per expert <= 64: twice them to a power of two in 16-64; else them, to 128."""
    sizes = [16, 16, 16, 32, 64, 128, 128]
    tokens = [1, 8, 64, 128, 256, 2048, 8192]  # 32 experts, top-4: 0.125 .. 1024 rows
    chosen = matmul_ogs_block_m(tokens, 4, 32)
    assert [(8, 16, 32, 48, 64, 128)[i] for i in chosen] == sizes


def test_the_memory_plan_keeps_mxfp4_bytes_on_every_backend():
    """The backend changes the kernel, not what is stored: gpt-oss-20b's experts are
    4.25-bit on an H100 (Triton), an A100 (Marlin) and a B200 (FlashInfer)."""
    arch = sim.load_model("gpt-oss-20b")
    plans = {g: plan_memory(arch, load_gpu(g), weight_dtype="fp4") for g in ("h100-sxm", "b200")}
    a100 = plan_memory(arch, load_gpu("a100-80gb-sxm"), weight_dtype="fp4")
    bf16 = plan_memory(arch, load_gpu("h100-sxm"), weight_dtype="bf16")
    assert plans["h100-sxm"].weights == a100.weights  # padded alike (mxfp4_layout)
    # 4.25 bits of 16, less the 9% of padding Marlin's alignment adds (2880 -> 3072 x 2944)
    assert plans["h100-sxm"].expert_weights < bf16.expert_weights / 3
    # FlashInfer pads the width to 3072, not 2944: 4% more
    assert plans["b200"].expert_weights == pytest.approx(a100.expert_weights * 3072 / 2944)


def _oss_run(gpu: str, *more: str) -> dict:
    sets = [
        f"hardware.gpu={gpu}",
        "model.name=gpt-oss-20b",
        "model.weight_dtype=fp4",  # its checkpoint's (quickstart.yaml sets bf16)
        "workload.num_requests=20",
        "workload.arrivals.rate_per_s=4",
        *more,
    ]
    scenario = Scenario.from_yaml("scenarios/quickstart.yaml", sets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InfersimWarning)  # read from the summary
        return sim.simulate(scenario, progress=False).summary()


@pytest.mark.parametrize(
    ("gpu", "more", "expected"),
    [
        ("h100-sxm", (), [TRITON]),  # no fp4 rate: the kernel line says bf16, once
        ("l40s", (), []),  # Marlin: the kernel line says it all
        ("b200", (), [FLASHINFER_TRTLLM_BF16]),  # no "priced as Marlin" claim
        ("b200", ("model.mxfp4_use_marlin=true",), []),  # Marlin is what vLLM runs then
    ],
)
def test_mxfp4_experts_get_one_warning_per_fact_and_only_true_ones(gpu, more, expected):
    summary = _oss_run(gpu, *more)
    caveats = [f"gpt-oss-20b's MXFP4 experts on {b.name}: {b.caveat}" for b in expected]
    assert summary["warnings"] == caveats
    marlin = "Marlin" in summary["run"]["moe_kernel"][0]
    assert marlin == (gpu == "l40s" or bool(more))


def test_the_run_says_which_kernel_its_mxfp4_experts_run():
    version = ".".join(map(str, EMULATED_VLLM_VERSION))
    moe = _oss_run("h100-sxm")["run"]["moe_kernel"]
    assert moe == [f"h100-sxm: {TRITON.describe(EMULATED_VLLM_VERSION)}"]
    assert "matmul_ogs" in moe[0] and version in moe[0]
    assert "Marlin" in _oss_run("l40s")["run"]["moe_kernel"][0]
    dense = Scenario.from_yaml("scenarios/quickstart.yaml", ["workload.num_requests=5"])
    assert "moe_kernel" not in sim.simulate(dense, progress=False).summary()["run"]


def test_vllm_mxfp4_use_marlin_forces_marlin_on_nvidia_and_is_refused_elsewhere():
    for gpu in ("h100-sxm", "b200", "l40s"):
        assert mxfp4_moe_backend(load_gpu(gpu), V19, use_marlin=True) == MARLIN
        assert moe_format("fp4", load_gpu(gpu), use_marlin=True) == "w4a16_mxfp4"
    with pytest.raises(InfersimError, match=r"model\.mxfp4_use_marlin: mi300x is not an NVIDIA"):
        mxfp4_moe_backend(load_gpu("mi300x"), V19, use_marlin=True)


def test_a_run_with_mxfp4_use_marlin_prices_and_names_marlin():
    sets = [
        "model.name=gpt-oss-20b",
        "model.weight_dtype=fp4",
        "model.mxfp4_use_marlin=true",
        "workload.num_requests=5",
    ]
    scenario = Scenario.from_yaml("scenarios/quickstart.yaml", sets)
    build = build_replica(scenario)
    assert "Marlin" in build.cost.moe_kernel_note()
    arch, gpu = build.arch, build.gpu
    marlin = routed_experts_cost(
        arch, gpu, 8192, ExpertLayout.of(arch, 1, False), weight_dtype="fp4", mxfp4_use_marlin=True
    )
    layer = MoeLayer(gpu, MoeShape(2880, 2880, 4, 32, moe_format="w4a16_mxfp4")).cost(8192)
    assert marlin.seconds == layer.seconds


def test_mxfp4_use_marlin_on_a_model_without_mxfp4_experts_says_it_changes_nothing():
    sets = ["model.mxfp4_use_marlin=true", "workload.num_requests=5"]
    scenario = Scenario.from_yaml("scenarios/quickstart.yaml", sets)
    with pytest.warns(InfersimWarning, match="VLLM_MXFP4_USE_MARLIN changes nothing"):
        sim.simulate(scenario, progress=False)
