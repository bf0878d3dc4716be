"""One model replica as a SimPy process: schedule a step, price it, wait, apply it.

Engine steps are the events, never single tokens. When the batch cannot change before
the next arrival, completion, KV-block shortage or the horizon, a run of decode steps is
priced in one vectorised call and applied in one event (`multi_step`); the results are
the same as stepping one by one, which `multi_step: false` keeps available and the
tests compare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import simpy

from hardware_models.attention import causal_pairs
from simulator.engine.kv_cache import BlockManager
from simulator.engine.requests import Outcome, RejectReason, RequestTable
from simulator.engine.running import RunningSet
from simulator.engine.scheduler import IterationPolicy, IterationScheduler, StepPlan
from simulator.engine.step_cost import StepCostModel
from simulator.engine.step_log import StepLog
from simulator.engine.waiting import WaitingQueue

Policy = Literal["static", "dynamic", "continuous", "chunked_prefill"]
MAX_RUN_STEPS = 4096


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    policy: Policy
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    total_blocks: int
    max_model_len: int
    watermark: float = 0.01
    preemption: Literal["recompute", "swap"] = "recompute"
    swap_blocks: int = 0
    swap_seconds_per_block: float = 0.0
    max_queue_delay_s: float = 0.0
    max_waiting: int | None = None
    sliding_window: int | None = None
    priority_preemption: bool = True
    multi_step: bool = True


class Clock:
    """What every replica may know about the future: the next arrival and the horizon."""

    def __init__(self, horizon: float) -> None:
        self.next_arrival = float("inf")
        self.horizon = horizon
        self.arrivals_done = False


class Replica:
    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        config: ReplicaConfig,
        cost: StepCostModel,
        requests: RequestTable,
        clock: Clock,
        on_finish: Callable[[int], None],
    ) -> None:
        self.env, self.index, self.cfg, self.cost = env, index, config, cost
        self.requests, self.clock, self.on_finish = requests, clock, on_finish
        self.kv = BlockManager(config.total_blocks, config.block_size, config.watermark)
        self.running = RunningSet(config.max_num_seqs)
        self.waiting = WaitingQueue()
        self.log = StepLog(index)
        self.busy_seconds = 0.0
        self._wakeup: simpy.Event | None = None
        self.t = 0.0  # the replica's own clock; SimPy's may lag it (see _catch_up)
        iterative = config.policy in ("continuous", "chunked_prefill")
        self.scheduler = (
            IterationScheduler(
                IterationPolicy(
                    chunked_prefill=config.policy == "chunked_prefill",
                    max_num_seqs=config.max_num_seqs,
                    max_num_batched_tokens=config.max_num_batched_tokens,
                    preemption=config.preemption,
                    priority_preemption=config.priority_preemption,
                    swap_blocks=config.swap_blocks,
                ),
                requests,
                self.running,
                self.kv,
                self.waiting,
            )
            if iterative
            else None
        )
        loop = self._iteration_loop() if iterative else self._batch_loop()
        self.process = env.process(loop)

    # ---- intake --------------------------------------------------------------------
    def rejection(self, rid: int) -> RejectReason:
        """Why this replica can never serve `rid`, or NONE."""
        req, cfg = self.requests, self.cfg
        total = int(req.prompt[rid] + req.output[rid])
        if total > cfg.max_model_len:
            return RejectReason.EXCEEDS_MAX_MODEL_LEN
        if self.kv.blocks_for(total - 1) > self.kv.total:
            return RejectReason.EXCEEDS_KV_CACHE
        if cfg.policy == "continuous" and req.prompt[rid] > cfg.max_num_batched_tokens:
            return RejectReason.EXCEEDS_TOKEN_BUDGET
        if cfg.max_waiting is not None and len(self.waiting) >= cfg.max_waiting:
            return RejectReason.QUEUE_FULL
        return RejectReason.NONE

    def submit(self, rid: int) -> None:
        req = self.requests
        req.replica[rid] = self.index
        reason = self.rejection(rid)
        if reason != RejectReason.NONE:
            req.reject(rid, reason, self.env.now)
            self.on_finish(rid)
            return
        self.waiting.push(rid, int(req.priority[rid]))
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _sleep(self, timeout: float | None = None):
        self._wakeup = self.env.event()
        if timeout is None:
            return self._wakeup
        return self._wakeup | self.env.timeout(timeout)

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + self.running.count

    # ---- iteration-level policies ----------------------------------------------------
    def _iteration_loop(self):
        assert self.scheduler is not None
        while True:
            plan = None
            if self.running.count or len(self.waiting):
                plan = self.scheduler.schedule(self.t)
            if plan is None or plan.empty:
                yield from self._catch_up(self.t)
                yield self._sleep()
                self.t = self.env.now
                continue
            if self._can_fast_forward(plan):
                yield from self._decode_run(plan.decode_slots)
            else:
                yield from self._single_step(plan)

    def _catch_up(self, end: float):
        """Advance SimPy's clock to the replica's own: steps run ahead of it while nothing
        from outside (an arrival, the horizon) can happen before they end."""
        if end > self.env.now:
            yield self.env.timeout(end - self.env.now)

    def _runs_ahead(self, end: float) -> bool:
        return self.cfg.multi_step and end < self.clock.next_arrival and end < self.clock.horizon

    def _can_fast_forward(self, plan: StepPlan) -> bool:
        return (
            self.cfg.multi_step
            and not plan.prefill_slots
            and plan.swap_blocks == 0
            and not len(self.waiting)
            and len(plan.decode_slots) == self.running.count
        )

    def _decode_context(self, computed: np.ndarray) -> np.ndarray | int:
        """Keys attended by each decode (its cached tokens plus the new one)."""
        keys = computed + 1
        window = self.cfg.sliding_window
        return np.minimum(keys, window) if window else keys

    def _single_step(self, plan: StepPlan):
        run, req, now = self.running, self.requests, self.t
        dec = plan.decode_slots
        prefill_tokens = sum(plan.prefill_chunks)
        pairs = 0
        context = 0
        for slot, chunk in zip(plan.prefill_slots, plan.prefill_chunks, strict=True):
            kv_len = int(run.computed[slot]) + chunk
            pairs += causal_pairs(chunk, kv_len, self.cfg.sliding_window)
            context += kv_len
        finishing = sum(
            1
            for slot, chunk in zip(plan.prefill_slots, plan.prefill_chunks, strict=True)
            if run.computed[slot] + chunk >= run.target[slot]
        )
        cost = self.cost.step(
            decode_seqs=len(dec),
            decode_context=int(np.sum(self._decode_context(run.computed[dec]))),
            prefill_seqs=len(plan.prefill_slots),
            prefill_tokens=prefill_tokens,
            prefill_pairs=pairs,
            prefill_context=context,
            sampled=len(dec) + finishing,
        )
        seconds = cost.seconds + plan.swap_blocks * self.cfg.swap_seconds_per_block
        self.log.step(
            now, seconds, len(dec) + len(plan.prefill_slots), len(dec), prefill_tokens,
            self.kv.used, len(self.waiting), cost.flops, cost.dram_bytes, cost.bound,
        )  # fmt: skip
        end = now + seconds
        completes = bool((run.remaining[dec] <= 1).any()) or any(
            run.remaining[slot] <= 1 and run.computed[slot] + chunk >= run.target[slot]
            for slot, chunk in zip(plan.prefill_slots, plan.prefill_chunks, strict=True)
        )
        if completes or not self._runs_ahead(end):
            yield from self._catch_up(end)
        self.t = end
        self.busy_seconds += seconds
        sampled = list(dec)
        if len(dec):
            run.computed[dec] += 1
        for slot, chunk in zip(plan.prefill_slots, plan.prefill_chunks, strict=True):
            run.computed[slot] += chunk
            if run.computed[slot] >= run.target[slot]:
                rid = int(run.rid[slot])
                if np.isnan(req.first_token[rid]):
                    req.first_token[rid] = end
                    req.last_token[rid] = end
                    req.generated[rid] += 1
                    run.remaining[slot] -= 1
                    continue
                sampled.append(slot)
        self._emit_tokens(np.asarray(sampled, dtype=np.int64), end)

    def _emit_tokens(self, slots: np.ndarray, end: float) -> None:
        """Each slot produced one token at `end`: count it, record the gap, finish."""
        if len(slots) == 0:
            self._finish_done(end)
            return
        run, req = self.running, self.requests
        rids = run.rid[slots]
        self.log.gaps(end - req.last_token[rids])
        req.last_token[rids] = end
        req.generated[rids] += 1
        run.remaining[slots] -= 1
        self._finish_done(end)

    def _finish_done(self, end: float) -> None:
        run, req = self.running, self.requests
        done = np.flatnonzero(run.active & (run.remaining <= 0))
        for slot in done.tolist():
            rid = int(run.rid[slot])
            req.finish[rid] = end
            req.outcome[rid] = Outcome.COMPLETED
            self.kv.release(int(run.blocks[slot]))
            run.remove(slot)
            self.on_finish(rid)

    def _run_length(self, dec: np.ndarray, durations: np.ndarray) -> tuple[int, np.ndarray]:
        """Steps that can run before anything could change the batch, and the extra KV
        blocks the run needs by each step."""
        now = self.t
        ends = now + np.cumsum(durations)
        starts = ends - durations
        limit = min(
            int(np.searchsorted(starts, self.clock.next_arrival, side="left")),
            int(np.searchsorted(ends, self.clock.horizon, side="left")),
        )
        run, bs = self.running, self.kv.block_size
        held = run.blocks[dec]
        first_new = held * bs - run.computed[dec]  # step index of each slot's next block
        steps = len(durations)
        per_slot = np.maximum(0, -(-(steps - first_new) // bs))
        offsets = np.arange(int(per_slot.max(initial=0)))
        positions = first_new[:, None] + bs * offsets[None, :]
        positions = positions[positions < steps]
        cum_blocks = np.cumsum(np.bincount(positions, minlength=steps))
        kv_limit = int(np.searchsorted(cum_blocks, self.kv.free, side="right"))
        return max(1, min(limit, kv_limit)), cum_blocks

    def _decode_run(self, dec: np.ndarray):
        run, req = self.running, self.requests
        n = len(dec)
        horizon = int(min(run.remaining[dec].min(), MAX_RUN_STEPS))
        computed = run.computed[dec]
        steps = np.arange(horizon)
        if self.cfg.sliding_window:
            keys = computed[:, None] + 1 + steps[None, :]
            contexts = np.minimum(keys, self.cfg.sliding_window).sum(axis=0)
        else:
            contexts = int(computed.sum()) + n + n * steps
        seconds, flops, dram, bound = self.cost.decode_run(n, contexts)
        k, cum_blocks = self._run_length(dec, seconds)
        seconds = seconds[:k]
        now = self.t
        ends = now + np.cumsum(seconds)
        extra = int(cum_blocks[k - 1])
        used = self.kv.used + cum_blocks[:k]
        self.log.steps_many(ends - seconds, seconds, n, n, used, 0, flops[:k], dram[:k], bound)
        end = float(ends[-1])
        yield from self._catch_up(end)
        self.t = end
        self.busy_seconds += float(seconds.sum())
        rids = run.rid[dec]
        self.log.gaps(ends[0] - req.last_token[rids])
        if k > 1:
            self.log.gaps(seconds[1:], n)
        self.kv.allocate(extra)
        run.computed[dec] += k
        run.blocks[dec] = -(-run.computed[dec] // self.kv.block_size)
        run.remaining[dec] -= k
        req.generated[rids] += k
        req.last_token[rids] = end
        self._finish_done(end)

    # ---- run-to-completion policies (static, dynamic) ------------------------------------
    def _take_batch(self) -> list[int]:
        """Up to max_num_seqs waiting requests whose padded KV footprint fits."""
        req, kv = self.requests, self.kv
        batch: list[int] = []
        longest_prompt = longest_output = 0
        while len(self.waiting) and len(batch) < self.cfg.max_num_seqs:
            rid, level = self.waiting.peek()
            prompt = max(longest_prompt, int(req.prompt[rid]))
            output = max(longest_output, int(req.output[rid]))
            if (len(batch) + 1) * kv.blocks_for(prompt + output - 1) > kv.free:
                break
            batch.append(self.waiting.pop(level))
            longest_prompt, longest_output = prompt, output
        return batch

    def _batch_ready(self) -> tuple[bool, float | None]:
        """(start now?, seconds until the dynamic batcher's delay expires)."""
        waiting = len(self.waiting)
        if waiting == 0:
            return False, None
        if waiting >= self.cfg.max_num_seqs or self.clock.arrivals_done:
            return True, None
        if self.cfg.policy == "static":
            return False, None
        oldest, _ = self.waiting.peek()
        delay = self.requests.arrival[oldest] + self.cfg.max_queue_delay_s - self.env.now
        # A nanosecond of slack: now + (deadline - now) can land an ulp short of deadline.
        return delay <= 1e-9, delay

    def _batch_loop(self):
        req = self.requests
        while True:
            ready, delay = self._batch_ready()
            if not ready:
                yield self._sleep(delay)
                continue
            batch = np.asarray(self._take_batch(), dtype=np.int64)
            n = len(batch)
            prompt = int(req.prompt[batch].max())
            outputs = req.output[batch]
            blocks = n * self.kv.blocks_for(prompt + int(outputs.max()) - 1)
            self.kv.allocate(blocks)
            now = self.env.now
            req.first_scheduled[batch] = now
            # Prefill: every prompt padded to the longest in the batch.
            cost = self.cost.step(
                decode_seqs=0,
                decode_context=0,
                prefill_seqs=n,
                prefill_tokens=n * prompt,
                prefill_pairs=n * causal_pairs(prompt, prompt, self.cfg.sliding_window),
                prefill_context=n * prompt,
            )
            self.log.step(
                now, cost.seconds, n, 0, n * prompt, self.kv.used, len(self.waiting),
                cost.flops, cost.dram_bytes, cost.bound,
            )  # fmt: skip
            yield self.env.timeout(cost.seconds)
            self.busy_seconds += cost.seconds
            first = self.env.now
            req.first_token[batch] = first
            req.generated[batch] = 1
            yield from self._padded_decode(batch, prompt, outputs, first)
            self.kv.release(blocks)

    def _padded_decode(self, batch: np.ndarray, prompt: int, outputs: np.ndarray, first: float):
        """Decode at full batch width until the longest output is done."""
        req, n = self.requests, len(batch)
        steps = int(outputs.max()) - 1
        if steps > 0:
            keys = prompt + 1 + np.arange(steps)
            if self.cfg.sliding_window:
                keys = np.minimum(keys, self.cfg.sliding_window)
            seconds, flops, dram, bound = self.cost.decode_run(n, n * keys)
            ends = first + np.cumsum(seconds)
            self.log.steps_many(
                ends - seconds, seconds, n, n, self.kv.used, len(self.waiting),
                flops, dram, bound,
            )  # fmt: skip
            still_generating = (outputs[None, :] - 1 > np.arange(steps)[:, None]).sum(axis=1)
            self.log.gaps(seconds, still_generating)
            if self.cfg.multi_step:
                yield self.env.timeout(float(ends[-1] - first))
            else:
                for d in seconds:
                    yield self.env.timeout(float(d))
            self.busy_seconds += float(seconds.sum())
            finish = np.where(outputs > 1, ends[np.maximum(outputs - 2, 0)], first)
        else:
            finish = np.full(n, first)
        req.finish[batch] = finish
        req.last_token[batch] = finish
        req.generated[batch] = outputs
        req.outcome[batch] = Outcome.COMPLETED
        for rid in batch.tolist():
            self.on_finish(rid)
