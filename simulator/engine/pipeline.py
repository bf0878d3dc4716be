"""Pipeline parallelism that pipelines: a PP replica keeps as many batches in flight as it
has stages.

vLLM runs a pp-stage replica as pp virtual engines (its V0 engine; V1's batch queue of
size pp does the same job): each has its own scheduler over a 1/pp share of the KV
cache blocks, requests go to the one with the fewest unfinished, and each schedules its
next batch as soon as its previous one has come out of the last stage. A batch flows
through the stages in order, waiting at a stage the batch before it still occupies; a
stage takes 1/pp of the batch's step time (the layers split evenly; the stage hand-offs'
send/recv are in that step time). So an empty pipeline gives a batch the latency of the
stages one after another, and at saturation every stage works on a different batch: pp
times the throughput. With fewer requests than engines, stages idle (the bubble).

The group's one process applies each batch when it leaves the last stage and schedules
the next at that moment, always on SimPy's clock: no step runs ahead, and no decode
runs are fast-forwarded, so stepping one event at a time gives the same run.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

import simpy

from simulator.engine.engine_group import EngineGroup
from simulator.engine.replica import Replica
from simulator.engine.scheduler import StepPlan


class Stages:
    """When each pipeline stage is next free."""

    def __init__(self, stages: int) -> None:
        self.free = [0.0] * stages

    def enter(self, ready: float, seconds: float) -> tuple[float, float, float]:
        """A batch of `seconds` (its step time over all stages) ready at `ready`: when it
        enters the first stage, its time in each stage, and when it leaves the last."""
        free = self.free
        stage = seconds / len(free)
        t = ready
        start = max(ready, free[0])
        for s, busy_until in enumerate(free):
            t = (t if t >= busy_until else busy_until) + stage
            free[s] = t
        return start, stage, t


class PipelineGroup(EngineGroup):
    """One replica of pp stages served by pp virtual engines (`driven` replicas sharing
    the replica's step log)."""

    def __init__(self, env: simpy.Environment, engines: Sequence[Replica]) -> None:
        super().__init__(env, engines)
        log = self.members[0].log  # one replica: one step table, its KV the engines' sum
        log.totals.kv_total_blocks[0] = self.kv.total
        for engine in self.members[1:]:
            engine.log = log
        self.start()

    def _step_loop(self):
        stages = Stages(len(self.members))
        flying: list[tuple[float, int, int, StepPlan, bool]] = []  # (out at, order, engine...)
        busy = [False] * len(self.members)
        order = itertools.count()
        while True:
            for i, engine in enumerate(self.members):
                if busy[i] or (plan := engine.next_plan()) is None:
                    continue
                cost, completes = engine.plan_cost(plan)
                seconds = cost.seconds + plan.swap_blocks * engine.cfg.swap_seconds_per_block
                start, stage, out = stages.enter(self.t, seconds)
                engine.t = start  # its row in the step table: its turn in the first stage
                held = (self.kv.used, sum(len(e.waiting) for e in self.members))
                engine.log_step(plan, stage, cost, held)
                engine.t = self.t
                heapq.heappush(flying, (out, next(order), i, plan, completes))
                busy[i] = True
            if not flying:
                yield from self._idle()
                continue
            out = flying[0][0]
            self._wakeup = wakeup = self.env.event()  # a request may arrive meanwhile
            if out > self.env.now:
                yield wakeup | self.members[0]._timeout_until(out)
            if self.env.now < out:  # woken by an arrival: idle engines may start now
                self._set_time(self.env.now)
                continue
            if out >= self.clock.horizon:
                for engine in self.members:
                    engine.running.materialize()
            out, _, i, plan, completes = heapq.heappop(flying)
            self._set_time(out)
            busy[i] = False
            self.members[i]._apply_step(plan, out, completes)
