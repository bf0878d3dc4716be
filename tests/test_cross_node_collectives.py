"""Collectives over groups spanning nodes, priced as NCCL runs them (one ring or tree
channel per NIC rail, the node's own link inside each node), not as one flat ring at the
network's rate; groups inside a node keep their single-link price."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hardware_models.collectives import collective_cost, group_link
from hardware_models.node import CrossNodeLink
from hardware_models.op_request import OperatorRequest
from hardware_models.presets import load_gpu, load_node
from simulator.engine.step_cost import StepCostModel
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import SHARED_DATA, needs_shared_data, scenario_dict

MiB = 2**20


def _busbw(seconds: float, nbytes: float, p: int) -> float:
    """nccl-tests' all-reduce bus bandwidth, GB/s."""
    return 2 * (p - 1) / p * nbytes / seconds / 1e9


def test_a_16_gpu_all_reduce_over_two_dgx_h100_runs_near_the_rails_aggregate():
    """NCCL over 2 x 8 H100 with 8 NDR NICs a node: each ring leaves a node through its
    own NIC, so the bus bandwidth is ~8 x 45 GB/s, not one NIC's 45 (the flat ring gave
    11,365 us for 256 MiB, 44 GB/s). Published nccl-tests: 400-450 GB/s for 8 GB+
    (docs/ARCHITECTURE.md, *Collectives across nodes*)."""
    gpu, node = load_gpu("h100-sxm"), load_node("dgx-h100")
    link = group_link(node, gpu, 16)
    assert isinstance(link, CrossNodeLink) and link.gpus_per_node == 8
    big = collective_cost("all_reduce", 256 * MiB, 16, link).seconds
    assert 300 < _busbw(big, 256 * MiB, 16) < 450
    inside = collective_cost("all_reduce", 256 * MiB, 8, group_link(node, gpu, 8)).seconds
    assert inside < big < 1.25 * inside
    # Small messages: NCCL's tree, 2 x (7 NVLink hops + 1 network hop), not 30 ring hops.
    small = collective_cost("all_reduce", 16 * 1024, 16, link)
    assert small.overhead_seconds == pytest.approx(2 * (7 * 3.0 + 6.0) * 1e-6)


def test_groups_inside_a_node_keep_the_node_link_and_its_fit():
    gpu, node = load_gpu("h100-sxm", "h100-sxm"), load_node("dgx-h100")
    for p in (2, 4, 8):
        assert group_link(node, gpu, p) == gpu.efficiency.link_for(p, node.intra_node_link)
    single = load_node("rtx4090-workstation")  # one GPU a node: every hop is the network's
    assert group_link(single, load_gpu("rtx-4090"), 2) == single.inter_node_link


def test_an_all_to_all_across_nodes_sends_only_the_other_nodes_share_over_the_rails():
    node = load_node("dgx-h100")
    link = CrossNodeLink(node.intra_node_link, node.inter_node_link, 8)
    nbytes, p = 64 * MiB, 16
    cost = collective_cost("all_to_all", nbytes, p, link)
    remote = (p - 8) / p * nbytes / node.inter_node_link.bytes_per_second
    assert cost.memory_seconds == pytest.approx(remote)
    flat = collective_cost("all_to_all", nbytes, p, node.inter_node_link)
    assert cost.seconds < 0.6 * flat.seconds


def test_roofline_prices_a_group_as_the_engine_does():
    gpu, node = load_gpu("h100-sxm", "h100-sxm"), load_node("dgx-h100")
    cost = StepCostModel(load_model("llama-3.1-405b"), gpu, node, tp=16)
    assert cost.tp_link == group_link(node, gpu, 16)
    asked = OperatorRequest(op="all_reduce", gpus=16, bytes=256 * MiB).price(gpu, node)
    assert asked == collective_cost("all_reduce", 256 * MiB, 16, cost.tp_link)


def test_a_dp_gather_across_nodes_takes_one_rail_per_rank_a_node():
    """tp=8 x dp=2 MoE: the dispatch gathers over the dp group, one rank on each node
    (8 GPUs apart), so nothing of it runs over NVLink: the network link's price."""
    gpu, node = load_gpu("h200-sxm"), load_node("hgx-h200")
    cost = StepCostModel(load_model("deepseek-v3"), gpu, node, tp=8, dp=2,
                         weight_dtype="fp8_block")  # fmt: skip
    assert isinstance(cost.ep_link, CrossNodeLink) and cost.ep_link.gpus_per_node == 1
    gather = collective_cost("all_gather", 8 * MiB, 2, cost.ep_link).seconds
    flat = collective_cost("all_gather", 8 * MiB, 2, node.inter_node_link).seconds
    assert gather == pytest.approx(flat)


@needs_shared_data
def test_the_rail_model_follows_measured_two_node_a100_all_reduces():
    """vidur's DGX A100 network profile: links fitted where each runs alone (g of g in a
    node; 2 GPUs, one a node), groups of 4 GPUs a node over 2 nodes predicted: 13% MAPE
    (flat ring at the network rate: 228%; benchmarks/cross_node_allreduce.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from cross_node_allreduce import TABLE, compare, measured_rows

    rows = measured_rows(SHARED_DATA / TABLE.relative_to("../shared/data"))
    table = compare(rows, 2**20).set_index("gpus")
    assert table.loc[8, "rail_mape_%"] < 20 < 200 < table.loc[8, "flat_mape_%"]
    assert (table["rail_mape_%"] < table["flat_mape_%"]).all()


def test_a_run_records_the_links_it_assumed():
    """summary.json provenance.links: each group's links, their figures and whether
    they are the node preset's or a calibration profile's fit; none for one GPU."""

    def links(**sections):
        scenario = Scenario.from_dict(scenario_dict(workload={"num_requests": 4}, **sections))
        return simulate(scenario).summary()["provenance"].get("links")

    assert links() is None
    recorded = links(
        hardware={"gpu": "h100-sxm", "calibration": "h100-sxm"},
        model={"name": "llama-3.1-70b", "weight_dtype": "bf16"},
        parallelism={"tp": 8, "pp": 2},
    )
    by_group = {r["group"]: r for r in recorded}
    assert set(by_group) == {"tp", "pp_handoff"}
    tp = by_group["tp"]
    assert tp["intra"]["kind"] == "nvswitch" and "inter" not in tp
    assert tp["intra"]["source"].startswith("calibration: h100-sxm")
    handoff = by_group["pp_handoff"]["inter"]
    assert handoff == {"kind": "infiniband", "bandwidth_gbps": 50.0, "latency_us": 6.0,
                       "efficiency": 0.9, "source": "node preset dgx-h100"}  # fmt: skip
    spanning = links(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-405b", "weight_dtype": "fp8"},
        parallelism={"tp": 16},
    )
    (tp16,) = spanning
    assert tp16["gpus"] == 16 and tp16["gpus_per_node"] == 8
    assert tp16["intra"]["kind"] == "nvswitch" and tp16["inter"]["kind"] == "infiniband"
