"""Reliability, part 1: scenarios generated across the schema's ranges either run to the
end with every invariant holding, or are refused up front with a one-line InfersimError.

Generated: models from llama-2-7b to llama-3.1-405b and the MoE models mixtral,
qwen3-30b-a3b, gpt-oss-20b and deepseek-v3 (MLA), gemma-2-9b (sliding-window layers, like
gpt-oss: with vLLM V1's hybrid KV cache manager or without), with and without expert parallelism and
routing skew, GPUs from L4 to B200, tp 1..8, rates from 0.01/s to 1000/s, prompts from 1
token to beyond the context window, one-token outputs, fixed/uniform/normal/lognormal
lengths, the four policies, recompute and swap, prefix caching, tiny KV caches, 1..16
replicas, count- or duration-limited workloads, open and closed loop, multi-turn sessions.
Work is bounded (<= 150 requests, short horizons) so every case takes milliseconds and the
default run stays within seconds; `-m slow` runs many more cases.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hardware_models.errors import InfeasibleError, InfersimError
from simulator.router import ROUTERS as ROUTER_NAMES
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict

MODELS = [
    "llama-2-7b",
    "llama-3.1-8b",
    "mistral-7b",
    "llama-2-13b",
    "mixtral-8x7b",
    "llama-2-70b",
    "llama-3.1-70b",
    "qwen2.5-72b",
    "llama-3.1-405b",
    "qwen3-30b-a3b",  # MoE: 128 experts, top 8
    "gpt-oss-20b",  # MoE with alternating sliding/full attention
    "gemma-2-9b",  # dense, alternating 4096-token sliding and full attention
    "deepseek-v3",  # MoE with MLA (refused where it does not fit)
]
MOE_MODELS = {"mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3"}
GPUS = [
    "l4",
    "rtx-4090",
    "l40s",
    "a100-40gb-sxm",
    "a100-80gb-sxm",
    "h100-pcie",
    "h100-sxm",
    "h200-sxm",
    "mi300x",
    "b200",
]
POLICIES = ["static", "dynamic", "continuous", "chunked_prefill"]
ROUTERS = list(ROUTER_NAMES)
MAX_TURNS = 4  # a session's prompts grow to MAX_TURNS x (prompt + output) at most
DTYPES = ["bf16", "fp16", "fp8", "int8", "int4", "fp4", "fp32"]
KV_DTYPES = ["bf16", "fp16", "fp8"]  # what vLLM has (tests/test_vllm_refusals.py: the rest)
MAX_REQUESTS = 150
# Largest prompt tokens one case may ask the engine to prefill, over all its requests and
# chunks of the token budget: keeps the worst case (tiny budget, huge prompts) to a few
# thousand steps.
MAX_PREFILL_STEPS = 6000


# ---- invariants --------------------------------------------------------------------------------
def check_invariants(results: Any, scenario: Scenario) -> dict[str, Any]:
    """Every invariant a finished run must satisfy; returns the summary it checked."""
    req, steps, ctx = results.requests, results.steps, results.context
    wl = scenario.workload
    n = len(req)
    outcome = req["outcome"].astype(str)
    # Each request has exactly one outcome, and the counts add up.
    assert outcome.isin(["completed", "rejected", "failed", "in_flight"]).all()
    summary = results.summary()
    counts = summary["counts"]
    assert counts["arrived"] == n
    assert counts["completed"] + counts["rejected"] + counts["failed"] + counts["in_flight"] == n
    assert counts["in_flight_queued"] + counts["in_flight_running"] == counts["in_flight"]
    assert sum(counts["rejected_by_reason"].values()) == counts["rejected"]
    assert counts["completed"] == int((outcome == "completed").sum())
    # Nobody arrives after the stop condition; count-limited runs see every request.
    if wl.num_requests is not None:
        assert n <= wl.num_requests
        if wl.duration_s is None:
            assert n == wl.num_requests
    if wl.duration_s is not None:
        assert (req["arrival"] < wl.duration_s + 1e-9).all()
        assert ctx.duration_s <= wl.duration_s + 1e-9
    assert (req["arrival"].diff().dropna() >= -1e-12).all() or wl.arrivals.kind == "closed_loop"
    assert (req["prompt"] >= 1).all() and (req["output"] >= 1).all()
    # Rejections and failures carry a reason, nothing else does.
    explained = outcome.isin(["rejected", "failed"])
    assert (req.loc[explained, "reason"].str.len() > 0).all()
    assert (req.loc[~explained, "reason"] == "").all()
    # Completed requests: all their tokens, in causal order.
    done = req[outcome == "completed"]
    assert (done["generated"] == done["output"]).all()
    assert (done["first_scheduled"] >= done["arrival"] - 1e-12).all()
    assert (done["first_token"] >= done["first_scheduled"]).all()
    assert (done["ttft"] <= done["e2e"] + 1e-12).all()
    assert (done["finish"] >= done["first_token"]).all()
    assert (done["finish"] <= ctx.duration_s + 1e-9).all()
    # Requests still in flight have not produced all their tokens, and none before their
    # first.
    live = req[outcome == "in_flight"]
    assert (live["generated"] < live["output"]).all()
    assert (live.loc[live["first_token"].isna(), "generated"] == 0).all()
    assert (req["generated"] <= req["output"]).all() and (req["generated"] >= 0).all()
    started = req["first_scheduled"].notna()
    assert (req.loc[started, "first_scheduled"] >= req.loc[started, "arrival"] - 1e-12).all()
    # Prefix-cache hits are whole prompts' prefixes, never the last token.
    cached = req["cached_prompt_tokens"]
    assert (cached >= 0).all() and (cached < req["prompt"]).all()
    assert (cached[~started] == 0).all()
    _check_sessions(req)
    # Every token after a request's first saw exactly one inter-token gap (a padded batch
    # cut by the horizon keeps only the gaps of the steps that ran). With failures, the
    # gaps a retried request saw before its replica died stay while its count restarts.
    if not scenario.faults:
        after_first = int((req["generated"] - 1).clip(lower=0).sum())
        assert int(results.itl["weight"].sum()) == after_first
    # KV blocks within [0, total] in every step of every replica; one step at a time.
    if len(steps):
        totals = np.array([r.kv_total_blocks for r in ctx.replicas])
        replica = steps["replica"].to_numpy().astype(int)
        used = steps["kv_blocks_used"].to_numpy()
        assert (used >= 0).all() and (used <= totals[replica]).all()
        assert (steps["duration"] > 0).all() and np.isfinite(steps["duration"]).all()
        # no step runs past the end of the run (one cut by the horizon is clipped to it)
        ends = steps["start"] + steps["duration"]
        assert (ends <= ctx.duration_s * (1 + 1e-12) + 1e-12).all()
        for _, group in steps.groupby("replica"):
            starts = group["start"].to_numpy()
            ends = starts + group["duration"].to_numpy()
            assert np.all(np.diff(starts) >= 0)
            assert np.all(starts[1:] >= ends[:-1] - 1e-9 * np.maximum(1, ends[:-1]))
    # The summary is strict JSON (no NaN) and its overload flag is explained.
    busy = summary["utilisation"]["gpu_busy_fraction"]
    assert busy is None or 0 <= busy <= 1 + 1e-9
    json.dumps(summary, allow_nan=False)
    assert isinstance(summary["overloaded"], bool)
    assert bool(summary["overload_reason"]) == summary["overloaded"]
    return summary


def _check_sessions(req: Any) -> None:
    """Turns of a session are numbered 1, 2, ...; each follows a completed turn and
    arrives after it finished, with the conversation so far in its prompt."""
    turns = req[req["session"] >= 0].sort_values(["session", "turn"])
    assert (req.loc[req["session"] < 0, "turn"] == 0).all()
    if turns.empty:
        return
    session = turns["session"].to_numpy()
    turn = turns["turn"].to_numpy()
    same = session[1:] == session[:-1]
    assert (turn[1:][same] == turn[:-1][same] + 1).all()
    assert (turn[1:][~same] == 1).all() and turn[0] == 1
    before, after = turns.iloc[:-1][same], turns.iloc[1:][same]
    assert (before["outcome"].astype(str).to_numpy() == "completed").all()
    assert (after["arrival"].to_numpy() >= before["finish"].to_numpy()).all()
    grown = before["prompt"].to_numpy() + before["output"].to_numpy()
    assert (after["prompt"].to_numpy() > grown).all()


def one_line(message: str) -> bool:
    return "\n" not in message.strip() and "\r" not in message


CASE_TIME_LIMIT_S = 60  # a case takes milliseconds: one that runs a minute does not end


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the body runs longer than `seconds`."""

    def expired(signum, frame):
        raise AssertionError(f"the simulation did not terminate within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_or_refuse(data: dict[str, Any]) -> str:
    """Validate and simulate; returns 'ran' or 'refused', asserting the contract of each."""
    try:
        with time_limit(CASE_TIME_LIMIT_S):
            scenario = Scenario.from_dict(data)
            results = simulate(scenario, progress=False)
    except InfersimError as exc:
        message = str(exc)
        assert message.strip(), "an InfersimError must say what is wrong"
        assert one_line(message), f"multi-line error: {message!r}"
        return "refused"
    check_invariants(results, scenario)
    return "ran"


# ---- scenario strategy -------------------------------------------------------------------------
def _log_uniform(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(math.log10(low), math.log10(high)).map(lambda x: round(10**x, 6))


@st.composite
def lengths(draw: st.DrawFn, high: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(["fixed", "uniform", "normal", "lognormal"]))
    if kind == "fixed":
        return {"kind": kind, "tokens": draw(st.integers(1, high))}
    if kind == "uniform":
        low = draw(st.integers(1, high))
        return {"kind": kind, "low": low, "high": draw(st.integers(low, high))}
    spec: dict[str, Any] = {
        "kind": kind,
        "mean": float(draw(st.integers(1, high))),
        "std": float(draw(st.integers(0, high))),
    }
    # The clip bounds keep the draws within the case's budget of work.
    spec["max"] = draw(st.integers(1, high))
    return spec


@st.composite
def scenarios(draw: st.DrawFn, max_requests: int = MAX_REQUESTS) -> dict[str, Any]:
    model = draw(st.sampled_from(MODELS))
    gpu = draw(st.sampled_from(GPUS))
    policy = draw(st.sampled_from(POLICIES))
    num_requests = draw(st.integers(1, max_requests))
    prompt_high = draw(st.sampled_from([1, 8, 512, 4096, 40_000, 200_000]))  # beyond context
    output_high = draw(st.sampled_from([1, 2, 16, 256, 1024]))
    budget = draw(st.sampled_from([1, 16, 256, 2048, 8192, 65536]))
    sessions = draw(st.integers(0, 3)) == 0  # multi-turn, when the arrivals are a rate
    longest = MAX_TURNS * (prompt_high + output_high) if sessions else prompt_high
    # Bound the prefill work of one case: raise the budget rather than drop the case.
    while num_requests * longest / budget > MAX_PREFILL_STEPS:
        budget *= 4
    serving: dict[str, Any] = {
        "policy": policy,
        "max_num_seqs": draw(st.sampled_from([1, 2, 7, 64, 256])),
        "max_num_batched_tokens": budget,
        "block_size": draw(st.sampled_from([1, 8, 16, 32, 256])),
        "preemption": draw(st.sampled_from(["recompute", "swap"])),
        "watermark": draw(st.sampled_from([None, 0.0, 0.01, 0.2])),
        "max_queue_delay_ms": draw(st.sampled_from([0.0, 10.0, 500.0])),
        "scheduling_policy": draw(st.sampled_from(["fcfs", "priority"])),
        "enable_prefix_caching": draw(st.booleans()),
        "reserve_full_sequence": draw(st.booleans()),
        # vLLM V1's hybrid KV cache manager (models with sliding-window layers)
        "disable_hybrid_kv_cache_manager": draw(st.booleans()),
    }
    # unset: what `vllm serve` chooses for the GPU (never a smaller budget than 2048)
    if draw(st.integers(0, 4)) == 0:
        del serving["max_num_seqs"]
    if budget <= 2048 and draw(st.integers(0, 4)) == 0:
        del serving["max_num_batched_tokens"]
    if draw(st.booleans()):
        serving["num_gpu_blocks"] = draw(st.sampled_from([1, 2, 5, 40, 300, 2000]))
    # Often: at a model's whole context a small KV cache cannot hold one sequence (refused)
    if draw(st.integers(0, 1)) == 0:
        serving["max_model_len"] = draw(st.sampled_from([2, 64, 4096, 32768]))
    if draw(st.integers(0, 4)) == 0:
        serving["max_waiting"] = draw(st.sampled_from([0, 1, 10]))
    if draw(st.integers(0, 3)) == 0:
        serving["swap_space_gb"] = draw(st.sampled_from([0.0, 0.001, 4.0]))
    if draw(st.integers(0, 4)) == 0:
        serving["gpu_memory_utilization"] = draw(st.sampled_from([0.05, 0.5, 1.0]))

    kind = draw(st.sampled_from(["poisson", "gamma", "constant", "closed_loop"]))
    if kind == "closed_loop":
        arrivals: dict[str, Any] = {
            "kind": kind,
            "users": draw(st.integers(1, 64)),
            "think_time_s": draw(st.sampled_from([0.0, 0.01, 1.0, 30.0])),
            "think_distribution": draw(st.sampled_from(["exponential", "constant"])),
        }
    else:
        arrivals = {"kind": kind, "rate_per_s": draw(_log_uniform(0.01, 1000.0))}
        if kind == "gamma":
            arrivals["cv"] = draw(st.sampled_from([0.1, 1.0, 4.0]))
    workload: dict[str, Any] = {
        "arrivals": arrivals,
        "prompt_tokens": draw(lengths(prompt_high)),
        "output_tokens": draw(lengths(output_high)),
    }
    stop = draw(st.sampled_from(["count", "duration", "both"]))
    if stop in ("count", "both"):
        workload["num_requests"] = num_requests
    if stop in ("duration", "both"):
        workload["duration_s"] = draw(st.sampled_from([0.001, 0.5, 5.0, 30.0]))
        if stop == "duration" and kind != "closed_loop":
            # Duration alone: the arrivals in the window must stay within the case's budget.
            rate = arrivals["rate_per_s"]
            workload["duration_s"] = min(workload["duration_s"], max_requests / rate)
        elif stop == "duration":
            workload["num_requests"] = None
    if sessions and kind != "closed_loop":
        workload["sessions"] = {
            "turns": draw(lengths(MAX_TURNS)),
            "think_time_s": draw(st.sampled_from([0.0, 0.01, 1.0])),
            "think_distribution": draw(st.sampled_from(["exponential", "constant"])),
        }
        workload["num_requests"] = num_requests  # duration alone: turns multiply starts
    if serving["scheduling_policy"] == "priority" or draw(st.integers(0, 9)) == 0:
        workload["priorities"] = [  # refused under fcfs, as vLLM refuses the request
            {"name": "interactive", "weight": 1, "priority": 0},
            {"name": "batch", "weight": 3, "priority": 5},
        ]
    if draw(st.integers(0, 4)) == 0:
        workload["max_total_tokens"] = draw(st.sampled_from([2, 100, 4096]))
        workload["max_total_policy"] = draw(st.sampled_from(["output_first", "proportional"]))
    if stop == "duration" and kind == "closed_loop":
        # closed loop keeps its users busy for the whole horizon: cap the request count
        workload["num_requests"] = num_requests
    data = {
        "name": "prop",
        "seed": draw(st.integers(0, 2**32)),
        "hardware": {"gpu": gpu},
        "model": {
            "name": model,
            "weight_dtype": draw(st.sampled_from(DTYPES)),
            "kv_dtype": draw(st.sampled_from(KV_DTYPES)),
            "moe_routing": draw(st.sampled_from(["balanced", "round_robin", "power_law_1.2"])),
        },
        "parallelism": {
            # tp 1..8, weighted to the degrees that divide every model's heads
            "tp": draw(st.sampled_from([1, 1, 1, 2, 2, 4, 4, 8, 8, 3, 5, 6, 7])),
            "pp": draw(st.sampled_from([1, 1, 1, 2, 4])),
            "replicas": draw(st.integers(1, 16)),
            "router": draw(st.sampled_from(ROUTERS)),
            "enable_expert_parallel": model in MOE_MODELS and draw(st.booleans()),
            "dp": draw(st.sampled_from([1, 1, 1, 2, 4])),
            "all2all_backend": draw(st.sampled_from(["allgather_reducescatter", "all_to_all"])),
        },
        "serving": serving,
        "engine": {"multi_step": draw(st.booleans())},
        "workload": workload,
        "output": {"plots": False, "progress": False},
    }
    if draw(st.integers(0, 5)) == 0:  # a heterogeneous or disaggregated cluster
        par = data.pop("parallelism")
        data.pop("hardware")
        data["parallelism"] = {"router": par["router"]}
        roles = draw(st.sampled_from([("mixed", "mixed"), ("prefill", "decode")]))
        data["pools"] = [
            {"name": "big", "hardware": {"gpu": gpu}, "tp": par["tp"], "pp": par["pp"],
             "replicas": draw(st.integers(1, 8)), "role": roles[0]},
            {"name": "small", "hardware": {"gpu": draw(st.sampled_from(GPUS))},
             "tp": draw(st.sampled_from([1, 2, 4, 8])), "replicas": draw(st.integers(1, 8)),
             "role": roles[1]},
        ]  # fmt: skip
    if draw(st.integers(0, 4)) == 0:  # replica failures, with or without recovery
        replicas = (
            sum(p["replicas"] for p in data["pools"])
            if "pools" in data
            else data["parallelism"]["replicas"]
        )
        events = []
        for _ in range(draw(st.integers(1, 3))):
            at = draw(_log_uniform(0.01, 100.0))
            recover = draw(st.one_of(st.none(), _log_uniform(0.01, 100.0)))
            events.append({"replica": draw(st.integers(0, replicas - 1)), "at_s": at,
                           "recover_at_s": None if recover is None else at + recover})  # fmt: skip
        data["faults"] = {"events": events, "on_failure": draw(st.sampled_from(["retry", "fail"])),
                          "max_retries": draw(st.integers(0, 3))}  # fmt: skip
    return data


# ---- the properties ----------------------------------------------------------------------------
# `pytest --hypothesis-show-statistics` prints how many cases ran and how many were refused.
PROPERTY = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@settings(PROPERTY, max_examples=800)
@given(scenarios())
def test_generated_scenarios_run_with_invariants_or_are_refused_in_one_line(data):
    event(run_or_refuse(data))


@pytest.mark.slow
@settings(PROPERTY, max_examples=10_000)
@given(scenarios())
def test_generated_scenarios_many(data):
    event(run_or_refuse(data))


# ---- bugs the property found -------------------------------------------------------------------
def _static(tmp_path, case: str) -> dict[str, Any]:
    serving = {"policy": "static", "max_num_seqs": 8}
    if case == "two replicas":  # round robin leaves each replica a partial batch
        return scenario_dict(serving=serving, parallelism={"replicas": 2},
                             workload={"num_requests": 3})  # fmt: skip
    if case == "closed loop":  # 4 users can never fill a batch of 8
        loop = {"arrivals": {"kind": "closed_loop", "users": 4}, "num_requests": 20}
        return scenario_dict(serving=serving, workload=loop)
    # one replica; the last arrival is longer than max_model_len, so it is rejected and
    # the replica is never told that the arrivals are over
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0.1,10,10\n0.2,10,10\n0.3,5000,10\n"
    )
    wl = {"arrivals": {"kind": "trace", "path": str(trace)}, "num_requests": 3,
          "prompt_tokens": None, "output_tokens": None}  # fmt: skip
    return scenario_dict(serving=serving, workload=wl)


@pytest.mark.parametrize(
    "case",
    [
        "two replicas",
        "closed loop",
        "last arrival rejected",
    ],
)
def test_static_batch_is_not_stranded_when_arrivals_end(tmp_path, case):
    scenario = Scenario.from_dict(_static(tmp_path, case))
    results = simulate(scenario)
    check_invariants(results, scenario)
    assert results.requests["outcome"].astype(str).isin(["completed", "rejected"]).all()


@pytest.mark.parametrize("policy", ["continuous", "chunked_prefill"])
def test_a_preempted_decode_does_not_empty_the_step_of_a_tiny_budget(policy):
    """A 2-token budget, the least vLLM starts 2 sequences with (one token each): chunked
    prefill runs it; a prefill-first engine is refused, as vLLM refuses a budget below
    max_model_len."""
    data = {
        "name": "prop", "seed": 0, "hardware": {"gpu": "l4"}, "model": {"name": "llama-2-7b"},
        "serving": {"policy": policy, "max_num_seqs": 2, "max_num_batched_tokens": 2,
                    "block_size": 16, "watermark": 0.0, "scheduling_policy": "priority",
                    "num_gpu_blocks": 2},
        "workload": {
            "arrivals": {"kind": "poisson", "rate_per_s": 1.0},
            "prompt_tokens": {"kind": "fixed", "tokens": 1},
            "output_tokens": {"kind": "fixed", "tokens": 17},
            "num_requests": 4,
            "priorities": [{"name": "interactive", "weight": 1, "priority": 0},
                           {"name": "batch", "weight": 3, "priority": 5}],
        },
        "output": {"plots": False, "progress": False},
    }  # fmt: skip
    scenario = Scenario.from_dict(data)
    if policy == "continuous":
        with pytest.raises(InfeasibleError, match="max_num_batched_tokens=2 is below"):
            simulate(scenario)
        return
    results = simulate(scenario)
    check_invariants(results, scenario)
    assert (results.requests["outcome"] == "completed").all()


def test_continuous_does_not_preempt_everyone_and_sleep():
    loop = {"arrivals": {"kind": "closed_loop", "users": 16},
            "prompt_tokens": {"kind": "fixed", "tokens": 8},
            "output_tokens": {"kind": "fixed", "tokens": 64}, "num_requests": 200}  # fmt: skip
    scenario = Scenario.from_dict(
        scenario_dict(
            serving={"policy": "continuous", "num_gpu_blocks": 16, "max_model_len": 512},
            workload=loop,
        )
    )
    results = simulate(scenario)
    check_invariants(results, scenario)
    assert (results.requests["outcome"] == "completed").all()
