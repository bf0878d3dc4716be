"""One-line answers to bad MoE inputs and misleading figures found in review."""

import pytest

from hardware_models.errors import InfeasibleError, InfersimError
from hardware_models.moe import Routing
from hardware_models.presets import load_gpu
from simulator.build import build_replica
from simulator.memory_planner import plan_memory
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from simulator.sizing import detailed_inference
from tests.conftest import scenario_dict


@pytest.mark.parametrize("value", ["power_law_abc", "power_law_", "zipf"])
def test_a_bad_routing_lists_what_is_allowed(value):
    with pytest.raises(InfersimError, match="allowed: balanced, round_robin, power_law"):
        Routing.parse(value)
    with pytest.raises(InfersimError, match=r"e\.g\. power_law_1\.2"):
        Routing.parse("power_law")


def test_an_unknown_model_is_separated_from_the_known_ones():
    with pytest.raises(InfersimError, match=r"unknown model 'nosuch'; known: deepseek-v3, "):
        load_model("nosuch")


def test_does_not_fit_says_gib_for_binary_capacities():
    """The budget is a share of the GiB CUDA sees (79.22 on an H100): the message gave
    '85.8993 GB'."""
    with pytest.raises(InfeasibleError) as exc:
        plan_memory(load_model("llama-3.1-70b"), load_gpu("h100-sxm"))
    assert "(79.22 GiB x 0.90)" in str(exc.value) and "85.8993" not in str(exc.value)


def test_moe_routing_on_a_dense_model_is_refused_as_expert_parallelism_is():
    dense = scenario_dict(model={"name": "llama-3.1-8b", "moe_routing": "power_law_1.2"})
    refused = r"model\.moe_routing: power_law_1\.2 .* llama-3\.1-8b has no experts"
    with pytest.raises(InfersimError, match=refused):
        build_replica(Scenario.from_dict(dense))
    plain = scenario_dict(model={"name": "llama-3.1-8b", "moe_routing": "balanced"})
    build_replica(Scenario.from_dict(plain))  # the default, said or not


def test_the_estimate_rounds_up_to_a_tensor_parallel_size_the_heads_split_over():
    """DeepSeek-V3 in fp8 needs 6 H200s of memory (139.72 GiB each as CUDA sees it), but
    128 heads split over 8, not 6."""
    est = detailed_inference(load_model("deepseek-v3"), load_gpu("h200-sxm"), weight_dtype="fp8")
    assert (est.gpus, est.tp) == (6, 8)
    one = detailed_inference(load_model("llama-3.1-8b"), load_gpu("h100-sxm"))
    assert one.gpus == one.tp == 1


def test_a_mistyped_config_path_is_not_taken_for_a_hub_id():
    with pytest.raises(InfersimError, match=r"config\.json: no such file"):
        load_model("mymodel/config.json")
    with pytest.raises(InfersimError, match="looks like a HuggingFace hub id"):
        load_model("deepseek-ai/DeepSeek-V3")
