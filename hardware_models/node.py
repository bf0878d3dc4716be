"""Machines and how their GPUs talk: the links collectives are priced over."""

from __future__ import annotations

import json
from typing import Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

_STRICT = ConfigDict(extra="forbid", frozen=True)

FabricKind = Literal["nvswitch", "nvlink_mesh", "pcie", "infinity_fabric", "none"]

# A PCIe peer-to-peer hop: a posted write through one switch into the peer's memory, seen
# by the peer polling its own memory. Half the 1.106 us round trip of NVIDIA gdrcopy's
# pplat test (two such writes, each seen by a local poll; NVIDIA/gdrcopy#264). NCCL's LL
# hop between switch neighbours and vLLM's custom all-reduce flag both travel this way.
PCIE_P2P_HOP_US = 0.55
# A GPU's read round trip to host memory across PCIe: a non-posted read takes twice a
# posted write's one-way latency (Intel's TCC developer guide, data streams), so 1.1 us;
# ~0.85 us was measured between a desktop Haswell and an FPGA endpoint (hackingnasdaq,
# 2014). A property of the host's root complex: a node YAML overrides it per server.
HOST_READ_US = 2 * PCIE_P2P_HOP_US


class PcieFabric(BaseModel):
    """The PCIe tree under a node's GPUs, for collectives that share it (pcie_fabric.py).

    GPUs sit in order under PCIe switches (or each on its own CPU root port), switches
    under CPU sockets. A hop between two GPUs under one switch goes peer to peer when the
    GPUs allow it; any other hop is staged in host memory (NCCL's SHM transport: the
    sender writes into a host buffer, the receiver reads it back), because NCCL does not
    use P2P across a CPU host bridge by default (`p2pLevel = PATH_PXB` in its
    src/graph/paths.cc). A staged hop also takes longer to be seen: the receiver polls
    the host buffer across PCIe (`host_read_us` a poll) rather than its own memory."""

    model_config = _STRICT
    gpus_per_switch: int = Field(
        ge=1, description="GPUs under one PCIe switch (1: each GPU on its own CPU root port)"
    )
    gpus_per_socket: int = Field(ge=1, description="GPUs whose root ports are on one CPU")
    p2p: bool = Field(
        description="GPUs under one switch write into each other's memory (else every hop "
        "is staged in host memory, as with NCCL_P2P_DISABLE)"
    )
    switch_uplink_gbps: float = Field(
        gt=0, description="a switch's link up to its CPU, one direction, GB/s"
    )
    host_memory_gbps: float = Field(
        gt=0,
        description="GPU DMA a socket's root complex and memory sustain, reads and writes "
        "together, GB/s: a staged hop costs it twice (written in, read out)",
    )
    inter_socket_gbps: float = Field(
        gt=0, description="CPU-to-CPU link (UPI, xGMI), one direction, GB/s"
    )
    host_read_us: float = Field(
        default=HOST_READ_US,
        ge=0,
        allow_inf_nan=False,
        description="a GPU's read of host memory across PCIe, round trip, microseconds: "
        "a hop staged in host memory takes it on top of the link's per-hop latency (its "
        "receiver polls the host buffer; a peer-to-peer receiver polls its own memory). "
        "A property of the host's root complex; default 1.1 (twice a posted write's "
        "one-way 0.55 us, Intel's TCC developer guide), set it per server where measured",
    )

    @model_validator(mode="after")
    def _switches_fill_sockets(self) -> PcieFabric:
        if self.gpus_per_socket % self.gpus_per_switch:
            raise ValueError(
                f"gpus_per_socket ({self.gpus_per_socket}) must be a multiple of "
                f"gpus_per_switch ({self.gpus_per_switch})"
            )
        return self


class LinkSpec(BaseModel):
    """One hop's alpha-beta parameters: a message of B bytes takes latency + B / bandwidth."""

    model_config = _STRICT
    kind: Literal["nvlink", "nvswitch", "pcie", "infiniband", "ethernet", "infinity_fabric"]
    bandwidth_gbps: float = Field(gt=0, description="per GPU, one direction, GB/s")
    latency_us: float = Field(ge=0, description="per message (alpha), microseconds")
    efficiency: float = Field(
        default=0.80,
        gt=0,
        le=1,
        description="fraction of bandwidth collectives attain (NCCL bus bandwidth / link rate)",
    )
    fabric: PcieFabric | None = Field(
        default=None,
        description="the PCIe tree the GPUs share (None: every GPU has the full link rate)",
    )

    @model_serializer(mode="wrap")
    def _without_absent_fabric(self, handler: SerializerFunctionWrapHandler) -> dict:
        """A link without a fabric is written as before there were fabrics (profiles'
        `links:` records stay byte-identical)."""
        data = handler(self)
        if self.fabric is None:
            data.pop("fabric", None)
        return data

    def signature(self) -> str:
        """The link as hardware, without the fitted latency and efficiency: a calibration's
        collective fits apply only over the link they were fitted over (a fit over one
        PCIe tree says nothing about another tree, or about a link with none)."""
        hardware = self.model_dump(mode="json", exclude={"latency_us", "efficiency"})
        return json.dumps(hardware, sort_keys=True)

    def as_fitted_over(self, fitted_over: str | None) -> LinkSpec | None:
        """This link as a collective fit recorded over `fitted_over` (a `signature()`)
        prices it, or None where the fit was made over other hardware. A fit over this
        very link, or recorded before fits named their link, takes it as it is. A fit over
        this PCIe tree made before `fabric.host_read_us` was modelled (its signature lacks
        the field) priced every hop at its fitted latency, which therefore holds the
        staged hops' host reads: it takes the link with no host read, the model it was
        fitted and validated under, so those reads are not counted twice."""
        if fitted_over is None or fitted_over == self.signature():
            return self
        if self.fabric is None:
            return None
        before = {"latency_us": True, "efficiency": True, "fabric": {"host_read_us"}}
        if fitted_over != json.dumps(self.model_dump(mode="json", exclude=before), sort_keys=True):
            return None
        return self.model_copy(
            update={"fabric": self.fabric.model_copy(update={"host_read_us": 0.0})}
        )

    @model_validator(mode="after")
    def _fabric_is_pcie(self) -> LinkSpec:
        if self.fabric is not None and self.kind != "pcie":
            raise ValueError(f"fabric describes a PCIe tree; this link is {self.kind}")
        return self

    @property
    def bytes_per_second(self) -> float:
        return self.bandwidth_gbps * 1e9 * self.efficiency


class CrossNodeLink(NamedTuple):
    """A collective group spread over nodes: up to `gpus_per_node` of its GPUs in each
    node, joined there by `intra`, the nodes by `inter`, each GPU on its own rail (`inter`
    is one GPU's share of its node's NICs, as node presets give it). Priced as NCCL runs
    such a group: collectives.collective_cost, docs/ARCHITECTURE.md."""

    intra: LinkSpec
    inter: LinkSpec
    gpus_per_node: int


class NodeSpec(BaseModel):
    """A server: GPUs of one type, the fabric between them and the NICs out of the box."""

    model_config = _STRICT
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    display_name: str
    gpu: str = Field(description="accelerator preset name")
    gpus_per_node: int = Field(ge=1, le=72)
    intra_node_fabric: FabricKind
    intra_node_link: LinkSpec | None = Field(
        default=None, description="GPU-to-GPU link inside the node (None for 1 GPU)"
    )
    nics_per_node: int = Field(ge=0)
    nic_bandwidth_gbps: float = Field(
        ge=0, description="per NIC, one direction, GB/s (400 Gb/s InfiniBand = 50 GB/s)"
    )
    inter_node_link: LinkSpec | None = Field(
        default=None, description="GPU-to-GPU across nodes (InfiniBand/Ethernet)"
    )
    host_memory_gb: float = Field(
        gt=0, description="CPU memory for KV swap, GiB (2 TB of DIMMs: 2048), as vLLM's swap space"
    )
    sources: dict[str, str] = Field(default_factory=dict)

    def links_without_host_read(self) -> list[str]:
        """The fields of its PCIe links whose `fabric` leaves `host_read_us` unset (node
        files written before it was modelled, whose `latency_us` meant every PCI hop's)."""
        links = {"intra_node_link": self.intra_node_link, "inter_node_link": self.inter_node_link}
        return [
            name
            for name, link in links.items()
            if link is not None
            and link.fabric is not None
            and "host_read_us" not in link.fabric.model_fields_set
        ]
