"""Per-GPU utilisation under tensor parallelism, and where an MoE model's weights, experts
and KV cache sit on a replica's GPUs (memory plan, expert parallelism, MLA)."""

import re
import warnings

import numpy as np
import pytest
import yaml

from hardware_models.errors import InfeasibleError, InfersimError, InfersimWarning
from hardware_models.presets import load_gpu, load_node
from simulator.cli.main import main
from simulator.engine.step_cost import StepCostModel
from simulator.memory_planner import GB, activation_bytes, plan_memory, stage_weight_bytes
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict


@pytest.fixture(scope="module")
def h200():
    return load_gpu("h200-sxm")


def _run(tp: int):
    data = scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-8b"},
        parallelism={"tp": tp},
        workload={**scenario_dict()["workload"], "num_requests": 60},
    )
    return simulate(Scenario.from_dict(data), progress=False)


def test_tp2_mfu_is_per_gpu():
    """A TP2 replica's MFU is its FLOPs per GPU / time / one GPU's peak: each step records
    the replica's FLOPs (both ranks'), twice one rank's, and the same work as TP1 does."""
    one, two = _run(1), _run(2)
    steps, requests = two.steps, two.requests
    arch = load_model("llama-3.1-8b")
    cost = StepCostModel(arch, load_gpu("h100-sxm"), load_node("dgx-h100"), tp=2)
    # The run's work counted independently of the step cost: 2 FLOPs per weight per token
    # through the layers, the LM head for sampled positions only (decodes and each
    # prompt's last token), and attention's 4 x heads x head_dim per attended pair.
    head = arch.vocab_size * arch.hidden_size
    body = arch.param_count() - arch.embedding_params - head
    tokens = steps["decode_tokens"].sum() + steps["prefill_tokens"].sum()
    sampled = steps["decode_tokens"].sum() + len(requests)
    prompt, decodes = requests["prompt"], (requests["generated"] - 1).clip(lower=0)
    pairs = (prompt * (prompt + 1) / 2 + decodes * prompt + decodes * (decodes + 1) / 2).sum()
    attention = 4 * arch.num_attention_heads * arch.head_dim * pairs * arch.num_layers
    work = 2 * body * tokens + 2 * head * sampled + attention
    peak = cost.gpu.peak_flops(cost.compute_dtype)
    mfu = two.summary()["utilisation"]["mfu"]
    assert mfu == pytest.approx(work / 2 / two.context.duration_s / peak, rel=0.01)
    # Decode steps of n sequences: the replica's FLOPs are twice one rank's.
    decode = cost.decode_steps(8)
    rank_flops = decode.fixed_flops / 2 + decode.attention.one_step(8, 800)[1] * 32
    assert decode.one(800).flops == pytest.approx(2 * rank_flops, rel=1e-12)
    # The same requests cost the same work whether split over one GPU or two
    # (replicated norms and the sampled logits' gather aside).
    assert steps["flops"].sum() == pytest.approx(one.steps["flops"].sum(), rel=0.02)


def test_moe_weights_per_gpu_tp_and_ep_hold_the_same_experts():
    """Qwen3-235B-A22B: 128 experts of 1536 split 8 ways, or 16 whole experts per GPU;
    the same bytes either way, and the attention/dense weights split over tp."""
    arch = load_model("qwen3-235b-a22b")
    tp8 = stage_weight_bytes(arch, weight_dtype="bf16", tp=8)
    ep8 = stage_weight_bytes(arch, weight_dtype="bf16", tp=8, expert_parallel=True)
    assert tp8 == pytest.approx(ep8, rel=1e-9)
    whole = stage_weight_bytes(arch, weight_dtype="bf16")
    assert whole == pytest.approx(arch.param_count() * 2, rel=1e-9)
    # 4 KV heads replicate over 8 ranks; everything else splits: just over 1/8 of it.
    assert whole / 8 < tp8 < whole / 8 * 1.01


def test_uneven_experts_load_the_fullest_gpu():
    """gpt-oss-20b's 32 experts over 6 GPUs: ceil(32 / 6) = 6 on the fullest, where
    tensor-parallel slices hold 32 / 6 experts' worth."""
    arch = load_model("gpt-oss-20b").model_copy(update={"num_attention_heads": 60})
    arch = arch.model_copy(update={"num_kv_heads": 6})
    tp = stage_weight_bytes(arch, weight_dtype="bf16", tp=6)
    ep = stage_weight_bytes(arch, weight_dtype="bf16", tp=6, expert_parallel=True)
    expert = arch.mlp_matrix_params(arch.expert_intermediate_size) * 2
    layers = arch.num_moe_layers
    assert ep - tp == pytest.approx(layers * expert * (6 - 32 / 6), rel=1e-3)


def test_deepseek_v3_plan_on_8_h200(h200):
    """DeepSeek-V3 in its native fp8 over 8 H200s: about 671B x 1 B / 8 of weights per
    GPU, and the MLA latent (576 elements per token and layer) replicated on every rank."""
    arch = load_model("deepseek-v3")
    plan = plan_memory(arch, h200, weight_dtype="fp8", tp=8, max_num_batched_tokens=4096)
    assert plan.weights / GB == pytest.approx(arch.param_count() / 8 / GB, rel=0.02)
    assert plan.kv_bytes_per_token == 61 * 576 * 2
    assert plan.kv_capacity_tokens > 100_000


def test_moe_that_does_not_fit_says_so(h200):
    """DeepSeek-V3 in bf16 (1.34 TB) does not fit 8 H200s (1.13 TB)."""
    with pytest.raises(
        InfeasibleError,
        match=r"weights 169\.\d GB .* most loaded GPU, 1\d\d\.\d GB of them routed experts; "
        r"the cheapest layout that fits is parallelism\.tp=8 with parallelism\.pp=2",
    ):
        plan_memory(load_model("deepseek-v3"), h200, tp=8)


def test_expert_parallel_needs_experts():
    with pytest.raises(InfersimError, match=r"enable_expert_parallel.*dense"):
        stage_weight_bytes(
            load_model("llama-3.1-8b"), weight_dtype="bf16", tp=2, expert_parallel=True
        )


def test_pp_stages_count_their_own_moe_layers(h200):
    """Llama 4 Maverick PP2: 12 MoE layers per stage; the first stage adds the embedding
    and the last the head, each about 1 GB at tp=4."""
    arch = load_model("llama-4-maverick")
    plan = plan_memory(arch, h200, tp=4, pp=2)
    assert plan.kv_bytes_per_token == 24 * 2 * 2 * 128 * 2  # 8 KV heads over 4 ranks
    assert plan.weights / GB == pytest.approx(arch.param_count() * 2 / 8 / GB, rel=0.01)


def _step_cost(name: str, *, tp: int, ep: bool) -> StepCostModel:
    return StepCostModel(
        load_model(name), load_gpu("h200-sxm"), load_node("hgx-h200"), tp=tp, expert_parallel=ep
    )


def test_ep_and_tp_do_the_same_work_per_step():
    """The same tokens through the same experts: the FLOPs of a step do not depend on how
    the experts are placed, only its time does."""
    tp = _step_cost("qwen3-30b-a3b", tp=4, ep=False)
    ep = _step_cost("qwen3-30b-a3b", tp=4, ep=True)
    for n in (1, 64, 512):
        a, b = tp.decode_steps(n).one(n * 1000), ep.decode_steps(n).one(n * 1000)
        assert a.flops == pytest.approx(b.flops, rel=0.02)
        assert a.seconds != b.seconds


def test_moe_decode_reads_only_the_activated_experts():
    """Qwen3-30B-A3B, one token on one H200: the fused MoE kernel reads the 8 experts
    the token picks, not all 128, so the step moves about the active weights (3.3B, the
    embedding table aside: a lookup) and is one kernel sequence per layer."""
    arch = load_model("qwen3-30b-a3b")
    cost = _step_cost("qwen3-30b-a3b", tp=1, ep=False)
    step = cost.decode_steps(1).one(100)
    active_bytes = (arch.active_param_count() - arch.embedding_params) * 2
    assert active_bytes < step.dram_bytes < 1.1 * active_bytes
    all_experts = arch.num_moe_layers * arch.num_experts * arch.expert_params * 2
    assert step.dram_bytes < all_experts / 8  # 8 of 128 experts, plus attention


def test_routing_skew_reaches_the_step():
    """model.moe_routing reaches the fused kernel: skewed (power-law) routing activates
    fewer distinct experts for a few tokens (fewer weights read: faster) and overloads
    the hottest expert for many (slower)."""
    balanced = _step_cost("qwen3-30b-a3b", tp=1, ep=False)
    skewed = StepCostModel(
        load_model("qwen3-30b-a3b"),
        load_gpu("h200-sxm"),
        load_node("hgx-h200"),
        moe_routing="power_law_1.2",
    )

    def seconds(model, n):
        return model.decode_steps(n).one(n * 500).seconds

    assert seconds(skewed, 16) < seconds(balanced, 16)
    assert seconds(skewed, 1024) > seconds(balanced, 1024)


def test_mla_decode_streams_the_latent_and_runs_step_by_step_as_in_runs():
    """DeepSeek-V3 at TP8: each rank's decode reads 576 x 2 bytes per cached token and
    layer; a run of decode steps prices each as one step would, to the last bit."""
    cost = _step_cost("deepseek-v3", tp=8, ep=False)
    _, _, dram = cost._decode_attention.one_step(4, 4000)
    assert 4000 * 576 * 2 < dram < 4000 * 576 * 2 * 1.05
    steps = cost.decode_steps(4)
    contexts = [4000, 4004, 4008]
    seconds, flops, dram_run, _ = steps.many(np.array(contexts))
    for j, context in enumerate(contexts):
        one = steps.one(context)
        assert (one.seconds, one.flops, one.dram_bytes) == (seconds[j], flops[j], dram_run[j])


def test_mla_chunk_after_a_prefix_decompresses_it():
    """A 512-token chunk after 3,584 cached tokens pays kv_b_proj over the prefix."""
    cost = _step_cost("deepseek-v3", tp=8, ep=False)
    first = cost._prefill_attention(1, 512, 512 * 513 / 2, 512)
    later = cost._prefill_attention(1, 512, 512 * (3584 + 257), 4096)
    kv_b = 3584 * 2 * (128 // 8) * (128 + 128) * 512  # FLOPs of decompressing the prefix
    assert later[1] - first[1] > kv_b


def test_hybrid_window_model_runs_with_a_one_line_warning(tmp_path, capsys):
    """Gemma 2 mixes sliding and full layers: the sliding ones are priced over their
    window, and with vLLM's hybrid KV cache manager disabled their KV cache is kept at
    full length, and the run says so, in one line as the CLI prints its errors; with it
    (the default) nothing is bent and nothing is said."""
    data = scenario_dict(model={"name": "gemma-2-9b"})
    data["workload"] = {**data["workload"], "num_requests": 5}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    window = "gemma-2-9b: 21 of 42 layers attend to a 4096-token window (priced so)"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=re.escape(window))
        simulate(Scenario.from_yaml(path), progress=False)
    off = ["serving.disable_hybrid_kv_cache_manager=true"]
    with pytest.warns(InfersimWarning, match=re.escape(window)):  # the library warns
        simulate(Scenario.from_yaml(path, off), progress=False)
    run = ["run", str(path), "-o", str(tmp_path / "o"), "--quiet", "--no-plots"]
    assert main([*run, "--set", off[0]]) == 0
    captured = capsys.readouterr()  # once in the summary, once on stderr (every warning is)
    warned = [line for line in captured.out.splitlines() if window in line]
    assert len(warned) == 1 and warned[0].startswith(f"warning: {window}")
    said = [line for line in captured.err.splitlines() if window in line]
    assert len(said) == 1 and said[0].startswith(f"infersim: warning: {window}")


def test_ep_scratch_holds_whole_experts():
    """With EP a rank runs whole experts over every token: its fused-MoE scratch is as
    wide per row as a whole expert's, not a tensor-parallel slice's. vLLM's workspaces
    are at least hidden-wide (max(width, hidden) and max(gate_up, hidden)), so only an
    expert wider than the hidden size (Mixtral's 14336 over 4096) widens them."""

    def workspaces(width: int, hidden: int) -> int:
        return max(width, hidden) + max(2 * width, hidden)

    arch = load_model("mixtral-8x7b")
    tp = activation_bytes(arch, 4096, tp=4, sampled_tokens=0)
    ep = activation_bytes(arch, 4096, tp=4, sampled_tokens=0, expert_parallel=True)
    rows = 4096 * arch.experts_per_token
    whole, sliced = arch.expert_intermediate_size, arch.expert_intermediate_size // 4
    hidden = arch.hidden_size
    assert ep - tp == pytest.approx(
        rows * (workspaces(whole, hidden) - workspaces(sliced, hidden)) * 2
    )
    narrow = load_model("qwen3-30b-a3b")  # 768-wide experts under a 2048 hidden size
    assert activation_bytes(narrow, 4096, tp=4, sampled_tokens=0) == activation_bytes(
        narrow, 4096, tp=4, sampled_tokens=0, expert_parallel=True
    )


def test_warnings_raised_in_a_run_stand_in_its_summary():
    """An InfersimWarning raised while a scenario runs is also a line of summary.json's
    `warnings`, so a result read later still carries it."""
    data = scenario_dict(model={"name": "gemma-2-9b"})
    data["workload"] = {**data["workload"], "num_requests": 5}
    data["serving"] = {**data["serving"], "disable_hybrid_kv_cache_manager": True}
    with pytest.warns(InfersimWarning):
        results = simulate(Scenario.from_dict(data), progress=False)
    assert any("attend to a 4096-token window" in w for w in results.summary()["warnings"])


def test_nvfp4_experts_on_a_chip_with_native_fp4_say_they_are_priced_as_marlin():
    """NVFP4 experts run as Marlin W4A16 in the model everywhere; on Blackwell, where
    vLLM runs NVFP4 MoE kernels with fp4 activations, the run says so. gpt-oss's MXFP4
    experts are priced as the kernel vLLM picks (test_mxfp4_moe_backend) and say nothing
    of it."""
    data = scenario_dict(
        model={"name": "qwen3-30b-a3b", "weight_dtype": "nvfp4"}, hardware={"gpu": "b200"}
    )
    data["workload"] = {**data["workload"], "num_requests": 5}
    with pytest.warns(InfersimWarning, match="nvfp4 experts are priced as the Marlin W4A16"):
        simulate(Scenario.from_dict(data), progress=False)
    oss = scenario_dict(model={"name": "gpt-oss-20b"}, hardware={"gpu": "b200"})
    oss["workload"] = {**oss["workload"], "num_requests": 5}
    assert not any("Marlin" in w for w in simulate(Scenario.from_dict(oss)).summary()["warnings"])
