"""Several iteration schedulers behind one replica's entry point (see dp_group.py and
pipeline.py): request routing over them, and the lifecycle of a group that one SimPy
process steps (failure drops every member, recovery restarts them together)."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence

import simpy

from simulator.engine.replica import Clock, Replica
from simulator.engine.requests import RejectReason


class PooledBlocks:
    """The KV blocks of all members, for routers that compare replicas by KV load."""

    def __init__(self, members: Sequence[Replica]) -> None:
        self._members = members

    @property
    def used(self) -> int:
        return sum(member.kv.used for member in self._members)

    @property
    def total(self) -> int:
        return sum(member.kv.total for member in self._members)


class EngineGroup(ABC):
    """Members (`driven` replicas) that this group's one process steps (`_step_loop`,
    which each kind of group defines: DP lockstep, PP batches in flight)."""

    def __init__(self, env: simpy.Environment, members: Sequence[Replica]) -> None:
        self.env, self.members = env, list(members)
        self.cfg = self.members[0].cfg
        self.kv = PooledBlocks(self.members)
        self.t = 0.0
        self.down = False
        self.incoming = 0  # requests whose KV cache is on its way here (a decode replica)
        self._wakeup: simpy.Event | None = None
        self._recovery: simpy.Event | None = None

    def start(self) -> None:
        self.process = self.env.process(self._lifecycle())

    # ---- what routers and the cluster see ------------------------------------------------
    @property
    def clock(self) -> Clock:
        return self.members[0].clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        for member in self.members:
            member.clock = clock

    @property
    def outstanding(self) -> int:
        if self.down:
            return sys.maxsize
        return sum(member.outstanding for member in self.members) + self.incoming

    def _load(self, member: Replica) -> int:
        """How loaded a member looks to the group's balancer (lowest is chosen)."""
        return member.outstanding

    def member_for(self) -> Replica:
        return min(self.members, key=self._load)

    def rejection(self, rid: int) -> RejectReason:
        return self.member_for().rejection(rid)

    def submit(self, rid: int, kv_tokens: int = 0) -> None:
        self.member_for().submit(rid, kv_tokens)
        self._wake()

    def nudge(self) -> None:
        self._wake()

    def settle(self, now: float) -> None:
        for member in self.members:
            member.settle(now)

    def fail(self) -> list[int]:
        """Every member dies with the replica; the requests they held, in id order."""
        held = sorted(rid for member in self.members for rid in member.drop())
        self.down = True
        self.process.interrupt("replica failure")
        return held

    def recover(self) -> None:
        if self._recovery is not None and not self._recovery.triggered:
            self._recovery.succeed()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    # ---- stepping -------------------------------------------------------------------------
    def _lifecycle(self):
        """Serve until a failure interrupts, stay down until recovered, serve again."""
        while True:
            logs = list({id(m.log): m.log for m in self.members}.values())
            marks = [log.mark() for log in logs]
            try:
                yield from self._step_loop()
            except simpy.Interrupt:
                for log, mark in zip(logs, marks, strict=True):  # steps in flight never ended
                    log.cut(mark, self.env.now, gaps=False)
                self._recovery = self.env.event()
                yield self._recovery
                self.down = False
                for member in self.members:
                    member.down = False
                self._set_time(self.env.now)

    @abstractmethod
    def _step_loop(self):
        """The SimPy generator that schedules and steps the members until interrupted."""

    def _set_time(self, t: float) -> None:
        self.t = t
        for member in self.members:
            member.t = t

    def _idle(self):
        """Sleep until a request arrives (a wake-up armed before catching up, as a replica
        arms its own)."""
        self._wakeup = wakeup = self.env.event()
        yield from self._catch_up(self.t)
        for member in self.members:
            member.running.materialize()
        yield wakeup
        self._set_time(self.env.now)

    def _catch_up(self, end: float):
        """Advance SimPy's clock to the group's own (see Replica._catch_up)."""
        if end >= self.clock.horizon:
            for member in self.members:
                member.running.materialize()
        yield from self.members[0].wait_until(end)
