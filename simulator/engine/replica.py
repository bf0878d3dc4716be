"""One model replica as a SimPy process: schedule a step, price it, wait, apply it.

Engine steps are the events, never single tokens, and the simulation is only as fast as
the Python work per step: that work does not grow with the batch size (the running set
keeps its sums and counts up to date, see running.py) and most of it happens without
SimPy. The replica keeps its own clock `t` and applies a step ahead of SimPy's clock
when nothing from outside (an arrival, the horizon) can happen before the step ends; it
catches up otherwise, and before a completion (whose callback may read the clock).

When the batch cannot change before the next arrival, completion, KV-block shortage or
the horizon, a run of decode steps is priced and applied as one event (`multi_step`):
step by step in plain Python when it is short, in one vectorised call when it is long.
Every path gives the same numbers, to the last bit, as stepping one by one, which
`multi_step: false` keeps available and the tests compare.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import simpy

from hardware_models.attention import causal_pairs
from hardware_models.power import power_model
from simulator.engine.kv_cache import BlockManager, HybridBlockManager
from simulator.engine.kv_groups import KvCacheGroups
from simulator.engine.prefix_hashes import BlockKeys, HashedBlockManager
from simulator.engine.requests import Outcome, RejectReason, RequestTable
from simulator.engine.running import RunningSet
from simulator.engine.scheduler import IterationPolicy, IterationScheduler, StepPlan
from simulator.engine.sliding_running import SlidingRunningSet
from simulator.engine.step_cost import (
    DecodeSteps,
    StepCost,
    StepCostModel,
    WindowSums,
    window_keys,
    window_sums,
)
from simulator.engine.step_log import StepLog
from simulator.engine.waiting import WaitingQueue
from simulator.metrics.step_totals import StepTotals, power_row

Policy = Literal["static", "dynamic", "continuous", "chunked_prefill"]
MAX_RUN_STEPS = 4096  # longest run of decode steps applied as one event
STEPWISE_RUN_STEPS = 32  # runs expected to be this short are priced one step at a time
_STEP_OFFSETS = np.arange(MAX_RUN_STEPS)


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    policy: Policy
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    total_blocks: int
    max_model_len: int
    watermark: float = 0.0
    preemption: Literal["recompute", "swap"] = "recompute"
    swap_blocks: int = 0
    swap_seconds_per_block: float = 0.0
    max_queue_delay_s: float = 0.0
    max_waiting: int | None = None
    sliding_window: int | None = None  # of the model's sliding-window layers, if any
    kv_groups: KvCacheGroups | None = None  # the hybrid KV cache manager's groups, if on
    scheduling: Literal["fcfs", "priority"] = "fcfs"  # vLLM's --scheduling-policy
    reserve_full_sequence: bool = True
    multi_step: bool = True
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    retried: bool = False  # a failed replica's requests are retried: a handed-off one may return
    prefix_caching: bool = False
    step_table: bool = True  # keep per-step rows (and exact ITL samples), not only totals

    @property
    def iterative(self) -> bool:
        """Scheduled iteration by iteration (vLLM style), not in run-to-completion batches."""
        return self.policy in ("continuous", "chunked_prefill")


def _step_times(start: float, seconds: np.ndarray) -> np.ndarray:
    """Start of each of consecutive steps and the end of the last: a running sum added
    one step at a time (numpy's cumsum is sequential), the same floats as a clock that
    advances step by step."""
    times = np.empty(len(seconds) + 1)
    times[0] = start
    times[1:] = seconds
    return np.cumsum(times, out=times)


class Clock:
    """What every replica may know about the future: the next arrival and the horizon."""

    def __init__(self, horizon: float) -> None:
        self.next_arrival = float("inf")
        self.next_fault = float("inf")  # steps must not run ahead across a failure
        self.horizon = horizon
        self.arrivals_done = False


def empty_kv_cache(config: ReplicaConfig, prefix_keys: BlockKeys | None) -> BlockManager:
    """An empty KV cache of the configured size, keyed by block identity when the
    prompts share blocks (`prefix_keys`) and prefix caching is on."""
    if prefix_keys is not None and config.prefix_caching:
        return HashedBlockManager(
            config.total_blocks, config.block_size, config.watermark, prefix_keys
        )
    if config.kv_groups is not None:
        return HybridBlockManager(
            config.total_blocks, config.kv_groups, config.max_num_batched_tokens, config.watermark
        )
    return BlockManager(config.total_blocks, config.block_size, config.watermark)


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
        on_handoff: Callable[[int, Callable[[], None]], None] | None = None,
        prefix_keys: BlockKeys | None = None,
        driven: bool = False,
        kv_source: Callable[[], BlockManager] | None = None,
    ) -> None:
        """`prefix_keys`: block identities of prompts that share blocks (a trace's block
        hashes); with prefix caching the KV cache is then keyed by them. A `driven`
        replica has no process of its own: a DpGroup steps it with its other dp ranks.
        `kv_source`: where its KV cache comes from when it is shared with other engines
        (a pipelined replica's, pipeline.SharedKv); by default its own."""
        self.env, self.index, self.cfg, self.cost = env, index, config, cost
        self._chunks_priced = cost.prices_by_sequence or bool(config.sliding_window)
        self.prefix_keys = prefix_keys
        self._kv_source = kv_source or functools.partial(empty_kv_cache, config, prefix_keys)
        self.requests, self.clock, self.on_finish = requests, clock, on_finish
        # A prefill replica passes requests on through it: (request, the call that frees
        # the prompt's blocks once sent).
        self.on_handoff = on_handoff
        self.incoming = 0  # requests whose KV cache is on its way here (a decode replica)
        self.log = StepLog(
            index,
            StepTotals(
                [cost.peak_flops],
                [cost.peak_bandwidth],
                [config.total_blocks],
                [config.max_num_batched_tokens if config.iterative else math.inf],
                [config.max_num_seqs],
                [power_row(power_model(cost.gpu), cost.tp * cost.pp)],
            ),
            lambda: env.now,
            keep_rows=config.step_table,
            gaps_final=config.iterative,
        )
        self._wakeup: simpy.Event | None = None
        self._recovery: simpy.Event | None = None
        self.down = False
        self.t = 0.0  # the replica's own clock; SimPy's may lag it (see _catch_up)
        # Static batches: seconds the GPU sat idle while requests waited for a full batch,
        # and those seconds times the requests waiting (their summed wait for the fill).
        self.batch_fill_idle_s = 0.0
        self.batch_fill_wait_s = 0.0
        self._reset()
        if not driven:
            self.process = env.process(self._lifecycle(self.scheduler is not None))

    def _reset(self) -> None:
        """Empty KV cache, queues and scheduler: at start, and after a failure."""
        config, requests = self.cfg, self.requests
        self.kv = self._kv_source()
        self.running = (
            SlidingRunningSet(config.max_num_seqs, config.block_size, requests, self.kv)
            if isinstance(self.kv, HybridBlockManager)
            else RunningSet(config.max_num_seqs, config.block_size, requests)
        )
        self.waiting = WaitingQueue()
        self._batch: list[int] = []  # a run-to-completion batch in progress
        self._batch_ends: np.ndarray | None = None
        self.scheduler = (
            IterationScheduler(
                IterationPolicy(
                    chunked_prefill=config.policy == "chunked_prefill",
                    max_num_seqs=config.max_num_seqs,
                    max_num_batched_tokens=config.max_num_batched_tokens,
                    preemption=config.preemption,
                    scheduling=config.scheduling,
                    reserve_full_sequence=config.reserve_full_sequence,
                    swap_blocks=config.swap_blocks,
                    prefix_caching=config.prefix_caching,
                ),
                requests,
                self.running,
                self.kv,
                self.waiting,
            )
            if config.iterative
            else None
        )

    # ---- failures --------------------------------------------------------------------
    def _lifecycle(self, iterative: bool):
        """Serve until a failure interrupts, stay down until recovered, serve again."""
        while True:
            self._mark = self.log.mark()
            try:
                yield from self._iteration_loop() if iterative else self._batch_loop()
            except simpy.Interrupt:
                # The step in flight never finished: keep only what ended before now.
                self.log.cut(self._mark, self.env.now, gaps=not iterative)
                self._recovery = self.env.event()
                yield self._recovery
                self.down = False
                self.t = self.env.now

    def fail(self) -> list[int]:
        """The replica dies now: it stops, its KV cache is lost, and the requests it held
        (waiting, running, in a batch) are returned for the cluster to retry or fail."""
        held = self.drop()
        self.process.interrupt("replica failure")
        return held

    def drop(self) -> list[int]:
        """Lose the KV cache and queues; the requests held, for fail()."""
        self.running.materialize()
        held = self.waiting.drain()
        held += [int(rid) for rid in self.running.rid[self.running.active]]
        held += self._batch
        self.down = True
        self._reset()
        return sorted(held)

    def recover(self) -> None:
        if self._recovery is not None and not self._recovery.triggered:
            self._recovery.succeed()

    # ---- intake --------------------------------------------------------------------
    def rejection(self, rid: int) -> RejectReason:
        """Why this replica can never serve `rid`, or NONE."""
        req, cfg = self.requests, self.cfg
        prompt = req.prompt.item(rid)
        total = prompt + req.output.item(rid)
        if total > cfg.max_model_len:
            return RejectReason.EXCEEDS_MAX_MODEL_LEN
        held = prompt + 1 if cfg.role == "prefill" else total
        if self.kv.peak_blocks(held - 1) > self.kv.total:
            return RejectReason.EXCEEDS_KV_CACHE
        if cfg.policy == "continuous" and prompt > cfg.max_num_batched_tokens:
            return RejectReason.EXCEEDS_TOKEN_BUDGET
        if cfg.max_waiting is not None and len(self.waiting) >= cfg.max_waiting:
            return RejectReason.QUEUE_FULL
        return RejectReason.NONE

    def submit(self, rid: int, kv_tokens: int = 0) -> None:
        """Queue a request; `kv_tokens` of its KV cache arrive with it (from a prefill
        replica), so it decodes without prefilling."""
        req = self.requests
        req.replica[rid] = self.index
        reason = self.rejection(rid)
        if reason != RejectReason.NONE:
            req.reject(rid, reason, self.env.now)
            self.on_finish(rid)
            self._wake()  # a batcher waiting for more may now know none will come
            return
        if kv_tokens:
            assert self.scheduler is not None
            self.scheduler.arrived_with_kv[rid] = kv_tokens
        self.waiting.push(rid, req.priority.item(rid))
        self._wake()

    def nudge(self) -> None:
        """Re-check now: no arrival is in sight any more, so a partial batch may go."""
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
        """Requests held; a down replica reports itself full so routers pass it by."""
        if self.down:
            return sys.maxsize
        return len(self.waiting) + self.running.count + self.incoming

    # ---- iteration-level policies ----------------------------------------------------
    def _iteration_loop(self):
        assert self.scheduler is not None
        while True:
            dec = self._decode_next()
            if dec is not None:
                yield from self._decode_run(dec)
                continue
            plan = self.next_plan()
            if plan is None:
                # Armed before catching up: a request submitted meanwhile (a closed-loop
                # user answering the step that just ended) must wake it.
                wakeup = self._sleep()
                yield from self._catch_up(self.t)
                self.running.materialize()  # asleep, it may never step again
                yield wakeup
                self.t = self.env.now
                continue
            if self._can_fast_forward(plan):
                yield from self._decode_run(plan.decode_slots)
                continue
            seconds, completes = self._price_step(plan)
            end = self.t + seconds
            if completes or not self._runs_ahead(end):
                yield from self._catch_up(end)
            self.t = end
            self._apply_step(plan, end, completes)

    def next_plan(self) -> StepPlan | None:
        """The step to run now, or None when there is nothing to do."""
        if not (self.running.count or len(self.waiting)):
            return None
        assert self.scheduler is not None
        plan = self.scheduler.schedule(self.t)
        if plan.empty and self.running.decode_count:
            # Only admissions that decode from the next step on (swapped back in): that
            # next step is now.
            plan = self.scheduler.schedule(self.t)
        return None if plan.empty else plan

    def _catch_up(self, end: float):
        """Advance SimPy's clock to the replica's own: steps run ahead of it while nothing
        from outside (an arrival, the horizon) can happen before they end."""
        if end >= self.clock.horizon:  # the run may stop there: the table must be whole
            self.running.materialize()
        yield from self.wait_until(end)

    def wait_until(self, end: float):
        """Timeouts until SimPy's clock reads `end` exactly: from a clock in a lower
        binade, every `now + delay` may round past `end` (ties to even skip every other
        float), and a second, one-ulp timeout then lands on it."""
        while end > self.env.now:
            yield self._timeout_until(end)

    def _timeout_until(self, end: float) -> simpy.Timeout:
        """A timeout that lands exactly on `end`: `now + (end - now)` can be an ulp off,
        and the clock at a completion is what a closed-loop user's next request and the
        run's duration are timed from, in step-by-step mode as in runs."""
        now = self.env.now
        delay = end - now
        while now + delay < end:
            delay = math.nextafter(delay, math.inf)
        while now + delay > end:
            delay = math.nextafter(delay, -math.inf)
        return self.env.timeout(delay)

    def _runs_ahead(self, end: float) -> bool:
        clock = self.clock
        return (
            self.cfg.multi_step
            and end < clock.next_arrival
            and end < clock.horizon
            and end < clock.next_fault
        )

    def _can_fast_forward(self, plan: StepPlan) -> bool:
        return (
            self.cfg.multi_step
            and not plan.prefill_slots
            and plan.swap_blocks == 0
            and not len(self.waiting)
            and len(plan.decode_slots) == self.running.count
        )

    def _decode_keys(self, dec: np.ndarray) -> int:
        """Keys the decodes of a step attend in full-attention layers: each its cached
        tokens plus the new one."""
        run = self.running
        if len(dec) == run.decode_count:
            return run.decode_computed + len(dec)  # kept up to date by the running set
        return int(np.sum(run.decode_computed_of(dec) + 1))

    # ---- one step ----------------------------------------------------------------------
    def _price_step(self, plan: StepPlan) -> tuple[float, bool]:
        """Price and log one scheduled step: (its seconds, whether it completes a request)."""
        cost, completes = self.plan_cost(plan)
        seconds = cost.seconds + plan.swap_blocks * self.cfg.swap_seconds_per_block
        self.log_step(plan, seconds, cost)
        return seconds, completes

    def plan_cost(
        self, plan: StepPlan, padded_tokens: int = 0, moe_tokens: int = 0
    ) -> tuple[StepCost, bool]:
        """Price one scheduled step (a dp rank's: its forward pass over at least
        `padded_tokens`, its MoE layers over all ranks' `moe_tokens`): its cost and
        whether it completes a request."""
        run = self.running
        dec = plan.decode_slots
        n = len(dec)
        prefill_tokens = pairs = context = finishing = 0
        completes = False
        # (new tokens, pairs, keys) of each chunk, where the pricing needs more than their
        # sums: MLA prices the chunks by sequence, sliding windows clip each one.
        chunks = [] if self._chunks_priced else None
        for slot, chunk in zip(plan.prefill_slots, plan.prefill_chunks, strict=True):
            kv_len = run.computed.item(slot) + chunk
            chunk_pairs = causal_pairs(chunk, kv_len)
            if chunks is not None:
                chunks.append((chunk, chunk_pairs, kv_len))
            pairs += chunk_pairs
            context += kv_len
            prefill_tokens += chunk
            if kv_len >= run.target.item(slot):
                finishing += 1
                # A prefill replica hands the request on (at SimPy's clock, like a finish).
                handed_on = self.on_handoff is not None
                completes = completes or handed_on or run.remaining.item(slot) <= 1
        if n and not completes:
            if n == run.decode_count:
                completes = run.min_remaining() <= 1
            else:  # out of lockstep (fewer decodes than decoding requests)
                completes = bool(run.remaining[dec].min() <= 1)
        cost = self.cost.step(
            decode_seqs=n,
            decode_context=self._decode_keys(dec) if n else 0,
            prefill_seqs=len(plan.prefill_slots),
            prefill_tokens=prefill_tokens,
            prefill_pairs=pairs,
            prefill_context=context,
            sampled=n + finishing,
            padded_tokens=padded_tokens,
            moe_tokens=moe_tokens,
            window=self._window_sums(dec, chunks) if self.cfg.sliding_window else None,
            prefill_chunks=chunks,
        )
        return cost, completes

    def _window_sums(self, dec: np.ndarray, chunks: list[tuple[int, int, int]]) -> WindowSums:
        """The step's sums over each sequence's sliding window (of a model whose layers
        slide); `chunks` as plan_cost gathers them, (new tokens, pairs, keys)."""
        keys = [(chunk, kv_len) for chunk, _, kv_len in chunks]
        return window_sums(self.cfg.sliding_window, self.running.decode_computed_of(dec) + 1, keys)

    def log_step(
        self, plan: StepPlan, seconds: float, cost: StepCost, held: tuple[int, int] | None = None
    ) -> None:
        """Record a step of `seconds` that started at the replica's clock; `held`: the
        (KV blocks used, requests waiting) to record, when not this engine's own."""
        n = len(plan.decode_slots)
        used, waiting = held or (self.kv.used, len(self.waiting))
        self.log.step(
            self.t, seconds, n + len(plan.prefill_slots), n, sum(plan.prefill_chunks),
            used, waiting, cost.flops, cost.dram_bytes, cost.bound,
        )  # fmt: skip

    def _apply_step(self, plan: StepPlan, end: float, completes: bool) -> None:
        """The step's tokens, at its end: decodes advance one token, prefill chunks are
        cached, a finished prefill samples the request's first token (or, when it was
        recomputed after a preemption, its next one)."""
        run, req = self.running, self.requests
        self._decode_tokens(plan.decode_slots, end)
        for slot, chunk in zip(plan.prefill_slots, plan.prefill_chunks, strict=True):
            if not run.prefill(slot, chunk):
                continue
            rid = int(run.rid[slot])
            if self.on_handoff is not None:  # decoded on a decode replica, which also
                self._hand_off(slot, rid)  # samples the first token the client sees
                continue
            if math.isnan(req.first_token[rid]):
                req.first_token[rid] = end
            else:
                self.log.gap(end, end - req.last_token[rid])
                self.log.resampled.append(end)
            req.last_token[rid] = end
            req.generated[rid] += 1
            run.remaining[slot] -= 1
            run.start_decoding(slot)
        if completes:
            self._finish(run.finished(), end)

    def _decode_tokens(self, dec: np.ndarray, end: float) -> None:
        """The step's decodes each took a token at `end`: in lockstep when they are all
        the decoding requests, else one request at a time."""
        run, n = self.running, len(dec)
        every_decode = n == run.decode_count
        if every_decode and run.lockstep:
            if n:
                self.log.gap(end, end - run.lockstep_time, n)
            run.advance_lockstep(1, end)
            return
        run.materialize()
        if n:
            run.advance(dec, 1)
            req = self.requests
            rids = run.rid[dec]
            self._log_gaps(end, end - req.last_token[rids])
            req.last_token[rids] = end
            req.generated[rids] += 1
        if every_decode:
            run.enter_lockstep(end)

    def _log_gaps(self, end: float, gaps: np.ndarray) -> None:
        """Inter-token gaps of a step's decodes, one weighted sample per run of equal
        values (usually one: every sequence decoded in the step before)."""
        first = gaps[0]
        if len(gaps) > 1 and (gaps == first).all():
            self.log.gap(end, first, len(gaps))
        else:
            self.log.gaps(end, gaps)

    def _finish(self, slots: list[int], end: float) -> None:
        """Complete the requests in `slots` (ascending, as the order of `on_finish` calls
        decides request ids in a closed loop)."""
        run, req = self.running, self.requests
        for slot in slots:
            rid = int(run.rid[slot])
            self._free(slot)
            req.finish[rid] = end
            req.outcome[rid] = Outcome.COMPLETED
            self.on_finish(rid)

    def _free(self, slot: int) -> None:
        """Release a slot that is done here (the scheduler keeps a session's prefix)."""
        assert self.scheduler is not None  # slots exist only under iteration-level policies
        self.scheduler.free(slot)

    def _hand_off(self, slot: int, rid: int) -> None:
        """Pass a prefilled request on to be decoded elsewhere. The token this step
        sampled goes nowhere (vLLM's P/D proxy sends the prefill with max_tokens=1 and
        drops its answer); the prompt's blocks stay held until the transfer has read
        them, then go free (or cached) in the KV cache they were taken from."""
        assert self.scheduler is not None and self.on_handoff is not None
        release_blocks, kv = self.scheduler.detach(slot, self.cfg.retried), self.kv

        def release() -> None:
            if self.kv is kv:  # else a failure has emptied the cache meanwhile
                release_blocks()

        self.on_handoff(rid, release)

    # ---- runs of decode steps --------------------------------------------------------
    def _decode_next(self) -> np.ndarray | None:
        """The slots of the next step when the scheduler could only plan the decode of
        every running request, with their next tokens' blocks given as the scheduler
        gives them; None when it could plan anything else (or runs are off): nothing
        waits (no admission or swap-in), none prefills, they fit the token budget and
        their blocks are free (no preemption). Asked where the scheduler would be, in
        the same state: the plan is the one it would make, without its general pass."""
        run, kv = self.running, self.kv
        if not self.cfg.multi_step or len(self.waiting) or not run.count:
            return None
        if run.decode_count != run.count or run.count > self.cfg.max_num_batched_tokens:
            return None
        dec = run.decoding()
        need = run.next_block_need(dec)
        if need > kv.free:
            return None
        if need:
            kv.allocate(need)
        if need or run.frees_blocks:  # sliding groups give blocks back (hybrid cache)
            run.take_next_blocks(dec)
        return dec

    def _decode_run(self, dec: np.ndarray):
        """Decode-only steps with the batch of this step, up to the first that could see
        a change: a completion, an arrival, the horizon or a KV-block shortage (or
        MAX_RUN_STEPS). A run expected to be short is priced one step at a time; a long
        one in a vectorised call, whose fixed cost only pays off over many steps."""
        run = self.running
        min_remaining = run.min_remaining()
        steps = min(min_remaining, MAX_RUN_STEPS)
        pricer = self.cost.decode_steps(len(dec))
        contexts, windowed = self._run_contexts(dec, steps)
        first = pricer.price(int(contexts[0]), int(windowed[0]) if windowed is not None else 0)
        expected = min(steps, (self.clock.next_arrival - self.t) / first[0])
        if expected <= STEPWISE_RUN_STEPS:
            ends, blocks = self._price_run_stepwise(
                pricer, first, contexts, windowed, steps, max(math.ceil(expected), 1)
            )
        else:
            ends, blocks = self._price_run_vectorised(pricer, contexts, windowed)
        # Each step takes its blocks when it starts: a router looking during the last
        # step (an arrival cut the run) sees them all, as it would stepping one by one.
        self.kv.allocate(blocks)
        end = ends[-1]
        yield from self._catch_up(end)
        self.t = end
        k = len(ends)
        # The gaps between consecutive tokens, as stepping one by one computes them.
        if run.lockstep:  # every decode's previous token came at the lockstep time
            self.log.run_gaps([run.lockstep_time, *ends], len(dec))
            run.advance_lockstep(k, end)
        else:
            self._decode_tokens(dec, ends[0])
            if k > 1:
                self.log.run_gaps(ends, len(dec))
                run.advance_lockstep(k - 1, end)
        if k == min_remaining:
            self._finish(run.finished(), end)

    def _run_contexts(
        self, dec: np.ndarray, steps: int
    ) -> tuple[np.ndarray | range, np.ndarray | None]:
        """Total keys the decodes attend at each step of a run: in full-attention layers,
        and in sliding-window ones (None: no layer slides)."""
        n, first = len(dec), self._decode_keys(dec)
        full = range(first, first + n * steps, n)
        window = self.cfg.sliding_window
        if not window:
            return full, None
        offsets = _STEP_OFFSETS[:steps]
        keys = self.running.decode_computed_of(dec)[:, None] + 1 + offsets[None, :]
        return full, window_keys(keys, window).sum(axis=0)

    def _price_run_stepwise(
        self,
        pricer: DecodeSteps,
        first: tuple,
        contexts: np.ndarray | range,
        windowed: np.ndarray | None,
        steps: int,
        expected: int,
    ) -> tuple[list[float], int]:
        """Price and log a run step by step (`first` is step 0's DecodeSteps.price; about
        `expected` steps run before the next arrival): the end of each step and the KV
        blocks the steps after the first need."""
        arrival, horizon, fault = self.clock.next_arrival, self.clock.horizon, self.clock.next_fault
        free, used = self.kv.free, self.kv.used
        # The blocks of the steps expected (a step more, as the run ends at the step that
        # crosses the arrival), more only if the run gets that far.
        opens = self.running.run_block_needs(min(steps, expected + 1)).tolist()
        n, replica = pricer.seqs, self.index
        price = pricer.price
        start, blocks = self.t, 0
        seconds, _, flops, dram, bound = first
        end = start + seconds
        rows = [(start, seconds, n, n, 0, used, 0, flops, dram, bound, replica)]
        ends = [end]
        for j in range(1, steps):
            # Does step j still run before anything could change the batch?
            if j == len(opens):
                opens = self.running.run_block_needs(min(steps, 2 * j)).tolist()
            need = opens[j]
            if end >= arrival or blocks + need > free:
                break
            start = end
            window = int(windowed[j]) if windowed is not None else 0
            seconds, _, flops, dram, bound = price(int(contexts[j]), window)
            end = start + seconds
            if end >= horizon or end > fault:
                break
            blocks += need
            rows.append((start, seconds, n, n, 0, used + blocks, 0, flops, dram, bound, replica))
            ends.append(end)
        self.log.step_rows(rows)
        return ends, blocks

    def _price_run_vectorised(
        self, pricer: DecodeSteps, contexts: np.ndarray | range, windowed: np.ndarray | None
    ) -> tuple[list[float], int]:
        """Price and log a run in one vectorised call: the end of each step and the KV
        blocks the steps after the first need."""
        if isinstance(contexts, range):
            contexts = contexts.start + contexts.step * _STEP_OFFSETS[: len(contexts)]
        seconds, flops, dram, bound = pricer.many(contexts, windowed)
        times = _step_times(self.t, seconds)
        k, cum_blocks = self._run_length(times)
        times, seconds = times[: k + 1], seconds[:k]
        if isinstance(bound, np.ndarray):
            bound = bound[:k]
        n, used = pricer.seqs, self.kv.used + cum_blocks[:k]
        self.log.steps_many(times[:-1], seconds, n, n, used, 0, flops[:k], dram[:k], bound)
        return times[1:].tolist(), int(cum_blocks[k - 1])

    def _run_length(self, times: np.ndarray) -> tuple[int, np.ndarray]:
        """Steps that can run before anything could change the batch (of those whose
        start and end are `times[j]` and `times[j + 1]`), and the extra KV blocks the run
        has needed by each step."""
        limit = len(times) - 1
        if self.clock.next_arrival < math.inf:
            limit = int(np.searchsorted(times[:-1], self.clock.next_arrival, side="left"))
        if self.clock.horizon < math.inf:
            limit = min(limit, int(np.searchsorted(times[1:], self.clock.horizon, side="left")))
        if self.clock.next_fault < math.inf:
            limit = min(limit, int(np.searchsorted(times[1:], self.clock.next_fault, "right")))
        cum_blocks = np.cumsum(self.running.run_block_needs(max(limit, 1)))
        # Sliding windows give blocks back: the first step over the free is the first
        # whose running peak is.
        peaks = np.maximum.accumulate(cum_blocks) if self.running.frees_blocks else cum_blocks
        kv_limit = int(np.searchsorted(peaks, self.kv.free, side="right"))
        return max(1, min(limit, kv_limit)), cum_blocks

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
        # A partial batch goes when no arrival is in sight (the last one came, or a closed
        # loop's users all wait on this queue): waiting for more would wait forever.
        if waiting >= self.cfg.max_num_seqs or self.clock.arrivals_done:
            return True, None
        if self.clock.next_arrival == math.inf:
            return True, None
        if self.cfg.policy == "static":
            return False, None
        # From the longest-waiting request, whatever its class: Triton's max_queue_delay
        # is the longest any request is delayed for a batch to form.
        oldest = self.waiting.oldest_arrival(self.requests.arrival)
        delay = oldest + self.cfg.max_queue_delay_s - self.env.now
        # A nanosecond of slack: now + (deadline - now) can land an ulp short of deadline.
        return delay <= 1e-9, delay

    def _batch_loop(self):
        req = self.requests
        while True:
            self._mark = self.log.mark()
            ready, delay = self._batch_ready()
            if not ready:
                waiting, since = len(self.waiting), self.env.now
                yield self._sleep(delay)
                if waiting and self.cfg.policy == "static":  # idle until the batch is full
                    self.batch_fill_idle_s += self.env.now - since
                    self.batch_fill_wait_s += waiting * (self.env.now - since)
                continue
            self._batch = self._take_batch()
            self._batch_ends = None  # no decode step of this batch has run yet
            batch = np.asarray(self._batch, dtype=np.int64)
            n = len(batch)
            prompt = int(req.prompt[batch].max())
            outputs = req.output[batch]
            blocks = n * self.kv.blocks_for(prompt + int(outputs.max()) - 1)
            self.kv.allocate(blocks)
            now = self.env.now
            req.first_scheduled[batch] = now
            # Prefill: every prompt padded to the longest in the batch.
            window = self.cfg.sliding_window
            cost = self.cost.step(
                decode_seqs=0,
                decode_context=0,
                prefill_seqs=n,
                prefill_tokens=n * prompt,
                prefill_pairs=n * causal_pairs(prompt, prompt),
                prefill_context=n * prompt,
                window=window_sums(window, np.empty(0), [(prompt, prompt)] * n) if window else None,
            )
            self.log.step(
                now, cost.seconds, n, 0, n * prompt, self.kv.used, len(self.waiting),
                cost.flops, cost.dram_bytes, cost.bound,
            )  # fmt: skip
            yield self.env.timeout(cost.seconds)
            first = self.env.now
            req.first_token[batch] = first
            req.generated[batch] = 1
            yield from self._padded_decode(batch, prompt, outputs, first)
            self._batch = []
            self.kv.release(blocks)

    def _padded_decode(self, batch: np.ndarray, prompt: int, outputs: np.ndarray, first: float):
        """Decode at full batch width until the longest output is done; each request
        completes when its own last token is out (the run may stop in between)."""
        n = len(batch)
        steps = int(outputs.max()) - 1
        if steps <= 0:
            self._complete_batch(batch, first)
            return
        keys = prompt + 1 + np.arange(steps)
        window = self.cfg.sliding_window
        windowed = n * window_keys(keys, window) if window else None
        seconds, flops, dram, bound = self.cost.decode_run(n, n * keys, windowed)
        times = _step_times(first, seconds)
        ends = times[1:]
        self.log.steps_many(
            times[:-1], seconds, n, n, self.kv.used, len(self.waiting), flops, dram, bound,
        )  # fmt: skip
        still_generating = (outputs[None, :] - 1 > np.arange(steps)[:, None]).sum(axis=1)
        self.log.gaps(ends, np.diff(times), still_generating)
        finish = np.where(outputs > 1, ends[np.maximum(outputs - 2, 0)], first)
        self._batch_ends = ends  # for settle(): the tokens out when a run stops midway
        moments = np.unique(finish) if self.cfg.multi_step else np.concatenate(([first], ends))
        for moment in moments.tolist():
            yield from self.wait_until(moment)
            done = batch[finish == moment]
            if len(done):
                self._complete_batch(done, moment)
        yield from self.wait_until(float(ends[-1]))  # the padded batch holds its slots

    def settle(self, now: float) -> None:
        """The run stops at `now`: count the tokens in-flight requests already have."""
        self.running.materialize()
        if not self._batch or self._batch_ends is None:
            return
        batch = np.asarray(self._batch, dtype=np.int64)
        decoded = int(np.searchsorted(self._batch_ends, now, side="right"))
        self.log.keep_gaps(self._mark, decoded)  # its gaps past `now` never happened
        req = self.requests
        req.generated[batch] = np.minimum(1 + decoded, req.output[batch])
        if decoded:
            req.last_token[batch] = self._batch_ends[decoded - 1]

    def _complete_batch(self, done: np.ndarray, end: float) -> None:
        req = self.requests
        req.finish[done] = end
        req.last_token[done] = end
        req.generated[done] = req.output[done]
        req.outcome[done] = Outcome.COMPLETED
        finished = set(done.tolist())
        self._batch = [rid for rid in self._batch if rid not in finished]
        for rid in sorted(finished):
            self.on_finish(rid)
