"""vLLM's --scheduling-policy (fcfs | priority) and what each engine the iteration-level
policies model does with priorities and preemption: vLLM v1 (chunked_prefill) never
preempts a running request for a waiting one and has no swap; vLLM v0 (continuous)
under priority scheduling does preempt for a waiting one, and may swap."""

from __future__ import annotations

import numpy as np
import pytest

from hardware_models.errors import InfersimError
from simulator.engine.requests import RequestTable
from simulator.engine.running import RunningSet
from simulator.engine.waiting import WaitingQueue
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict

TWO_CLASSES = [
    {"name": "interactive", "weight": 1, "priority": 0},
    {"name": "batch", "weight": 1, "priority": 5},
]


def _refusal(**sections) -> str:
    with pytest.raises(InfersimError) as info:
        Scenario.from_dict(scenario_dict(**sections))
    return str(info.value)


def test_fcfs_refuses_a_non_zero_priority_as_vllm_does():
    message = _refusal(workload={"priorities": TWO_CLASSES})
    assert "workload.priorities: class 'batch' has priority 5" in message
    assert "Got priority 5 but Priority scheduling is not enabled." in message
    assert "serving.scheduling_policy: priority" in message
    Scenario.from_dict(
        scenario_dict(
            workload={"priorities": TWO_CLASSES}, serving={"scheduling_policy": "priority"}
        )
    )


def test_priority_preemption_is_gone_with_its_replacement_named():
    message = _refusal(serving={"priority_preemption": False})
    assert "priority_preemption was removed" in message
    assert "scheduling_policy: priority" in message


def test_swap_under_chunked_prefill_is_refused_as_vllm_v1_has_none():
    message = _refusal(serving={"preemption": "swap"})
    assert "chunked_prefill models vLLM v1, which preempts by recompute only" in message
    continuous = {"policy": "continuous", "max_num_batched_tokens": 4096, "preemption": "swap"}
    Scenario.from_dict(scenario_dict(serving=continuous))


def _late_interactive(tmp_path, policy: str):
    """A batch request (320 + 100 tokens) runs in 100 blocks with a 20-block watermark;
    an interactive one (1,400 + 10, 88 blocks) arrives and cannot get in beside it."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,320,100\n0.2,1400,10\n")
    serving = {
        "policy": policy,
        "num_gpu_blocks": 100,
        "max_num_batched_tokens": 2048,
        "max_model_len": 2048,
        "watermark": 0.2,
        "scheduling_policy": "priority",
    }
    workload = {
        "arrivals": {"kind": "trace", "path": str(trace)},
        "prompt_tokens": None,
        "output_tokens": None,
        "num_requests": 2,
        "priorities": TWO_CLASSES,
    }
    results = simulate(
        Scenario.from_dict(scenario_dict(seed=4, serving=serving, workload=workload))
    )
    req = results.requests.sort_values("arrival")
    assert req["priority"].tolist() == [5, 0]  # the seed draws these classes
    assert (req["outcome"] == "completed").all()
    return req


def test_a_waiting_request_never_preempts_a_running_one_in_vllm_v1(tmp_path):
    """vLLM v1's waiting loop stops at the first request that gets no blocks."""
    batch, interactive = (
        row for _, row in _late_interactive(tmp_path, "chunked_prefill").iterrows()
    )
    assert batch["preemptions"] == 0
    assert interactive["first_scheduled"] >= batch["finish"] - 1e-9


def test_vllm_v0_priority_scheduling_preempts_for_a_waiting_request(tmp_path):
    """vLLM v0's Scheduler._schedule_priority_preemption."""
    req = _late_interactive(tmp_path, "continuous")
    assert req["preemptions"].tolist() == [1, 0]


def _running(arrivals: list[float], priorities: list[int], admit: list[int]) -> RunningSet:
    requests = RequestTable(4)
    n = len(arrivals)
    requests.add(np.array(arrivals), np.full(n, 8), np.full(n, 8), np.array(priorities))
    running = RunningSet(8, 16, requests)
    for rid in admit:
        running.admit(rid, 8, 8, priorities[rid])
    return running


def test_victim_under_fcfs_is_the_last_admitted_and_under_priority_the_latest_arrival():
    # Request 1 arrived last but was admitted first (request 0 came back from a preemption).
    running = _running([0.0, 5.0, 3.0], [0, 0, 0], admit=[1, 2, 0])
    last_admitted, latest_arrival = running.victim(), running.victim(by_arrival=True)
    assert running.rid[last_admitted] == 0  # FCFS: running.pop()
    assert running.rid[latest_arrival] == 1  # max(running, key=(priority, arrival_time))
    # Less important first whatever its arrival; equal keys: the first admitted (max()).
    running = _running([0.0, 5.0, 0.0, 0.0], [1, 0, 1, 1], admit=[0, 1, 2, 3])
    assert running.rid[running.victim(by_arrival=True)] == 0


def test_preempted_requests_rejoin_the_priority_queue_by_arrival():
    arrival = np.array([0.0, 1.0, 2.0, 3.0])
    waiting = WaitingQueue()
    waiting.push(1, 0)
    waiting.push(3, 0)
    waiting.push_by_arrival(2, 0, arrival)  # between 1 and 3, as vLLM's heap orders it
    waiting.push_front(0, 0)  # FCFS: at the front
    assert waiting.drain() == [0, 1, 2, 3]
    same_time = np.zeros(4)  # offline arrivals: ties go by request id (Request.__lt__)
    waiting.push(1, 0)
    waiting.push(3, 0)
    waiting.push_by_arrival(2, 0, same_time)
    assert waiting.drain() == [1, 2, 3]
