"""The price of one operator: time, work, traffic per memory level, and what bound it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Bound(StrEnum):
    COMPUTE = "compute"
    MEMORY = "memory"
    L2 = "l2"
    LATENCY = "latency"
    COMMUNICATION = "communication"


@dataclass(frozen=True, slots=True)
class OpCost:
    """Seconds on the device plus the quantities that explain them."""

    name: str
    seconds: float
    flops: float
    dram_bytes: float
    l2_bytes: float
    bound: Bound
    compute_seconds: float = 0.0
    memory_seconds: float = 0.0
    overhead_seconds: float = 0.0
    kernels: int = 1

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per device-memory byte: the x axis of a roofline plot."""
        return self.flops / self.dram_bytes if self.dram_bytes else float("inf")

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.seconds if self.seconds else 0.0

    @classmethod
    def from_terms(
        cls,
        name: str,
        seconds: float,
        flops: float,
        dram_bytes: float,
        l2_bytes: float,
        compute: float,
        memory: float,
        overhead: float,
        kernels: int = 1,
    ) -> OpCost:
        """An op priced by its compute, DRAM and fixed-overhead terms, its bound named by
        the largest of them (classify): the label always agrees with the terms."""
        bound = classify(compute, memory, 0.0, overhead)
        return cls(
            name, seconds, flops, dram_bytes, l2_bytes, bound, compute, memory, overhead, kernels
        )

    def as_dict(self) -> dict[str, float | str]:
        return {
            "op": self.name,
            "seconds": self.seconds,
            "flops": self.flops,
            "dram_bytes": self.dram_bytes,
            "l2_bytes": self.l2_bytes,
            "bound": self.bound.value,
            "compute_seconds": self.compute_seconds,
            "memory_seconds": self.memory_seconds,
            "overhead_seconds": self.overhead_seconds,
            "kernels": self.kernels,
        }


def classify(compute: float, dram: float, l2: float, overhead: float) -> Bound:
    """The largest term names the bound; a kernel dominated by its fixed floor is latency-bound."""
    work = max(compute, dram, l2)
    if overhead >= work:
        return Bound.LATENCY
    if work == compute:
        return Bound.COMPUTE
    return Bound.MEMORY if work == dram else Bound.L2
