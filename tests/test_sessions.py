"""Multi-turn chat sessions: conversations that grow turn by turn, prefix-cache reuse of
a session's earlier turns, and the session_affinity router that keeps a session where
its conversation is cached."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from hardware_models.errors import InfersimError
from simulator.engine.kv_cache import BlockManager, request_key, session_key
from simulator.scenario import Scenario
from simulator.simulation import simulate
from simulator.workload import SessionSampler, WorkloadConfig
from tests.conftest import scenario_dict
from tests.test_engine import _assert_same_run
from tests.test_reliability_properties import check_invariants

PROMPT, OUTPUT, THINK = 100, 20, 0.5
SESSIONS: dict[str, Any] = {
    "arrivals": {"kind": "poisson", "rate_per_s": 2.0},
    "sessions": {"turns": 4, "think_time_s": THINK, "think_distribution": "constant"},
    "prompt_tokens": {"kind": "fixed", "tokens": PROMPT},
    "output_tokens": {"kind": "fixed", "tokens": OUTPUT},
    "num_requests": 120,
}


def _scenario(workload: dict[str, Any] | None = None, **sections: Any) -> Scenario:
    serving = {"enable_prefix_caching": True, **sections.pop("serving", {})}
    parallelism = {"replicas": 3, "router": "session_affinity", **sections.pop("parallelism", {})}
    return Scenario.from_dict(
        scenario_dict(
            workload={**SESSIONS, **(workload or {})},
            serving=serving,
            parallelism=parallelism,
            **sections,
        )
    )


def _run(workload: dict[str, Any] | None = None, **sections: Any):
    scenario = _scenario(workload, **sections)
    results = simulate(scenario)
    check_invariants(results, scenario)
    return results


def _turns(results) -> pd.DataFrame:
    return results.requests.sort_values(["session", "turn"])


@pytest.fixture(scope="module")
def affinity():
    return _run()


def test_turn_prompt_is_the_conversation_so_far_plus_new_tokens(affinity):
    req = _turns(affinity)
    assert (req["session"] >= 0).all() and (req["turn"] >= 1).all()
    # Turn k: k new user messages of PROMPT tokens and k - 1 answers of OUTPUT tokens.
    assert (req["prompt"] == PROMPT * req["turn"] + OUTPUT * (req["turn"] - 1)).all()
    for _, turns in req.groupby("session"):
        assert turns["turn"].tolist() == list(range(1, len(turns) + 1))


def test_next_turn_arrives_a_think_time_after_the_previous_completes(affinity):
    req = _turns(affinity)
    same = req["session"].to_numpy()[1:] == req["session"].to_numpy()[:-1]
    finish = req["finish"].to_numpy()[:-1][same]
    arrival = req["arrival"].to_numpy()[1:][same]
    assert same.sum() > 50
    np.testing.assert_allclose(arrival, finish + THINK, rtol=0, atol=1e-9)
    # Request ids follow arrival order, so num_requests means the first turns to arrive.
    assert (affinity.requests["arrival"].diff().dropna() >= 0).all()
    assert len(affinity.requests) == SESSIONS["num_requests"]


def test_affinity_keeps_a_session_on_one_replica_and_hits_its_cache(affinity):
    req = affinity.requests
    assert (req.groupby("session")["replica"].nunique() == 1).all()
    later = req[req["turn"] > 1]
    # The previous turn computed prompt + output - 1 tokens: its full blocks are reused.
    block = 16
    expected = (later["prompt"] - PROMPT - 1) // block * block
    assert (later["cached_prompt_tokens"] == expected).all()
    assert (req.loc[req["turn"] == 1, "cached_prompt_tokens"] == 0).all()
    cache = affinity.summary()["prefix_cache"]
    assert cache["cached_prompt_tokens"] == int(req["cached_prompt_tokens"].sum())
    assert cache["hit_rate"] == pytest.approx(
        req["cached_prompt_tokens"].sum() / req["prompt"].sum()
    )


def test_hits_skip_prefill_and_cut_ttft(affinity):
    cold = _run(serving={"enable_prefix_caching": False})
    spread = _run(parallelism={"router": "round_robin"})
    prefilled = affinity.steps["prefill_tokens"].sum()
    assert cold.requests["cached_prompt_tokens"].sum() == 0
    # No preemption here: what was found cached is exactly what was not prefilled.
    assert affinity.requests["preemptions"].sum() == 0
    assert prefilled == cold.steps["prefill_tokens"].sum() - (
        affinity.requests["cached_prompt_tokens"].sum()
    )
    later = affinity.requests["turn"] > 1
    assert affinity.requests.loc[later, "ttft"].mean() < cold.requests.loc[later, "ttft"].mean()
    hit = {r: r.summary()["prefix_cache"]["hit_rate"] for r in (affinity, spread)}
    assert hit[affinity] > hit[spread] > 0


def test_a_session_ends_before_a_turn_beyond_the_context():
    # 100 + 20, then 220 + 20, 340 + 20: a 300-token context admits two turns.
    req = _turns(_run({"max_total_tokens": 300}))
    assert req["turn"].max() == 2
    assert (req["prompt"] + req["output"] <= 300).all()
    assert (req["outcome"] == "completed").all()


def test_a_rejected_turn_ends_its_session():
    # 20 blocks of 16 tokens: turn 3 (340 + 20 tokens) can never fit, so it is rejected
    # and the session's turn 4 is never sent.
    req = _turns(_run(serving={"num_gpu_blocks": 20, "watermark": 0.0}))
    assert set(req.loc[req["outcome"] == "rejected", "turn"]) == {3}
    assert req["turn"].max() == 3


def test_no_turn_is_lost_when_a_replica_fails():
    faults = {"events": [{"replica": 0, "at_s": 5.0, "recover_at_s": 20.0}], "max_retries": 2}
    results = _run(faults=faults, workload={"num_requests": 200})
    req = results.requests
    assert len(req) == 200
    assert (req["outcome"] == "completed").all()
    # Sessions living on replica 0 moved away while it was down.
    moved = req.groupby("session")["replica"].nunique()
    assert (moved > 1).any()
    assert (req.loc[req["arrival"].between(5.0, 20.0), "replica"] != 0).all()


def test_failed_turns_end_their_sessions_and_every_request_has_an_outcome(affinity):
    # Fail replica 1 half-way through a turn it serves, so that something is in flight.
    served = affinity.requests[affinity.requests["replica"] == 1].iloc[3]
    at_s = float((served["first_scheduled"] + served["finish"]) / 2)
    faults = {"events": [{"replica": 1, "at_s": at_s}], "on_failure": "fail"}
    req = _turns(_run(faults=faults))
    failed = req[req["outcome"] == "failed"]
    assert len(failed)
    for _, row in failed.iterrows():
        later = req[(req["session"] == row["session"]) & (req["turn"] > row["turn"])]
        assert later.empty


def test_duration_stop_and_determinism():
    a = _run({"duration_s": 10.0, "num_requests": None})
    b = _run({"duration_s": 10.0, "num_requests": None})
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert (a.requests["arrival"] < 10.0).all()
    assert a.context.duration_s <= 10.0
    c = _run({"duration_s": 10.0, "num_requests": None}, seed=9)
    assert not a.requests["arrival"].equals(c.requests["arrival"])


@pytest.mark.parametrize("replicas", [1, 3])
def test_sessions_multi_step_matches_step_by_step(replicas):
    workload = {"sessions": {"turns": {"kind": "uniform", "low": 1, "high": 5},
                             "think_time_s": 1.0},
                "prompt_tokens": {"kind": "uniform", "low": 16, "high": 400}}  # fmt: skip
    tight = {"num_gpu_blocks": 300}  # preemptions, so both kinds of cached blocks mix
    fast = _run(workload, serving=tight, parallelism={"replicas": replicas})
    slow = _run(workload, serving=tight, parallelism={"replicas": replicas},
                engine={"multi_step": False})  # fmt: skip
    _assert_same_run(fast, slow)


def test_same_conversations_whatever_the_router():
    """What users say is drawn per session, so routers compare on the same traffic."""
    a = _turns(_run(parallelism={"router": "round_robin"}))
    b = _turns(_run())
    key = ["session", "turn", "prompt", "output"]
    common = a[key].merge(b[key], on=["session", "turn"])
    assert len(common) > 100
    assert (common["prompt_x"] == common["prompt_y"]).all()


def test_sampler_draws_whole_sessions_and_cuts_at_the_context():
    config = WorkloadConfig.model_validate(
        {**SESSIONS, "sessions": {"turns": {"kind": "uniform", "low": 1, "high": 9}}}
    )
    sampler = SessionSampler(config, seed=5, context_limit=500)
    sessions = [sampler.session(i) for i in range(20)]
    assert all(s.turns == min(s.drawn_turns, 4) for s in sessions)  # 4 x 120 <= 500 < 5 x 120
    again = SessionSampler(config, seed=5, context_limit=500)
    np.testing.assert_array_equal(sampler.starts, again.starts)
    for index, session in enumerate(sessions):
        twin = again.session(index)
        np.testing.assert_array_equal(session.prompt, twin.prompt)
        np.testing.assert_array_equal(session.think_s, twin.think_s)


def test_block_manager_keeps_a_session_prefix_until_evicted():
    kv = BlockManager(10, 16, watermark=0.0)
    kv.allocate(6)
    kv.release(6)
    kv.keep_cached(session_key(7), 6)
    kv.keep_cached(request_key(7), 2)  # another owner with the same number
    assert kv.cached_blocks(session_key(7)) == 6 and kv.cached_total == 8
    kv.allocate(4)  # 6 free: the least recently freed (the session) loses its tail
    assert kv.cached_blocks(session_key(7)) == 4 and kv.cached_blocks(request_key(7)) == 2
    kv.keep_cached(session_key(7), 3)  # a newer turn replaces the entry
    assert kv.cached_blocks(session_key(7)) == 3 and kv.cached_total == 5


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"arrivals": {"kind": "closed_loop", "users": 2}}, "workload: sessions: "),
        ({"sessions": {"turns": 0}}, "workload.sessions.turns"),
        ({"sessions": {"turns": {"kind": "trace", "path": "x.csv"}}}, "workload.sessions.turns"),
        ({"sessions": {"turns": 2, "think_time_s": -1}}, "workload.sessions.think_time_s"),
        ({"sessions": {"turns": 2, "thinktime": 1}}, "workload.sessions.thinktime"),
    ],
)
def test_bad_session_input_is_one_line_naming_the_field(change, field):
    with pytest.raises(InfersimError) as info:
        _scenario(change)
    message = str(info.value)
    assert field in message and "\n" not in message


def test_session_affinity_without_sessions_balances_requests(make_scenario):
    results = simulate(make_scenario(parallelism={"replicas": 3, "router": "session_affinity"}))
    counts = results.requests["replica"].value_counts()
    assert len(counts) == 3 and counts.min() > 50
