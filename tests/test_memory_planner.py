import pytest

from hardware_models.errors import InfeasibleError, InfersimError
from hardware_models.presets import load_gpu
from simulator.memory_planner import GB, plan_memory, stage_weight_bytes
from simulator.model_catalog import load_model


@pytest.fixture(scope="module")
def h100():
    return load_gpu("h100-sxm")


def test_llama_2_7b_bf16_on_h100(h100):
    arch = load_model("llama-2-7b")
    plan = plan_memory(arch, h100, weight_dtype="bf16", kv_dtype="bf16")
    assert plan.weights == pytest.approx(arch.param_count() * 2, rel=1e-9)
    assert plan.weights / GB == pytest.approx(13.48, abs=0.01)
    assert plan.kv_bytes_per_token == 32 * 32 * 128 * 2 * 2
    # vLLM's budget is a share of what CUDA reports (79.22 GiB on an H100 80GB), not 80 GiB
    assert plan.usable == pytest.approx(0.9 * h100.memory.cuda_visible_gib * 2**30)
    assert plan.kv_capacity_tokens > 0
    assert plan.kv_capacity_bytes == pytest.approx(
        plan.usable - plan.weights - plan.activations - plan.framework_overhead
    )
    assert sum(gb for _, gb in plan.breakdown()) == pytest.approx(h100.cuda_memory_bytes / GB)
    assert "KV capacity" in plan.table()


def test_70b_bf16_tp1_is_infeasible_with_breakdown(h100):
    with pytest.raises(InfeasibleError) as info:
        plan_memory(load_model("llama-2-70b"), h100, weight_dtype="bf16", kv_dtype="bf16")
    message = str(info.value)
    assert "weights" in message and "usable" in message
    assert "h100-sxm" in message
    assert "the cheapest layout that fits is parallelism.tp=2 (2 GPUs)" in message


def test_70b_bf16_tp4_fits(h100):
    plan = plan_memory(load_model("llama-2-70b"), h100, weight_dtype="bf16", kv_dtype="bf16", tp=4)
    assert plan.kv_capacity_tokens > 100_000
    # 8 KV heads split 4 ways: 2 heads per GPU.
    assert plan.kv_bytes_per_token == 80 * 2 * 2 * 128 * 2


def _linear_params(arch) -> int:
    """The weight matrices of every layer (projections, every routed expert; routers
    aside): what weight quantisation applies to."""
    routed = arch.num_experts * arch.mlp_matrix_params(arch.expert_intermediate_size)
    matrices = (n * k * times for name, _, n, k, times in arch.gemms(1) if name != "router")
    return sum(matrices) + arch.num_moe_layers * routed


def test_fp8_weights_halve_layer_weights(h100):
    arch = load_model("llama-2-7b")
    bf16 = plan_memory(arch, h100, weight_dtype="bf16", kv_dtype="bf16")
    fp8 = plan_memory(arch, h100, weight_dtype="fp8", kv_dtype="bf16")
    linear = _linear_params(arch)
    assert bf16.weights - fp8.weights == pytest.approx(linear)
    assert 0.5 < fp8.weights / bf16.weights < 0.55  # embeddings and norms stay 16-bit


def test_fp8_kv_doubles_kv_capacity_tokens(h100):
    arch = load_model("llama-3.1-8b")
    bf16 = plan_memory(arch, h100, kv_dtype="bf16")
    fp8 = plan_memory(arch, h100, kv_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens, abs=2)


def test_int4_includes_group_scales():
    arch = load_model("llama-2-7b")
    int4 = stage_weight_bytes(arch, weight_dtype="int4")
    bf16 = stage_weight_bytes(arch, weight_dtype="bf16")
    linear = _linear_params(arch)
    assert bf16 - int4 == pytest.approx(linear * (2 - 0.5 - 2 / 128))


def test_tp_divides_weights():
    arch = load_model("llama-2-13b")  # MHA: every matrix splits
    one = stage_weight_bytes(arch, weight_dtype="bf16", tp=1)
    for tp in (2, 4, 8):
        sharded = stage_weight_bytes(arch, weight_dtype="bf16", tp=tp)
        assert sharded == pytest.approx(one / tp, rel=0.001)


def test_pp_puts_embeddings_on_the_worst_stage():
    arch = load_model("llama-3.1-8b")
    one = stage_weight_bytes(arch, weight_dtype="bf16")
    two = stage_weight_bytes(arch, weight_dtype="bf16", pp=2)
    embedding = arch.embedding_params * 2
    assert two == pytest.approx((one - 2 * embedding) / 2 + embedding, rel=1e-6)


def test_invalid_parallelism_is_explained(h100):
    arch = load_model("llama-2-13b")
    with pytest.raises(InfersimError, match="not divisible by tp=3"):
        plan_memory(arch, h100, tp=3)
    with pytest.raises(InfersimError, match="pp=41 exceeds num_layers"):
        plan_memory(arch, h100, pp=41)
    with pytest.raises(InfersimError, match="gpu_memory_utilization"):
        plan_memory(arch, h100, gpu_memory_utilization=1.5)


def test_activations_grow_with_token_budget(h100):
    arch = load_model("llama-3.1-8b")
    small = plan_memory(arch, h100, max_num_batched_tokens=2048)
    large = plan_memory(arch, h100, max_num_batched_tokens=16384)
    assert large.activations > small.activations
    assert large.kv_capacity_tokens < small.kv_capacity_tokens


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80gb-sxm", "l40s"])
def test_unset_batch_limits_plan_as_run_does(gpu):
    """plan_memory's unset max_num_seqs / max_num_batched_tokens are vLLM's defaults for
    the GPU (1024 / 8192 on an H100, 256 / 2048 on an A100 or L40S), as `run` resolves a
    scenario's, so the API's plan and the run's agree (they differed by 4.7% on an H100)."""
    from simulator.build import build_replica
    from simulator.scenario import Scenario

    scenario = Scenario.from_dict(
        {
            "name": "defaults",
            "hardware": {"gpu": gpu},
            "model": {"name": "llama-3.1-8b"},
            "serving": {"max_model_len": 8192},
            "workload": {
                "arrivals": {"kind": "closed_loop", "users": 1},
                "prompt_tokens": {"kind": "fixed", "tokens": 100},
                "output_tokens": {"kind": "fixed", "tokens": 10},
                "num_requests": 1,
            },
        }
    )
    run = build_replica(scenario)
    plan = plan_memory(load_model("llama-3.1-8b"), load_gpu(gpu), max_model_len=8192)
    assert plan.kv_capacity_tokens == run.memory.kv_capacity_tokens
    assert plan.activations == run.memory.activations
