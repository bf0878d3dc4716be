"""Attention data parallelism inside one replica: dp ranks, each an iteration scheduler
with its own KV cache, behind one entry point.

vLLM runs each DP rank as its own engine core and spreads requests over them by load
(its DP coordinator scores a rank waiting x 4 + running and takes the lowest). For a
dense model the ranks are then independent replicas. For an MoE model they are not:
every MoE layer runs over all ranks' tokens (the experts live on all tp x dp GPUs), so
the ranks step in lockstep. Each step every rank with work runs its batch, and a rank
with nothing scheduled runs a dummy forward pass to join the MoE layers' collectives;
with CUDA graphs vLLM pads every rank's batch to the largest rank's token count (eager,
each runs its own). The step lasts as long as the slowest rank's, so one rank's long
prefill holds every other rank's decodes back.

The lockstep group reuses the replica's pieces (scheduler, running set, KV cache, step
log) one step at a time; there is no fast-forwarding of decode runs, so a step is the
same whether the run is stepped ahead of SimPy's clock or one event at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import simpy

from simulator.engine.engine_group import EngineGroup
from simulator.engine.replica import Replica
from simulator.engine.scheduler import StepPlan


class DpGroup(EngineGroup):
    """One replica of dp ranks. `lockstep` (an MoE model): the ranks are `driven`
    replicas this group steps together; otherwise they run on their own."""

    def __init__(self, env: simpy.Environment, ranks: Sequence[Replica], lockstep: bool) -> None:
        super().__init__(env, ranks)
        self.lockstep = lockstep
        self.pad_to_largest = self.members[0].cost.overheads.cuda_graphs  # as vLLM pads
        if lockstep:
            self.start()

    def _load(self, member: Replica) -> int:
        """vLLM's DP load balancing: the rank with the lowest waiting x 4 + running."""
        return len(member.waiting) * 4 + member.running.count

    def nudge(self) -> None:
        for rank in self.members:
            rank.nudge()
        self._wake()

    def fail(self) -> list[int]:
        """Every rank dies with the replica; the requests they held, in id order."""
        if self.lockstep:
            return super().fail()
        self.down = True
        return sorted(rid for rank in self.members for rid in rank.fail())

    def recover(self) -> None:
        if self.lockstep:
            super().recover()
            return
        self.down = False
        for rank in self.members:
            rank.recover()

    def _sizes(self, steps: list[tuple[Replica, StepPlan]]) -> tuple[int, int]:
        """(tokens each rank's forward pass runs over at least, tokens the MoE layers
        see). With CUDA graphs vLLM pads every rank, an idle one's dummy pass included,
        to the largest rank's count; eager, each rank runs its own tokens (a dummy pass
        one token)."""
        tokens = [_tokens(plan) for _, plan in steps]
        if self.pad_to_largest:
            return max(tokens), max(tokens) * len(self.members)
        return 0, sum(tokens) + len(self.members) - len(steps)

    def _log_dummy_passes(
        self, steps: list[tuple[Replica, StepPlan]], seconds: float, padded: int, moe: int
    ) -> None:
        """The idle ranks' dummy forward passes (padded, or one token eager): their GPUs
        are busy for the step too, on no request's behalf (a row with no sequences)."""
        busy = {id(rank) for rank, _ in steps}
        for rank in self.members:
            if id(rank) not in busy:
                dummy = rank.cost.step(
                    decode_seqs=0, decode_context=0, sampled=0,
                    padded_tokens=max(padded, 1), moe_tokens=moe,
                )  # fmt: skip
                rank.log_step(_DUMMY, seconds, dummy)

    def _step_loop(self):
        lead = self.members[0]
        while True:
            steps = [(rank, plan) for rank in self.members if (plan := rank.next_plan())]
            if not steps:
                yield from self._idle()
                continue
            padded, moe = self._sizes(steps)
            priced = [(rank, plan, *rank.plan_cost(plan, padded, moe)) for rank, plan in steps]
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
            if len(steps) < len(self.members):
                self._log_dummy_passes(steps, seconds, padded, moe)
            self._set_time(end)
            for rank, plan, _, done in priced:
                rank._apply_step(plan, end, done)


_DUMMY = StepPlan(decode_slots=np.empty(0, np.int64))  # an idle rank's step: no sequences


def _tokens(plan: StepPlan) -> int:
    return len(plan.decode_slots) + sum(plan.prefill_chunks)
