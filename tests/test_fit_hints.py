"""What does not fit says the cheapest layout that does: tensor parallelism inside a node,
pipeline stages of the widest tp a node holds, within the cluster's nodes when given."""

import pytest

from hardware_models.errors import InfeasibleError
from simulator.build import build_replica
from simulator.memory_planner import (
    ESTIMATE_SETTINGS,
    PLAN_SETTINGS,
    DoesNotFit,
    plan_memory,
)
from simulator.planner import _reason
from simulator.scenario import Scenario
from tests.conftest import scenario_dict


def _refusal(**kwargs) -> DoesNotFit:
    with pytest.raises(DoesNotFit) as exc:
        plan_memory("llama-3.1-405b", "h100-sxm", weight_dtype="bf16", **kwargs)
    return exc.value


def test_405b_bf16_on_h100_needs_two_nodes_of_tp8():
    """811.7 GB of bf16 weights: 101.5 GB a GPU at tp=8 is too much for one 80 GB H100
    node; two stages of tp=8 (50.7 GB a GPU) fit. The hint said "try tp>=16", a tensor-
    parallel group across nodes, whatever the cluster."""
    refusal = _refusal(tp=8, max_model_len=8192)
    assert refusal.fit == (8, 2)
    assert "parallelism.tp=8 with parallelism.pp=2 (16 GPUs" in str(refusal)
    assert "tp>=16" not in str(refusal)
    plan_memory("llama-3.1-405b", "h100-sxm", weight_dtype="bf16", tp=8, pp=2, max_model_len=8192)


def test_a_cluster_too_small_says_so_and_how_many_nodes():
    data = scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-405b", "weight_dtype": "bf16"},
        parallelism={"tp": 8, "nodes": 1},
        serving={"max_model_len": 8192},
    )
    with pytest.raises(
        InfeasibleError,
        match=r"no tp x pp on the cluster's 1 x 8 GPUs fits.*"
        r"parallelism\.tp=8 with parallelism\.pp=2.*parallelism\.nodes >= 2",
    ):
        build_replica(Scenario.from_dict(data))


def test_the_hint_leaves_room_for_one_sequence_of_max_model_len():
    """Llama-3.1-70B's 141 GB: two H100s hold the weights, but not with a 131072-token
    sequence's 21 GB of KV cache a GPU as well; four do."""

    def fit(max_model_len):
        with pytest.raises(DoesNotFit) as exc:
            plan_memory("llama-3.1-70b", "h100-sxm", tp=1, max_model_len=max_model_len)
        return exc.value.fit

    assert fit(None) == (2, 1)
    assert fit(131072) == (4, 1)


def test_each_command_names_its_own_settings():
    refusal = _refusal(tp=4, max_model_len=8192)
    assert "plan.tp=8 with plan.pp=2" in _reason(refusal)
    estimate = str(refusal.named(ESTIMATE_SETTINGS))
    assert "tp=8 with pp=2, pipeline stages --tp alone cannot set" in estimate
    assert "plan.tp=8 with plan.pp=2" in str(refusal.named(PLAN_SETTINGS))


def test_a_tp_that_cuts_fp8_blocks_is_skipped():
    """Qwen3-30B-A3B's 768-wide experts in fp8 blocks: tp=4 and tp=8 leave shards that cut
    128-wide blocks (vLLM refuses them), so the stages are tp=2 wide."""
    with pytest.raises(DoesNotFit) as exc:
        plan_memory("qwen3-30b-a3b", "l4", weight_dtype="fp8_block", gpu_memory_utilization=0.5)
    assert exc.value.fit == (2, 2)
    assert "parallelism.tp=2 with parallelism.pp=2 (4 GPUs in 2 stages of tp=2)" in str(exc.value)
