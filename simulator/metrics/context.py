"""What the metrics need to know about a run besides its tables."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hardware_models.power import PowerModel


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives; a request meets them when every given bound holds."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One replica, or one dp rank of one (`dp_rank`): its GPUs and the peaks and prices
    they bring."""

    gpu: str
    gpus: int
    peak_flops: float  # all GPUs of the replica, compute dtype, dense
    peak_bandwidth: float  # bytes/s, all GPUs of the replica
    kv_total_blocks: int
    power: PowerModel  # what each of its GPUs draws (hardware_models.power)
    usd_per_gpu_hour: float
    pool: str = "default"
    token_budget: float = math.inf  # tokens per step; inf where the policy has none
    max_num_seqs: float = math.inf  # sequences per step or batch (serving.max_num_seqs)
    calibration: str = "none"  # the profile its GPU runs with, and why (calibration_lookup)
    all_reduce: str | None = None  # which backend its tp all-reduces take (None: tp = 1)
    moe_kernel: str | None = None  # which kernel its MXFP4 experts run (None: no such)
    # Its rank among its replica's attention data-parallel ranks (vLLM's DP ranks of one
    # engine, each with its own scheduler); None where the replica has one (dp = 1).
    dp_rank: int | None = None


@dataclass(frozen=True, slots=True)
class RunContext:
    scenario: str
    seed: int
    duration_s: float  # simulated time covered by the run (first arrival at 0 to the end)
    replicas: tuple[ReplicaInfo, ...]
    slo: SLO = field(default_factory=SLO)
    pue: float = 1.2
    host_w_per_gpu: float = 0.0  # servers around the GPUs, W a GPU: IT load beside them
    usd_per_kwh: float = 0.10
    priority_names: tuple[str, ...] = ("default",)
    wall_seconds: float = 0.0
    # What produced the run (the resolved scenario, --set overrides, build), JSON-ready,
    # and what its configuration quietly limits (simulator.caveats), for the summary.
    provenance: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # The API server front end's figures (simulator.api_server), where it was modelled.
    frontend: Mapping[str, Any] | None = None

    @property
    def gpus(self) -> int:
        return sum(r.gpus for r in self.replicas)

    @property
    def idle_power_w(self) -> float:
        """What every GPU of the run draws together with no step running, W."""
        return math.fsum(r.gpus * r.power.idle_w for r in self.replicas)
