"""What the metrics need to know about a run besides its tables."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SLO:
    """Latency objectives; a request meets them when every given bound holds."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One replica: its GPUs and the peaks and prices they bring."""

    gpu: str
    gpus: int
    peak_flops: float  # all GPUs of the replica, compute dtype, dense
    peak_bandwidth: float  # bytes/s, all GPUs of the replica
    kv_total_blocks: int
    idle_power_w: float  # per GPU
    tdp_w: float  # per GPU
    usd_per_gpu_hour: float
    pool: str = "default"
    calibration: str = "none"  # the profile its GPU runs with, and why (calibration_lookup)


@dataclass(frozen=True, slots=True)
class RunContext:
    scenario: str
    seed: int
    duration_s: float  # simulated time covered by the run (first arrival at 0 to the end)
    replicas: tuple[ReplicaInfo, ...]
    slo: SLO = field(default_factory=SLO)
    pue: float = 1.2
    usd_per_kwh: float = 0.10
    priority_names: tuple[str, ...] = ("default",)
    wall_seconds: float = 0.0

    @property
    def gpus(self) -> int:
        return sum(r.gpus for r in self.replicas)
