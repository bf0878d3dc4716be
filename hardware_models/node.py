"""Machines and how their GPUs talk: the links collectives are priced over."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", frozen=True)

FabricKind = Literal["nvswitch", "nvlink_mesh", "pcie", "infinity_fabric", "none"]


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

    @property
    def bytes_per_second(self) -> float:
        return self.bandwidth_gbps * 1e9 * self.efficiency


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
    host_memory_gb: float = Field(gt=0, description="CPU memory for KV swap, GB")
    sources: dict[str, str] = Field(default_factory=dict)

    @property
    def tp_within_node_allowed(self) -> bool:
        return self.intra_node_link is not None
