"""Pipeline parallelism that pipelines: pp virtual engines keep pp batches in flight, a
batch waits for the stage the one before it occupies, and too few requests leave
stages idle (the bubble)."""

import itertools

import numpy as np
import pytest

from hardware_models.errors import InfersimWarning
from simulator.engine.pipeline import Stages
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict
from tests.test_engine import _assert_same_run, _check_invariants


def _scenario(users: int | None = None, pp: int = 2, **serving) -> dict:
    workload = {
        "arrivals": {"kind": "poisson", "rate_per_s": 8.0},
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 3000},
        "output_tokens": {"kind": "uniform", "low": 2, "high": 300},
        "num_requests": 200,
    }
    if users is not None:  # saturated: fixed lengths, a closed loop of `users`
        workload = {
            "arrivals": {"kind": "closed_loop", "users": users},
            "prompt_tokens": {"kind": "fixed", "tokens": 256},
            "output_tokens": {"kind": "fixed", "tokens": 256},
            "num_requests": max(4 * users, 8),
        }
    return scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-70b"},
        parallelism={"tp": 4, "pp": pp},
        serving={"policy": "chunked_prefill", "max_num_seqs": 64,
                 "max_num_batched_tokens": 2048, **serving},
        workload=workload,
    )  # fmt: skip


def _run(data: dict, **engine):
    if engine:
        data = {**data, "engine": engine}
    return simulate(Scenario.from_dict(data), progress=False)


def test_stages_hold_a_batch_until_the_one_before_leaves():
    stages = Stages([0.5, 0.5])
    assert stages.enter(0.0, 2.0) == (0.0, 1.0, 2.0)  # empty pipeline: the whole step
    # Ready at once: it takes stage 0 when the first batch leaves it, stage 1 after.
    assert stages.enter(0.0, 2.0) == (1.0, 1.0, 3.0)
    # A short batch behind a long one waits for stage 1 to free.
    stages = Stages([0.5, 0.5])
    stages.enter(0.0, 8.0)  # stage 0 until 4, stage 1 until 8
    assert stages.enter(0.0, 2.0) == (4.0, 1.0, 9.0)


def test_stages_take_their_share_of_the_layers_and_the_slowest_sets_the_rate():
    """DeepSeek-V3's 61 layers over pp=2 are 31 + 30: stage 0 takes 31/61 of the GPU
    time, and saturated, batches leave one per slowest stage's time."""
    stages = Stages([31 / 61, 30 / 61])
    assert stages.enter(0.0, 61.0) == (0.0, 31.0, 61.0)
    outs = [stages.enter(0.0, 61.0)[2] for _ in range(4)]
    assert [b - a for a, b in itertools.pairwise(outs)] == [31.0, 31.0, 31.0]


def test_host_work_is_serial_across_the_batches_in_flight():
    """One CPU thread schedules every batch (vLLM's engine core): host time does not
    pipeline. Synchronous, a batch's GPU work starts after its host work; overlapped
    (async scheduling), a batch leaves when both its stages and its host work are done."""
    sync = Stages([0.5, 0.5], overlap=False)
    assert sync.enter(0.0, 2.0, host=3.0) == (3.0, 1.0, 5.0)
    assert sync.enter(0.0, 2.0, host=3.0) == (6.0, 1.0, 8.0)  # after the first's host work
    hidden = Stages([0.5, 0.5], overlap=True)
    assert hidden.enter(0.0, 2.0, host=3.0) == (0.0, 1.0, 3.0)
    assert hidden.enter(0.0, 2.0, host=3.0) == (3.0, 1.0, 6.0)  # host-bound: 1 per 3 s


def test_a_host_bound_replica_does_not_gain_from_pp():
    """Host work of 20 ms a step dwarfs an 8B model's GPU time: PP cannot multiply it."""

    def throughput(pp: int) -> float:
        data = scenario_dict(
            hardware={"gpu": "h100-sxm"},
            model={"name": "llama-3.1-8b"},
            parallelism={"pp": pp},
            engine={"host_overhead_step_us": 20000},
            serving={"policy": "chunked_prefill", "max_num_seqs": 64},
            workload={"arrivals": {"kind": "offline"},
                      "prompt_tokens": {"kind": "fixed", "tokens": 200},
                      "output_tokens": {"kind": "fixed", "tokens": 100},
                      "num_requests": 256},
        )  # fmt: skip
        return _run(data).summary()["throughput"]["output_tokens_per_s"]

    assert throughput(2) <= 1.05 * throughput(1)


@pytest.mark.parametrize("pp", [2, 4])
def test_multi_step_matches_step_by_step(pp):
    data = _scenario(pp=pp)
    fast, slow = _run(data), _run(data, multi_step=False)
    _assert_same_run(fast, slow)
    _check_invariants(fast)
    assert (fast.requests["outcome"] == "completed").all()


def test_engines_short_of_their_one_kv_cache_preempt_their_own_and_stay_exact():
    """400 blocks for 64 sequences of up to 3,300 tokens: engines preempt their own
    requests when the shared cache is full, and every request still completes, the same
    stepping one event at a time."""
    data = _scenario(num_gpu_blocks=400)
    fast, slow = _run(data), _run(data, multi_step=False)
    _assert_same_run(fast, slow)
    _check_invariants(fast)
    assert fast.summary()["kv"]["preemptions"] > 0
    assert fast.steps["kv_blocks_used"].max() <= 400
    assert (fast.requests["outcome"] == "completed").all()


def test_saturated_pp2_does_twice_the_work_of_its_stages_one_after_another():
    """Each step-table row of a pipelined replica is its batch's turn in the first stage
    (1/pp of the step's time through all stages). Saturated, the first stage is never
    idle: the replica does pp x busy fraction times the work per second of the same
    stages run one after another, i.e. of a replica with one batch in flight."""
    saturated = _run(_scenario(users=256))
    busy = saturated.summary()["utilisation"]["gpu_busy_fraction"]
    assert 2 * busy >= 1.9
    # One request at a time: one batch in flight, each stage idle while the other works.
    alone = _run(_scenario(users=1))
    assert alone.summary()["utilisation"]["gpu_busy_fraction"] == pytest.approx(0.5, abs=0.01)
    # Its latency is the stages' one after another: a step row's duration times pp.
    steps = alone.steps
    decode = steps[steps["prefill_tokens"] == 0]
    tpot = alone.requests["tpot"].median()
    assert tpot == pytest.approx(2 * decode["duration"].median(), rel=0.02)


def test_the_engines_share_one_kv_cache():
    """vLLM V1 has one KV cache for the replica's batches in flight: 200 blocks, and a
    request of 69 blocks (1000 + 100 tokens) is served, though more than half of them."""
    res = _run(_scenario(users=16, num_gpu_blocks=200))
    assert res.context.replicas[0].kv_total_blocks == 200
    used = res.steps["kv_blocks_used"]
    assert 100 < used.max() <= 200
    assert res.summary()["kv"]["max_utilisation"] == used.max() / 200
    assert len(res.context.replicas) == 1 and res.context.gpus == 8
    _check_invariants(res)
    data = _scenario(num_gpu_blocks=100, max_model_len=4096)
    data["workload"] = {"arrivals": {"kind": "poisson", "rate_per_s": 0.5},
                        "prompt_tokens": {"kind": "fixed", "tokens": 1000},
                        "output_tokens": {"kind": "fixed", "tokens": 100},
                        "num_requests": 10}  # fmt: skip
    res = _run(data)
    assert (res.requests["outcome"] == "completed").all()


@pytest.mark.parametrize("max_num_seqs", [64, 3, 1])
def test_max_num_seqs_caps_the_requests_of_all_batches_in_flight(max_num_seqs):
    """vLLM V1's one scheduler admits at most max_num_seqs requests over the batches in
    flight; with fewer than pp, fewer batches fly."""
    data = _scenario(users=128, max_num_seqs=max_num_seqs)
    data["workload"]["num_requests"] = 256
    res = _run(data)
    q = res.requests
    starts, ends = q["first_scheduled"].to_numpy(), q["finish"].to_numpy()
    times = np.concatenate([starts, ends])
    change = np.concatenate([np.ones_like(starts), -np.ones_like(ends)])
    order = np.lexsort((change, times))  # a finish before a start at the same time
    assert np.cumsum(change[order]).max() == max_num_seqs
    assert (q["outcome"] == "completed").all()


def test_whole_batches_do_not_pipeline_and_the_run_says_so():
    with pytest.warns(InfersimWarning, match="no pipelining"):
        _run(_scenario(pp=2, policy="static", max_num_seqs=8))


def test_a_failed_pipelined_replica_loses_its_batches_in_flight_and_recovers():
    data = _scenario()
    data["parallelism"]["replicas"] = 2  # the retries go to the other meanwhile
    data["faults"] = {"events": [{"replica": 0, "at_s": 5.0, "recover_at_s": 8.0}],
                      "on_failure": "retry", "max_retries": 3}  # fmt: skip
    res = _run(data)
    _check_invariants(res)
    assert (res.requests["outcome"] == "completed").all()
    steps = res.steps[res.steps["replica"] == 0]
    assert not ((steps["start"] > 5.0) & (steps["start"] < 8.0)).any()  # down meanwhile
    assert (steps["start"] > 8.0).any()  # and serving again
    assert res.requests["retries"].sum() > 0


def test_the_split_of_max_num_seqs_over_batches_in_flight_is_said():
    """The per-batch split approximates vLLM V1's global cap: the run says so."""
    data = scenario_dict(model={"name": "llama-3.1-8b"}, parallelism={"tp": 1, "pp": 2})
    data["workload"] = {**data["workload"], "num_requests": 5}
    with pytest.warns(InfersimWarning, match=r"max_num_seqs=64 is split as \[32, 32\]"):
        results = simulate(Scenario.from_dict(data), progress=False)
    assert any("batches in flight" in w for w in results.summary()["warnings"])


def test_a_pools_split_warning_names_the_pools_own_pp_field():
    """In a scenario's own pools, pp is `pools.<i>.pp`: the warnings name that field."""
    data = scenario_dict(model={"name": "llama-3.1-8b"}, serving={"max_num_seqs": 64})
    data.pop("hardware", None)
    data["pools"] = [
        {"name": "a", "hardware": {"gpu": "h100-sxm"}},
        {"name": "b", "hardware": {"gpu": "h100-sxm"}, "pp": 2},
    ]
    data["workload"] = {**data["workload"], "num_requests": 5}
    results = simulate(Scenario.from_dict(data), progress=False)
    split = [w for w in results.summary()["warnings"] if "batches in flight" in w]
    assert split and split[0].startswith("pools.1.pp=2: serving.max_num_seqs=64 is split")
    data["serving"] = {**data["serving"], "policy": "static"}
    with pytest.warns(InfersimWarning, match=r": pools\.1\.pp=2: serving\.policy 'static'"):
        simulate(Scenario.from_dict(data), progress=False)


def test_a_warning_raised_by_every_replica_is_passed_on_once():
    """Four pipelined replicas each raise the split warning: the caller sees it once."""
    import warnings

    data = scenario_dict(model={"name": "llama-3.1-8b"},
                         parallelism={"tp": 1, "pp": 2, "replicas": 4})  # fmt: skip
    data["workload"] = {**data["workload"], "num_requests": 8}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        simulate(Scenario.from_dict(data), progress=False)
    assert sum("batches in flight" in str(w.message) for w in seen) == 1
