"""Sliding-window layers get the credit their kernels take: decode over the last `window`
keys, prefill over the banded causal mask, in the layers that slide and only there."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from hardware_models.attention import DecodeAttention, causal_pairs
from hardware_models.presets import load_gpu, load_node
from simulator.engine import replica
from simulator.engine.step_cost import StepCostModel, window_sums
from simulator.model_catalog import load_model
from simulator.simulation import simulate

CONTEXT = 32768


def _costs(name: str, gpu: str = "h100-sxm", node: str = "dgx-h100"):
    """(the model's step costs, the same model priced with every layer full)."""
    arch = load_model(name)
    full = arch.model_copy(update={"sliding_window": None, "full_attention_interval": None})
    spec, box = load_gpu(gpu), load_node(node)
    dtype = arch.checkpoint_dtype or "bf16"
    return (
        StepCostModel(arch, spec, box, weight_dtype=dtype),
        StepCostModel(full, spec, box, weight_dtype=dtype),
    )


def test_gpt_oss_decode_at_32k_saves_the_sliding_layers_attention():
    """gpt-oss-20b: 12 of 24 layers slide over 128 keys. At 32k context a decode step
    costs less than the all-full pricing by exactly those layers' full attention less
    their windowed attention."""
    hybrid, full = _costs("gpt-oss-20b")
    arch = hybrid.arch
    assert (arch.num_layers, arch.num_sliding_layers, arch.sliding_window) == (24, 12, 128)
    seqs = 32
    keys = np.full(seqs, CONTEXT)
    window = window_sums(arch.sliding_window, keys, [])
    assert window.decode_context == seqs * arch.sliding_window
    cheap = hybrid.step(decode_seqs=seqs, decode_context=seqs * CONTEXT, window=window)
    dear = full.step(decode_seqs=seqs, decode_context=seqs * CONTEXT)
    full_layer = full._decode_attention.one_step(seqs, seqs * CONTEXT)[0]
    window_layer = hybrid._window_decode.one_step(seqs, seqs * arch.sliding_window)[0]
    assert dear.seconds - cheap.seconds == pytest.approx(12 * (full_layer - window_layer))
    # Attention over 32k keys is most of the step: half the layers' share is saved.
    assert cheap.seconds < 0.75 * dear.seconds


def test_prefill_chunks_are_priced_over_the_band():
    """A chunk's sliding layers attend the banded causal mask and read the window before
    the chunk, not the whole prefix."""
    window, chunk, kv_len = 128, 512, 4096
    sums = window_sums(window, np.empty(0), [(chunk, kv_len)])
    assert sums.prefill_pairs == causal_pairs(chunk, kv_len, window)
    # The union of the keys the chunk's queries see, counted one by one.
    seen = set()
    for position in range(kv_len - chunk + 1, kv_len + 1):
        seen.update(range(max(1, position - window + 1), position + 1))
    assert sums.prefill_context == len(seen)
    hybrid, full = _costs("gpt-oss-20b")
    step = {"decode_seqs": 0, "decode_context": 0, "prefill_seqs": 1, "prefill_tokens": chunk}
    step |= {"prefill_pairs": causal_pairs(chunk, kv_len), "prefill_context": kv_len}
    assert hybrid.step(**step, window=sums).seconds < full.step(**step).seconds


def test_fa2_runs_a_windowed_decode_one_block_per_query_head():
    """FlashAttention-2 packs a KV head's query heads only without a window: the A100
    profile's windowed decode runs a block per query head, unsplit, with no swap copies."""
    gpu = load_gpu("a100-80gb-sxm", calibration="a100-80gb-sxm")
    assert gpu.efficiency.decode_split_kv == "gqa"
    heads = {"num_heads": 64, "num_kv_heads": 8, "head_dim": 64}
    packed = DecodeAttention(gpu, **heads)
    windowed = DecodeAttention(gpu, **heads, window=128)
    assert (packed.block_heads, windowed.block_heads) == (8, 64)
    assert packed.splits_kv and not windowed.splits_kv
    assert packed.copy_seconds > 0 and windowed.copy_seconds == 0
    # Many sequences over the same few keys: eight times the blocks, a slower call.
    assert windowed.one_step(256, 256 * 100)[0] > packed.one_step(256, 256 * 100)[0]


def _hybrid(make_scenario, hybrid_kv: bool = True, rate: float = 3.0, **sections):
    """gpt-oss-20b serving a mixed workload; `hybrid_kv`: vLLM V1's hybrid KV cache
    manager on (the default) or off. Held at full length, the run says so."""
    workload = {
        "arrivals": {"kind": "poisson", "rate_per_s": rate},
        "prompt_tokens": {"kind": "uniform", "low": 16, "high": 600},
        "output_tokens": {"kind": "uniform", "low": 2, "high": 300},
        "num_requests": 60,
    }
    serving = sections.pop("serving", {}) | {"disable_hybrid_kv_cache_manager": not hybrid_kv}
    scenario = make_scenario(
        hardware={"gpu": "h100-sxm"},
        model={"name": "gpt-oss-20b"},
        workload=workload,
        serving=serving,
        **sections,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = simulate(scenario)
    full_length = [w for w in caught if "held at full length" in str(w.message)]
    static = serving.get("policy") == "static"
    assert bool(full_length) == (static or not hybrid_kv), [str(w.message) for w in caught]
    return results


def _assert_same_run(fast, slow):
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)


@pytest.mark.parametrize("hybrid_kv", [True, False], ids=["hybrid", "full_length"])
@pytest.mark.parametrize("policy", ["static", "chunked_prefill"])
@pytest.mark.parametrize("stepwise_up_to", [-1, 10**9])
def test_hybrid_multi_step_matches_step_by_step(
    make_scenario, monkeypatch, policy, stepwise_up_to, hybrid_kv
):
    """Runs of decode steps (priced one by one or vectorised) give a hybrid model's
    step-by-step numbers bit for bit, contexts crossing the window included, with its
    sliding groups' blocks freed as the window slides or held at full length."""
    serving = {"policy": policy, "max_num_batched_tokens": 1024, "max_model_len": 1024}
    slow = _hybrid(make_scenario, hybrid_kv, serving=serving, engine={"multi_step": False})
    monkeypatch.setattr(replica, "STEPWISE_RUN_STEPS", stepwise_up_to)
    fast = _hybrid(make_scenario, hybrid_kv, serving=serving)
    _assert_same_run(fast, slow)
    assert (fast.requests["outcome"] == "completed").all()


@pytest.mark.parametrize("stepwise_up_to", [-1, 10**9])
def test_hybrid_multi_step_matches_step_by_step_under_kv_pressure(
    make_scenario, monkeypatch, stepwise_up_to
):
    """A pool so small that sequences are preempted while their windows slide: runs
    stop where the stepping would have run out of blocks, freed ones counted."""
    serving = {"max_num_batched_tokens": 256, "max_model_len": 1024, "num_gpu_blocks": 160}
    slow = _hybrid(make_scenario, rate=40.0, serving=serving, engine={"multi_step": False})
    monkeypatch.setattr(replica, "STEPWISE_RUN_STEPS", stepwise_up_to)
    fast = _hybrid(make_scenario, rate=40.0, serving=serving)
    _assert_same_run(fast, slow)
    assert fast.requests["preemptions"].sum() > 0
    assert (fast.requests["outcome"] == "completed").all()


@pytest.mark.parametrize("parallelism", [{"pp": 2}, {"dp": 2}], ids=["pp2", "dp2"])
def test_hybrid_multi_step_matches_step_by_step_pipelined_and_data_parallel(
    make_scenario, parallelism
):
    """The windowed sums and the sliding groups' blocks travel through the pipelined
    engines and the dp ranks too."""
    slow = _hybrid(make_scenario, parallelism=parallelism, engine={"multi_step": False})
    fast = _hybrid(make_scenario, parallelism=parallelism)
    _assert_same_run(fast, slow)
