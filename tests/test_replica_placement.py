"""Replicas packed in order over the cluster's nodes, each priced where its GPUs sit: one
that straddles two nodes hands its activations over the inter-node link."""

import warnings

import pytest
import yaml

from hardware_models.errors import InfeasibleError, InfersimWarning
from hardware_models.presets import load_gpu, load_node
from simulator.engine.step_cost import StepCostModel
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from simulator.simulation import _Run, build_replica
from tests.conftest import scenario_dict


def _straddling(**parallelism):
    return Scenario.from_dict(
        scenario_dict(
            hardware={"gpu": "h100-sxm"},
            model={"name": "llama-3.1-70b"},
            parallelism={"tp": 2, "pp": 3, "replicas": 4, "nodes": 3, **parallelism},
            serving={"max_model_len": 4096},
        )
    )


def test_a_replica_straddling_two_nodes_hands_off_over_the_inter_node_link():
    """tp=2 x pp=3 = 6 GPUs a replica on 8-GPU nodes: replica 1 holds GPUs 6-11 (stage 0
    on node 0, stages 1-2 on node 1), replica 2 GPUs 12-17 (stages 0-1 on node 1, stage
    2 on node 2); replicas 0 and 3 sit inside a node."""
    arch, gpu, node = load_model("llama-3.1-70b"), load_gpu("h100-sxm"), load_node("dgx-h100")
    cost = StepCostModel(arch, gpu, node, tp=2, pp=3)

    def hand_offs(first: int) -> dict[str, int]:
        counts: dict[str, int] = {}
        for link, n, *_ in cost.placed(first).handoffs:
            counts[link.kind] = counts.get(link.kind, 0) + n
        return counts

    intra, inter = node.intra_node_link.kind, node.inter_node_link.kind
    assert hand_offs(0) == hand_offs(18) == {intra: 2}
    assert hand_offs(6) == hand_offs(12) == {intra: 1, inter: 1}
    assert cost.placed(18) is cost and cost.placed(6) is cost.placed(14)

    def step(model: StepCostModel) -> float:
        return model.step(decode_seqs=32, decode_context=32 * 1000).gpu_seconds

    assert step(cost.placed(6)) > step(cost)


def test_the_run_prices_and_names_the_straddling_replicas():
    """The review's layout was accepted with all four replicas priced alike and no word."""
    scenario = _straddling()
    with pytest.warns(InfersimWarning, match=r"replicas 1, 2 of 4 .*straddl"):
        build_replica(scenario)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = _Run(scenario, progress=False)
    costs = [replica.cost for replica in run.replicas]
    assert costs[0] is costs[3] and costs[1] is costs[2] and costs[0] is not costs[1]


def test_replicas_of_whole_nodes_or_node_divisors_sit_alike():
    for parallelism in ({"tp": 2, "pp": 2, "replicas": 6}, {"tp": 8, "pp": 2, "replicas": 1}):
        with warnings.catch_warnings():
            warnings.simplefilter("error", InfersimWarning)
            try:
                build_replica(_straddling(**parallelism))
            except InfersimWarning as warning:
                assert "straddl" not in str(warning)


def test_a_tensor_parallel_group_that_would_straddle_nodes_is_refused(tmp_path):
    """tp=4 on nodes of 6 (a custom node): packed in order, GPUs 4-7 span two nodes."""
    node = load_node("dgx-h100").model_copy(update={"gpus_per_node": 6, "name": "six"})
    path = tmp_path / "six.yaml"
    path.write_text(yaml.safe_dump(node.model_dump(mode="json")))
    data = scenario_dict(
        hardware={"gpu": "h100-sxm", "node": str(path)},
        model={"name": "llama-3.1-8b"},
        parallelism={"tp": 4, "replicas": 2},
    )
    with pytest.raises(InfeasibleError, match="tp=4 does not divide the 6 GPUs"):
        build_replica(Scenario.from_dict(data))
