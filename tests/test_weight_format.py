"""Block-scaled fp8 weights (DeepSeek-V3's and Qwen3-FP8's checkpoint format) as a weight
dtype of its own: accepted by a scenario, run by the block-scaled GEMM and fused-MoE
kernels, stored with its scales, and refused on shards vLLM refuses."""

import pytest

from hardware_models.efficiency import MOE_FORMATS
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_cost
from hardware_models.presets import load_gpu, load_node, with_calibration
from simulator.engine.moe_layer import moe_format
from simulator.engine.step_cost import StepCostModel
from simulator.memory_planner import plan_memory, weight_bytes_per_param
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from tests.conftest import scenario_dict


def test_a_scenario_takes_fp8_block_weights():
    data = scenario_dict(model={"name": "deepseek-v3", "weight_dtype": "fp8_block"})
    assert Scenario.from_dict(data).model.weight_dtype == "fp8_block"


def test_fp8_block_runs_the_block_scaled_kernels():
    """The H100 profile holds fitted block-scaled fp8 GEMM curves (3x per-tensor fp8 at one
    row, as the public table measures): a decode step of DeepSeek-V3 at batch 1 must use
    them, and the experts the fp8_block fused-MoE format."""
    gpu = with_calibration(load_gpu("h100-sxm"), "h100-sxm")
    arch, node = load_model("deepseek-v3"), load_node("dgx-h100")
    per_tensor = StepCostModel(arch, gpu, node, weight_dtype="fp8", tp=8)
    block = StepCostModel(arch, gpu, node, weight_dtype="fp8_block", tp=8)
    assert block.gemm_dtype == "fp8_block" and per_tensor.gemm_dtype == "fp8"
    one, blk = (m.step(decode_seqs=1, decode_context=1024).seconds for m in (per_tensor, block))
    assert blk > 1.3 * one
    assert moe_format("fp8_block") == "fp8_block" and moe_format("fp8") == "fp8"


def test_fp8_block_without_native_fp8_dequantises_to_bf16():
    """On an A100 (no fp8 tensor cores) the weights are dequantised: bf16 GEMMs."""
    m = StepCostModel(
        load_model("llama-3.1-8b"), load_gpu("a100-80gb-sxm"), load_node("dgx-a100"),
        weight_dtype="fp8_block",
    )  # fmt: skip
    assert m.gemm_dtype == m.compute_dtype == "bf16"


def test_fp8_block_weights_carry_their_scales():
    """One fp32 scale per 128 x 128 block: 1 + 4 / 16384 bytes a weight."""
    assert weight_bytes_per_param("fp8_block") == pytest.approx(1 + 4 / 128**2)
    assert weight_bytes_per_param("fp8") == 1.0
    arch, gpu = load_model("deepseek-v3"), load_gpu("h200-sxm")
    fp8, block = (plan_memory(arch, gpu, weight_dtype=d, tp=8) for d in ("fp8", "fp8_block"))
    assert block.weight_dtype == "fp8_block"
    extra = block.weights - fp8.weights
    assert 0 < extra < fp8.weights * 4 / 128**2 * 1.01


@pytest.mark.parametrize("tp", [4, 8])
def test_fp8_block_refuses_partial_block_shards(tp):
    """Qwen3-30B-A3B's 768-wide experts split 4 or 8 ways leave 192 or 96 columns a GPU,
    not whole 128-wide blocks: vLLM refuses the FP8 checkpoint at those tp."""
    arch, gpu, node = load_model("qwen3-30b-a3b"), load_gpu("h100-sxm"), load_node("dgx-h100")
    with pytest.raises(InfersimError, match=r"moe_intermediate_size 768 / tp \d = \d+"):
        StepCostModel(arch, gpu, node, weight_dtype="fp8_block", tp=tp)
    with pytest.raises(InfersimError, match="fp8_block weights need shards"):
        plan_memory(arch, gpu, weight_dtype="fp8_block", tp=tp)
    # Whole experts per GPU, per-tensor fp8, or 384-wide shards at tp=2 are fine.
    StepCostModel(arch, gpu, node, weight_dtype="fp8_block", tp=tp, expert_parallel=True)
    StepCostModel(arch, gpu, node, weight_dtype="fp8", tp=tp)
    StepCostModel(arch, gpu, node, weight_dtype="fp8_block", tp=2)


def test_fp4_weights_are_stored_as_the_moe_kernel_reads_them():
    """fp4 is MXFP4 (one 8-bit scale per 32 weights: gpt-oss's checkpoint) in the planner
    and in the fused-MoE format alike; the planner used NVFP4's 1/16."""
    assert weight_bytes_per_param("fp4") == MOE_FORMATS[moe_format("fp4")].weight_bytes
    assert weight_bytes_per_param("fp4") == pytest.approx(0.5 + 1 / 32)


@pytest.mark.parametrize("gpu_name", ["h100-sxm", "b200"])
def test_mxfp4_moe_prices_its_linear_layers_in_16_bits(gpu_name):
    """vLLM's Mxfp4Config quantises gpt-oss's fused-MoE experts only; its attention
    projections keep bf16 weights and bf16 math (also on B200, which multiplies fp4
    natively), as the memory plan stores them. The experts stay MXFP4."""
    arch, gpu = load_model("gpt-oss-20b"), load_gpu(gpu_name)
    node = load_node("dgx-h100" if gpu_name == "h100-sxm" else "hgx-b200")
    mxfp4 = StepCostModel(arch, gpu, node, weight_dtype="mxfp4")
    bf16 = StepCostModel(arch, gpu, node, weight_dtype="bf16")
    assert mxfp4.gemm_dtypes("qkv_proj") == bf16.gemm_dtypes("qkv_proj") == ("bf16", "bf16")
    assert mxfp4.compute_dtype == "bf16"
    (_, _, n, k), *_ = arch.attention_gemms(1)
    qkv = gemm_cost(gpu, 1, n, k, *mxfp4.gemm_dtypes("qkv_proj"))
    assert qkv.dram_bytes >= 2 * n * k
    experts, dense_experts = (m._routed_experts(1) for m in (mxfp4, bf16))
    assert moe_format(mxfp4.weight_format) == "w4a16_mxfp4"
    assert experts.dram_bytes < 0.3 * dense_experts.dram_bytes
    plan = plan_memory(arch, gpu, weight_dtype="mxfp4")
    attention_bytes = 2 * sum(n * k for _, _, n, k in arch.attention_gemms(1))
    assert plan.weights - plan.expert_weights >= attention_bytes * arch.num_layers


def test_a_dense_mxfp4_model_keeps_its_linear_layers_in_mxfp4():
    """Only an MoE checkpoint's experts-only rule sends its linear layers to 16 bits: a
    dense model in mxfp4 (B200 multiplies it natively) runs its GEMMs in mxfp4."""
    gpu, node = load_gpu("b200"), load_node("hgx-b200")
    m = StepCostModel(load_model("llama-3.1-8b"), gpu, node, weight_dtype="mxfp4")
    assert m.gemm_dtypes("qkv_proj") == ("mxfp4", "mxfp4")
