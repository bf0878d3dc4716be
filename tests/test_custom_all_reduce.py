"""The tensor-parallel all-reduce as vLLM dispatches it: which backend each size takes on
which machine, what each costs (hand-worked), the switches, and a TP8 decode step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from hardware_models.calibration_lookup import choose_calibration
from hardware_models.collectives import collective_cost
from hardware_models.custom_all_reduce import (
    FUSION_NOT_MODELLED,
    TWO_SHOT_FENCE_US,
    AllReducePath,
    MiB,
    TpAllReduce,
)
from hardware_models.dtypes import Dtype
from hardware_models.efficiency import CollectiveFit
from hardware_models.errors import InfeasibleError
from hardware_models.node import PCIE_P2P_HOP_US
from hardware_models.presets import load_gpu, load_node
from simulator.build import build_replica
from simulator.engine.step_cost import StepCostModel
from simulator.model_catalog import load_model

KiB = 1024
L40S_NODE = Path(__file__).resolve().parents[1] / "hardware_models/presets/nodes/l40s-8x-pcie.yaml"
ONE_SHOT, TWO_SHOT = AllReducePath.CUSTOM_ONE_SHOT, AllReducePath.CUSTOM_TWO_SHOT
MULTIMEM, NCCL = AllReducePath.SYMM_MEM_MULTIMEM, AllReducePath.NCCL


def plan(node_name: str, tp: int, **options) -> TpAllReduce:
    node = load_node(node_name)
    gpu = load_gpu(node.gpu)
    return TpAllReduce.plan(gpu, node, tp, node.intra_node_link, **options)


def test_eight_h100s_on_nvswitch_take_the_custom_one_shot_kernel_for_small_tensors() -> None:
    tp8 = plan("dgx-h100", 8)
    assert tp8.path(16 * KiB) == ONE_SHOT  # one Llama-70B token: 8192 x bf16
    assert tp8.path(256 * KiB - 16) == ONE_SHOT
    # vLLM caps the custom kernel at 256 KiB for 8 Hopper GPUs once symmetric memory is
    # up (strictly below), and hands larger tensors to torch's multimem all-reduce.
    assert tp8.path(256 * KiB) == MULTIMEM
    assert tp8.path(64 * MiB) == MULTIMEM
    assert tp8.path(64 * MiB + 16) == NCCL
    assert tp8.path(16 * KiB + 8) == MULTIMEM  # not a multiple of 16 bytes: not custom


def test_without_symmetric_memory_the_custom_kernel_goes_two_shot_up_to_8_mib() -> None:
    tp8 = plan("dgx-h100", 8, symm_mem=False)
    assert tp8.path(255 * KiB) == ONE_SHOT
    assert tp8.path(256 * KiB) == TWO_SHOT
    assert tp8.path(8 * MiB - 16) == TWO_SHOT
    assert tp8.path(8 * MiB) == NCCL
    tp4 = plan("dgx-a100", 4)  # Ampere: no symmetric memory; one-shot below 512 KiB
    assert (tp4.path(511 * KiB), tp4.path(512 * KiB)) == (ONE_SHOT, TWO_SHOT)
    assert plan("dgx-a100", 2).path(8 * MiB - 16) == ONE_SHOT  # two GPUs: always one-shot


def test_blackwell_and_fp16_follow_vllms_tables() -> None:
    b200 = plan("hgx-b200", 8)
    assert [b200.path(n) for n in (128 * KiB, 512 * KiB, MiB, 128 * MiB, 256 * MiB)] == [
        ONE_SHOT,
        TWO_SHOT,
        MULTIMEM,
        MULTIMEM,
        NCCL,
    ]
    assert plan("hgx-b200", 4).path(4 * MiB) == AllReducePath.SYMM_MEM_TWO_SHOT
    # Symmetric memory takes bf16 tensors only, but once started it still lowers the
    # custom kernel's limit: an fp16 tensor of 256 KiB or more goes to NCCL.
    fp16 = plan("dgx-h100", 8, activation_dtype=Dtype.FP16)
    assert (fp16.path(128 * KiB), fp16.path(256 * KiB), fp16.path(MiB)) == (ONE_SHOT, NCCL, NCCL)


def test_pcie_gpus_take_the_custom_kernel_only_as_a_peer_access_pair() -> None:
    assert {plan("l40s-8x-pcie", tp).path(64 * KiB) for tp in (4, 8)} == {NCCL}
    pair = plan("l40s-8x-pcie", 2)  # switch neighbours with P2P
    assert (pair.path(MiB), pair.path(8 * MiB - 16), pair.path(8 * MiB)) == (
        ONE_SHOT,
        ONE_SHOT,
        NCCL,
    )
    node = load_node("l40s-8x-pcie")
    fabric = node.intra_node_link.fabric.model_copy(update={"p2p": False})
    no_p2p = node.model_copy(
        update={"intra_node_link": node.intra_node_link.model_copy(update={"fabric": fabric})}
    )
    blocked = TpAllReduce.plan(load_gpu("l40s"), no_p2p, 2, no_p2p.intra_node_link)
    assert blocked.path(MiB) == NCCL
    assert "peer access" in blocked.describe(16 * KiB)


def _with_link(node_name: str, **update):
    node = load_node(node_name)
    link = node.intra_node_link.model_copy(update=update)
    return node.model_copy(update={"intra_node_link": link})


@pytest.mark.parametrize("kind", ["ethernet", "infiniband"])
def test_a_network_link_inside_a_node_runs_nccl_not_a_peer_kernel(kind: str) -> None:
    """Regression: a node whose own link is a network (no peer access) crashed tp=2
    runs looking up the peer kernel's flag latency for that link kind."""
    node = _with_link("l40s-8x-pcie", kind=kind, fabric=None)
    pair = TpAllReduce.plan(load_gpu("l40s"), node, 2, node.intra_node_link)
    assert {pair.path(n) for n in (16 * KiB, MiB)} == {NCCL}
    assert pair.cost(16 * KiB).seconds > 0
    assert f"peer access, which the node's {kind} link has not" in pair.describe(16 * KiB)
    with pytest.raises(InfeasibleError, match=f"a {kind} link has not"):
        pair.cost(16 * KiB, ONE_SHOT)  # forcing the peer kernel: a clear error
    model = StepCostModel(load_model("llama-3.1-8b"), load_gpu("l40s"), node, tp=2)
    assert model.step(decode_seqs=8, decode_context=8 * 512).seconds > 0


def test_a_pcie_link_without_a_fabric_is_not_assumed_to_allow_peer_access() -> None:
    """vLLM tests P2P at start-up and consumer cards fail it; a PCIe link that does not
    describe its tree says nothing of peer access, so NCCL runs."""
    bare = _with_link("l40s-8x-pcie", fabric=None)
    pair = TpAllReduce.plan(load_gpu("l40s"), bare, 2, bare.intra_node_link)
    assert pair.path(16 * KiB) == NCCL
    assert "does not describe it (intra_node_link.fabric.p2p)" in pair.describe(16 * KiB)


def test_the_line_names_the_unmodelled_fusion_on_hopper_and_blackwell_only() -> None:
    for node, tp in (("dgx-h100", 8), ("hgx-b200", 4)):
        assert plan(node, tp).describe(16 * KiB).endswith(FUSION_NOT_MODELLED)
    for node, tp in (("dgx-a100", 8), ("l40s-8x-pcie", 2), ("mi300x-8x", 8)):
        assert FUSION_NOT_MODELLED not in plan(node, tp).describe(16 * KiB)


def test_the_symmetric_memory_off_reason_is_said_once_and_not_on_rocm() -> None:
    reason = "symmetric memory: needs Hopper/Blackwell with NVSwitch"
    assert reason in plan("dgx-a100", 8).describe(16 * KiB)  # Ampere
    assert reason in plan("l40s-8x-pcie", 2).describe(16 * KiB)  # no NVSwitch
    assert "symmetric memory" not in plan("mi300x-8x", 8).describe(16 * KiB)
    assert "symmetric memory" not in plan("mi300x-8x", 8, symm_mem=False).describe(16 * KiB)


def test_unsupported_groups_and_the_switches_fall_back_to_nccl() -> None:
    assert plan("dgx-h100", 3).path(16 * KiB) == NCCL  # custom: 2, 4, 6 or 8 GPUs
    node = load_node("dgx-h100")
    across = TpAllReduce.plan(load_gpu("h100-sxm"), node, 16, node.inter_node_link)
    assert across.path(16 * KiB) == NCCL
    assert "spans nodes" in across.describe(16 * KiB)
    off = plan("dgx-h100", 8, custom=False, symm_mem=False)
    assert {off.path(n) for n in (16 * KiB, MiB, 64 * MiB)} == {NCCL}


def test_the_one_shot_cost_hand_worked() -> None:
    """16 KiB on 8 H100s: 1,024 vectors of 16 bytes in 2 blocks of 512 threads, one pass;
    the pass waits one peer round trip (2 x 0.6 us) rather than 7 x 16 KiB at 0.8 x 450
    GB/s (0.32 us); the start and end barriers are a hop each; plus the kernel floor."""
    tp8 = plan("dgx-h100", 8)
    floor = load_gpu("h100-sxm").efficiency.kernel_floor_us
    cost = tp8.cost(16 * KiB)
    assert cost.seconds == pytest.approx((floor + 1.2 + 1.2) * 1e-6, rel=1e-12)
    assert cost.kernels == 1
    # 4 MiB: 262,144 vectors over 36 x 512 threads = 15 passes (18 us of round trips),
    # against 7 x 4 MiB at 360 GB/s = 81.6 us: bandwidth-bound.
    big = tp8.cost(4 * MiB, ONE_SHOT)
    assert big.seconds == pytest.approx((floor + 1.2) * 1e-6 + 7 * 4 * MiB / 360e9, rel=1e-12)


def test_a_pcie_pairs_flags_are_peer_to_peer_hops_as_nccls_between_switch_neighbours() -> None:
    """16 KiB on two L40S switch neighbours: one pass, its peer round trip two P2P hops
    (1.1 us) rather than 16 KiB at 0.70 x 31.5 GB/s (0.74 us); a barrier a hop each.
    The flag and NCCL's LL hop between the same two GPUs are one figure."""
    pair = plan("l40s-8x-pcie", 2)
    assert load_node("l40s-8x-pcie").intra_node_link.latency_us == PCIE_P2P_HOP_US == 0.55
    floor = load_gpu("l40s").efficiency.kernel_floor_us
    cost = pair.cost(16 * KiB)
    assert cost.seconds == pytest.approx((floor + 4 * PCIE_P2P_HOP_US) * 1e-6, rel=1e-12)
    big = pair.cost(4 * MiB)  # bandwidth-bound: the barriers alone are fixed
    rate = 31.5e9 * 0.70
    assert big.seconds == pytest.approx((floor + 1.1) * 1e-6 + 4 * MiB / rate, rel=1e-12)


def test_a_pcie_pairs_flag_hop_is_its_nodes_link_latency(tmp_path) -> None:
    """A node whose PCIe peer-to-peer hop is 0.9 us (another switch) moves the custom
    kernel's flags as it moves NCCL's LL hops: 16 KiB on the pair takes 4 such hops
    (two barriers, one peer round trip), 4 x 0.35 us more than on the preset."""
    data = yaml.safe_load(L40S_NODE.read_text())
    data["name"], data["intra_node_link"]["latency_us"] = "slow-switch", 0.9
    path = tmp_path / "slow-switch.yaml"
    path.write_text(yaml.safe_dump(data))
    node = load_node(str(path))
    slow = TpAllReduce.plan(load_gpu("l40s"), node, 2, node.intra_node_link)
    preset = plan("l40s-8x-pcie", 2)
    assert slow.path(16 * KiB) == ONE_SHOT
    extra = slow.cost(16 * KiB).seconds - preset.cost(16 * KiB).seconds
    assert extra == pytest.approx(4 * (0.9 - 0.55) * 1e-6, rel=1e-9)
    nccl = collective_cost("all_reduce", 16 * KiB, 2, node.intra_node_link)
    assert nccl.seconds > collective_cost("all_reduce", 16 * KiB, 2, preset.link).seconds


def test_the_two_shot_and_multimem_costs_hand_worked() -> None:
    """1 MiB on 8 A100s: each stage reads 7 parts of 128 KiB at 0.78 x 300 GB/s (3.92
    us, more than one 1.2 us round trip), two stages, plus the fence. On 8 H100s torch's
    multimem moves 1 MiB x (1 + 1/8) at 360 GB/s, and copies the tensor in and out."""
    a100 = load_gpu("a100-80gb-sxm")
    stage = 7 * 128 * KiB / (300e9 * 0.78)
    fixed = (a100.efficiency.kernel_floor_us + 1.2 + TWO_SHOT_FENCE_US) * 1e-6
    assert plan("dgx-a100", 8).cost(MiB).seconds == pytest.approx(fixed + 2 * stage, rel=1e-12)
    h100 = load_gpu("h100-sxm")
    eff = h100.efficiency
    copy = eff.kernel_floor_us * 1e-6 + 2 * MiB / (h100.memory_bandwidth * eff.memory_bandwidth)
    multimem = plan("dgx-h100", 8).cost(MiB)
    expected = (eff.kernel_floor_us + 1.2) * 1e-6 + 1.125 * MiB / 360e9 + 2 * copy
    assert multimem.seconds == pytest.approx(expected, rel=1e-12)
    assert multimem.kernels == 3
    # Outside a CUDA graph the custom kernel first copies the input into its buffer.
    eager = plan("dgx-h100", 8, cuda_graphs=False).cost(16 * KiB)
    copy_16k = eff.kernel_floor_us * 1e-6 + 32 * KiB / (
        h100.memory_bandwidth * eff.memory_bandwidth
    )
    assert eager.seconds == pytest.approx(plan("dgx-h100", 8).cost(16 * KiB).seconds + copy_16k)
    assert eager.kernels == 2


def test_nccl_keeps_the_profiles_fit_and_the_peer_kernels_the_links_own_figures() -> None:
    """A calibration's NCCL fit prices NCCL calls only: changing it moves the NCCL path
    and leaves the custom kernel's price alone."""
    gpu = choose_calibration(load_gpu("h100-sxm"), "h100-sxm").gpu
    node = load_node("dgx-h100")
    fitted = gpu.efficiency.link_for(8, node.intra_node_link)
    assert fitted != node.intra_node_link  # the shipped profile has an 8-GPU fit
    tp8 = TpAllReduce.plan(gpu, node, 8, fitted)
    assert tp8.cost(128 * MiB) == collective_cost("all_reduce", 128 * MiB, 8, fitted)
    slow = CollectiveFit(latency_us=50.0, efficiency=0.1, fitted_over=fitted.signature())
    profile = gpu.efficiency.model_copy(update={"collective_by_gpus": {8: slow}})
    slow_gpu = gpu.with_efficiency(profile)
    slow_tp8 = TpAllReduce.plan(slow_gpu, node, 8, profile.link_for(8, node.intra_node_link))
    assert slow_tp8.cost(16 * KiB) == tp8.cost(16 * KiB)
    assert slow_tp8.cost(128 * MiB).seconds > 5 * tp8.cost(128 * MiB).seconds


def test_a_tp8_h100_llama70b_decode_step_sheds_the_nccl_latency_of_its_160_all_reduces() -> None:
    gpu = choose_calibration(load_gpu("h100-sxm")).gpu
    node, arch = load_node("dgx-h100"), load_model("llama-3.1-70b")
    vllm = StepCostModel(arch, gpu, node, tp=8)
    nccl = StepCostModel(arch, gpu, node, tp=8, custom_all_reduce=False, symm_mem_all_reduce=False)
    row = 8192 * 2
    for batch in (1, 8):
        saved = (
            2
            * 80
            * (
                nccl.tp_all_reduce.cost(batch * row).seconds
                - vllm.tp_all_reduce.cost(batch * row).seconds
            )
        )
        before = nccl.decode_steps(batch).one(batch * 2000)
        after = vllm.decode_steps(batch).one(batch * 2000)
        assert before.gpu_seconds - after.gpu_seconds == pytest.approx(saved, rel=1e-9)
        assert saved > 1.5e-3  # NCCL's ~17 us tree latency against ~5 us one-shot, x 160
    assert vllm.all_reduce_note() == (
        "tp=8 all-reduce: custom one-shot below 256 KiB (16 tokens), symm-mem multimem up "
        f"to 64 MiB (4096 tokens), NCCL above; {FUSION_NOT_MODELLED}"
    )
    # Both switches off: the NCCL-only pricing of before, to the bit.
    assert math.isclose(nccl.tp_all_reduce.cost(row).seconds, collective_cost(
        "all_reduce", row, 8, gpu.efficiency.link_for(8, node.intra_node_link)
    ).seconds, rel_tol=0)  # fmt: skip


def test_the_scenario_switches_reach_the_step_and_the_run_names_its_backend(
    make_scenario,
) -> None:
    tp2 = build_replica(make_scenario(parallelism={"tp": 2}))
    assert tp2.info.all_reduce.startswith("tp=2 all-reduce: custom one-shot below 8 MiB")
    off = build_replica(make_scenario(parallelism={"tp": 2, "disable_custom_all_reduce": True}))
    assert off.info.all_reduce == (
        "tp=2 all-reduce: NCCL (symmetric memory: needs Hopper/Blackwell with NVSwitch; "
        "custom all-reduce disabled)"
    )
    assert off.cost.tp_all_reduce.path(4096 * 2) == NCCL
    assert build_replica(make_scenario()).info.all_reduce is None  # one GPU: nothing to say


def test_a_bad_switch_is_a_one_line_error_naming_the_field(make_scenario) -> None:
    from hardware_models.errors import InfersimError

    with pytest.raises(InfersimError, match=r"parallelism\.disable_custom_all_reduce"):
        make_scenario(parallelism={"disable_custom_all_reduce": "sometimes"})


def test_a_tensor_parallel_run_says_which_backend_in_its_summary_and_terminal(
    make_scenario,
) -> None:
    from simulator.display import summary_html
    from simulator.metrics.terminal import summary_table
    from simulator.simulation import simulate

    workload = {**make_scenario().workload.model_dump(), "num_requests": 20}
    summary = simulate(make_scenario(parallelism={"tp": 2}, workload=workload)).summary()
    assert summary["run"]["all_reduce"] == [
        "a100-80gb-sxm: tp=2 all-reduce: custom one-shot below 8 MiB (1024 tokens), NCCL "
        "above (symmetric memory: needs Hopper/Blackwell with NVSwitch)"
    ]
    assert "all-reduce  a100-80gb-sxm: tp=2 all-reduce: custom one-shot" in summary_table(summary)
    html = summary_html(summary)
    assert "<b>All-reduce:</b> a100-80gb-sxm: tp=2 all-reduce: custom one-shot" in html
    one_gpu = simulate(make_scenario(workload=workload)).summary()
    assert "all_reduce" not in one_gpu["run"]  # a one-GPU summary is as before
    assert "All-reduce" not in summary_html(one_gpu)


def test_a_size_limit_between_two_token_counts_reads_as_such():
    """DeepSeek-V3's 7,168-wide rows put 256 KiB between 18 and 19 tokens: the run's
    all-reduce line says up to 18 (tokens are whole; it said ~18.3)."""
    from hardware_models.custom_all_reduce import _size

    assert _size(256 * 1024, 7168 * 2) == "256 KiB (up to 18 tokens)"
    assert _size(256 * 1024, 8192 * 2) == "256 KiB (16 tokens)"
