"""Attention data parallelism inside one replica: dp ranks, each an iteration scheduler
with its own KV cache, behind one entry point.

vLLM runs each DP rank as its own engine core and spreads requests over them by load
(its DP coordinator scores a rank waiting x 4 + running and takes the lowest). For a
dense model the ranks are then independent replicas. For an MoE model they are not:
every MoE layer runs over all ranks' tokens (the experts live on all tp x dp GPUs), so
the ranks step in lockstep. Each step every rank with work runs its batch, padded to
the largest rank's token count; a rank with nothing scheduled runs a dummy forward pass
of that size to join the MoE layers' collectives; the step lasts as long as the slowest
rank's. So one rank's long prefill holds every other rank's decodes back.

The lockstep group reuses the replica's pieces (scheduler, running set, KV cache, step
log) one step at a time; there is no fast-forwarding of decode runs, so a step is the
same whether the run is stepped ahead of SimPy's clock or one event at a time.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import simpy

from simulator.engine.replica import Clock, Replica
from simulator.engine.requests import RejectReason
from simulator.engine.scheduler import StepPlan


class PooledBlocks:
    """The KV blocks of all ranks, for routers that compare replicas by KV load."""

    def __init__(self, ranks: Sequence[Replica]) -> None:
        self._ranks = ranks

    @property
    def used(self) -> int:
        return sum(rank.kv.used for rank in self._ranks)

    @property
    def total(self) -> int:
        return sum(rank.kv.total for rank in self._ranks)


class DpGroup:
    """One replica of dp ranks. `lockstep` (an MoE model): the ranks are `driven`
    replicas this group steps together; otherwise they run on their own."""

    def __init__(self, env: simpy.Environment, ranks: Sequence[Replica], lockstep: bool) -> None:
        self.env, self.ranks, self.lockstep = env, list(ranks), lockstep
        self.cfg = self.ranks[0].cfg
        self.kv = PooledBlocks(self.ranks)
        self.t = 0.0
        self._wakeup: simpy.Event | None = None
        self._recovery: simpy.Event | None = None
        self._down = False
        if lockstep:
            self.process = env.process(self._lifecycle())

    # ---- what routers and the cluster see ------------------------------------------------
    @property
    def clock(self) -> Clock:
        return self.ranks[0].clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        for rank in self.ranks:
            rank.clock = clock

    @property
    def down(self) -> bool:
        return self._down if self.lockstep else self.ranks[0].down

    @property
    def outstanding(self) -> int:
        if self.down:
            return sys.maxsize
        return sum(rank.outstanding for rank in self.ranks)

    def _rank_for(self) -> Replica:
        """vLLM's DP load balancing: the rank with the lowest waiting x 4 + running."""
        return min(self.ranks, key=lambda rank: len(rank.waiting) * 4 + rank.running.count)

    def rejection(self, rid: int) -> RejectReason:
        return self._rank_for().rejection(rid)

    def submit(self, rid: int, kv_tokens: int = 0) -> None:
        self._rank_for().submit(rid, kv_tokens)
        self._wake()

    def nudge(self) -> None:
        for rank in self.ranks:
            rank.nudge()
        self._wake()

    def settle(self, now: float) -> None:
        for rank in self.ranks:
            rank.settle(now)

    def fail(self) -> list[int]:
        """Every rank dies with the replica; the requests they held, in id order."""
        if not self.lockstep:
            return sorted(rid for rank in self.ranks for rid in rank.fail())
        held = sorted(rid for rank in self.ranks for rid in rank.drop())
        self._down = True
        self.process.interrupt("replica failure")
        return held

    def recover(self) -> None:
        if not self.lockstep:
            for rank in self.ranks:
                rank.recover()
        elif self._recovery is not None and not self._recovery.triggered:
            self._recovery.succeed()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    # ---- stepping in lockstep ------------------------------------------------------------
    def _lifecycle(self):
        """Serve until a failure interrupts, stay down until recovered, serve again."""
        while True:
            for rank in self.ranks:
                rank._mark = rank.log.mark()
            try:
                yield from self._step_loop()
            except simpy.Interrupt:
                for rank in self.ranks:  # the step in flight never finished
                    rank.log.cut(rank._mark, self.env.now, gaps=False)
                self._recovery = self.env.event()
                yield self._recovery
                self._down = False
                for rank in self.ranks:
                    rank.down = False
                self._set_time(self.env.now)

    def _set_time(self, t: float) -> None:
        self.t = t
        for rank in self.ranks:
            rank.t = t

    def _step_loop(self):
        lead = self.ranks[0]
        while True:
            steps = [(rank, plan) for rank in self.ranks if (plan := rank.next_plan())]
            if not steps:
                self._wakeup = self.env.event()  # armed before catching up, as a replica
                wakeup = self._wakeup
                yield from self._catch_up(self.t)
                for rank in self.ranks:
                    rank.running.materialize()
                yield wakeup
                self._set_time(self.env.now)
                continue
            padded = max(_tokens(plan) for _, plan in steps)
            priced = [(rank, plan, *rank.plan_cost(plan, padded)) for rank, plan in steps]
            seconds = max(
                cost.seconds + plan.swap_blocks * rank.cfg.swap_seconds_per_block
                for rank, plan, cost, _ in priced
            )
            completes = any(done for *_, done in priced)
            end = self.t + seconds
            if completes or not lead._runs_ahead(end):
                yield from self._catch_up(end)
            for rank, plan, cost, _ in priced:
                rank.log_step(plan, seconds, cost)
            self._set_time(end)
            for rank, plan, _, done in priced:
                rank._apply_step(plan, end, done)

    def _catch_up(self, end: float):
        """Advance SimPy's clock to the group's own (see Replica._catch_up)."""
        if end >= self.clock.horizon:
            for rank in self.ranks:
                rank.running.materialize()
        if end > self.env.now:
            yield self.ranks[0]._timeout_until(end)


def _tokens(plan: StepPlan) -> int:
    return len(plan.decode_slots) + sum(plan.prefill_chunks)
