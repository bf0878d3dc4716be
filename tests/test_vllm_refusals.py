"""What vLLM refuses to start, infersim refuses too: a KV cache that cannot hold one
max_model_len sequence (check_enough_kv_cache_memory), a max_model_len above the model's
context, a token budget below max_num_seqs, block sizes and KV cache types vLLM lacks."""

from __future__ import annotations

import pytest

from hardware_models.errors import InfeasibleError, InfersimError
from hardware_models.presets import load_gpu
from simulator.build import build_pools, build_replica
from simulator.cli.main import main
from simulator.engine.kv_groups import kv_cache_groups
from simulator.memory_planner import one_sequence_kv_bytes, plan_memory
from simulator.model_catalog import load_model
from simulator.planner import plan_capacity
from simulator.scenario import Scenario
from tests.conftest import scenario_dict


def _llama70b_tp2(**serving) -> Scenario:
    return Scenario.from_dict(
        scenario_dict(
            hardware={"gpu": "h100-sxm"},
            model={"name": "llama-3.1-70b"},
            parallelism={"tp": 2},
            serving={"max_num_batched_tokens": 2048, **serving},
        )
    )


def test_a_kv_cache_short_of_one_max_model_len_sequence_is_refused_with_the_way_out():
    with pytest.raises(InfeasibleError) as exc:
        build_replica(_llama70b_tp2())
    message = str(exc.value)
    assert "\n" not in message
    # 22,098 tokens hold 1,381 whole 16-token blocks: 22,096 tokens, as vLLM counts blocks
    for part in ("max_model_len=131072", "KV capacity 22098 tokens",
                 "largest max_model_len that fits is 22096", "serving.max_model_len",
                 "check_enough_kv_cache_memory"):  # fmt: skip
        assert part in message, (part, message)


def test_the_largest_max_model_len_named_is_the_boundary():
    assert build_replica(_llama70b_tp2(max_model_len=22096)).config.max_model_len == 22096
    with pytest.raises(InfeasibleError, match="largest max_model_len that fits is 22096"):
        build_replica(_llama70b_tp2(max_model_len=22097))


def test_pipeline_stages_are_judged_each_on_its_own_layers():
    """vLLM checks each worker: the stage with the least room per layer decides."""
    arch, gpu = load_model("llama-3.1-70b"), load_gpu("h100-sxm")
    plan = plan_memory(arch, gpu, pp=2, max_num_batched_tokens=2048, max_model_len=131072)
    assert plan.longest_fitting_len is not None and plan.longest_fitting_len < 131072
    assert plan.longest_fitting_len <= plan.kv_capacity_tokens
    fits = plan_memory(arch, gpu, pp=2, max_num_batched_tokens=2048,
                       max_model_len=plan.longest_fitting_len)  # fmt: skip
    assert fits.refusal() == ""
    assert "max_model_len=131072" in plan.refusal()


def test_sliding_window_layers_need_the_window_not_the_sequence_as_vllm_sums_them():
    """With the hybrid KV cache manager a sliding layer needs cdiv(min(window - 1 +
    budget, max_model_len), block) + 1 blocks (vLLM's SlidingWindowSpec), a full one
    cdiv(max_model_len, block); without it every layer needs the full length."""
    arch = load_model("gemma-2-9b")
    layers = range(arch.num_layers)
    groups = kv_cache_groups(arch, 16)
    page = 16 * arch.kv_elements_per_token_layer_shard(1) * 2
    sliding = arch.num_sliding_layers
    full = arch.num_layers - sliding
    window = -(-(arch.sliding_window - 1 + 2048) // 16) + 1
    hybrid = one_sequence_kv_bytes(arch, layers, "bf16", 1, 8192, 16, 2048, groups)
    assert hybrid == page * (full * 512 + sliding * window)
    flat = one_sequence_kv_bytes(arch, layers, "bf16", 1, 8192, 16, 2048, None)
    assert flat == page * arch.num_layers * 512 > hybrid


def test_a_sliding_window_model_fits_with_the_hybrid_manager_where_it_would_not_without():
    arch, gpu = load_model("gemma-2-9b"), load_gpu("l4")
    common = {"max_num_batched_tokens": 2048, "max_model_len": 8192, "block_size": 16}
    utilization = 0.9
    while True:  # the least memory with which the hybrid layout holds one sequence
        hybrid = plan_memory(arch, gpu, gpu_memory_utilization=utilization,
                             kv_groups=kv_cache_groups(arch, 16), **common)  # fmt: skip
        if hybrid.refusal():
            break
        utilization -= 0.01
    utilization += 0.01
    hybrid = plan_memory(arch, gpu, gpu_memory_utilization=utilization,
                         kv_groups=kv_cache_groups(arch, 16), **common)  # fmt: skip
    flat = plan_memory(arch, gpu, gpu_memory_utilization=utilization, **common)
    assert hybrid.refusal() == "" and flat.refusal() != ""
    assert hybrid.kv_capacity_bytes == flat.kv_capacity_bytes < 8192 * flat.kv_bytes_per_token


def test_the_planner_marks_a_refused_candidate_infeasible_with_the_reason(make_scenario):
    scenario = make_scenario(
        model={"name": "llama-3.1-70b"},
        serving={"max_num_batched_tokens": 2048},
        slo={"ttft_ms": 2000, "tpot_ms": 80},
        plan={"gpus": ["h100-sxm"], "tp": [2], "requests_per_probe": 100},
    )
    table = plan_capacity(scenario, workers=1)
    assert table.loc[0, "status"] == "infeasible"
    reason = table.loc[0, "reason"]
    assert "largest max_model_len that fits is 22096" in reason
    # the plan sets the probes' degrees from plan.tp and plan.pp: those are the way out
    assert "raise plan.tp (now 2) or plan.pp (now 1)" in reason and "parallelism." not in reason


def test_a_refusal_names_each_setting_and_offers_only_what_can_still_change():
    def refusal(**changes) -> str:
        model = {"name": "llama-3.1-70b", **changes.pop("model", {})}
        with pytest.raises(InfeasibleError) as exc:
            build_replica(Scenario.from_dict(scenario_dict(
                hardware={"gpu": "h100-sxm"}, model=model, parallelism={"tp": 2},
                serving={"max_num_batched_tokens": 2048, **changes})))  # fmt: skip
        return str(exc.value)

    every_way = refusal()
    for part in ("set serving.max_model_len to at most that",
                 "raise serving.gpu_memory_utilization (now 0.9)",
                 "raise parallelism.tp (now 2) or parallelism.pp (now 1)",
                 "set model.kv_dtype to fp8 (now bf16)"):  # fmt: skip
        assert part in every_way, (part, every_way)
    at_full_memory = refusal(gpu_memory_utilization=1.0)
    assert "gpu_memory_utilization" not in at_full_memory and "model.kv_dtype" in at_full_memory
    fp8 = refusal(model={"kv_dtype": "fp8"})
    assert "kv_dtype" not in fp8 and "raise serving.gpu_memory_utilization" in fp8


def test_a_refusal_in_a_pool_names_that_pools_degrees():
    pool = {"name": "big", "hardware": {"gpu": "h100-sxm"}, "tp": 2}
    scenario = Scenario.from_dict(scenario_dict(
        model={"name": "llama-3.1-70b"}, pools=[pool], hardware=None,
        serving={"max_num_batched_tokens": 2048}))  # fmt: skip
    with pytest.raises(InfeasibleError, match=r"raise pools.0.tp \(now 2\) or pools.0.pp"):
        build_pools(scenario)


def test_max_model_len_above_the_models_context_is_refused():
    with pytest.raises(InfeasibleError, match=r"max_model_len=1000000 is above .*131072"):
        build_replica(Scenario.from_dict(scenario_dict(
            model={"name": "llama-3.1-8b"}, serving={"max_model_len": 1_000_000})))  # fmt: skip
    at_context = scenario_dict(model={"name": "llama-2-7b"}, serving={"max_model_len": 4096})
    assert build_replica(Scenario.from_dict(at_context)).config.max_model_len == 4096


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_a_token_budget_below_max_num_seqs_is_refused(policy):
    data = scenario_dict(serving={"policy": policy, "max_num_seqs": 256,
                                  "max_num_batched_tokens": 128, "max_model_len": 128})  # fmt: skip
    with pytest.raises(InfeasibleError, match=r"max_num_batched_tokens=128 is below .*256"):
        build_replica(Scenario.from_dict(data))


def test_a_default_budget_below_the_sequences_given_says_it_was_the_default():
    """vLLM 0.19 on an A100 defaults the budget to 2048 whatever max_num_seqs is given,
    then refuses 4096 sequences: the message names the unset budget as the default."""
    serving = {"max_num_seqs": 4096, "max_num_batched_tokens": None}
    data = scenario_dict(hardware={"gpu": "a100-80gb-sxm"}, serving=serving)
    with pytest.raises(InfeasibleError) as refused:
        build_replica(Scenario.from_dict(data))
    message = str(refused.value)
    assert "max_num_batched_tokens=2048 is below serving.max_num_seqs=4096" in message
    assert "took vLLM's default for this GPU, 2048: set it to at least 4096" in message


def test_run_to_completion_batches_have_no_token_budget_to_refuse():
    data = scenario_dict(serving={"policy": "static", "max_num_seqs": 256,
                                  "max_num_batched_tokens": 128})  # fmt: skip
    assert build_replica(Scenario.from_dict(data)).config.max_num_seqs == 256


@pytest.mark.parametrize("block_size", [17, 512, 1024])
def test_block_sizes_vllm_lacks_are_refused_naming_those_it_has(block_size):
    with pytest.raises(InfersimError, match=r"serving.block_size: .*1, 8, 16, 32, 64, 128"):
        Scenario.from_dict(scenario_dict(serving={"block_size": block_size}))


@pytest.mark.parametrize("kv_dtype", ["int8", "int4", "fp4", "fp32", "auto", "fp8_inc"])
def test_kv_cache_types_vllm_lacks_are_refused_naming_those_it_has(kv_dtype):
    accepted = (
        r"allowed: bf16, fp16, fp8, or vLLM's spellings bfloat16, float16, fp8_e4m3, fp8_e5m2"
    )
    with pytest.raises(InfersimError, match=rf"model.kv_dtype: vLLM has no such .*{accepted}"):
        Scenario.from_dict(scenario_dict(model={"name": "llama-2-7b", "kv_dtype": kv_dtype}))


@pytest.mark.parametrize(
    ("vllm_name", "modelled"),
    [("fp8_e4m3", "fp8"), ("fp8_e5m2", "fp8"), ("bfloat16", "bf16"), ("float16", "fp16")],
)
def test_vllms_kv_cache_spellings_are_read_as_the_cache_they_store(vllm_name, modelled, capsys):
    model = {"name": "llama-2-7b", "kv_dtype": vllm_name}
    assert Scenario.from_dict(scenario_dict(model=model)).model.kv_dtype == modelled
    main(["estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--kv-dtype", vllm_name])
    assert f"bf16 weights, {modelled} KV" in capsys.readouterr().out


def test_estimate_defaults_the_kv_cache_to_the_models_dtype_not_the_weights(capsys):
    main(["estimate", "--model", "llama-2-70b", "--gpu", "h100-sxm", "--precision", "int4"])
    out = capsys.readouterr().out
    assert "int4 weights, bf16 KV" in out and "int4 KV" not in out


def test_estimate_says_plainly_when_vllm_would_not_start(capsys):
    main(["estimate", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "2"])
    out = capsys.readouterr().out
    assert "KV capacity                     11541 tokens" in out
    assert "vLLM would not start" in out and "largest max_model_len that fits is 11536" in out
    # estimate's own flags; it has no --pp
    for part in ("set --max-model-len to", "raise --gpu-memory-utilization (now 0.9)",
                 "raise --tp (now 2), or", "set --kv-dtype to fp8 (now bf16)"):  # fmt: skip
        assert part in out, (part, out)
    refusal = next(line for line in out.splitlines() if "vLLM would not start" in line)
    assert "pp (now" not in refusal and "serving." not in refusal
    main(["estimate", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "2",
          "--max-model-len", "11536"])  # fmt: skip
    assert "vLLM would not start" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("serving", "why", "way_out"),
    [
        ({"max_model_len": 200000},
         "{max_model_len}=200000 is above llama-3.1-8b's context of 131072 tokens",
         "set {max_model_len} to at most 131072"),
        ({"max_num_batched_tokens": 512, "max_num_seqs": 1024},
         "{max_num_batched_tokens}=512 is below {max_num_seqs}=1024",
         "raise {max_num_batched_tokens} or lower {max_num_seqs}"),
        ({"max_num_seqs": 10000, "max_num_batched_tokens": None},  # vLLM's default budget
         "{max_num_batched_tokens}=8192 is below {max_num_seqs}=10000",
         "{max_num_batched_tokens} was left unset and took vLLM's default for this GPU, 8192: "
         "set it to at least 10000 or lower {max_num_seqs}"),
    ],
)  # fmt: skip
def test_estimate_refuses_what_run_refuses_before_planning(capsys, serving, why, way_out):
    """`run` refuses these at build time (check_context, check_token_budget); `estimate`
    with the same settings says vLLM would not start, and plans no KV cache for them.
    Each names the settings as its user typed them: the scenario's serving fields, or
    estimate's flags."""
    given = {name: value for name, value in serving.items() if value is not None}
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in given.items()]
    main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", *flags])
    out = capsys.readouterr().out
    names = ("max_model_len", "max_num_seqs", "max_num_batched_tokens")
    as_flags = {name: f"--{name.replace('_', '-')}" for name in names}
    refusal = next(line for line in out.splitlines() if "vLLM would not start" in line)
    assert f"vLLM would not start: {why.format(**as_flags)}" in refusal
    assert way_out.format(**as_flags) in refusal and "serving." not in refusal
    assert "KV capacity" not in out
    scenario = scenario_dict(
        hardware={"gpu": "h100-sxm"}, model={"name": "llama-3.1-8b"}, serving=serving
    )
    with pytest.raises(InfeasibleError) as refused:
        build_replica(Scenario.from_dict(scenario))
    as_fields = {name: f"serving.{name}" for name in names}
    assert why.format(**as_fields) in str(refused.value)
    assert way_out.format(**as_fields) in str(refused.value)


def test_a_plan_holding_one_sequence_has_no_refusal_and_none_without_a_max_model_len():
    arch, gpu = load_model("llama-2-7b"), load_gpu("a100-80gb-sxm")
    plan = plan_memory(arch, gpu, max_model_len=4096)
    assert plan.refusal() == "" and plan.longest_fitting_len == 4096
    unchecked = plan_memory(arch, gpu)
    assert unchecked.longest_fitting_len is None and unchecked.refusal() == ""


def test_a_replay_without_max_model_len_runs_at_the_largest_that_started(tmp_path, capsys):
    """Llama-3.1-8B on an RTX 4090 cannot hold one 131,072-token sequence: the run that
    happened set a shorter max_model_len, so the replay takes the largest that fits."""
    from tests.test_replay import _meta, replay, write_run, written

    run = write_run(tmp_path / "run", _meta(), log=False)
    code, out, err = replay(capsys, str(run), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "replayed at the largest that fits, 45,600" in out
    assert written(tmp_path / "out")["scenario"]["serving"]["max_model_len"] == 45600


def test_estimate_says_when_the_budget_it_refuses_was_vllms_default(capsys):
    """As run says it: a max_num_seqs above vLLM's default budget, the budget left unset."""
    main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-num-seqs", "10000"])
    out = capsys.readouterr().out
    assert "vLLM would not start" in out
    assert "left unset and took vLLM's default for this GPU, 8192" in out
