"""A setting that quietly limits the answer is said (summary.json `warnings` and the
terminal); what vLLM refuses at start-up is refused with the fields named."""

from __future__ import annotations

import pytest
import yaml

from hardware_models.errors import InfeasibleError
from simulator.cli.main import main
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict

FEW = {"num_requests": 20}


def _warnings(**sections) -> list[str]:
    return simulate(Scenario.from_dict(scenario_dict(**sections))).summary()["warnings"]


def test_a_healthy_run_has_no_warnings():
    assert _warnings(workload=FEW) == []


def test_fp4_weights_on_a_gpu_without_fp4_math_say_they_run_at_bf16():
    fp4 = {"name": "llama-3.1-8b", "weight_dtype": "fp4"}
    warnings = _warnings(hardware={"gpu": "h200-sxm"}, model=fp4, workload=FEW)
    assert warnings == [
        "h200-sxm has no fp4 tensor rate: fp4 weights are dequantized and multiplied at the "
        "bf16 rate (weight-only quantization: less memory and traffic, no faster math)"
    ]


def test_fp8_on_an_a100_warns_for_weights_and_kv_but_not_on_an_h100():
    fp8 = {"name": "llama-3.1-8b", "weight_dtype": "fp8", "kv_dtype": "fp8"}
    a100 = _warnings(hardware={"gpu": "a100-80gb-sxm"}, model=fp8, workload=FEW)
    assert len(a100) == 2 and "fp8 KV cache is dequantized" in a100[1]
    assert _warnings(hardware={"gpu": "h100-sxm"}, model=fp8, workload=FEW) == []


def test_tensor_parallelism_across_nodes_is_said():
    warnings = _warnings(hardware={"gpu": "h100-sxm"}, model={"name": "llama-3.1-405b"},
                         parallelism={"tp": 16}, workload=FEW)  # fmt: skip
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "crossing dgx-h100 nodes of 8 GPUs: tp=16's all-reduces (2 nodes), over the "
        "infiniband link (50 GB/s per GPU, 6 us)"
    )


def test_pipeline_hand_offs_and_moe_dispatch_across_nodes_are_said():
    """Before, only tp > gpus_per_node warned: a pp=2 hand-off or a dp=16 MoE dispatch
    between two nodes was priced on InfiniBand without a word."""
    pp = _warnings(hardware={"gpu": "h100-sxm"},
                   model={"name": "llama-3.1-70b", "weight_dtype": "bf16"},
                   parallelism={"tp": 8, "pp": 2}, workload=FEW)  # fmt: skip
    crossing = [w for w in pp if w.startswith("crossing")]
    assert crossing and "pipeline hand-offs (1 of 1), over the infiniband" in crossing[0]
    moe = _warnings(hardware={"gpu": "h200-sxm"},
                    model={"name": "deepseek-v3", "weight_dtype": "fp8_block"},
                    parallelism={"tp": 1, "dp": 16, "enable_expert_parallel": True},
                    serving={"max_model_len": 8192}, workload=FEW)  # fmt: skip
    (crossing,) = [w for w in moe if w.startswith("crossing")]
    assert "the MoE dispatch over tp x dp = 16 GPUs, over the infiniband" in crossing
    inside = _warnings(hardware={"gpu": "h100-sxm"},
                       model={"name": "llama-3.1-70b", "weight_dtype": "bf16"},
                       parallelism={"tp": 4, "pp": 2}, workload=FEW)  # fmt: skip
    assert not [w for w in inside if w.startswith("crossing")]


def test_a_later_replica_straddling_two_nodes_is_in_the_crossing_caveat():
    """Replicas of 6 GPUs packed over nodes of 8: replica 0 stays in node 0, replica 1
    straddles nodes 0 and 1. The caveat used to read replica 0 alone and say nothing of
    the hand-offs and dispatches that cross nodes in replica 1."""
    h100 = {"gpu": "h100-sxm"}
    pp = _warnings(hardware=h100, model={"name": "llama-3.1-8b"},
                   parallelism={"tp": 2, "pp": 3, "replicas": 2}, workload=FEW)  # fmt: skip
    (crossing,) = [w for w in pp if w.startswith("crossing")]
    assert "pipeline hand-offs (0 to 1 of 2, by replica), over the infiniband" in crossing
    moe = _warnings(hardware=h100, model={"name": "qwen3-30b-a3b"},
                    parallelism={"tp": 2, "dp": 3, "replicas": 2,
                                 "enable_expert_parallel": True}, workload=FEW)  # fmt: skip
    (crossing,) = [w for w in moe if w.startswith("crossing")]
    assert "the MoE dispatch over tp x dp = 6 GPUs (in some replicas), over the" in crossing


def test_a_token_budget_capping_the_batch_with_the_kv_cache_free_is_said():
    """128 tokens a step on an H100: memory-bound steps, so a bigger budget serves more
    per step (TTFT p50 0.93 s at 128, 0.025 s at 2048)."""
    load = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}, "num_requests": 300}
    h100 = {"gpu": "h100-sxm"}
    (warning,) = _warnings(hardware=h100, workload=load, serving={"max_num_batched_tokens": 128})
    assert warning.startswith(
        "the token budget (serving.max_num_batched_tokens=128), not memory, capped the batch"
    )
    assert _warnings(hardware=h100, workload=load, serving={"max_num_batched_tokens": 2048}) == []


def test_a_full_budget_of_compute_bound_steps_is_not_blamed():
    """512 tokens a step of a 7B model on an A100 is compute-bound: a budget 8x larger
    serves no faster (TTFT p50 7.8 s at 512, 8.3 s at 4096), so nothing to warn about."""
    load = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}, "num_requests": 600}
    assert not [w for w in _warnings(workload=load) if "token budget" in w]


def test_max_num_seqs_capping_the_batch_with_the_kv_cache_free_is_said():
    """4 sequences a step on an H100 at 8 req/s: memory-bound decode steps, KV 1% used,
    the queue grows (quickstart with --set serving.max_num_seqs=4)."""
    load = {"arrivals": {"kind": "poisson", "rate_per_s": 8.0}, "num_requests": 300}
    h100 = {"gpu": "h100-sxm"}
    (warning,) = _warnings(hardware=h100, workload=load, serving={"max_num_seqs": 4})
    assert warning.startswith(
        "serving.max_num_seqs=4, not memory, capped the batch: steps ran that many sequences, "
        "not compute-bound, for "
    )
    assert warning.endswith("% used") and "while requests waited" in warning
    assert _warnings(hardware=h100, workload=load, serving={"max_num_seqs": 256}) == []
    light = {**load, "arrivals": {"kind": "poisson", "rate_per_s": 0.5}}  # rarely 4 at once
    assert _warnings(hardware=h100, workload=light, serving={"max_num_seqs": 4}) == []


def test_a_kv_starved_layout_that_preempts_heavily_is_said():
    load = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}, "num_requests": 300}
    (warning,) = _warnings(serving={"num_gpu_blocks": 200}, workload=load)
    assert warning.startswith("the KV cache is short for this load: ")
    assert "were preempted" in warning


def test_continuous_with_a_budget_below_max_model_len_is_refused_as_vllm_does(tmp_path, capsys):
    data = scenario_dict(serving={"policy": "continuous", "max_num_batched_tokens": 2048})
    with pytest.raises(InfeasibleError, match="max_num_batched_tokens=2048 is below max_model_len"):
        simulate(Scenario.from_dict(data))
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "serving.max_num_batched_tokens=2048" in err
    data["serving"]["max_model_len"] = 2048  # what a vLLM user does: runs
    assert simulate(Scenario.from_dict(data)).summary()["counts"]["completed"] == 300


@pytest.mark.parametrize(
    ("serving", "setting"),
    [
        ({"max_model_len": 512}, "serving.max_model_len is too short"),
        ({"num_gpu_blocks": 40}, "the KV cache is too small for them"),
    ],
)
def test_many_rejected_requests_are_said_with_the_setting_responsible(serving, setting):
    data = scenario_dict(serving=serving, workload={"num_requests": 100})
    summary = simulate(Scenario.from_dict(data)).summary()
    rejected = summary["counts"]["rejected"]
    assert rejected > 1, "the setting must reject some of these requests"
    (warning,) = [w for w in summary["warnings"] if "were rejected because" in w]
    assert warning.startswith(f"{rejected:,} of 100 requests (")
    assert setting in warning


def test_a_rare_rejection_is_not_warned_about():
    """2 requests of 200 (1%) over max_model_len: not more than the 1% a warning needs."""
    data = scenario_dict(serving={"max_model_len": 1240}, workload={"num_requests": 200})
    summary = simulate(Scenario.from_dict(data)).summary()
    assert summary["counts"]["rejected"] == 2
    assert not [w for w in summary["warnings"] if "rejected" in w]


@pytest.mark.parametrize("allow", [False, True])
def test_llama4_chunked_attention_priced_as_a_window_is_said_in_either_kv_mode(allow):
    """Llama 4's chunked layers are priced as a window of the chunk (an upper bound):
    said whether its KV cache is held at full length or in the hybrid manager's groups."""
    warnings = _warnings(
        hardware={"gpu": "h200-sxm"},
        model={"name": "llama-4-scout", "weight_dtype": "fp8"},
        parallelism={"tp": 2},
        serving={"max_model_len": 16384,
                 "allow_chunked_local_attn_with_hybrid_kv_cache": allow},
        workload={"num_requests": 2},
    )  # fmt: skip
    priced = [w for w in warnings if "priced as a sliding window of 8192 tokens" in w]
    assert len(priced) == 1 and "upper bound" in priced[0]
    assert any("held at full length" in w for w in warnings) != allow


def test_swap_preemption_without_room_for_one_sequence_is_said():
    """vLLM v0 aborts at a swap-out that finds too little swap space, so a swap space
    smaller than one max_model_len sequence is said up front, even on a run that ends."""
    swap = {
        "preemption": "swap",
        "max_model_len": 4096,
        "policy": "continuous",
        "max_num_batched_tokens": 4096,
    }  # swap is vLLM v0's
    (warning,) = _warnings(serving={**swap, "swap_space_gb": 0}, workload=FEW)
    assert warning == (
        "serving.swap_space_gb holds 0 KV blocks of host swap space, fewer than one "
        "4,096-token sequence needs (256): with serving.preemption=swap, a swap-out that finds "
        "too little free stops the run, as vLLM v0 aborts the engine (Scheduler._swap_out)"
    )
    assert _warnings(serving=swap, workload=FEW) == []  # 4 GB: 476 blocks of 8 MiB
    assert _warnings(serving={"swap_space_gb": 0}, workload=FEW) == []  # recompute: unused


def test_num_gpu_blocks_beyond_the_gpus_memory_is_refused_as_vllm_runs_out_of_it():
    """vLLM takes --num-gpu-blocks-override as given and runs out of memory allocating
    it; up to what the memory left at gpu_memory_utilization 1 holds, it runs."""
    with pytest.raises(
        InfeasibleError,
        match=r"serving.num_gpu_blocks=10,000,000 is more KV "
        r"blocks than the GPU holds .*\(([\d,]+) at gpu_memory_utilization 1",
    ):
        simulate(Scenario.from_dict(scenario_dict(serving={"num_gpu_blocks": 10_000_000})))
    assert _warnings(serving={"num_gpu_blocks": 4000}, workload=FEW) == []


@pytest.mark.parametrize(
    ("gb", "tp", "outcome"),
    [(800, 1, "ran"), (120, 8, "warned"), (180, 8, "refused"), (1500, 1, "refused")],
)
def test_swap_space_against_the_nodes_host_memory_as_vllm(gb, tp, outcome):
    """vLLM's CacheConfig.verify_with_parallel_config: swap_space x tp above 70% of the
    node's CPU memory (dgx-h100: 2,048 GiB; both in GiB, as vLLM counts) is refused, above
    40% warned about."""
    sections = {"hardware": {"gpu": "h100-sxm", "node": "dgx-h100"}, "workload": FEW,
                "serving": {"swap_space_gb": gb}, "parallelism": {"tp": tp}}  # fmt: skip
    if outcome == "refused":
        with pytest.raises(InfeasibleError, match="vLLM refuses more than 70% at start-up"):
            _warnings(**sections)
        return
    swap = [w for w in _warnings(**sections) if "swap_space_gb" in w]
    assert swap == ([] if outcome == "ran" else [
        f"serving.swap_space_gb={gb} for each of tp={tp} GPUs takes {gb * tp} GiB of the 2048 GiB "
        f"of host memory of a dgx-h100 node ({gb * tp / 2048:.0%}): vLLM warns above 40% "
        "('Possibly too large swap space')"])  # fmt: skip
