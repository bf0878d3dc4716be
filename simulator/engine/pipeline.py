"""Pipeline parallelism that pipelines: a PP replica keeps as many batches in flight as it
has stages.

vLLM V1 serves a pp-stage replica with one scheduler, one KV cache and a batch queue of
pp (EngineCore.step_with_batch_queue): it schedules a new batch while the queue has
room, and a request whose batch is still in flight has nothing to schedule until that
batch's output is back. Here up to pp engines (min(pp, max_num_seqs)) share the
replica's one KV cache (`SharedKv`) and split max_num_seqs between them, so at most
max_num_seqs requests are running over all batches in flight; each engine has one
batch in flight and schedules its next when that one leaves the last stage, so no
request is in two batches at once. Requests go to the engine with the fewest
unfinished and stay there, as in V1 a request keeps the cadence of the batch it was
first scheduled in (it is eligible again only when that batch is out); V1's cap is
global, though, so its groups may be more uneven than the engines' shares.

A batch flows through the stages in order, waiting at a stage the batch before it still
occupies; a stage takes its share of the layers of the batch's GPU time (vLLM's
get_pp_indices split, memory_planner.stage_layers; the hand-offs' send/recv are in that
time), so the slowest stage sets the rate. The host work (scheduling, output
processing) is not split: vLLM's engine core does it for every batch on one CPU thread,
so it is a serial resource and a host-bound replica gains nothing from PP. An empty
pipeline gives a batch the latency of the stages one after another, and at saturation
every stage works on a different batch: up to pp times the throughput. With fewer
requests than engines, stages idle (the bubble).

The group's one process applies each batch when it leaves the last stage and schedules
the next at that moment, always on SimPy's clock: no step runs ahead, and no decode
runs are fast-forwarded, so stepping one event at a time gives the same run.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

import simpy

from simulator.engine.engine_group import EngineGroup, PooledBlocks
from simulator.engine.kv_cache import BlockManager
from simulator.engine.replica import Replica
from simulator.engine.scheduler import StepPlan


class Stages:
    """When each pipeline stage, and the one host thread that schedules every batch, is
    next free."""

    def __init__(self, shares: Sequence[float], overlap: bool = True) -> None:
        self.shares = list(shares)  # each stage's fraction of a batch's GPU time
        self.free = [0.0] * len(self.shares)
        self.host_free = 0.0
        self.overlap = overlap  # host work hidden under the GPU's (async scheduling)

    def enter(self, ready: float, gpu: float, host: float = 0.0) -> tuple[float, float, float]:
        """A batch of `gpu` seconds over all stages and `host` seconds of host work, ready
        at `ready`: when it enters the first stage, its time there, and when it leaves.
        The host work of a batch starts when the previous batch's ends; its GPU work
        starts after it (synchronous scheduling) or with it (async), and the batch is
        out when both are done."""
        began = ready if ready >= self.host_free else self.host_free
        host_end = self.host_free = began + host
        t = began if self.overlap else host_end
        start = first = 0.0
        free = self.free
        for s, (busy_until, share) in enumerate(zip(free, self.shares, strict=True)):
            begin = t if t >= busy_until else busy_until
            t = free[s] = begin + gpu * share
            if s == 0:
                start, first = begin, t - begin
        return start, first, t if t >= host_end else host_end


class SharedKv:
    """The one KV cache of a pipelined replica's engines (vLLM V1's one scheduler holds
    one for all batches in flight): every engine's `kv_source`. A failure loses it;
    `renew` makes the next engine to ask build an empty one, which the others share."""

    def __init__(self, make: Callable[[], BlockManager]) -> None:
        self.make = make
        self._kv: BlockManager | None = None

    def __call__(self) -> BlockManager:
        if self._kv is None:
            self._kv = self.make()
        return self._kv

    def renew(self) -> None:
        self._kv = None


class PipelineGroup(EngineGroup):
    """One replica of pp stages served by up to pp engines (`driven` replicas sharing the
    replica's step log and its one KV cache, `kv`)."""

    def __init__(
        self,
        env: simpy.Environment,
        engines: Sequence[Replica],
        layers: Sequence[int],
        kv: SharedKv,
    ) -> None:
        """`layers`: each stage's layer count (memory_planner.stage_layers); `kv`: the
        engines' `kv_source`."""
        super().__init__(env, engines)
        total = sum(layers)
        self.shares = [n / total for n in layers]
        self.shared_kv = kv
        self.kv = PooledBlocks(self.members[:1])  # every engine's kv is the one cache
        log = self.members[0].log  # one replica: one step table
        log.totals.kv_total_blocks[0] = self.kv.total
        for engine in self.members[1:]:
            engine.log = log
        self.start()

    def fail(self) -> list[int]:
        self.shared_kv.renew()  # the engines' resets build the next one, empty
        return super().fail()

    def _step_loop(self):
        cost = self.members[0].cost
        stages = Stages(self.shares, cost.overheads.async_scheduling)
        flying: list[tuple[float, int, int, StepPlan, bool]] = []  # (out at, order, engine...)
        busy = [False] * len(self.members)
        order = itertools.count()
        while True:
            for i, engine in enumerate(self.members):
                if busy[i] or (plan := engine.next_plan()) is None:
                    continue
                step, completes = engine.plan_cost(plan)
                gpu = step.gpu_seconds + plan.swap_blocks * engine.cfg.swap_seconds_per_block
                host = cost.host_seconds(len(plan.decode_slots) + len(plan.prefill_slots))
                start, stage, out = stages.enter(self.t, gpu, host)
                engine.t = start  # its row in the step table: its turn in the first stage
                held = (self.kv.used, sum(len(e.waiting) for e in self.members))
                engine.log_step(plan, stage, step, held)
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
