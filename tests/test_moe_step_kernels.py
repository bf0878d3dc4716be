"""What a DeepSeek-V3 step runs besides its big GEMMs, as vLLM runs it: the MoE gate
unquantised, MLA's latent norms."""

import pytest

import simulator.engine.step_cost as step_cost
from hardware_models.presets import load_gpu, load_node
from simulator.engine.step_cost import StepCostModel
from simulator.model_catalog import load_model


@pytest.fixture
def priced(monkeypatch):
    """Every GEMM and pointwise chain a new StepCostModel prices for one token."""
    gemms, chains = [], []
    real_gemm, real_pointwise = step_cost.gemm_cost, step_cost.elementwise_cost

    def gemm(gpu, m, n, k, dtype="bf16", weight_dtype=None):
        gemms.append((n, k, str(dtype)))
        return real_gemm(gpu, m, n, k, dtype, weight_dtype)

    def pointwise(gpu, chain, elements, dtype, fused=True):
        chains.append((tuple(op.name for op in chain), elements))
        return real_pointwise(gpu, chain, elements, dtype, fused=fused)

    monkeypatch.setattr(step_cost, "gemm_cost", gemm)
    monkeypatch.setattr(step_cost, "elementwise_cost", pointwise)
    model = StepCostModel(
        load_model("deepseek-v3"), load_gpu("h200-sxm"), load_node("hgx-h200"),
        weight_dtype="fp8_block", tp=8,
    )  # fmt: skip
    model.step(decode_seqs=1, decode_context=1000)
    return gemms, chains


def test_the_moe_gate_runs_in_the_activation_dtype(priced):
    """vLLM builds DeepSeek's, Qwen3's and Mixtral's gate with quant_config=None: a bf16
    GEMM even in an fp8 checkpoint (the planner already stores it in bf16)."""
    gemms, _ = priced
    assert (256, 7168, "bf16") in gemms
    assert (2112, 7168, "fp8_block") in gemms  # the fused q/kv down-projection
    assert not any(n == 256 and k == 7168 and d != "bf16" for n, k, d in gemms)


def test_mla_prices_its_latent_norms(priced):
    """q_a_layernorm over the 1536-wide compressed query, kv_a_layernorm over the 512-wide
    latent: two RMSNorm kernels a layer."""
    _, chains = priced
    norms = [elements for ops, elements in chains if ops == ("rmsnorm",)]
    assert 1536 in norms and 512 in norms
