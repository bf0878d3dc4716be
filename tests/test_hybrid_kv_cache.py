"""vLLM V1's hybrid KV cache manager: KV cache groups, the blocks each group holds, the
pool the memory planner sizes in them, and what that does to a run. Hand-worked numbers
follow vLLM's rules (kv_cache_utils grouping, SlidingWindowManager's skipped tokens
max(0, computed - window + 1), its prefix-cache hit of cdiv(window - 1, block) blocks)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.presets import load_gpu
from simulator.engine.kv_cache import HybridBlockManager, request_key
from simulator.engine.kv_groups import group_layers, kv_cache_groups, page_layers
from simulator.memory_planner import plan_memory
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict


def _gemma3_27b():
    """Gemma 3 27B's layer pattern (62 layers, every sixth full, 1024-token window) on
    Gemma 2 27B's shapes: what the grouping reads."""
    return load_model("gemma-2-27b").model_copy(
        update={
            "name": "gemma-3-27b",
            "num_layers": 62,
            "sliding_window": 1024,
            "full_attention_interval": 6,
        }
    )


def test_gpt_oss_forms_one_full_and_one_sliding_group_of_twelve():
    arch = load_model("gpt-oss-20b")
    groups = group_layers(arch)
    assert groups == [list(range(1, 24, 2)), list(range(0, 24, 2))]
    g = kv_cache_groups(arch, 16)
    assert (g.full, g.sliding, g.layers, g.window) == (1, 1, 12, 128)
    # Pipeline stages of 12 layers hold 6 of each group: pages of 6 layers a block.
    assert page_layers(arch, range(0, 12)) == page_layers(arch, range(12, 24)) == 6


def test_gemma3_forms_six_sliding_groups_of_ten_with_padding():
    """10 full + 52 sliding layers: groups of 10 (52 >= 1.5 x 10), the 52 strided into 6
    groups (8 padding slots), the full ones in one."""
    arch = _gemma3_27b()
    groups = group_layers(arch)
    assert groups[0] == list(range(5, 62, 6))
    assert [len(g) for g in groups[1:]] == [9, 9, 9, 9, 8, 8]
    g = kv_cache_groups(arch, 16)
    assert (g.full, g.sliding, g.layers) == (1, 6, 10)


def test_block_counts_per_group_follow_vllms_rules_for_gpt_oss():
    """gpt-oss-20b, 16-token blocks, a 1000-token prompt in one chunk: 63 blocks in each
    group while it is computed (nothing cached yet, nothing skipped); its first decode
    (1000 cached) skips max(0, 1000 - 128 + 1) = 873 tokens = 54 whole blocks of the
    sliding group, which keeps 63 - 54 = 9."""
    g = kv_cache_groups(load_model("gpt-oss-20b"), 16)
    assert g.held(0, 1000) == 63 + 63
    assert g.held(1000, 1001) == 63 + 9
    # Steady decoding: the window's 128 keys span 8 or 9 blocks, never more.
    computed = np.arange(2000, 2100)
    sliding = g.held(computed, computed + 1) - (computed + 1 + 15) // 16
    assert set(sliding.tolist()) == {8, 9}
    # A chunk of 256 after 1000 cached: 1000 - 127 = 873 skipped -> 54 blocks; 80 held.
    assert g.held(1000, 1256) == 79 + (79 - 54)
    # Peak (vLLM's max_admission_blocks_per_request): window - 1 + budget tokens, and a
    # block more: cdiv(127 + 2048, 16) + 1 = 137.
    assert g.window_cap(2048) == 137
    assert g.peak(100_000, 2048) == 6250 + 137


def test_admission_reserves_the_sliding_groups_capped_as_vllm_does():
    """A 32k prompt admitted whole (full_sequence_must_fit), budget 8192: the full group's
    2000 blocks, the sliding group's capped at cdiv(127 + 8192, 16) + 1 = 521, not 2000.
    With 16,000 tokens cached (1000 blocks): the cap less the hit's blocks is nothing
    left to allocate, and the hit's window, 1000 - (16000 - 127) // 16 = 8 blocks,
    leaves the free queue."""
    g = kv_cache_groups(load_model("gpt-oss-20b"), 16)
    assert g.full_sequence(0, 32000, 8192) == 2000 + 521
    assert g.full_sequence(16000, 32000, 8192) == 2000 + 8
    # Short prompts are not capped: the whole prompt, as held() gives it.
    assert g.full_sequence(0, 1000, 8192) == g.held(0, 1000) == 126


def test_block_counts_per_group_follow_vllms_rules_for_gemma3():
    """Gemma 3 at 32k: the full group holds all 2049 blocks; each of the 6 sliding ones
    the window: 32768 - 1023 = 31745 skipped tokens = 1984 blocks, 2049 - 1984 = 65."""
    g = kv_cache_groups(_gemma3_27b(), 16)
    assert g.held(32768, 32769) == 2049 + 6 * 65
    # In layer-pages: 2439 blocks x 10 layers against 2049 x 62 at full length, 5.2x.
    assert 2049 * 62 / (g.held(32768, 32769) * 10) == pytest.approx(5.21, abs=0.01)


@pytest.mark.parametrize(
    ("model", "gain"), [("gpt-oss-20b", 2.0), ("gemma-3-27b", 6.2)], ids=["gpt-oss", "gemma3"]
)
def test_the_pool_is_sized_in_blocks_of_one_groups_layers(model, gain):
    """The same KV memory holds `gain` times the blocks: a block pages one group's
    layers (12 of gpt-oss's 24, 10 of Gemma 3's 62), not every layer."""
    arch = _gemma3_27b() if model == "gemma-3-27b" else load_model(model)
    gpu = load_gpu("h200-sxm")  # Gemma 3 27B's 16-bit weights and a KV cache on one GPU
    dtype = arch.checkpoint_dtype or "bf16"
    full = plan_memory(arch, gpu, weight_dtype=dtype)
    hybrid = plan_memory(arch, gpu, weight_dtype=dtype, kv_groups=kv_cache_groups(arch, 16))
    assert hybrid.kv_capacity_bytes == full.kv_capacity_bytes
    assert full.kv_bytes_per_token / hybrid.kv_bytes_per_token == pytest.approx(gain)
    # Both floor whole tokens: within one token of the larger pages.
    assert hybrid.kv_capacity_tokens == pytest.approx(gain * full.kv_capacity_tokens, abs=gain)
    assert "KV cache groups" in hybrid.table()


def test_prefix_cache_hits_need_the_window_and_break_on_eviction():
    """A released sequence leaves its full group's blocks and the window's sliding
    blocks cached (cdiv(127, 16) = 8); a hit takes them whole. Evicting any of them
    breaks the hit: the window before a shorter prefix was freed as it slid."""
    g = kv_cache_groups(load_model("gpt-oss-20b"), 16)
    kv = HybridBlockManager(200, g, max_num_batched_tokens=2048)
    key = request_key(7)
    kv.allocate(kv.held(0, 1000))
    kv.release(kv.held(0, 1000))
    kv.keep_cached(key, 1000 // 16)
    assert kv.cached_total == 62 + 8
    assert kv.cached_blocks(key) == 62
    kv.allocate(200 - 70 + 1)  # takes one cached block: the hit is gone
    assert kv.cached_blocks(key) == 0


def _run_noting_full_length(scenario: Scenario):
    """Simulate: the results, and whether the run said the sliding layers' KV cache is
    held at full length."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = simulate(scenario)
    return results, any("held at full length" in str(w.message) for w in caught)


def _long_prompts(make_scenario, full_length: bool, serving: dict, workload: dict, **sections):
    """Simulate fixed-length prompts under an 8192-token budget and a 16384 max_model_len
    (`workload`: rate_per_s, prompt, output, num_requests), checking the run says the
    sliding layers' KV cache is held at full length exactly when `full_length`."""
    scenario = make_scenario(
        serving={"max_num_batched_tokens": 8192, "max_model_len": 16384, **serving},
        workload={
            "arrivals": {"kind": "poisson", "rate_per_s": workload["rate_per_s"]},
            "prompt_tokens": {"kind": "fixed", "tokens": workload["prompt"]},
            "output_tokens": {"kind": "fixed", "tokens": workload["output"]},
            "num_requests": workload["num_requests"],
        },
        **sections,
    )
    results, said = _run_noting_full_length(scenario)
    assert said == full_length
    return results


def _long_context(make_scenario, disable: bool, **serving):
    """gpt-oss-20b on an L4 (its KV memory is small): long prompts arriving together."""
    return _long_prompts(
        make_scenario,
        disable,
        {"disable_hybrid_kv_cache_manager": disable, **serving},
        {"rate_per_s": 1000.0, "prompt": 12000, "output": 64, "num_requests": 48},
        hardware={"gpu": "l4"},
        model={"name": "gpt-oss-20b"},
    )


def test_more_long_sequences_run_at_once_with_the_hybrid_manager(make_scenario):
    """Sliding layers holding only the window's blocks: about twice the sequences run
    together, and the same work ends sooner."""
    full = _long_context(make_scenario, disable=True)
    hybrid = _long_context(make_scenario, disable=False)
    most = {name: int(r.steps["batch_size"].max()) for name, r in [("f", full), ("h", hybrid)]}
    assert most["h"] >= 1.8 * most["f"]
    assert (hybrid.requests["outcome"] == "completed").all()
    assert hybrid.requests["finish"].max() < full.requests["finish"].max()


def test_a_trace_sharing_blocks_by_hash_runs_without_the_hybrid_manager_and_says_so():
    """Prompts that share blocks by hash (a trace's hash_ids) with prefix caching run, as
    vLLM runs them, with every layer at full length (sharing across the groups is not
    modelled), as if the manager were disabled, and the run says why; without prefix
    caching the hashes are unused and the manager runs."""
    path = "scenarios/mooncake-prefix-cache.yaml"
    sets = ["model.name=gpt-oss-20b", "workload.num_requests=4"]
    with pytest.warns(InfersimWarning, match="held at full length: the trace's prompts share"):
        hashed = simulate(Scenario.from_yaml(path, sets), progress=False)
    off = Scenario.from_yaml(path, [*sets, "serving.disable_hybrid_kv_cache_manager=true"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        disabled = simulate(off, progress=False)
    assert (hashed.requests["outcome"] == "completed").all()
    assert hashed.requests["cached_prompt_tokens"].sum() > 0
    pd.testing.assert_frame_equal(hashed.requests, disabled.requests, check_exact=True)
    unused = Scenario.from_yaml(path, [*sets, "serving.enable_prefix_caching=false"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(unused, progress=False)
    assert not any("held at full length" in str(w.message) for w in caught)


def test_compares_feasibility_check_builds_a_hashed_traces_pools_as_its_run_does():
    """`infersim compare` checks every run fits before simulating any: for a trace whose
    prompts share blocks by hash it must plan the full-length pool the run will build,
    not the hybrid manager's twice as many blocks (found by review)."""
    from simulator.build import build_pools, open_loop_requests, shares_blocks_by_hash

    sets = ["model.name=gpt-oss-20b", "workload.num_requests=4"]
    scenario = Scenario.from_yaml("scenarios/mooncake-prefix-cache.yaml", sets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hashed = shares_blocks_by_hash(open_loop_requests(scenario))
        checked = build_pools(scenario, hashed)[0][1].config
        hybrid = build_pools(scenario, False)[0][1].config
    assert hashed and checked.kv_groups is None
    # Both floor whole blocks: within one block of twice as many.
    assert hybrid.total_blocks == pytest.approx(2 * checked.total_blocks, abs=1)


@st.composite
def _sliding_scenarios(draw: st.DrawFn) -> dict:
    """Small scenarios of models with sliding-window layers, the KV cache tight or not."""
    policy = draw(st.sampled_from(["chunked_prefill", "continuous"]))
    serving = {
        "policy": policy,
        "max_num_seqs": draw(st.sampled_from([4, 64])),
        # A small budget lets a prefix hit (a session's, a preempted request's) pass the
        # sliding groups' cap; continuous batching needs the budget to cover the length.
        "max_num_batched_tokens": draw(st.sampled_from([512, 2048]))
        if policy == "chunked_prefill"
        else 8192,
        "max_model_len": 8192,
        "block_size": draw(st.sampled_from([8, 16, 64])),
        "enable_prefix_caching": draw(st.booleans()),
        "reserve_full_sequence": draw(st.booleans()),
        "disable_hybrid_kv_cache_manager": draw(st.booleans()),
    }
    if draw(st.booleans()):
        serving["num_gpu_blocks"] = draw(st.sampled_from([120, 400, 2000]))
    workload = {
        "arrivals": {"kind": "poisson", "rate_per_s": draw(st.sampled_from([2.0, 50.0]))},
        "prompt_tokens": {"kind": "uniform", "low": 1, "high": draw(st.sampled_from([64, 1500]))},
        "output_tokens": {"kind": "uniform", "low": 1, "high": draw(st.sampled_from([8, 400]))},
        "num_requests": draw(st.integers(1, 40)),
    }
    if draw(st.integers(0, 3)) == 0:
        workload["sessions"] = {"turns": 3, "think_time_s": 0.5, "think_distribution": "constant"}
    return scenario_dict(
        model={"name": draw(st.sampled_from(["gpt-oss-20b", "gemma-2-9b", "mistral-7b"]))},
        hardware={"gpu": "h100-sxm"},
        serving=serving,
        workload=workload,
    )


# Found by the property: continuous batching admitted against blocks the decodes' windows
# would only free next step (a negative lookahead), and over-allocated.
_WINDOWS_FREE_NEXT_STEP = scenario_dict(
    hardware={"gpu": "h100-sxm"},
    model={"name": "gpt-oss-20b"},
    serving={"policy": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 2048,
             "max_model_len": 2048, "block_size": 8, "reserve_full_sequence": False,
             "num_gpu_blocks": 400},
    workload={"arrivals": {"kind": "poisson", "rate_per_s": 2.0},
              "prompt_tokens": {"kind": "uniform", "low": 1, "high": 1500},
              "output_tokens": {"kind": "uniform", "low": 1, "high": 400},
              "num_requests": 7,
              "sessions": {"turns": 3, "think_time_s": 0.5, "think_distribution": "constant"}},
)  # fmt: skip


# Found by review: with reserve_full_sequence, a session's prefix hit past the sliding
# cap made the whole-sequence need smaller than the first chunk's allocation; admission
# checked only the former and over-allocated (a RuntimeError, not a wait).
_HIT_PAST_THE_SLIDING_CAP = scenario_dict(
    hardware={"gpu": "h100-sxm"},
    model={"name": "gpt-oss-20b"},
    serving={"policy": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 512,
             "max_model_len": 8192, "enable_prefix_caching": True, "num_gpu_blocks": 120},
    workload={"arrivals": {"kind": "poisson", "rate_per_s": 5.0},
              "prompt_tokens": {"kind": "uniform", "low": 100, "high": 400},
              "output_tokens": {"kind": "uniform", "low": 300, "high": 800},
              "num_requests": 30,
              "sessions": {"turns": 4, "think_time_s": 0.3}},
) | {"seed": 1}  # fmt: skip


def test_admission_waits_when_the_first_chunk_needs_more_than_the_whole_sequence_gate():
    """A hit of 800 tokens and 14 to compute (gpt-oss, budget 512): vLLM's whole-sequence
    gate asks 59 blocks, the chunk's own allocation 60; with 59 free the request waits
    (as vLLM's second check makes it), and the run that crashed there runs to its end
    (turns longer than the 120-block pool refused)."""
    kv = HybridBlockManager(59, kv_cache_groups(load_model("gpt-oss-20b"), 16), 512)
    assert (kv.full_sequence_blocks(800, 814), kv.held(800, 814)) == (59, 60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = simulate(Scenario.from_dict(_HIT_PAST_THE_SLIDING_CAP), progress=False)
    outcomes = results.requests["outcome"].value_counts()
    assert outcomes["completed"] + outcomes["rejected"] == len(results.requests)
    assert outcomes["completed"] >= 25


@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@example(_WINDOWS_FREE_NEXT_STEP)
@example(_HIT_PAST_THE_SLIDING_CAP)
@given(_sliding_scenarios())
def test_runs_of_decode_steps_equal_stepping_with_sliding_groups(data):
    """Generated: multi-step runs equal stepping one by one, bit for bit, whether the
    sliding groups free blocks or not, under pressure, prefix caching and sessions."""
    results, refusals = [], []
    for multi_step in (False, True):
        scenario = Scenario.from_dict(data | {"engine": {"multi_step": multi_step}})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                results.append(simulate(scenario, progress=False))
            except InfersimError as exc:  # refused up front, in one line
                assert "\n" not in str(exc)
                refusals.append(str(exc))
    if refusals:  # then both runs, the same way
        assert not results and refusals[0] == refusals[1]
        return
    slow, fast = results
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


@pytest.mark.parametrize("multi_step", [False, True])
def test_the_engine_holds_the_blocks_vllms_rules_give_step_by_step(make_scenario, multi_step):
    """One gpt-oss-20b request, 1000 prompt tokens in chunks of 512 and 488, 40 output
    tokens: each step's KV blocks are what vLLM's rule gives (full group every block;
    sliding group freed behind the window at the request's next allocation), 64 for the
    first chunk, 63 + (63 - 24) = 102 for the second (its 512 cached tokens skip 385 = 24
    blocks), 63 + 9 = 72 at the first decode, then held(c, c + 1) a step."""
    results = simulate(
        make_scenario(
            hardware={"gpu": "h100-sxm"},
            model={"name": "gpt-oss-20b"},
            serving={"max_num_batched_tokens": 512, "max_model_len": 2048},
            workload={
                "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
                "prompt_tokens": {"kind": "fixed", "tokens": 1000},
                "output_tokens": {"kind": "fixed", "tokens": 40},
                "num_requests": 1,
            },
            engine={"multi_step": multi_step},
        )
    )
    g = kv_cache_groups(load_model("gpt-oss-20b"), 16)
    decodes = [int(g.held(c, c + 1)) for c in range(1000, 1039)]
    assert decodes[0] == 72
    assert results.steps["kv_blocks_used"].tolist() == [64, 102, *decodes]


def test_estimate_sizes_the_serving_plan_as_vllm_serves_by_default(capsys):
    """`infersim estimate` plans gpt-oss in the hybrid manager's groups (vLLM's default)
    and Llama 4 at full length (vLLM turns the manager off for its chunked layers)."""
    from simulator.cli.main import main

    assert main(["estimate", "--model", "gpt-oss-20b", "--gpu", "h100-sxm"]) == 0
    assert "1 full + 1 sliding (128 tokens) groups of 12 layers" in capsys.readouterr().out
    assert main(["estimate", "--model", "llama-4-scout", "--gpu", "h200-sxm", "--tp", "2"]) == 0
    assert "KV cache groups" not in capsys.readouterr().out


@pytest.mark.parametrize("hybrid_kv", [True, False], ids=["hybrid", "full_length"])
def test_a_sessions_next_turn_reuses_its_cached_prefix_with_sliding_groups(
    make_scenario, hybrid_kv
):
    """Multi-turn gpt-oss sessions with prefix caching: a turn's prompt opens with the
    conversation so far, whose full blocks (and, with the hybrid manager, the window's
    sliding blocks) stay cached, so later turns skip them, with or without the manager."""
    scenario = make_scenario(
        hardware={"gpu": "h100-sxm"},
        model={"name": "gpt-oss-20b"},
        serving={
            "enable_prefix_caching": True,
            "max_model_len": 8192,
            "disable_hybrid_kv_cache_manager": not hybrid_kv,
        },
        workload={
            "arrivals": {"kind": "poisson", "rate_per_s": 2.0},
            "prompt_tokens": {"kind": "uniform", "low": 200, "high": 600},
            "output_tokens": {"kind": "uniform", "low": 20, "high": 200},
            "num_requests": 40,
            "sessions": {"turns": 4, "think_time_s": 1.0},
        },
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        requests = simulate(scenario).requests
    later = requests[requests["turn"] > requests["turn"].min()]
    assert len(later) and (later["cached_prompt_tokens"] > 0).all()
    # Whole blocks of the previous turn's prompt and output, never the last token.
    assert (later["cached_prompt_tokens"] % 16 == 0).all()
    assert (later["cached_prompt_tokens"] < later["prompt"]).all()


def test_llama4_chunked_layers_keep_only_the_current_chunk():
    """Llama 4 Scout: 12 full + 36 chunked layers (8192-token chunks) form one full and
    three chunked groups of 12. A chunked group holds the blocks of the current chunk
    (vLLM's skipped tokens: computed // chunk * chunk): at 10,000 cached tokens,
    626 - 512 = 114 blocks; the step that starts a new chunk frees the old one's."""
    g = kv_cache_groups(load_model("llama-4-scout"), 16)
    assert (g.full, g.sliding, g.layers, g.window, g.chunked) == (1, 3, 12, 8192, True)
    assert g.held(10_000, 10_001) == 626 + 3 * 114
    assert g.held(8191, 8192) == 512 + 3 * 512
    assert g.held(8192, 8193) == 513 + 3 * 1
    assert g.window_cap(8192) == 1024  # cdiv(chunk + budget, block)
    # A hit at 10,000 tokens needs the current chunk's cached blocks: 625 - 512 = 113.
    assert g.cached_prefix_blocks(625) == 625 + 3 * 113
    assert "3 chunked local (8192 tokens)" in g.describe()


@pytest.mark.parametrize("multi_step", [False, True])
def test_llama4_runs_chunked_groups_only_when_allowed(make_scenario, multi_step):
    """vLLM keeps Llama 4's chunked layers at full length unless allowed, and the run
    says so; allowed, one request of 8100 prompt and 200 output tokens holds, step by
    step, what vLLM's rule gives: 507 blocks in each of the 4 groups for its prompt,
    then its chunked groups' first-chunk blocks freed at the decode that starts the
    second chunk, in runs of decode steps as stepping one by one."""

    def run(allow: bool):
        return _long_prompts(
            make_scenario,
            not allow,
            {"allow_chunked_local_attn_with_hybrid_kv_cache": allow},
            {"rate_per_s": 1.0, "prompt": 8100, "output": 200, "num_requests": 1},
            hardware={"gpu": "h200-sxm"},
            model={"name": "llama-4-scout", "weight_dtype": "fp8"},
            parallelism={"tp": 2},
            engine={"multi_step": multi_step},
        )

    assert run(False).steps["kv_blocks_used"].tolist()[-1] == -(-8299 // 16)  # 48 layers
    g = kv_cache_groups(load_model("llama-4-scout"), 16)
    decodes = [int(g.held(c, c + 1)) for c in range(8100, 8299)]
    assert run(True).steps["kv_blocks_used"].tolist() == [4 * 507, *decodes]
    assert decodes[0] == 4 * 507 and decodes[92] == 513 + 3 * 1  # c = 8192


def test_compares_feasibility_check_builds_the_pools_a_disaggregated_run_builds():
    """A disaggregated gpt-oss scenario holds every layer at full length (vLLM turns the
    manager off with a KV connector): compare's pre-check plans that pool, not the
    hybrid manager's larger one."""
    from simulator.build import build_pools

    path = "scenarios/disaggregated-vs-colocated.yaml"
    base = Scenario.from_yaml(path, ["model.name=gpt-oss-20b", "workload.num_requests=4"])
    runs = {run.name: run for run in base.expand()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        split = build_pools(runs["disaggregated-2p4d"])
        colocated = build_pools(runs["colocated"])
    assert [build.config.kv_groups for _, build in split] == [None, None]
    assert colocated[0][1].config.kv_groups is not None
    # Half the layers a block: twice the blocks in the same memory.
    assert colocated[0][1].config.total_blocks == pytest.approx(
        2 * split[0][1].config.total_blocks, abs=1
    )  # both floor whole blocks


# Found by review: with the decodes' blocks not taken when a step's new and freed blocks
# cancelled, only the slots' counts went wrong (the outputs did not): checked per slot.
_CONTINUOUS_WIDE_BLOCKS = {
    "serving": {"policy": "continuous", "max_num_seqs": 8, "max_num_batched_tokens": 8192,
                "max_model_len": 8192, "block_size": 32, "reserve_full_sequence": True,
                "num_gpu_blocks": 400},
    "workload": {"arrivals": {"kind": "poisson", "rate_per_s": 20.0},
                 "prompt_tokens": {"kind": "uniform", "low": 1, "high": 300},
                 "output_tokens": {"kind": "uniform", "low": 1, "high": 600},
                 "num_requests": 30, "duration_s": 3.0},
    "seed": 385514,
}  # fmt: skip
_PRESSURE_WITH_PREFIXES = {
    "serving": {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "max_model_len": 8192,
                "enable_prefix_caching": True, "num_gpu_blocks": 150},
    "workload": {"arrivals": {"kind": "poisson", "rate_per_s": 30.0},
                 "prompt_tokens": {"kind": "uniform", "low": 1, "high": 1000},
                 "output_tokens": {"kind": "uniform", "low": 1, "high": 600},
                 "num_requests": 40,
                 "sessions": {"turns": 2, "think_time_s": 0.2,
                              "think_distribution": "constant"}},
}  # fmt: skip


@pytest.mark.parametrize(
    ("model", "multi_step", "sections"),
    [
        ("gpt-oss-20b", False, _PRESSURE_WITH_PREFIXES),
        ("gpt-oss-20b", True, _PRESSURE_WITH_PREFIXES),
        ("gemma-2-9b", False, _PRESSURE_WITH_PREFIXES),
        ("gemma-2-9b", True, _PRESSURE_WITH_PREFIXES),
        ("gpt-oss-20b", True, _CONTINUOUS_WIDE_BLOCKS),
    ],
)
def test_each_planned_slot_holds_the_rules_blocks_and_the_pool_their_sum(
    monkeypatch, model, multi_step, sections
):
    """After every plan, the scheduler's or the replica's own decode-only one
    (`Replica._decode_next`), under KV pressure: each decode holds held(c, c + 1), each
    prefill chunk held(c, c + chunk), and the pool's used blocks are the sum the slots
    hold, also while the running set counts its lockstep blocks by residue rather than
    per slot (sliding_running.py)."""
    from simulator.engine.replica import Replica

    wrong = []

    def check(replica, decode_slots, prefills) -> None:
        run, g = replica.running, replica.kv.groups
        slots = np.flatnonzero(run.active).tolist()
        if sum(map(run.blocks_of, slots)) != replica.kv.used:
            wrong.append(("pool", replica.t))
        for slot in decode_slots:
            c = run.computed_of(slot)
            if run.blocks_of(slot) != g.held(c, c + 1):
                wrong.append(("decode", replica.t, slot))
        for slot, chunk in prefills:
            c = run.computed_of(slot)
            if run.blocks_of(slot) != g.held(c, c + chunk):
                wrong.append(("prefill", replica.t, slot))

    plan_next, decode_next = Replica.next_plan, Replica._decode_next

    def checked_plan(self):
        plan = plan_next(self)
        if plan is not None:
            prefills = zip(plan.prefill_slots, plan.prefill_chunks, strict=True)
            check(self, plan.decode_slots.tolist(), prefills)
        return plan

    def checked_decodes(self):
        dec = decode_next(self)
        if dec is not None:
            check(self, dec.tolist(), ())
        return dec

    monkeypatch.setattr(Replica, "next_plan", checked_plan)
    monkeypatch.setattr(Replica, "_decode_next", checked_decodes)
    data = scenario_dict(
        model={"name": model},
        hardware={"gpu": "h100-sxm"},
        engine={"multi_step": multi_step},
        **sections,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = simulate(Scenario.from_dict(data), progress=False)
    if sections is _PRESSURE_WITH_PREFIXES:
        assert results.requests["preemptions"].sum() > 0  # the pool was short
    assert wrong == []
