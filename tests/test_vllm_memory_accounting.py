"""The memory plan follows vLLM's accounting: the budget is a share of what CUDA reports,
non-torch memory grows with NVLink peers, the profiled peak is the larger of the forward
pass (fused-MoE workspaces included) and the sampler, and MXFP4 MoE checkpoints load as
vLLM's Mxfp4Config lays them out."""

import warnings

import pytest
from pydantic import ValidationError

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.errors import InfeasibleError, InfersimWarning
from hardware_models.presets import load_gpu
from simulator.build import build_replica
from simulator.memory_planner import (
    _FUSED_MOE_CHUNK_TOKENS,
    GB,
    activation_bytes,
    framework_overhead_bytes,
    plan_memory,
    sampler_bytes_per_logit,
    stage_weights,
)
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from tests.conftest import scenario_dict

GIB = 2**30


def test_the_budget_is_a_share_of_what_cuda_reports():
    h100 = load_gpu("h100-sxm")
    assert h100.memory.cuda_visible_gib < h100.memory.capacity_gb
    plan = plan_memory(load_model("llama-3.1-8b"), h100, gpu_memory_utilization=0.9)
    assert plan.usable == pytest.approx(0.9 * h100.memory.cuda_visible_gib * GIB)
    assert plan.capacity == h100.cuda_memory_bytes


def test_a_gpu_without_a_public_figure_keeps_its_siblings_reserved_share():
    """L40S and L4 have no public CUDA total in the presets: GDDR keeps 98% (the RTX
    4090's 23.52 of 24 GiB), HBM 98.75%."""
    l40s = load_gpu("l40s")
    assert l40s.memory.cuda_visible_gib is None
    assert l40s.memory.visible_gib == pytest.approx(48 * 0.98)
    mi300x = load_gpu("mi300x")
    assert mi300x.memory.visible_gib == pytest.approx(192 * (1 - 0.0125))
    rtx = load_gpu("rtx-4090")
    assert rtx.memory.visible_gib / rtx.memory.capacity_gb == pytest.approx(0.98, abs=0.001)


def test_cuda_never_sees_more_than_the_datasheet():
    spec = load_gpu("h100-sxm").model_dump()
    spec["memory"]["cuda_visible_gib"] = 81
    with pytest.raises(ValidationError, match=r"memory\.cuda_visible_gib 81.* exceeds capacity_gb"):
        AcceleratorSpec.model_validate(spec)


def test_non_torch_memory_grows_with_nvlink_peers_only():
    h100, rtx = load_gpu("h100-sxm"), load_gpu("rtx-4090")
    one, two, three, eight = (framework_overhead_bytes(h100, tp) for tp in (1, 2, 3, 8))
    assert one < two < eight
    assert eight - two == pytest.approx(6 * (three - two))  # the same share a peer
    # Over PCIe (no NVLink) NCCL's and the custom all-reduce's big buffers are absent.
    assert framework_overhead_bytes(rtx, 2) == framework_overhead_bytes(rtx, 1) == one


def test_peers_on_other_nodes_add_no_nvlink_buffers():
    """tp=16 over two 8-GPU nodes: a GPU reaches 7 peers over NVLink and the other 8
    over the network, where vLLM's custom all-reduce does not start: 4.39 GB as at tp=8,
    not 7.40 (15 peers charged before)."""
    h100 = load_gpu("h100-sxm")
    eight = framework_overhead_bytes(h100, 8)
    assert framework_overhead_bytes(h100, 16) == eight  # the dgx-h100 preset's 8 a node
    assert framework_overhead_bytes(h100, 16, gpus_per_node=8) == eight
    assert framework_overhead_bytes(h100, 16, gpus_per_node=16) > eight
    assert eight / GB == pytest.approx(4.39, abs=0.01)
    plan = plan_memory(load_model("llama-3.1-405b"), h100, weight_dtype="bf16", tp=16)
    assert plan.framework_overhead == eight


def test_the_users_overhead_overrides_the_model():
    arch, h100 = load_model("llama-3.1-8b"), load_gpu("h100-sxm")
    modelled = plan_memory(arch, h100, tp=2)
    assert modelled.framework_overhead == framework_overhead_bytes(h100, 2)
    given = plan_memory(arch, h100, tp=2, framework_overhead_gb=3.0)
    assert given.framework_overhead == 3.0 * GIB  # GiB, as vLLM logs its non-torch memory
    assert given.framework_overhead / GB == pytest.approx(3.22, abs=0.01)  # not 3 GB
    assert given.kv_capacity_bytes == pytest.approx(
        modelled.kv_capacity_bytes + modelled.framework_overhead - 3.0 * GIB
    )


def test_a_scenario_setting_the_overhead_is_told_what_it_now_covers():
    """engine.framework_overhead_gb was a catch-all allowance before the memory plan
    followed vLLM's profiler; an old file's figure still loads, so the run says once that
    it is now non-torch memory only, with the modelled figure beside it."""

    def said(**engine) -> list[str]:
        scenario = Scenario.from_dict(scenario_dict(engine=engine))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            build_replica(scenario)
        return [str(w.message) for w in caught if issubclass(w.category, InfersimWarning)]

    told = [text for text in said(framework_overhead_gb=3.0) if "framework_overhead_gb" in text]
    assert len(told) == 1, told
    modelled = framework_overhead_bytes(load_gpu("h100-sxm"), 1) / GIB
    for part in ("framework_overhead_gb=3:", "non-torch memory only", "sampler peak",
                 f"{modelled:.2f} GiB modelled here", "counts them twice"):  # fmt: skip
        assert part in told[0], (part, told[0])
    assert not [text for text in said() if "framework_overhead_gb" in text]


def test_the_sampler_peak_scales_with_max_num_seqs():
    """vLLM's dummy sampler run takes one position per sequence: past the forward's
    peak, each more sequence costs a vocabulary of sampler buffers."""
    arch, h200 = load_model("gpt-oss-120b"), load_gpu("h200-sxm")
    small = plan_memory(arch, h200, weight_dtype="mxfp4", max_num_seqs=512)
    large = plan_memory(arch, h200, weight_dtype="mxfp4", max_num_seqs=1024)
    assert large.activations - small.activations == pytest.approx(
        512 * arch.vocab_size * sampler_bytes_per_logit()
    )
    assert large.weights == small.weights


def test_the_sampler_peak_follows_the_vllm_versions_top_k_top_p_path():
    """vLLM before 0.17 sorted the logits for top-k/top-p (values, int64 indices, softmax,
    cumsum, mask: 27 bytes a logit with the bf16 and fp32 logits); from 0.17 a Triton kernel
    masks them in place (vllm PR #33538), leaving the logits, softmax and noise: 14 bytes.
    Llama-3.1-70B's 128k vocabulary over vLLM's 1024 sequences: 3.6 GB against 1.8 GB."""
    assert sampler_bytes_per_logit((0, 16, 1)) == 27
    assert sampler_bytes_per_logit((0, 17, 0)) == sampler_bytes_per_logit() == 14
    arch, h100 = load_model("llama-3.1-70b"), load_gpu("h100-sxm")
    sort = activation_bytes(arch, 8192, tp=2, sampled_tokens=1024, vllm_version=(0, 14, 1))
    triton = activation_bytes(arch, 8192, tp=2, sampled_tokens=1024)
    assert sort - triton == pytest.approx(1024 * arch.vocab_size * 13)
    old = plan_memory(arch, h100, tp=2, max_num_seqs=1024, vllm_version=(0, 14, 1))
    new = plan_memory(arch, h100, tp=2, max_num_seqs=1024)
    assert new.kv_capacity_tokens > 10_000 > 2_000 > old.kv_capacity_tokens


def test_gpt_oss_120b_with_vllms_1024_sequences_does_not_fit_an_h100_at_0_9():
    """vLLM 0.10.1 refused it (vllm#23278: -2.14 GiB of KV): 66 GiB of padded weights and
    a 5 GiB sampler peak leave no KV cache in 0.9 x 79.22 GiB."""
    arch, h100 = load_model("gpt-oss-120b"), load_gpu("h100-sxm")
    with pytest.raises(InfeasibleError, match="does not fit on h100-sxm"):
        plan_memory(arch, h100, weight_dtype="mxfp4", max_num_seqs=1024, vllm_version=(0, 10, 1))
    assert plan_memory(arch, h100, weight_dtype="mxfp4", max_num_seqs=256).kv_capacity_tokens


def test_the_fused_moe_workspaces_hold_a_hidden_wide_row_per_routed_token():
    """Qwen3-235B's experts at tp=4 are 384 wide, narrower than the 4096 hidden size:
    both of vLLM's workspaces (workspace13: max(width, hidden), workspace2: max(gate_up,
    hidden)) are hidden-wide per routed row, besides the layer's output."""
    arch = load_model("qwen3-235b-a22b")
    tokens = 4096
    rows = tokens * arch.experts_per_token
    forward = activation_bytes(arch, tokens, tp=4, sampled_tokens=0)
    residual = 2 * tokens * arch.hidden_size
    workspaces = rows * 2 * arch.hidden_size
    assert forward == 2 * (residual + workspaces + tokens * arch.hidden_size)
    # Past VLLM_FUSED_MOE_CHUNK_SIZE tokens the workspaces stop growing.
    big = 2 * _FUSED_MOE_CHUNK_TOKENS  # the residual stream still grows with every token
    moe = activation_bytes(arch, big, tp=4, sampled_tokens=0) - 2 * 3 * big * arch.hidden_size
    chunk_rows = _FUSED_MOE_CHUNK_TOKENS * arch.experts_per_token
    assert moe == 2 * chunk_rows * 2 * arch.hidden_size


def _expert_bytes(arch, hidden: int, width: int) -> float:
    mxfp4 = 0.5 + 1 / 32  # an e2m1 weight and its share of an e8m0 scale per 32
    return arch.num_layers * arch.num_experts * 3 * hidden * width * mxfp4


@pytest.mark.parametrize(
    ("gpu", "hidden", "width"),
    [(None, 2880, 2880), ("h100-sxm", 3072, 2944), ("b200", 3072, 3072)],
)
def test_mxfp4_experts_are_padded_for_the_kernel_that_runs_them(gpu, hidden, width):
    """gpt-oss's 2880-wide experts: Marlin (no fp4 tensor cores) pads the width to 128
    and the hidden size to 256; FlashInfer on sm_100 pads both to 256."""
    arch = load_model("gpt-oss-120b")
    spec = None if gpu is None else load_gpu(gpu)
    (stage,) = stage_weights(arch, weight_dtype="mxfp4", gpu=spec)
    assert stage.experts == pytest.approx(_expert_bytes(arch, hidden, width))


def test_mxfp4_moe_leaves_attention_in_16_bits():
    """vLLM's Mxfp4Config quantises the fused-MoE layers only: attention's projections
    stay bf16, so fp8 attention (a plain fp8 checkpoint) weighs half of it."""
    arch = load_model("gpt-oss-120b")
    (mxfp4,) = stage_weights(arch, weight_dtype="mxfp4")
    attention = arch.num_layers * arch.attention_linear_params
    non_expert = mxfp4.total - mxfp4.experts
    (fp8,) = stage_weights(arch, weight_dtype="fp8")
    assert non_expert - (fp8.total - fp8.experts) == pytest.approx(attention * (2 - 1))
