"""Correctness of the simulation core: conservation, bounds, determinism, queueing theory,
and the orderings a practitioner expects between batching policies."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from hardware_models.errors import InfeasibleError, InfersimError
from simulator.engine import replica
from simulator.engine.scheduler import IterationScheduler
from simulator.simulation import simulate

POLICIES = ["static", "dynamic", "continuous", "chunked_prefill"]


def _check_invariants(results) -> None:
    req, steps = results.requests, results.steps
    counts = req["outcome"].value_counts()
    assert counts.sum() == len(req)  # every request has exactly one outcome
    done = req[req["outcome"] == "completed"]
    assert (done["generated"] == done["output"]).all()
    assert (done["ttft"] <= done["e2e"] + 1e-12).all()
    assert (done["first_scheduled"] >= done["arrival"] - 1e-12).all()
    assert (done["first_token"] > done["first_scheduled"]).all()
    total_blocks = results.context.replicas[0].kv_total_blocks
    assert steps["kv_blocks_used"].between(0, total_blocks).all()
    assert (steps["duration"] > 0).all()
    for _, group in steps.groupby("replica"):
        starts = group["start"].to_numpy()
        ends = starts + group["duration"].to_numpy()
        assert np.all(np.diff(starts) >= 0)
        assert np.all(starts[1:] >= ends[:-1] - 1e-9)  # a replica runs one step at a time


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_completes_with_invariants(make_scenario, policy):
    budget = 512 if policy == "chunked_prefill" else 2048  # whole prompts must fit unchunked
    serving = {"policy": policy, "max_num_batched_tokens": budget, "max_model_len": 2048}
    results = simulate(make_scenario(serving=serving))
    _check_invariants(results)
    assert (results.requests["outcome"] == "completed").all()


def _assert_same_run(fast, slow) -> None:
    """Bit for bit: requests, steps, and the inter-token gaps as a multiset (a sample of
    weight n stands for n tokens, however the gaps were grouped into rows)."""
    pd.testing.assert_frame_equal(fast.requests, slow.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, slow.steps, check_exact=True)

    def gaps(results):
        return results.itl.groupby("seconds")["weight"].sum()

    pd.testing.assert_series_equal(gaps(fast), gaps(slow), check_exact=True)


@pytest.mark.parametrize("policy", POLICIES)
def test_multi_step_matches_step_by_step(make_scenario, policy):
    serving = {"policy": policy, "max_num_batched_tokens": 2048, "max_model_len": 2048}
    fast = simulate(make_scenario(serving=serving))
    slow = simulate(make_scenario(serving=serving, engine={"multi_step": False}))
    _assert_same_run(fast, slow)


def test_multi_step_matches_under_kv_pressure(make_scenario):
    pressure = {"policy": "chunked_prefill", "num_gpu_blocks": 300, "max_num_seqs": 64}
    workload = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}}
    fast = simulate(make_scenario(serving=pressure, workload=workload))
    slow = simulate(make_scenario(serving=pressure, workload=workload,
                                  engine={"multi_step": False}))  # fmt: skip
    assert fast.requests["preemptions"].sum() > 0
    _assert_same_run(fast, slow)
    _check_invariants(fast)


@pytest.mark.parametrize("stepwise_up_to", [-1, 10**9])
def test_decode_runs_priced_either_way_match_step_by_step(make_scenario, monkeypatch,
                                                          stepwise_up_to):  # fmt: skip
    """Runs are priced step by step in Python when short and vectorised when long: both
    must give stepping one by one's numbers (low load, so some runs are long)."""
    workload = {"arrivals": {"kind": "poisson", "rate_per_s": 0.5}, "num_requests": 60}
    slow = simulate(make_scenario(workload=workload, engine={"multi_step": False}))
    monkeypatch.setattr(replica, "STEPWISE_RUN_STEPS", stepwise_up_to)
    _assert_same_run(simulate(make_scenario(workload=workload)), slow)


@pytest.mark.parametrize(
    ("model", "blocks", "block_size"),
    [("llama-2-7b", None, 16), ("llama-2-7b", 300, 16), ("gpt-oss-20b", 160, 8)],
)
def test_decode_only_steps_planned_without_the_scheduler(make_scenario, monkeypatch,
                                                          model, blocks, block_size):  # fmt: skip
    """When the scheduler could only plan every running request's decode, the replica
    plans it itself: the same run as asking the scheduler each time (also when the KV
    cache runs short and the scheduler must preempt, and when sliding-window groups give
    blocks back as their windows move: gpt-oss under the hybrid KV cache manager), with
    fewer calls to it."""
    serving = {"policy": "chunked_prefill", "num_gpu_blocks": blocks, "max_num_seqs": 64,
               "block_size": block_size}  # fmt: skip
    workload = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}}
    plans = []
    schedule = IterationScheduler.schedule
    monkeypatch.setattr(IterationScheduler, "schedule",
                        lambda self, now: plans.append(now) or schedule(self, now))  # fmt: skip
    model_section = {"name": model}
    fast = simulate(make_scenario(model=model_section, serving=serving, workload=workload))
    fast_plans = len(plans)
    monkeypatch.setattr(replica.Replica, "_decode_next", lambda self: None)
    slow = simulate(make_scenario(model=model_section, serving=serving, workload=workload))
    _assert_same_run(fast, slow)
    assert fast_plans < len(plans) - fast_plans
    if blocks:
        assert fast.requests["preemptions"].sum() > 0


def test_router_sees_the_same_state_in_runs(make_scenario):
    """A run applied ahead of the clock must show a router what stepping would (KV use)."""
    cluster = {"replicas": 2, "router": "least_kv_load"}
    workload = {"arrivals": {"kind": "poisson", "rate_per_s": 12.0}}
    fast = simulate(make_scenario(parallelism=cluster, workload=workload))
    slow = simulate(make_scenario(parallelism=cluster, workload=workload,
                                  engine={"multi_step": False}))  # fmt: skip
    _assert_same_run(fast, slow)


# Swap preemption is vLLM v0's: the continuous policy, whose budget covers max_model_len.
V0_SWAP = {"policy": "continuous", "max_num_batched_tokens": 4096, "preemption": "swap"}


def test_swapped_in_requests_alone_keep_the_replica_busy(make_scenario):
    """When a step's only work is swapping requests back in, they decode in it: the
    replica used to fall asleep with them running and never wake (a stalled run)."""
    tight = {**V0_SWAP, "num_gpu_blocks": 100, "max_num_seqs": 16}
    results = simulate(make_scenario(serving=tight, workload={"num_requests": 120}))
    assert results.requests["preemptions"].sum() > 0
    assert (results.requests["outcome"] == "completed").all()
    _check_invariants(results)


def test_swaps_are_counted_apart_from_recomputes(make_scenario):
    """Under swap preemption a decoding request is swapped out; one whose prefill is
    unfinished is recomputed. The summary counts the swaps, per request and in all."""
    tight = {**V0_SWAP, "num_gpu_blocks": 100, "max_num_seqs": 16}
    results = simulate(make_scenario(serving=tight, workload={"num_requests": 120}))
    req, kv = results.requests, results.summary()["kv"]
    assert (req["swaps"] <= req["preemptions"]).all()
    assert kv["swaps"] == req["swaps"].sum() and 0 < kv["swaps"] <= kv["preemptions"]
    assert "swapped out)" in results.summary_table()
    recompute = simulate(make_scenario(serving={**tight, "preemption": "recompute"},
                                       workload={"num_requests": 120}))  # fmt: skip
    assert recompute.summary()["kv"]["swaps"] == 0 and recompute.requests["preemptions"].sum()


def test_a_swap_out_without_swap_space_stops_the_run_as_vllm_v0_aborts(make_scenario):
    """vLLM v0's Scheduler._swap_out raises when block_manager.can_swap_out is false: no
    silent recompute instead. The error names the time, the blocks and the swap space."""
    tight = {**V0_SWAP, "num_gpu_blocks": 100, "max_num_seqs": 16}
    for gb in (0.0, 0.4):  # none at all; room for the first swap, not for a later one
        scenario = make_scenario(serving={**tight, "swap_space_gb": gb},
                                 workload={"num_requests": 120})  # fmt: skip
        with pytest.raises(InfersimError) as info:
            simulate(scenario)
        message = str(info.value)
        assert re.search(r"at t=\d+\.\d{3} s, swapping out request \d+ needs \d+ KV blocks, "
                         r"but the host swap space \(serving.swap_space_gb\) has \d+ of \d+ "
                         r"free", message), message  # fmt: skip
        assert "Aborted due to the lack of CPU swap space" in message


def test_same_seed_same_results_other_seed_differs(make_scenario):
    a = simulate(make_scenario())
    b = simulate(make_scenario())
    pd.testing.assert_frame_equal(a.requests, b.requests)
    c = simulate(make_scenario(seed=4))
    assert not np.allclose(a.requests["arrival"], c.requests["arrival"])


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_kv_pressure_preempts_and_still_completes(make_scenario, preemption):
    results = simulate(
        make_scenario(
            serving={
                "num_gpu_blocks": 200,
                "max_num_seqs": 64,
                **(V0_SWAP if preemption == "swap" else {}),
            },
            workload={"arrivals": {"kind": "poisson", "rate_per_s": 30.0}},
        )
    )
    _check_invariants(results)
    assert results.requests["preemptions"].sum() > 0
    assert (results.requests["outcome"] == "completed").all()


def test_request_longer_than_kv_cache_is_rejected_with_reason(make_scenario):
    results = simulate(
        make_scenario(
            serving={"num_gpu_blocks": 40},  # 640 tokens of KV
            workload={"prompt_tokens": {"kind": "uniform", "low": 100, "high": 1000}},
        )
    )
    req = results.requests
    rejected = req[req["outcome"] == "rejected"]
    assert len(rejected) > 0
    assert (rejected["prompt"] + rejected["output"] - 1 > 640).all()
    assert rejected["reason"].str.contains("KV cache").all()
    fits = req[req["prompt"] + req["output"] - 1 <= 640]
    assert (fits["outcome"] == "completed").all()


def test_model_that_does_not_fit_is_explained(make_scenario):
    with pytest.raises(InfeasibleError, match="does not fit"):
        simulate(make_scenario(model={"name": "llama-2-70b"}))


def test_duration_horizon_leaves_requests_in_flight(make_scenario):
    results = simulate(
        make_scenario(
            workload={
                "arrivals": {"kind": "poisson", "rate_per_s": 60.0},
                "num_requests": None,
                "duration_s": 20.0,
            }
        )
    )
    outcomes = results.requests["outcome"].value_counts()
    assert outcomes["in_flight"] > 0 and outcomes["completed"] > 0
    assert results.context.duration_s == pytest.approx(20.0)
    done = results.requests[results.requests["outcome"] == "completed"]
    assert (done["finish"] <= 20.0 + 1e-9).all()


def test_littles_law_on_a_steady_run(make_scenario):
    results = simulate(
        make_scenario(
            workload={"arrivals": {"kind": "poisson", "rate_per_s": 6.0}, "num_requests": 3000}
        )
    )
    req, steps = results.requests, results.steps
    done = req[req["outcome"] == "completed"]
    horizon = done["finish"].max()
    # L from the engine's own queue state, time-weighted over steps ...
    in_system = (steps["waiting"] + steps["batch_size"]) * steps["duration"]
    busy = steps["duration"].sum()
    # ... and lambda x W from request timestamps; idle gaps hold nobody.
    lam_w = done["e2e"].sum() / horizon
    little = in_system.sum() / horizon
    assert busy / horizon > 0.5
    assert little == pytest.approx(lam_w, rel=0.05)


def test_md1_queue_matches_theory(make_scenario):
    """Batch size 1, fixed lengths: a deterministic server under Poisson arrivals."""
    scenario = make_scenario(
        serving={"policy": "static", "max_num_seqs": 1},
        workload={
            "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
            "prompt_tokens": {"kind": "fixed", "tokens": 256},
            "output_tokens": {"kind": "fixed", "tokens": 32},
            "num_requests": 20000,
        },
    )
    results = simulate(scenario)
    req = results.requests
    service = (req["finish"] - req["first_scheduled"]).to_numpy()
    assert np.ptp(service) < 1e-9 * service.max()  # deterministic service time
    d = service[0]
    lam = len(req) / req["arrival"].max()
    rho = lam * d
    assert 0.3 < rho < 0.9
    wq_theory = rho * d / (2 * (1 - rho))
    assert req["queueing"].mean() == pytest.approx(wq_theory, rel=0.05)


def _p99(series: pd.Series) -> float:
    return float(series.quantile(0.99))


def test_continuous_beats_static_on_throughput_under_load(make_scenario):
    load = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}, "num_requests": 600}
    static = simulate(make_scenario(serving={"policy": "static", "max_num_seqs": 32},
                                    workload=load))  # fmt: skip
    continuous = simulate(make_scenario(serving={"policy": "continuous", "max_num_seqs": 32,
                                                 "max_num_batched_tokens": 4096},
                                        workload=load))  # fmt: skip

    def throughput(r):
        done = r.requests[r.requests["outcome"] == "completed"]
        return done["generated"].sum() / done["finish"].max()

    assert throughput(continuous) > 1.3 * throughput(static)


def test_chunked_prefill_lowers_p99_tpot_against_prefill_first(make_scenario):
    load = {
        "arrivals": {"kind": "poisson", "rate_per_s": 6.0},
        "prompt_tokens": {"kind": "uniform", "low": 1024, "high": 3072},
        "output_tokens": {"kind": "uniform", "low": 64, "high": 256},
        "num_requests": 400,
    }
    serving = {"max_num_seqs": 64, "max_num_batched_tokens": 4096}
    chunked = simulate(make_scenario(serving={**serving, "policy": "chunked_prefill",
                                              "max_num_batched_tokens": 512},
                                     workload=load))  # fmt: skip
    first = simulate(make_scenario(serving={**serving, "policy": "continuous"}, workload=load))
    done = lambda r: r.requests[r.requests["outcome"] == "completed"]  # noqa: E731
    assert _p99(done(chunked)["tpot"]) < _p99(done(first)["tpot"])
    assert _p99(done(first)["ttft"]) < _p99(done(chunked)["ttft"]) * 1.5  # the trade-off


def test_priority_class_gets_lower_ttft_under_load(make_scenario):
    workload = {
        "arrivals": {"kind": "poisson", "rate_per_s": 25.0},
        "num_requests": 800,
        "priorities": [
            {"name": "interactive", "weight": 1, "priority": 0},
            {"name": "batch", "weight": 3, "priority": 1},
        ],
    }
    serving = {"max_num_seqs": 16, "scheduling_policy": "priority"}
    results = simulate(make_scenario(workload=workload, serving=serving))
    done = results.requests[results.requests["outcome"] == "completed"]
    ttft = done.groupby("priority_class")["ttft"].mean()
    assert ttft["interactive"] < 0.5 * ttft["batch"]


def test_closed_loop_keeps_at_most_users_in_flight(make_scenario):
    results = simulate(
        make_scenario(
            workload={
                "arrivals": {"kind": "closed_loop", "users": 8, "think_time_s": 0.5},
                "num_requests": 200,
            }
        )
    )
    req = results.requests
    assert len(req) == 200 and (req["outcome"] == "completed").all()
    assert (results.steps["batch_size"] + results.steps["waiting"]).max() <= 8


def test_prefix_caching_spares_recomputing_what_was_not_evicted(make_scenario):
    pressure = {"num_gpu_blocks": 300, "max_num_seqs": 64, "preemption": "recompute"}
    workload = {"arrivals": {"kind": "poisson", "rate_per_s": 20.0}}
    plain = simulate(make_scenario(serving={**pressure, "enable_prefix_caching": False},
                                   workload=workload))  # fmt: skip
    cached = simulate(make_scenario(serving={**pressure, "enable_prefix_caching": True},
                                    workload=workload))  # fmt: skip
    slow = simulate(make_scenario(serving={**pressure, "enable_prefix_caching": True},
                                  workload=workload, engine={"multi_step": False}))  # fmt: skip
    assert plain.requests["preemptions"].sum() > 0 and cached.requests["preemptions"].sum() > 0
    assert cached.steps["prefill_tokens"].sum() < plain.steps["prefill_tokens"].sum()
    _check_invariants(cached)
    assert (cached.requests["outcome"] == "completed").all()
    cols = ["first_token", "finish", "preemptions"]
    pd.testing.assert_frame_equal(cached.requests[cols], slow.requests[cols])


@pytest.mark.parametrize("reserve", [True, False])
def test_admission_reserves_the_whole_sequence(make_scenario, tmp_path, reserve):
    # 100 blocks of 16 tokens. A (800-token prompt, 600 out) grows to 88 blocks; B (800
    # tokens, 50 blocks) arrives while A holds ~51. vLLM 0.19 keeps B waiting until its
    # whole prompt fits, so nobody is preempted; admitting on its first chunk's blocks
    # starts B, and A's growth then has to preempt.
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,800,600\n0.5,800,10\n")
    results = simulate(
        make_scenario(
            serving={
                "num_gpu_blocks": 100,
                "max_num_batched_tokens": 256,
                "reserve_full_sequence": reserve,
            },
            workload={
                "arrivals": {"kind": "trace", "path": str(trace)},
                "prompt_tokens": None,  # the trace's lengths
                "output_tokens": None,
                "num_requests": 2,
            },
        )
    )
    _check_invariants(results)
    req = results.requests.sort_values("arrival")
    assert (req["outcome"] == "completed").all()
    a, b = req.iloc[0], req.iloc[1]
    if reserve:
        assert req["preemptions"].sum() == 0
        assert b["first_scheduled"] >= a["finish"] - 1e-9
    else:
        assert b["first_scheduled"] < a["finish"]
        assert req["preemptions"].sum() > 0


def test_a_request_submitted_while_the_replica_catches_up_wakes_it(make_scenario):
    # Summed step times can put the replica's own clock one ulp past SimPy's; a
    # closed-loop user answering that step submits while the replica catches up, and the
    # replica then slept through it ("No scheduled events left"). Found at seed 54.
    sections = {
        "seed": 54,
        "serving": {
            "max_num_seqs": 1,
            "max_num_batched_tokens": 1,
            "num_gpu_blocks": 7,
        },
        "workload": {
            "arrivals": {"kind": "closed_loop", "users": 1, "think_time_s": 0.0},
            "prompt_tokens": {"kind": "uniform", "low": 1, "high": 1},
            "output_tokens": {"kind": "uniform", "low": 1, "high": 112},
            "num_requests": 3,
        },
    }
    runs = simulate(make_scenario(**sections))
    slow = simulate(make_scenario(**sections, engine={"multi_step": False}))
    assert (runs.requests["outcome"] == "completed").all()
    pd.testing.assert_frame_equal(runs.requests, slow.requests)


def test_priority_preemption_only_when_it_makes_room(make_scenario, tmp_path):
    # vLLM v0's priority preemption (continuous, scheduling_policy priority).
    # 100 blocks with a 20-block watermark. A batch-class request (320 + 100 tokens) runs;
    # an interactive one of 1,400 + 10 tokens (88 blocks) arrives: beside anything it
    # cannot be admitted (88 > 100 - 20), alone it can. Preempting the batch request must
    # let it in alone, not leave both waiting on an idle replica.
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,320,100\n0.2,1400,10\n")
    workload = {
        "arrivals": {"kind": "trace", "path": str(trace)},
        "prompt_tokens": None,
        "output_tokens": None,
        "num_requests": 2,
        "priorities": [
            {"name": "interactive", "weight": 1, "priority": 0},
            {"name": "batch", "weight": 1, "priority": 5},
        ],
    }
    serving = {
        "num_gpu_blocks": 100,
        "max_num_batched_tokens": 2048,
        "watermark": 0.2,
        "policy": "continuous",
        "max_model_len": 2048,
        "scheduling_policy": "priority",
    }
    results = simulate(make_scenario(seed=4, serving=serving, workload=workload))
    req = results.requests.sort_values("arrival")
    assert req["priority"].tolist() == [5, 0]  # the seed draws these classes
    assert (req["outcome"] == "completed").all()
    assert req["preemptions"].tolist() == [1, 0]


def test_a_request_swapped_in_is_not_swapped_out_by_the_same_step(make_scenario, monkeypatch):
    # Swapping a request back in also keeps free the block its next token opens (and,
    # prefill-first, those of the running decodes): without it the step could preempt it
    # straight back out, paying the PCIe copy twice for nothing.
    from simulator.engine.scheduler import IterationScheduler

    original = IterationScheduler.schedule
    bounced = []

    def schedule(self, now):
        waiting = {rid for queue in self.waiting._queues.values() for rid in queue}
        before = self.requests.preemptions.copy()
        plan = original(self, now)
        preempted = np.flatnonzero(self.requests.preemptions[: len(before)] != before)
        bounced.extend(set(preempted.tolist()) & waiting)
        return plan

    monkeypatch.setattr(IterationScheduler, "schedule", schedule)
    results = simulate(
        make_scenario(
            serving={
                **V0_SWAP,
                "num_gpu_blocks": 2000,
                "max_num_seqs": 256,
                "watermark": 0.0,
                "swap_space_gb": 16,
            },
            workload={
                "arrivals": {"kind": "poisson", "rate_per_s": 30.0},
                "num_requests": 600,
                "prompt_tokens": {"kind": "uniform", "low": 200, "high": 2000},
                "output_tokens": {"kind": "uniform", "low": 100, "high": 1500},
            },
        )
    )
    assert results.requests["preemptions"].sum() > 100  # swaps do happen
    assert bounced == []


def test_a_finished_requests_blocks_queue_behind_those_freed_before():
    # vLLM v1 frees every block to the tail of one queue and reuses from its head: a
    # request preempted first loses its cached blocks before one that finished later.
    from simulator.engine.kv_cache import request_key, unreachable_key
    from tests.test_prefix_caching_default import two_prefilled_requests

    scheduler, _, kv, plan = two_prefilled_requests(blocks=10)
    first, second = plan.prefill_slots
    scheduler._preempt(first, plan)  # 4 full blocks cached, freed first
    scheduler.free(second)  # finished: its 3 full blocks cached, freed last
    kv.allocate(8)  # 2 free left: the 5 evicted come from the least recently freed
    assert kv.cached_blocks(request_key(0)) == 0
    assert kv.cached_blocks(unreachable_key(1)) == 2


def test_step_prices_do_not_depend_on_the_order_token_counts_come_in():
    """A step's GEMMs are priced one token count at a time until a block of counts has
    been asked for often enough, then the whole block in one array pass (step_cost's
    _gemms): every step must cost the same whichever way its count was priced."""
    from hardware_models.gemm import gemm_cost
    from hardware_models.presets import load_gpu, load_node
    from simulator.engine import step_cost
    from simulator.engine.step_cost import StepCostModel
    from simulator.model_catalog import load_model

    def prices(counts):
        gemm_cost.cache_clear()  # both ways of pricing start cold (they cache across runs)
        step_cost._gemm_block.cache_clear()
        arch, node = load_model("llama-3.1-8b"), load_node("dgx-h100")
        cost = StepCostModel(arch, load_gpu("h100-sxm"), node)
        steps = {
            t: cost.step(decode_seqs=1, decode_context=900, prefill_seqs=1, prefill_tokens=t,
                         prefill_pairs=t * (t + 1) // 2, prefill_context=t)
            for t in counts
        }  # fmt: skip
        return steps

    counts = list(range(1, 700))  # two blocks (step_cost._GEMM_BLOCK)
    ascending = prices(counts)
    assert prices(counts[::-1]) == ascending
    assert prices(counts[::7]) == {t: ascending[t] for t in counts[::7]}  # both ways
    assert prices(counts[::50]) == {t: ascending[t] for t in counts[::50]}  # one at a time


def test_catching_up_lands_on_the_step_end_across_binades():
    """From a clock in a lower binade, no single timeout may land on a run's end (every
    `now + delay` rounds past it, ties to even): the replica waits again, one ulp, so a
    completion's time and the run's end agree as they do stepping one by one (found by
    tests/test_hybrid_kv_cache.py's property: a gpt-oss session's 7-step run)."""
    import simpy

    now, end = 0.00418606478233814, 0.02905738089977938
    env = simpy.Environment(initial_time=now)
    delay = end - now
    assert now + delay != end  # one timeout does not get there
    waiter = replica.Replica.__new__(replica.Replica)
    waiter.env = env
    env.process(waiter.wait_until(end))
    env.run()
    assert env.now == end


def test_run_block_needs_repeat_the_block_edges_of_each_sequence():
    """A run's new blocks at step j: every decoding sequence whose next token starts a
    block, counted directly, in lockstep and out of it, over runs longer than one block
    pattern and after the cached step index has grown."""
    from simulator.engine.requests import RequestTable
    from simulator.engine.running import RunningSet

    req = RequestTable(8)
    rids = req.add(np.zeros(5), np.array([5, 16, 17, 30, 47]), np.full(5, 500), np.zeros(5, int))
    run = RunningSet(8, 16, req)
    for rid in rids:
        slot = run.admit(int(rid), int(req.prompt[rid]), 500, 0)
        run.prefill(slot, int(req.prompt[rid]))
        run.start_decoding(slot)

    def counted(steps: int) -> list[int]:
        computed = run.decode_computed_of(run.decoding())
        # Step j writes token c + j of a sequence of c cached: a new block where c + j
        # is a multiple of the block size (step 0's block the scheduler gave).
        return [0] + [int(((computed + j) % 16 == 0).sum()) for j in range(1, steps)]

    for steps in (1, 7, 16, 40, 300, 5000, 33):
        assert run.run_block_needs(steps).tolist() == counted(steps)
    run.enter_lockstep(1.0)
    for advanced in (3, 16, 29):
        run.advance_lockstep(advanced, 2.0)
        for steps in (5, 64, 4096):
            assert run.run_block_needs(steps).tolist() == counted(steps)
