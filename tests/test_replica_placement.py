"""Replicas packed in order over the cluster's nodes, each priced where its GPUs sit: one
that straddles two nodes hands its activations over the inter-node link."""

import warnings

import pytest
import yaml

from hardware_models.errors import InfeasibleError, InfersimWarning
from hardware_models.node import CrossNodeLink
from hardware_models.presets import load_gpu, load_node
from simulator.build import build_pools, build_replica
from simulator.engine.step_cost import StepCostModel
from simulator.model_catalog import load_model
from simulator.provenance import assumed_links
from simulator.run_loop import Run
from simulator.scenario import Scenario
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
    with pytest.warns(
        InfersimWarning, match=r"replicas 1, 2 of 4 .*so their pipeline hand-offs run"
    ):
        build_replica(scenario)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Run(scenario, progress=False)
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


def _moe_dp(**parallelism) -> Scenario:
    """qwen3-30b-a3b, tp=2 x dp=3 = 6 GPUs a replica, 2 replicas over 2 nodes of 8:
    replica 1 holds GPUs 6-11, its MoE dispatch group straddling the two nodes."""
    return Scenario.from_dict(
        scenario_dict(
            hardware={"gpu": "h100-sxm"},
            model={"name": "qwen3-30b-a3b"},
            parallelism={"tp": 2, "dp": 3, "replicas": 2, "nodes": 2,
                         "enable_expert_parallel": True, **parallelism},
            workload={"num_requests": 6},
        )
    )  # fmt: skip


def test_a_dp_group_straddling_two_nodes_dispatches_over_the_inter_node_link():
    """The review's layout: replica 1's 6-GPU dispatch group (2 GPUs on node 0, 4 on
    node 1) was priced over NVSwitch, as replica 0's inside one node."""
    arch, gpu, node = load_model("qwen3-30b-a3b"), load_gpu("h100-sxm"), load_node("dgx-h100")
    cost = StepCostModel(arch, gpu, node, tp=2, dp=3, expert_parallel=True)
    assert cost.ep_link == node.intra_node_link and cost.placed(0, 0) is cost
    straddling = cost.placed(6, 6)
    assert straddling is not cost and cost.placed(8, 6) is straddling  # its rank 1's GPU
    link = straddling.ep_link
    # vLLM's gather over the dp ranks, 2 GPUs apart: at most 2 of the 3 on one node
    assert isinstance(link, CrossNodeLink) and link.inter == node.inter_node_link
    assert link.gpus_per_node == 2
    to_all = StepCostModel(arch, gpu, node, tp=2, dp=3, expert_parallel=True,
                           all2all_backend="all_to_all")  # fmt: skip
    assert to_all.placed(6, 6).ep_link.gpus_per_node == 4  # the experts' GPUs: 4 on node 1

    def step(model: StepCostModel) -> float:
        return model.step(decode_seqs=32, decode_context=32_000, moe_tokens=96).gpu_seconds

    assert step(straddling) > step(cost)


def test_a_pipelined_dp_groups_stages_spread_over_its_ranks_gpus():
    """tp=4 x pp=2 x dp=2: the dispatch group of stage 0 is GPUs 0-3 and 8-11 (rank 1
    starts tp x pp GPUs on), two nodes, though tp x dp = 8 is a node's GPUs."""
    arch, gpu, node = load_model("qwen3-30b-a3b"), load_gpu("h100-sxm"), load_node("dgx-h100")
    cost = StepCostModel(arch, gpu, node, tp=4, pp=2, dp=2, expert_parallel=True)
    assert isinstance(cost.ep_link, CrossNodeLink) and cost.ep_link.gpus_per_node == 1


def test_the_run_names_and_prices_the_straddling_dp_group():
    with pytest.warns(
        InfersimWarning, match=r"parallelism: replicas 1 of 2 .*so their MoE dispatches run"
    ):
        build_replica(_moe_dp())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Run(_moe_dp(), progress=False)
    ranks = [replica.cost for replica in run.replicas]  # 2 replicas x 3 dp ranks
    assert ranks[0] is ranks[1] is ranks[2] and ranks[3] is ranks[4] is ranks[5]
    assert isinstance(ranks[3].ep_link, CrossNodeLink)
    assert not isinstance(ranks[0].ep_link, CrossNodeLink)
    links = [r for r in assumed_links(run.builds) if r["group"] == "moe_dispatch"]
    assert [("inter" in r, r.get("replicas")) for r in links] == [(False, [0]), (True, [1])]


def test_the_links_of_every_placed_replica_are_recorded():
    """provenance.links read replica 0's build only: replicas 1 and 2's hand-offs over
    InfiniBand went unrecorded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Run(_straddling(), progress=False)
    handoffs = [r for r in assumed_links(run.builds) if r["group"] == "pp_handoff"]
    assert [(list(set(r) & {"intra", "inter"}), r.get("replicas")) for r in handoffs] == [
        (["intra"], None),
        (["inter"], [1, 2]),
    ]


def test_a_pools_straddling_warning_names_the_pool():
    data = scenario_dict(model={"name": "llama-3.1-8b"})
    del data["hardware"]
    data["pools"] = [
        {"name": "big", "hardware": {"gpu": "h100-sxm"}, "replicas": 3, "tp": 2, "pp": 3}
    ]
    with pytest.warns(InfersimWarning, match=r"^pools\.0 \(big\): replicas 1, 2 of 3 ") as caught:
        build_pools(Scenario.from_dict(data))
    assert not [w for w in caught if str(w.message).startswith("parallelism: replicas")]
