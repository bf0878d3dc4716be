"""Pipeline stages of any layer count, split as vLLM's get_pp_indices splits them."""

import pytest

from hardware_models.presets import load_gpu
from simulator.memory_planner import plan_memory, stage_layers
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from simulator.simulation import build_replica
from tests.conftest import scenario_dict


@pytest.mark.parametrize(
    ("model", "pp", "sizes"),
    [
        ("llama-3.1-8b", 2, [16, 16]),
        ("llama-3.1-8b", 3, [11, 11, 10]),  # the remainder before the last stage
        ("deepseek-v3", 4, [15, 15, 16, 15]),
        ("qwen3-235b-a22b", 4, [23, 24, 24, 23]),
        ("gpt-oss-20b", 7, [3, 3, 3, 4, 4, 4, 3]),
        ("llama-3.1-8b", 12, [2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 2]),
    ],
)
def test_stages_split_as_vllm_get_pp_indices(model, pp, sizes):
    """vLLM: layers // pp each, one more for each of the `remainder` stages before the last
    (tests/distributed/test_pipeline_partition.py: 5 layers over 3 -> 2, 2, 1)."""
    stages = stage_layers(load_model(model), pp)
    assert [len(s) for s in stages] == sizes
    assert [s.start for s in stages[1:]] == [s.stop for s in stages[:-1]]
    assert stages[0].start == 0 and stages[-1].stop == load_model(model).num_layers


@pytest.mark.parametrize(("model", "pp"), [("gpt-oss-20b", 7), ("llama-3.1-8b", 12)])
def test_uneven_stages_plan_every_stage(model, pp):
    """The planner used to leave the last stages empty (ceil) and divide by zero."""
    plan = plan_memory(load_model(model), load_gpu("h200-sxm"), weight_dtype="fp8", pp=pp)
    assert plan.kv_capacity_tokens > 0 and plan.kv_bytes_per_token > 0


def test_a_replica_with_uneven_stages_builds():
    """DeepSeek-V3's 61 layers over two stages (31 + 30), and an error only past a layer
    a stage."""
    data = scenario_dict(
        hardware={"gpu": "h200-sxm"},
        model={"name": "deepseek-v3"},
        parallelism={"tp": 8, "pp": 2},
    )
    build = build_replica(Scenario.from_dict(data))
    assert build.memory.pp == 2
