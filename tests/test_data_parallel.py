"""Attention data parallelism (parallelism.dp): ranks in lockstep for an MoE model,
independent for a dense one; the MoE dispatch and combine over the tp x dp GPUs; each
rank's share of the memory; exact stepping and determinism."""

import pandas as pd
import pytest

from hardware_models.errors import InfersimError
from hardware_models.presets import load_gpu, load_node
from simulator.engine.step_cost import StepBound, StepCostModel
from simulator.memory_planner import plan_memory
from simulator.metrics.writer import summary_json
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict
from tests.test_engine import _assert_same_run, _check_invariants

_WORKLOAD = {
    "arrivals": {"kind": "poisson", "rate_per_s": 12.0},
    "prompt_tokens": {"kind": "lognormal", "mean": 1200, "std": 1500, "min": 16, "max": 6000},
    "output_tokens": {"kind": "uniform", "low": 4, "high": 200},
    "num_requests": 150,
}


def _scenario(model: str = "qwen3-30b-a3b", **parallelism) -> dict:
    return scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": model},
        parallelism={"dp": 2, "enable_expert_parallel": model != "llama-3.1-8b", **parallelism},
        serving={"policy": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 2048},
        workload=_WORKLOAD,
    )


def _run(data: dict, **engine):
    if engine:
        data = {**data, "engine": engine}
    return simulate(Scenario.from_dict(data), progress=False)


@pytest.mark.parametrize(
    "layout",
    [
        {"dp": 2},
        {"dp": 4, "all2all_backend": "all_to_all"},
        {"dp": 2, "tp": 2, "enable_expert_parallel": False},
    ],
)
def test_lockstep_multi_step_matches_step_by_step(layout):
    data = _scenario(**layout)
    fast, slow = _run(data), _run(data, multi_step=False)
    _assert_same_run(fast, slow)
    _check_invariants(fast)
    assert (fast.requests["outcome"] == "completed").all()


def test_eager_lockstep_multi_step_matches_step_by_step():
    data = {**_scenario(), "engine": {"cuda_graphs": False}}
    fast = _run(data)
    slow = _run({**data, "engine": {"cuda_graphs": False, "multi_step": False}})
    _assert_same_run(fast, slow)
    # Unpadded, the ranks' steps are cheaper than with CUDA graphs' padding.
    padded = _run(_scenario())
    assert fast.steps["flops"].sum() < padded.steps["flops"].sum()


def test_dense_ranks_multi_step_matches_step_by_step():
    data = _scenario("llama-3.1-8b")
    _assert_same_run(_run(data), _run(data, multi_step=False))


def test_moe_ranks_step_together_and_a_long_prefill_holds_the_others_back():
    steps = _run(_scenario()).steps
    by_start = steps.groupby("start")
    # Every rank steps at every moment, for the same time: the slowest's. A rank with
    # nothing to run logs its dummy pass (no sequences, but work on its GPU).
    assert (by_start["duration"].nunique() == 1).all()
    assert (by_start["replica"].nunique() == 2).all()
    dummy = steps[steps["batch_size"] == 0]
    assert len(dummy) and (dummy["flops"] > 0).all()
    # A decode-only step of one rank alongside a big prefill on the other lasts as long
    # as that prefill: far longer than its decode-only steps beside an idle rank.
    peer_prefill = by_start["prefill_tokens"].transform("max")
    peer_idle = by_start["batch_size"].transform("min") == 0
    decoding = (steps["prefill_tokens"] == 0) & (steps["batch_size"] > 0)
    held = steps[decoding & (peer_prefill >= 1024)]
    beside_idle = steps[decoding & peer_idle]
    assert len(held) and len(beside_idle)
    assert held["duration"].median() > 3 * beside_idle["duration"].median()


def test_dense_ranks_are_independent():
    steps = _run(_scenario("llama-3.1-8b")).steps
    starts = {r: set(g["start"]) for r, g in steps.groupby("replica")}
    # Independent ranks step on their own clocks: few moments are shared.
    shared = starts[0] & starts[1]
    assert len(shared) < 0.05 * min(len(starts[0]), len(starts[1]))


def test_requests_are_balanced_and_every_gpu_is_counted():
    res = _run(_scenario(dp=4, tp=2))
    per_rank = res.requests.groupby("replica").size()
    assert len(per_rank) == 4 and per_rank.min() >= 0.6 * per_rank.max()
    assert res.context.gpus == 8  # tp x dp, every one priced
    summary = res.summary()
    assert summary["cost"]["usd_per_hour"] == pytest.approx(
        8 * res.context.replicas[0].usd_per_gpu_hour
    )


def test_same_seed_same_summary():
    a, b = _run(_scenario(dp=4)), _run(_scenario(dp=4))
    same = (summary_json(r.summary(), include_wall_time=False) for r in (a, b))
    assert len(set(same)) == 1
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)


# ---- the cost of a rank's step --------------------------------------------------------------
@pytest.fixture(scope="module")
def deepseek():
    return load_model("deepseek-v3"), load_gpu("h200-sxm"), load_node("hgx-h200")


def _cost(deepseek, **kw) -> StepCostModel:
    arch, gpu, node = deepseek
    return StepCostModel(arch, gpu, node, weight_dtype="fp8", **kw)


def test_padding_to_the_largest_rank_costs_a_decode_step_more(deepseek):
    """Eight decodes on this rank while another rank prefills 2048 tokens: padded (CUDA
    graphs), this rank's step runs 2048 tokens and the MoE layers 8 x 2048."""
    cost = _cost(deepseek, tp=1, dp=8, expert_parallel=True)
    alone = cost.step(decode_seqs=8, decode_context=8000, moe_tokens=64)
    padded = cost.step(decode_seqs=8, decode_context=8000, padded_tokens=2048, moe_tokens=16384)
    eager = cost.step(decode_seqs=8, decode_context=8000, moe_tokens=2048 + 7 * 8)
    assert padded.seconds > eager.seconds > alone.seconds


def test_dispatch_and_combine_are_priced_on_the_link(deepseek):
    """DP8 + EP on one node: the dispatch adds communication that grows with the tokens,
    all-to-all moving fewer bytes than gathering every rank's tokens; across two nodes
    (tp2 x dp8) it runs on the slower inter-node link."""
    comm = int(StepBound.COMMUNICATION)

    def comm_seconds(tokens: int, **kw) -> float:
        cost = _cost(deepseek, expert_parallel=True, **kw)
        return cost._moe_over_ranks(cost.dp * tokens, tokens).seconds[comm]

    gather = comm_seconds(256, tp=1, dp=8)
    assert gather > 0.0
    assert _cost(deepseek, tp=8)._dense(256).seconds[comm] < gather  # TP8's all-reduces
    assert comm_seconds(2048, tp=1, dp=8) > 4 * gather
    assert comm_seconds(256, tp=1, dp=8, all2all_backend="all_to_all") < gather
    assert comm_seconds(256, tp=2, dp=8) > gather


def test_each_rank_holds_its_kv_cache_and_a_share_of_the_experts(deepseek):
    arch, gpu, _ = deepseek
    dp8 = plan_memory(arch, gpu, weight_dtype="fp8", tp=1, dp=8, expert_parallel=True,
                      max_num_batched_tokens=1024)  # fmt: skip
    tp8 = plan_memory(arch, gpu, weight_dtype="fp8", tp=8, expert_parallel=True,
                      max_num_batched_tokens=1024)  # fmt: skip
    assert dp8.expert_weights == tp8.expert_weights  # 32 whole experts per GPU either way
    assert dp8.weights > tp8.weights  # attention and dense layers whole on every rank
    # MLA's latent is whole on every GPU: a rank of one GPU holds as many tokens per
    # GPU as the TP8 replica, less the room its larger weights take.
    assert dp8.kv_bytes_per_token == tp8.kv_bytes_per_token
    assert dp8.kv_capacity_tokens < tp8.kv_capacity_tokens
    assert "dp=8" in dp8.table()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"serving": {"policy": "static", "max_num_seqs": 8}}, "parallelism.dp"),
        ({"parallelism": {"dp": 0}}, "parallelism.dp"),
        ({"parallelism": {"dp": 2, "pp": 2}}, "parallelism.dp"),
    ],
)
def test_bad_dp_settings_are_refused_in_one_line(change, field):
    data = _scenario()
    for section, values in change.items():
        data[section] = {**data[section], **values}
    with pytest.raises(InfersimError, match=field.replace(".", r"\.")) as info:
        Scenario.from_dict(data)
    assert "\n" not in str(info.value)


def test_dp_is_refused_with_pools():
    data = _scenario()
    data.pop("hardware")
    data["pools"] = [{"name": "a", "hardware": {"gpu": "h100-sxm"}}]
    with pytest.raises(InfersimError, match=r"parallelism\.dp"):
        Scenario.from_dict(data)


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "llama-3.1-8b"])
def test_a_failed_dp_replica_loses_every_rank_and_recovers(model):
    data = _scenario(model, replicas=2)  # the retries go to the other meanwhile
    data["faults"] = {"events": [{"replica": 0, "at_s": 3.0, "recover_at_s": 5.0}],
                      "on_failure": "retry", "max_retries": 3}  # fmt: skip
    res = _run(data)
    _check_invariants(res)
    assert (res.requests["outcome"] == "completed").all()
    steps = res.steps[res.steps["replica"] < 2]  # replica 0's ranks
    assert not ((steps["start"] > 3.0) & (steps["start"] < 5.0)).any()  # every rank down
    assert set(steps[steps["start"] > 5.0]["replica"]) == {0, 1}  # and serving again
    assert res.requests["retries"].sum() > 0


def test_the_terminal_header_names_dp_and_ep():
    """The header says what ran, data and expert parallelism included."""
    from simulator.provenance import header_lines

    pools = [{"pool": "default", "gpu": "h200-sxm", "tp": 1, "pp": 1, "dp": 8, "ep": True,
              "replicas": 1}]  # fmt: skip
    config = {"model": "m", "weight_dtype": "fp8_block", "kv_dtype": "bf16",
              "activation_dtype": "bf16", "pools": pools, "policy": "chunked_prefill",
              "max_num_seqs": 32, "max_num_batched_tokens": 512, "load": "poisson"}  # fmt: skip
    assert "1 replica x 8 h200-sxm (tp=1 pp=1 dp=8 ep)" in header_lines(config)[0]


def test_a_dp_rank_is_named_a_rank_of_its_replica_not_a_replica():
    """vLLM's DP ranks are ranks of one engine: two replicas of dp 2 are 2 replicas of 4
    dp ranks in the summary, the terminal rows and the notebook caption, as the header
    (`2 replicas x 2 h100-sxm`) says; each rank's row keeps its engine's index."""
    from simulator.display import summary_html
    from simulator.metrics import summary_table

    summary = _run(_scenario("llama-3.1-8b", replicas=2)).summary()
    assert (summary["run"]["replicas"], summary["run"]["dp_ranks"]) == (2, 4)
    rows = summary["per_replica"]
    assert [(r["replica"], r["dp_rank"]) for r in rows] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    table = summary_table(summary)
    assert "2 replicas x 2 h100-sxm (tp=1 pp=1 dp=2)" in table
    assert "replica 1 rank 1 " in table and "replica 3" not in table
    assert "4 x h100-sxm in 2 replicas of 4 dp ranks" in summary_html(summary)
    one = _run(_scenario("llama-3.1-8b", dp=4)).summary()
    assert (one["run"]["replicas"], one["run"]["dp_ranks"]) == (1, 4)
    assert "rank 3 " in summary_table(one) and "replica 0" not in summary_table(one)
