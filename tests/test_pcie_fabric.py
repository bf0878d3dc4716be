"""Collectives over a shared PCIe tree (hardware_models/pcie_fabric.py): the share of
the link rate a collective's flows leave each GPU, the call latency and chain tree NCCL
uses inside a node, the fit of such a link, and the node YAML's field errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from hardware_models.calibration.fit_links import fit_link
from hardware_models.calibration.profile_file import read_profile, write_profile
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.validate import predict_all
from hardware_models.collectives import (
    LL_BASE_US,
    LL_DATA_FRACTION,
    SIMPLE_BASE_US,
    SIMPLE_HOP_US,
    collective_cost,
)
from hardware_models.efficiency import CollectiveFit, EfficiencyProfile
from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.node import HOST_READ_US, LinkSpec, PcieFabric
from hardware_models.pcie_fabric import (
    all_to_all_flows,
    fabric_share,
    flow_rate_gbps,
    staged_hops,
)
from hardware_models.presets import load_gpu, load_node
from tests.conftest import needs_shared_data

PRESETS = Path(__file__).resolve().parents[1] / "hardware_models/presets"
L40S_NODE = PRESETS / "nodes/l40s-8x-pcie.yaml"
L40S_PROFILE = PRESETS / "calibrations/l40s.yaml"


def _fabric(**changes) -> PcieFabric:
    base = {
        "gpus_per_switch": 2,
        "gpus_per_socket": 4,
        "p2p": True,
        "switch_uplink_gbps": 32.0,
        "host_memory_gbps": 40.0,
        "inter_socket_gbps": 22.0,
        "host_read_us": 1.0,
    }
    return PcieFabric(**{**base, **changes})


def _link(fabric: PcieFabric | None) -> LinkSpec:
    return LinkSpec(kind="pcie", bandwidth_gbps=32.0, latency_us=1.0, efficiency=0.5, fabric=fabric)


def test_switch_neighbours_with_p2p_get_the_whole_link() -> None:
    assert fabric_share(_link(_fabric()), "ring", 2) == 1.0


def test_staged_hops_share_the_sockets_memory_and_the_ring_slows_as_it_spans_more() -> None:
    link = _link(_fabric())
    # 4 GPUs on two switches of one socket: two hops staged, each written and read.
    assert fabric_share(link, "ring", 4) == pytest.approx((40.0 / 4) / 32.0)
    # Without P2P every hop is staged: 2 GPUs put 4 loads on memory and 2 on the uplink.
    no_p2p = _link(_fabric(p2p=False))
    assert fabric_share(no_p2p, "ring", 2) == pytest.approx((40.0 / 4) / 32.0)
    # A slow CPU link caps the 8-GPU ring, whose two crossings carry one flow each way.
    slow_cpu = _link(_fabric(inter_socket_gbps=4.0))
    assert fabric_share(slow_cpu, "ring", 8) == pytest.approx(4.0 / 32.0)
    assert fabric_share(slow_cpu, "ring", 4) == pytest.approx((40.0 / 4) / 32.0)


def test_an_all_to_alls_flows_split_every_resource_they_cross() -> None:
    fabric = _fabric(host_memory_gbps=1e6, switch_uplink_gbps=1e6, inter_socket_gbps=1e6)
    # Fabric unlimited: each GPU's link splits over its p - 1 flows, the full rate in all.
    assert flow_rate_gbps(32.0, fabric, all_to_all_flows(4)) == pytest.approx(32.0 / 3)
    assert fabric_share(_link(fabric), "all_to_all", 4) == pytest.approx(1.0)
    # The real fabric: 8 GPUs' all-to-all crosses sockets with 16 flows each way.
    assert fabric_share(_link(_fabric()), "all_to_all", 8) < fabric_share(
        _link(_fabric()), "ring", 8
    )


def test_a_fabric_link_runs_the_faster_of_nccls_pcie_protocols_and_a_chain_tree() -> None:
    link = _link(_fabric())
    p = 4
    share = fabric_share(link, "ring", p)

    def ring(nbytes: float) -> tuple[float, float]:
        """(LL, Simple) seconds of an all-reduce ring, by NCCL's tuning model on PCI."""
        wire = 2 * (p - 1) / p * nbytes / (32e9 * 0.5 * share)
        # 6 LL hops of 1 us, 3 of them staged in host memory (1 us more each).
        ll = LL_BASE_US * 1e-6 + (2 * (p - 1) + 3) * 1e-6 + wire / LL_DATA_FRACTION
        simple = (SIMPLE_BASE_US + 2 * (p - 1) * SIMPLE_HOP_US) * 1e-6 + wire
        return ll, simple

    small, large = ring(4096.0), ring(2.0**26)
    assert small[0] < small[1] and large[1] < large[0]  # LL for small, Simple for large
    for nbytes, want in ((4096.0, small[0]), (2.0**26, large[1])):
        assert collective_cost("all_reduce", nbytes, p, link).seconds == pytest.approx(want)
    latency = collective_cost("all_reduce", 4096.0, p, link).overhead_seconds
    assert latency == pytest.approx(LL_BASE_US * 1e-6 + (2 * (p - 1) + 3) * 1e-6)
    # The in-node tree is a chain, priced when asked for; `auto` runs the ring, as
    # NCCL's tuner does on one PCIe node. The chain moves the whole buffer each way.
    for nbytes in (8, 2.0**26):
        assert collective_cost("all_reduce", nbytes, 8, link).seconds == pytest.approx(
            collective_cost("all_reduce", nbytes, 8, link, "ring").seconds
        )
    assert collective_cost("all_reduce", 2.0**26, 8, link, "tree").seconds > (
        collective_cost("all_reduce", 2.0**26, 8, link, "ring").seconds
    )
    # Without a fabric nothing changes: the plain alpha-beta ring/tree.
    plain = _link(None)
    nbytes = 2.0**24
    assert collective_cost("all_reduce", nbytes, 2, plain).seconds == pytest.approx(
        2e-6 + nbytes / (32e9 * 0.5)
    )


def test_staged_hops_count_host_memory_hops_on_the_slowest_path() -> None:
    link = _link(_fabric())  # a switch per 2 GPUs, a socket per 4
    assert staged_hops(link, "ring", 2, 2) == 0  # switch neighbours: peer to peer
    assert staged_hops(link, "ring", 2, 2, first_gpu=1) == 2  # GPUs 1, 2: two switches
    # A ring of 4 alternates peer-to-peer and staged hops: an all-reduce's 6 hops in a
    # row cross 3 staged ones; an all-gather's 3 hops, from the worst start, 2.
    assert staged_hops(link, "ring", 4, 6) == 3
    assert staged_hops(link, "ring", 4, 3) == 2
    assert staged_hops(link, "ring", 8, 14) == 7
    # NCCL's in-node chain 0-1-2-3, down and back: one staged link, crossed twice.
    assert staged_hops(link, "chain", 4, 6) == 2
    # Flows that run at once wait for one hop, staged if any is.
    assert staged_hops(link, "all_to_all", 4, 3) == 1
    assert staged_hops(link, "pair", 2, 1) == 0
    assert staged_hops(link, "pair", 8, 1) == 1
    # Without P2P, or with every GPU on its own root port, every hop is staged.
    assert staged_hops(_link(_fabric(p2p=False)), "ring", 2, 2) == 2
    single = _fabric(gpus_per_switch=1)
    assert staged_hops(_link(single), "ring", 4, 6) == 6
    assert staged_hops(_link(None), "ring", 8, 14) == 0


def test_a_staged_ll_hop_adds_the_host_read_and_a_peer_hop_does_not() -> None:
    slow_reads = _link(_fabric(host_read_us=3.0))
    fast_reads = _link(_fabric(host_read_us=0.0))

    def latency(link: LinkSpec, op: str, p: int) -> float:
        return collective_cost(op, 64, p, link).overhead_seconds

    # Two switch neighbours: peer to peer, the host read never enters.
    assert latency(slow_reads, "all_reduce", 2) == pytest.approx(
        latency(fast_reads, "all_reduce", 2)
    )
    # 8 GPUs: 7 of an all-reduce's 14 hops staged; an all-to-all waits for one.
    assert latency(slow_reads, "all_reduce", 8) - latency(fast_reads, "all_reduce", 8) == (
        pytest.approx(7 * 3e-6)
    )
    assert latency(slow_reads, "all_to_all", 8) - latency(fast_reads, "all_to_all", 8) == (
        pytest.approx(3e-6)
    )


def test_fit_link_recovers_a_fabric_links_latency_and_efficiency() -> None:
    truth = _link(_fabric()).model_copy(update={"latency_us": 2.0, "efficiency": 0.6})
    sizes = 2.0 ** np.arange(10, 29, 2)
    rows = pd.DataFrame(
        [
            {"op_class": "all_reduce", "nbytes": b, "num_gpus": p,
             "measured_s": collective_cost("all_reduce", b, p, truth).seconds}
            for p in (2, 4, 8) for b in sizes
        ]
    )  # fmt: skip
    for p in (2, 4, 8):
        fitted = fit_link(rows[rows["num_gpus"] == p], _link(_fabric()))
        assert fitted.efficiency == pytest.approx(0.6, abs=0.011)
        assert fitted.latency_us == pytest.approx(2.0, rel=0.1)
        assert fitted.fabric == truth.fabric


def test_the_l40s_node_describes_its_pcie_tree() -> None:
    link = load_node("l40s-8x-pcie").intra_node_link
    assert link.fabric is not None and link.fabric.gpus_per_socket * 2 == 8
    shares = [fabric_share(link, "ring", p) for p in (2, 4, 8)]
    assert shares[0] == 1.0 and shares[1] < 1.0 and shares[2] <= shares[1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpus_per_socket": 3}, r"fabric.*gpus_per_socket \(3\) must be a multiple"),
        ({"host_memory_gbps": 0}, r"fabric\.host_memory_gbps"),
        ({"p2p": "sometimes"}, r"fabric\.p2p"),
        ({"host_read_us": -1.0}, r"fabric\.host_read_us"),
        ({"host_read_us": "fast"}, r"fabric\.host_read_us"),
        ({"host_read_us": float("inf")}, r"fabric\.host_read_us"),
    ],
)
def test_a_bad_fabric_is_a_one_line_error_naming_the_field(
    tmp_path: Path, change: dict, message: str
) -> None:
    data = yaml.safe_load(L40S_NODE.read_text())
    data["name"] = "bad-node"
    data["intra_node_link"]["fabric"].update(change)
    path = tmp_path / "bad-node.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InfersimError, match=message) as error:
        load_node(str(path))
    assert "\n" not in str(error.value)


def test_a_fabric_written_before_host_read_us_loads_with_the_sourced_default(
    tmp_path: Path,
) -> None:
    """Node YAMLs and profiles written before the field keep loading: the host read
    takes its default (1.1 us, twice a posted write's 0.55), and a fitted profile written
    from them states it, so its links say what they were fitted over."""
    data = yaml.safe_load(L40S_NODE.read_text())
    assert data["intra_node_link"]["fabric"].pop("host_read_us") == HOST_READ_US == 1.1
    data["name"] = "old-l40s"
    path = tmp_path / "old-l40s.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.warns(InfersimWarning, match=r"intra_node_link\.fabric\.host_read_us"):
        old = load_node(str(path)).intra_node_link
    shipped = load_node("l40s-8x-pcie").intra_node_link
    assert old.fabric.host_read_us == HOST_READ_US
    assert old == shipped and old.signature() == shipped.signature()
    assert collective_cost("all_reduce", 4096, 8, old) == collective_cost(
        "all_reduce", 4096, 8, shipped
    )
    profile = yaml.safe_load(L40S_PROFILE.read_text())
    for record in profile["links"]:
        record["link"]["fabric"].pop("host_read_us")
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(profile))
    written = write_profile(read_profile(tmp_path / "old.yaml"), tmp_path / "new.yaml")
    assert read_profile(written) == read_profile(L40S_PROFILE)
    links = yaml.safe_load(written.read_text())["links"]
    assert [record["link"]["fabric"]["host_read_us"] for record in links] == [1.1] * 3


def _node_before_host_read(tmp_path: Path, **fabric) -> Path:
    """ccaf331's l40s-8x-pcie.yaml: every PCI hop at NCCL's 1.0 us, no host read field
    (`fabric` adds fields to its tree)."""
    data = yaml.safe_load(L40S_NODE.read_text())
    data["intra_node_link"]["fabric"].pop("host_read_us")
    data["intra_node_link"]["fabric"].update(fabric)
    data["name"], data["intra_node_link"]["latency_us"] = "l40s-before", 1.0
    path = tmp_path / f"l40s-before-{len(fabric)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_node_file_without_host_read_us_warns_once_what_latency_us_now_means(
    tmp_path: Path,
) -> None:
    """Its latency_us was every PCI hop's; now a staged hop adds the default host read,
    so 16 KiB over 8 GPUs goes from ccaf331's 28.792 us to 36.492 (the ring's 7 staged
    hops x 1.1). The warning names the field, the default and the two ways back;
    host_read_us: 0 prices as ccaf331's code did. The preset states it: no warning."""
    path = _node_before_host_read(tmp_path)
    pattern = (
        r"intra_node_link\.fabric\.host_read_us is not set: taken as 1\.1 us.*"
        r"latency_us \(1\.0\) now prices a peer-to-peer hop only.*host_read_us: 0"
    )
    with pytest.warns(InfersimWarning, match=pattern) as caught:
        link = load_node(str(path)).intra_node_link
        load_node(str(path))  # read once: one warning
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    cost_us = collective_cost("all_reduce", 16 * 1024, 8, link).seconds * 1e6
    assert cost_us == pytest.approx(28.792 + 7 * HOST_READ_US, abs=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InfersimWarning)
        kept = load_node(str(_node_before_host_read(tmp_path, host_read_us=0))).intra_node_link
        shipped = tmp_path / "l40s-8x-pcie.yaml"
        shipped.write_text(L40S_NODE.read_text())
        load_node(str(shipped))
    kept_us = collective_cost("all_reduce", 16 * 1024, 8, kept).seconds * 1e6
    assert kept_us == pytest.approx(28.792, abs=1e-3)  # ccaf331's price


# ccaf331's l40s profile (before fabric.host_read_us): its collective fits by group size.
FITS_BEFORE_HOST_READ = {2: (0.295, 0.64), 4: (0.671, 0.56), 8: (0.812, 0.15)}


def _fits_before_host_read(link: LinkSpec) -> EfficiencyProfile:
    """The shipped L40S profile with ccaf331's collective fits, recorded over `link`'s
    hardware as signatures were written before the host read was a field."""
    before = link.signature().replace(f', "host_read_us": {link.fabric.host_read_us}', "")
    assert "host_read_us" not in before
    fits = {
        p: CollectiveFit(latency_us=alpha, efficiency=eff, fitted_over=before)
        for p, (alpha, eff) in FITS_BEFORE_HOST_READ.items()
    }
    profile = read_profile(L40S_PROFILE).efficiency
    return profile.model_copy(update={"collective_by_gpus": fits})


def test_fits_made_before_host_read_us_price_as_the_model_they_were_fitted_under() -> None:
    """A fit made before the host read was modelled priced every hop at its one fitted
    latency, which holds the staged hops' reads: over the same tree it applies with no
    host read, as it was fitted and validated, pricing what ccaf331's code priced (its
    collective_cost over `load_gpu("l40s", <ccaf331's l40s.yaml>).efficiency.link_for(p,
    l40s-8x-pcie's link)`); adding the default 1.1 us a staged hop would count those
    reads twice."""
    shipped = load_node("l40s-8x-pcie").intra_node_link
    efficiency = _fits_before_host_read(shipped)
    assert efficiency.links_fitted_elsewhere(shipped) == []
    fitted = efficiency.link_for(4, shipped)
    assert (fitted.latency_us, fitted.efficiency, fitted.fabric.host_read_us) == (0.671, 0.56, 0)
    assert fitted.fabric.model_copy(update={"host_read_us": 1.1}) == shipped.fabric
    ccaf331_us = {(2, 16): 8.8154, (4, 16): 19.4031, (8, 16): 56.1973, (8, 4096): 4981.5547}
    for (p, kib), before in ccaf331_us.items():
        cost = collective_cost("all_reduce", kib * 1024, p, efficiency.link_for(p, shipped))
        assert cost.seconds * 1e6 == pytest.approx(before, abs=1e-4)
    # The node may state its own host read: the old fit still holds the reads it had.
    measured = shipped.model_copy(
        update={"fabric": shipped.fabric.model_copy(update={"host_read_us": 0.85})}
    )
    assert efficiency.link_for(8, measured) == efficiency.link_for(8, shipped)
    # The run applies them without a word (no "another link"), as it would a fresh fit.
    from simulator.build import _warn_links_fitted_elsewhere

    with warnings.catch_warnings():
        warnings.simplefilter("error", InfersimWarning)
        gpu = load_gpu("l40s").with_efficiency(efficiency)
        _warn_links_fitted_elsewhere(gpu, load_node("l40s-8x-pcie"), "l40s-ccaf331.yaml")
    # Over another tree the fit says nothing, before the field as after it.
    other = shipped.model_copy(
        update={"fabric": shipped.fabric.model_copy(update={"gpus_per_switch": 4})}
    )
    assert efficiency.links_fitted_elsewhere(other) == [2, 4, 8]
    assert efficiency.link_for(4, other) == other


def test_a_fabric_on_an_nvlink_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(L40S_NODE.read_text())
    data["intra_node_link"]["kind"] = "nvlink"
    path = tmp_path / "nvlink-fabric.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InfersimError, match="fabric describes a PCIe tree"):
        load_node(str(path))


@needs_shared_data
def test_l40s_all_reduce_over_pcie_uncalibrated() -> None:
    """Held-out half (seed 0) of the L40S's NCCL table, datasheet model: 103.7% MAPE on
    independent links, 30.6% on the shared tree, 29.5% with a staged LL hop priced apart
    from a peer-to-peer one (benchmarks/README.md): issue 15's target, <= 30%."""
    from hardware_models.calibration.sources import load_measurements

    table = load_measurements(from_shared="l40s").table
    rows = table[table["op_class"] == "all_reduce"]
    held = rows[holdout_mask(rows, 0.5, 0)]
    predicted = predict_all(held, load_gpu("l40s"))
    mape = float(np.mean(np.abs(predicted - held["measured_s"]) / held["measured_s"]))
    assert len(held) == 57
    assert mape == pytest.approx(0.2947, abs=0.001)
    assert mape <= 0.30


def test_a_stage_hand_off_is_priced_where_the_stages_sit_on_the_tree():
    """Each tp rank sends to the same rank of the next stage, at once: switch neighbours
    go peer to peer, a boundary across sockets is staged in host memory and shares it."""
    link = load_node("l40s-8x-pcie").intra_node_link
    nbytes = 64e6
    neighbours = collective_cost("send_recv", nbytes, 2, link, first_gpu=0)
    across = collective_cost("send_recv", nbytes, 8, link, first_gpu=0)  # GPUs 0-3 -> 4-7
    assert fabric_share(link, "pair", 2) == 1.0
    assert fabric_share(link, "pair", 8) < 0.5
    assert across.seconds > 2 * neighbours.seconds
    # Without a tree the placement changes nothing.
    bare = link.model_copy(update={"fabric": None})
    assert collective_cost("send_recv", nbytes, 8, bare).seconds == pytest.approx(
        collective_cost("send_recv", nbytes, 2, bare).seconds
    )
