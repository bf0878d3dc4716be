"""Pipeline stages of any layer count, split as vLLM's get_pp_indices splits them."""

import pytest

from hardware_models.collectives import collective_cost
from hardware_models.presets import load_gpu, load_node
from simulator.build import build_replica
from simulator.engine.step_cost import StepCostModel
from simulator.memory_planner import plan_memory, stage_layers
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
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


def test_only_the_hand_offs_between_nodes_cross_them():
    """tp=4 x pp=4 over 8-GPU nodes: stages 0-1 on one node, 2-3 on the next, so of the
    three hand-offs one crosses nodes; each tp rank sends its quarter of the hidden states
    and the residual to the same rank of the next stage (a send/recv priced on the link's
    own terms: the calibrated link efficiencies are all-reduce fits), and the receiving
    stage all-gathers both over its tensor-parallel link."""
    arch, gpu, node = load_model("llama-3.1-70b"), load_gpu("h100-sxm"), load_node("dgx-h100")
    assert node.gpus_per_node == 8 and node.inter_node_link is not None

    def step(pp: int) -> float:
        cost = StepCostModel(arch, gpu, node, tp=4, pp=pp)
        return cost.step(decode_seqs=32, decode_context=32 * 1000).gpu_seconds

    hidden = 32 * arch.hidden_size * 2  # the bf16 activations of 32 tokens
    launch = gpu.efficiency.launch_overhead_graph_us * 1e-6  # a kernel's, CUDA graphs on
    sends = [collective_cost("send_recv", hidden / 4, 2, link)
             for link in (node.intra_node_link, node.inter_node_link)]  # fmt: skip
    gather = collective_cost("all_gather", hidden, 4, node.intra_node_link)
    # Two tensors (hidden states and residual), each sent and gathered in calls of its own.
    seconds = 2 * sum(send.seconds + send.kernels * launch for send in sends)
    seconds += 2 * 2 * (gather.seconds + gather.kernels * launch)
    # pp=2 -> pp=4 adds one hand-off inside the first node and one across nodes.
    assert step(4) - step(2) == pytest.approx(seconds, rel=1e-9)


@pytest.mark.parametrize(("norm", "tensors"), [("rmsnorm", 2), ("layernorm", 1)])
def test_a_hand_off_sends_slices_and_gathers_them_as_vllm(norm, tensors):
    """vLLM V1's send_tensor_dict(all_gather_group=tp group): each rank sends 1/tp of the
    intermediate tensors (hidden states, and the residual of RMSNorm models), the next
    stage all-gathers them; with tp=1 the whole tensors go."""
    arch = load_model("llama-3.1-8b").model_copy(update={"norm": norm})
    node = load_node("l40s-8x-pcie")
    nbytes = 512 * arch.hidden_size * 2
    for tp in (1, 2, 4):
        model = StepCostModel(arch, load_gpu("l40s"), node, tp=tp, pp=2)
        ((link, count, first, receiving),) = model.handoffs
        assert (count, first, receiving) == (1, 0, tp)
        parts = model._hand_off(nbytes, link, first, receiving)
        send, times = parts[0]
        assert times == tensors  # a call a tensor
        expected = collective_cost("send_recv", nbytes / tp, 2 * tp, link)
        assert send.seconds == pytest.approx(expected.seconds)
        if tp == 1:
            assert len(parts) == 1
            continue
        # Elements that do not split over the ranks go whole, ungathered (vLLM's
        # `tensor.numel() % all_gather_size == 0` test).
        ((whole, sends),) = model._hand_off(3 * 2, link, first, receiving)
        assert sends == tensors
        assert whole.seconds == pytest.approx(
            collective_cost("send_recv", 3 * 2, 2 * tp, link).seconds
        )
        ((gather, gathers),) = parts[1:]
        assert gathers == tensors
        assert gather.seconds == pytest.approx(
            collective_cost("all_gather", nbytes, tp, model.tp_link, first_gpu=tp).seconds
        )


def test_each_stage_plans_its_all_reduce_where_its_gpus_sit():
    """On a PCIe tree of 3 GPUs a switch, tp=2 x pp=3 puts stage 1 on GPUs 2-3, across a
    switch: no peer access there, so its layers' all-reduces go to NCCL while stages 0
    (GPUs 0-1) and 2 (GPUs 4-5) keep vLLM's custom kernel; each plan prices the layers of
    its stages (vLLM's get_pp_indices split)."""
    base = load_node("l40s-8x-pcie")
    fabric = base.intra_node_link.fabric.model_copy(
        update={"gpus_per_switch": 3, "gpus_per_socket": 3}
    )
    link = base.intra_node_link.model_copy(update={"fabric": fabric})
    node = base.model_copy(update={"gpus_per_node": 6, "intra_node_link": link})
    arch, gpu = load_model("llama-3.1-8b"), load_gpu("l40s")
    cost = StepCostModel(arch, gpu, node, tp=2, pp=3)
    (peer, peer_layers), (nccl, nccl_layers) = cost.stage_all_reduces
    layers = [len(r) for r in stage_layers(arch, 3)]
    assert (peer_layers, nccl_layers) == (layers[0] + layers[2], layers[1])
    small = 8 * arch.hidden_size * 2
    assert peer.path(small).value == "custom_one_shot" and nccl.path(small).value == "nccl"
    note = cost.all_reduce_note()
    assert f"{layers[1]} of {arch.num_layers} layers: tp=2 all-reduce: NCCL" in note
    # One plan per replica where every stage's group sits alike: the price of before.
    aligned = StepCostModel(arch, gpu, base, tp=2, pp=2)
    assert [n for _, n in aligned.stage_all_reduces] == [arch.num_layers]
