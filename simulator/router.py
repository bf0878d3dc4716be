"""Routers: which replica serves an arriving request.

Every router is deterministic for a given seed; ties go to the lowest replica index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, get_args

import numpy as np

from hardware_models.errors import InfersimError
from simulator.engine.requests import RejectReason


class _Blocks(Protocol):
    used: int
    total: int


class Routable(Protocol):
    kv: _Blocks
    down: bool

    @property
    def outstanding(self) -> int: ...

    def rejection(self, rid: int) -> RejectReason: ...


class _Sessions(Protocol):
    session: np.ndarray


class RoundRobin:
    def __init__(self, replicas: Sequence[Routable]) -> None:
        self.replicas, self._next = replicas, 0

    def route(self, rid: int) -> Routable:
        replica = self.replicas[self._next]
        self._next = (self._next + 1) % len(self.replicas)
        return replica

    def routes(self, count: int) -> np.ndarray:
        """The replica indices the next `count` route() calls would pick, at once."""
        picks = (np.arange(count) + self._next) % len(self.replicas)
        self._next = (self._next + count) % len(self.replicas)
        return picks


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

    def routes(self, count: int) -> np.ndarray:
        """The replica indices of the next `count` requests, drawn at once: numpy's
        Generator draws `integers(n, size=count)` as `count` single draws in a row (the
        same numbers; tests/test_sharding.py checks it)."""
        return self._rng.integers(len(self.replicas), size=count)


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


class SessionAffinity:
    """Every turn of a multi-turn session goes to the replica that served the session's
    previous turn, where its conversation's KV blocks may still be cached (a prefix cache
    hit skips their prefill); requests outside sessions go to the least loaded replica.

    A session is placed, when it starts, on the replica with the fewest live sessions,
    then fewest outstanding requests. Sticky sessions make the session the unit of load:
    placing by outstanding requests alone sends every session that starts while the
    cluster is idle to replica 0, and they stay there. Consistent hashing would need no
    state, which matters for a fleet of routers, not for one simulated router, and it
    ignores load.

    A session leaves its replica when that replica is down or would refuse the turn (the
    conversation outgrew its pool's context or KV cache, or its waiting queue is full):
    the turn goes to the best other replica that takes it, which becomes the session's
    home (its cache now holds the conversation)."""

    def __init__(self, replicas: Sequence[Routable], requests: _Sessions) -> None:
        self.replicas = replicas
        self._requests = requests  # read at each route: its arrays grow (reallocate)
        self._home: dict[int, int] = {}  # live session -> replica index
        self._sessions = [0] * len(replicas)  # live sessions homed on each replica

    def route(self, rid: int) -> Routable:
        session = int(self._requests.session[rid])
        home = self._home.get(session)
        if home is not None:
            replica = self.replicas[home]
            if not replica.down and replica.rejection(rid) == RejectReason.NONE:
                return replica
        candidates = [i for i, r in enumerate(self.replicas) if not r.down] or list(
            range(len(self.replicas))
        )
        if session < 0:
            return self.replicas[min(candidates, key=self._outstanding)]
        if home is not None:  # leaving: prefer a replica that takes the turn
            taking = [i for i in candidates if self.replicas[i].rejection(rid) == RejectReason.NONE]
            candidates = taking or candidates
        best = min(candidates, key=self._load)
        self.end(session)
        self._home[session] = best
        self._sessions[best] += 1
        return self.replicas[best]

    def _outstanding(self, index: int) -> int:
        return self.replicas[index].outstanding

    def _load(self, index: int) -> tuple[int, int]:
        return self._sessions[index], self.replicas[index].outstanding

    def end(self, session: int) -> None:
        """`session` sends no more turns: it no longer weighs on its replica."""
        home = self._home.pop(session, None)
        if home is not None:
            self._sessions[home] -= 1


RouterName = Literal[
    "round_robin",
    "random",
    "least_outstanding",
    "least_kv_load",
    "power_of_two",
    "session_affinity",
]
ROUTERS: tuple[str, ...] = get_args(RouterName)


def foreseen_routes(kind: str, replicas: int, seed: int, count: int) -> np.ndarray:
    """The replica (an index below `replicas`) each of `count` requests goes to under a
    state-blind router (round robin, random), which looks at no replica: the whole run's
    routing, before it, in any process (simulator/sharding.py). As the smallest unsigned
    integers that hold them: a million requests over 64 replicas in 1 MB."""
    router = make_router(kind, range(replicas), seed)  # type: ignore[arg-type]  # unread
    if not isinstance(router, RoundRobin | Random):
        raise InfersimError(
            f"router {kind!r} reads the replicas' state: its routes are not foreseeable"
        )
    return router.routes(count).astype(np.min_scalar_type(max(replicas - 1, 0)))


def make_router(
    kind: str, replicas: Sequence[Routable], seed: int, requests: _Sessions | None = None
):
    """The router `kind` over `replicas`; session_affinity reads sessions from `requests`."""
    if not replicas:
        raise InfersimError("a cluster needs at least one replica to route to")
    if kind == "session_affinity":
        if requests is None:
            raise InfersimError("router session_affinity needs the request table")
        return SessionAffinity(replicas, requests)
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
