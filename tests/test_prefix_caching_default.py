"""serving.enable_prefix_caching left unset follows the engine the policy models, as vLLM
v1 turns prefix caching on by default; caching where nothing can hit costs nothing and
changes no result."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware_models.presets import load_gpu
from simulator.engine.kv_cache import BlockManager, request_key, unreachable_key
from simulator.engine.requests import RequestTable
from simulator.engine.running import RunningSet
from simulator.engine.scheduler import IterationPolicy, IterationScheduler, StepPlan
from simulator.engine.waiting import WaitingQueue
from simulator.scenario import ServingSection
from simulator.simulation import simulate

PRESSURE = {"num_gpu_blocks": 300, "max_num_seqs": 64}  # recompute preemptions at 20 req/s
BUSY = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}}


@pytest.mark.parametrize(
    ("policy", "on"),
    [("chunked_prefill", True), ("continuous", False), ("static", False), ("dynamic", False)],
)
def test_unset_prefix_caching_is_the_default_of_the_engine_the_policy_models(policy, on):
    """vLLM v1 (chunked_prefill) caches prefixes unless told not to
    (ModelConfig.is_prefix_caching_supported for a decoder-only model); vLLM v0
    (continuous) did not; the run-to-completion batchers keep no cache. The run's
    header says which, for the two vLLM policies; a value given is kept, unsaid."""
    gpu = load_gpu("h100-sxm")
    unset = ServingSection(policy=policy)
    assert unset.enable_prefix_caching is None and unset.prefix_caching is on
    served, notes = unset.with_vllm_defaults(gpu, 4096)
    assert served.enable_prefix_caching is on
    said = [line for line in notes if line.startswith("serving.enable_prefix_caching")]
    if policy in ("chunked_prefill", "continuous"):
        assert said == [
            f"serving.enable_prefix_caching = {on} ({unset.prefix_caching_default().reason})"
        ]
        assert ("is_prefix_caching_supported" if on else "vLLM v0") in said[0]
    else:
        assert not said
    for given_value in (True, False):
        given_section = ServingSection(policy=policy, enable_prefix_caching=given_value)
        served, notes = given_section.with_vllm_defaults(gpu, 4096)
        assert given_section.prefix_caching is given_value is served.enable_prefix_caching
        assert not any("enable_prefix_caching" in line for line in notes)


def test_a_run_that_leaves_it_unset_recomputes_from_its_cached_blocks_as_vllm_v1(make_scenario):
    """Before, an unset enable_prefix_caching was off: a recompute-preempted request
    recomputed its whole sequence, where vLLM v1 hits the blocks not yet evicted. The
    summary names the value the run used and why."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the KV cache is short for this load, as meant
        unset = simulate(make_scenario(serving=PRESSURE, workload=BUSY))
        on = simulate(make_scenario(serving={**PRESSURE, "enable_prefix_caching": True},
                                    workload=BUSY))  # fmt: skip
        off = simulate(make_scenario(serving={**PRESSURE, "enable_prefix_caching": False},
                                     workload=BUSY))  # fmt: skip
    assert unset.requests["preemptions"].sum() > 0
    pd.testing.assert_frame_equal(unset.requests, on.requests, check_exact=True)
    assert unset.steps["prefill_tokens"].sum() < off.steps["prefill_tokens"].sum()
    provenance = unset.summary()["provenance"]
    assert provenance["scenario"]["serving"]["enable_prefix_caching"] is True
    assert any(line.startswith("serving.enable_prefix_caching = True (vLLM 0.19.0 default")
               for line in provenance["defaults"])  # fmt: skip
    assert on.summary()["provenance"]["defaults"] == []
    # The KV cache stays within the memory plan's blocks, and the prefix-cache metrics
    # count first-scheduled hits only (a recompute's hits recover its own work).
    total = unset.context.replicas[0].kv_total_blocks
    assert unset.steps["kv_blocks_used"].max() <= total
    assert unset.summary()["prefix_cache"]["cached_prompt_tokens"] == 0
    assert unset.summary()["kv"]["max_utilisation"] == unset.steps["kv_blocks_used"].max() / total


def two_prefilled_requests(
    blocks: int,
) -> tuple[IterationScheduler, RunningSet, BlockManager, StepPlan]:
    """A chunked-prefill scheduler with prefix caching on, two requests (64 and 48
    prompt tokens) prefilled in its KV cache of `blocks` blocks, and the plan that
    admitted them (their slots: `plan.prefill_slots`)."""
    req = RequestTable(4)
    run, kv, waiting = RunningSet(4, 16, req), BlockManager(blocks, 16), WaitingQueue()
    policy = IterationPolicy(
        chunked_prefill=True, max_num_seqs=4, max_num_batched_tokens=256, prefix_caching=True
    )
    scheduler = IterationScheduler(policy, req, run, kv, waiting)
    for rid in req.add(np.zeros(2), np.array([64, 48]), np.array([4, 4]), np.zeros(2, int)):
        waiting.push(int(rid), 0)
    plan = scheduler.schedule(0.0)
    for slot, chunk in zip(plan.prefill_slots, plan.prefill_chunks, strict=True):
        run.prefill(slot, chunk)
    return scheduler, run, kv, plan


def test_completed_requests_leave_nothing_to_track_where_no_prefix_can_hit():
    """A completed request outside a session is never asked for again; with nothing
    cached before its blocks they decide no eviction either, so the cache does not
    track them (before, every completion was kept and every allocation then evicted:
    a cost on every run, where nothing could hit)."""
    scheduler, _, kv, plan = two_prefilled_requests(10)
    first, second = plan.prefill_slots
    scheduler.free(first)
    scheduler.free(second)
    assert kv.cached_total == 0 and kv.free == 10
    scheduler, _, kv, plan = two_prefilled_requests(10)
    first, second = plan.prefill_slots
    scheduler.detach(first, reachable=True)()  # handed off: a retry may come back for it
    assert kv.cached_blocks(request_key(0)) == 4
    scheduler.free(second)  # freed after it: kept, to be evicted after it
    assert kv.cached_blocks(unreachable_key(1)) == 3


class _KeepsEverything(BlockManager):
    """The cache as it was: a completed request's blocks tracked like any other's."""

    def keep_unreachable(self, key, blocks):
        self.keep_cached(key, blocks)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["keep", "done", "take", "alloc", "release"]),
            st.integers(0, 5),  # owner
            st.integers(0, 12),  # blocks
        ),
        max_size=60,
    )
)
def test_not_tracking_unreachable_blocks_changes_no_hit(ops):
    """Whatever owners leave, take back, allocate and release, every owner that can be
    asked for finds as many blocks cached, and as many are free, as when the blocks
    nobody asks for are tracked too: an owner's survival depends only on what was freed
    after it."""
    ours, kept = BlockManager(40, 16), _KeepsEverything(40, 16)
    for step, (op, owner, blocks) in enumerate(ops):
        for kv in (ours, kept):
            if op == "keep":
                kv.release(min(blocks, kv.used))
                kv.keep_cached(request_key(owner), min(blocks, kv.free))
            elif op == "done":
                kv.release(min(blocks, kv.used))
                if kv.cached_total or isinstance(kv, _KeepsEverything):
                    kv.keep_unreachable(unreachable_key(step), min(blocks, kv.free))
            elif op == "take":
                kv.take_cached(request_key(owner))
            elif op == "alloc":
                kv.allocate(min(blocks, kv.free))
            else:
                kv.release(min(blocks, kv.used))
        assert ours.free == kept.free
        for owner in range(6):
            assert ours.cached_blocks(request_key(owner)) == kept.cached_blocks(request_key(owner))


@pytest.mark.parametrize(
    "sections",
    [
        {"serving": PRESSURE, "workload": BUSY},
        {
            "serving": {**PRESSURE, "max_num_batched_tokens": 2048},
            "workload": BUSY,
            "model": {"name": "gemma-2-9b"},
        },  # sliding layers: the hybrid KV cache manager
        {
            "serving": PRESSURE,
            "workload": BUSY,
            "hardware": None,
            "pools": [
                {"name": "p", "hardware": {"gpu": "a100-80gb-sxm"}, "role": "prefill"},
                {"name": "d", "hardware": {"gpu": "a100-80gb-sxm"}, "role": "decode"},
            ],
        },
        {
            "workload": {"arrivals": {"kind": "poisson", "rate_per_s": 8.0}, "num_requests": 200},
            "hardware": None,
            "pools": [
                {"name": "p", "hardware": {"gpu": "a100-80gb-sxm"}, "role": "prefill"},
                {
                    "name": "d",
                    "hardware": {"gpu": "a100-80gb-sxm"},
                    "role": "decode",
                    "replicas": 2,
                },
            ],
            "faults": {"events": [{"replica": 1, "at_s": 10.0, "recover_at_s": 12.0}]},
        },
    ],
    ids=["llama", "hybrid-manager", "disaggregated", "disaggregated-retried"],
)
def test_runs_under_pressure_are_those_of_tracking_every_completed_request(
    make_scenario, monkeypatch, sections
):
    """With recompute preemptions, whose blocks are cached among completed (or, with
    no failures to retry, handed-off) requests', the engine gives the results of one
    that keeps every such request's blocks (freeing each as reachable, as the engine
    did before), bit for bit. Where a failed decode replica's requests are retried,
    they come back to the prefill replica and hit the blocks their handoff left."""
    scenario = make_scenario(**sections)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = simulate(scenario)
        detach = IterationScheduler.detach
        monkeypatch.setattr(
            IterationScheduler, "detach", lambda self, slot, reachable: detach(self, slot, True)
        )
        everything = simulate(scenario)
    assert (ours.requests["preemptions"] + ours.requests["retries"]).sum() > 5
    pd.testing.assert_frame_equal(ours.requests, everything.requests, check_exact=True)
    pd.testing.assert_frame_equal(ours.steps, everything.steps, check_exact=True)
