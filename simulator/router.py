"""Routers: which replica serves an arriving request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from hardware_models.errors import InfersimError


class Routable(Protocol):
    @property
    def outstanding(self) -> int: ...


class RoundRobin:
    def __init__(self, replicas: Sequence[Routable]) -> None:
        self.replicas, self._next = replicas, 0

    def route(self, rid: int) -> Routable:
        replica = self.replicas[self._next]
        self._next = (self._next + 1) % len(self.replicas)
        return replica


class LeastOutstanding:
    """Fewest waiting + running requests; ties go to the lowest index (deterministic)."""

    def __init__(self, replicas: Sequence[Routable]) -> None:
        self.replicas = replicas

    def route(self, rid: int) -> Routable:
        return min(self.replicas, key=lambda r: r.outstanding)


class Random:
    def __init__(self, replicas: Sequence[Routable], seed: int) -> None:
        self.replicas = replicas
        self._rng = np.random.default_rng([seed, 0x524F555445])  # own stream

    def route(self, rid: int) -> Routable:
        return self.replicas[int(self._rng.integers(len(self.replicas)))]


def make_router(kind: str, replicas: Sequence[Routable], seed: int):
    if kind == "round_robin":
        return RoundRobin(replicas)
    if kind == "least_outstanding":
        return LeastOutstanding(replicas)
    if kind == "random":
        return Random(replicas, seed)
    raise InfersimError(f"unknown router {kind!r}; allowed: round_robin, least_outstanding, random")
