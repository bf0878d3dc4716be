"""Routers: which replica serves an arriving request.

Every router is deterministic for a given seed; ties go to the lowest replica index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from hardware_models.errors import InfersimError


class _Blocks(Protocol):
    used: int
    total: int


class Routable(Protocol):
    kv: _Blocks

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
    """Fewest waiting + running requests (join the shortest queue)."""

    def __init__(self, replicas: Sequence[Routable]) -> None:
        self.replicas = replicas

    def route(self, rid: int) -> Routable:
        return min(self.replicas, key=lambda r: r.outstanding)


class LeastKVLoad:
    """Lowest share of KV-cache blocks in use, then fewest outstanding: balances memory
    pressure rather than request counts (long prompts weigh more)."""

    def __init__(self, replicas: Sequence[Routable]) -> None:
        self.replicas = replicas

    def route(self, rid: int) -> Routable:
        return min(self.replicas, key=lambda r: (r.kv.used / r.kv.total, r.outstanding))


class Random:
    def __init__(self, replicas: Sequence[Routable], seed: int) -> None:
        self.replicas = replicas
        self._rng = np.random.default_rng([seed, 0x524F555445])  # the router's own stream

    def route(self, rid: int) -> Routable:
        return self.replicas[int(self._rng.integers(len(self.replicas)))]


class PowerOfTwo:
    """Sample two replicas at random, send to the less loaded (Mitzenmacher): nearly the
    balance of least-outstanding with a constant cost per decision."""

    def __init__(self, replicas: Sequence[Routable], seed: int) -> None:
        self.replicas = replicas
        self._rng = np.random.default_rng([seed, 0x503243])

    def route(self, rid: int) -> Routable:
        if len(self.replicas) == 1:
            return self.replicas[0]
        a, b = self._rng.choice(len(self.replicas), size=2, replace=False)
        first, second = self.replicas[int(min(a, b))], self.replicas[int(max(a, b))]
        return second if second.outstanding < first.outstanding else first


ROUTERS = ("round_robin", "random", "least_outstanding", "least_kv_load", "power_of_two")


def make_router(kind: str, replicas: Sequence[Routable], seed: int):
    if not replicas:
        raise InfersimError("a cluster needs at least one replica to route to")
    if kind == "round_robin":
        return RoundRobin(replicas)
    if kind == "random":
        return Random(replicas, seed)
    if kind == "least_outstanding":
        return LeastOutstanding(replicas)
    if kind == "least_kv_load":
        return LeastKVLoad(replicas)
    if kind == "power_of_two":
        return PowerOfTwo(replicas, seed)
    raise InfersimError(f"unknown router {kind!r}; allowed: {', '.join(ROUTERS)}")
