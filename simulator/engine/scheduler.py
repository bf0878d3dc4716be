"""Iteration-level schedulers (Orca / vLLM): one `schedule()` per engine step that returns
a plain StepPlan within a token budget, prefill and decode unified.

- `continuous`: prefill first. When waiting requests can be admitted, the step runs
  their whole prompts and running decodes pause; otherwise every running request decodes.
- `chunked_prefill`: decodes first, then prefill chunks (partial ones first, then new
  admissions) fill what is left of the token budget (Sarathi-Serve / vLLM v1).

Both admit in arrival order (FCFS, vLLM's default --scheduling-policy) or, under
`priority` scheduling, by priority class then arrival; keep a KV watermark free for
running requests (by default none for chunked prefill, as vLLM v1, and 1% for
continuous, as vLLM v0); and preempt when the cache runs out, even the request asking
for blocks: the most recently admitted under FCFS, max(running, key=(priority,
arrival)) under priority scheduling (vLLM v1's Scheduler.schedule). A preempted request
is recomputed (vLLM v1 has no other way) or, under `continuous` (vLLM v0), may be
swapped to host memory. A step that preempted admits nothing new, and a request is
admitted only while the blocks for its whole sequence are free (vLLM 0.19).

Only `continuous` under priority scheduling lets a waiting request preempt running
ones that come after it in (priority, arrival) order, as vLLM v0's
Scheduler._schedule_priority_preemption did in a step that scheduled no prefill; vLLM
v1 never does (its waiting loop stops at the first request without blocks).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from hardware_models.errors import InfersimError
from simulator.engine.kv_cache import (
    BlockManager,
    CacheKey,
    request_key,
    session_key,
    unreachable_key,
)
from simulator.engine.prefix_hashes import HashedBlockManager, Key
from simulator.engine.requests import RequestTable
from simulator.engine.running import RunningSet
from simulator.engine.waiting import WaitingQueue


@dataclass(frozen=True, slots=True)
class IterationPolicy:
    chunked_prefill: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    preemption: Literal["recompute", "swap"] = "recompute"
    scheduling: Literal["fcfs", "priority"] = "fcfs"  # vLLM's --scheduling-policy
    reserve_full_sequence: bool = True  # admission needs the whole sequence's blocks free
    swap_blocks: int = 0  # host blocks available for swapping
    prefix_caching: bool = False  # recomputes and a session's next turn reuse cached blocks


@dataclass(slots=True)
class StepPlan:
    decode_slots: np.ndarray
    prefill_slots: list[int] = field(default_factory=list)
    prefill_chunks: list[int] = field(default_factory=list)
    swap_blocks: int = 0  # blocks copied over PCIe this step (out + in)
    preempted: bool = False  # a running request was preempted for this step's blocks

    @property
    def empty(self) -> bool:
        return len(self.decode_slots) == 0 and not self.prefill_slots


@dataclass(slots=True)
class _Swapped:
    computed: int
    target: int
    remaining: int
    blocks: int


class IterationScheduler:
    def __init__(
        self,
        policy: IterationPolicy,
        requests: RequestTable,
        running: RunningSet,
        kv: BlockManager,
        waiting: WaitingQueue,
    ) -> None:
        self.policy = policy
        self.requests = requests
        self.running = running
        self.kv = kv
        # Prompts with block hashes share a cache keyed by content (prefix_hashes.py).
        self.hashed = kv if isinstance(kv, HashedBlockManager) and policy.prefix_caching else None
        self.waiting = waiting
        self.swapped: dict[int, _Swapped] = {}
        self.swap_used = 0
        # Requests whose KV cache arrived from a prefill replica: tokens already cached.
        self.arrived_with_kv: dict[int, int] = {}
        self.now = 0.0
        self.by_priority = policy.scheduling == "priority"
        # vLLM v0's priority preemption: prefill-first (continuous) and priority only.
        self.waiting_preempts = self.by_priority and not policy.chunked_prefill

    # ---- preemption ----------------------------------------------------------------
    def _preempt(self, slot: int, plan: StepPlan) -> None:
        run, req = self.running, self.requests
        rid = int(run.rid[slot])
        blocks = run.blocks_of(slot)
        level = int(run.priority[slot])
        computed, target = run.computed_of(slot), int(run.target[slot])
        req.preemptions[rid] += 1
        plan.preempted = True
        # A request whose prefill is unfinished is recomputed (its partial blocks are not
        # swapped; vLLM v0 would swap them too). A finished one is swapped out, or, as
        # vLLM v0's Scheduler._swap_out (block_manager.can_swap_out false), the run stops.
        swap = self.policy.preemption == "swap" and computed >= target
        if swap and self.swap_used + blocks > self.policy.swap_blocks:
            self._out_of_swap_space(rid, blocks)
        if self.hashed is not None:  # swapped blocks come back as its own
            self.hashed.leave(rid, blocks, 0 if swap else computed, finished=False)
        else:
            self.kv.release(blocks)
        if swap:
            req.swaps[rid] += 1
            self.swapped[rid] = _Swapped(computed, target, run.remaining_of(slot), blocks)
            self.swap_used += blocks
            plan.swap_blocks += blocks
        elif self.policy.prefix_caching and self.hashed is None:
            self.kv.keep_cached(request_key(rid), computed // self.kv.block_size)
        if self.by_priority:
            self.waiting.push_by_arrival(rid, level, req.arrival)
        else:
            self.waiting.push_front(rid, level)
        run.remove(slot)

    def _out_of_swap_space(self, rid: int, blocks: int) -> None:
        free, total = self.policy.swap_blocks - self.swap_used, self.policy.swap_blocks
        raise InfersimError(
            f"at t={self.now:.3f} s, swapping out request {rid} needs {blocks} KV blocks, "
            f"but the host swap space (serving.swap_space_gb) has {free} of {total} free: "
            "vLLM v0 aborts here ('Aborted due to the lack of CPU swap space'); raise "
            "serving.swap_space_gb or use serving.preemption: recompute"
        )

    def _make_room(self, blocks: int, plan: StepPlan, requester: int) -> bool:
        """Preempt victims until `blocks` are free for `requester`; False when the
        requester itself was the victim (RunningSet.victim is preempted whoever asks,
        as vLLM v1 takes it from its running list)."""
        while self.kv.free < blocks:
            victim = self.running.victim(self.by_priority)
            self._drop_from_plan(victim, plan)
            self._preempt(victim, plan)
            if victim == requester:
                return False
        return True

    @staticmethod
    def _drop_from_plan(slot: int, plan: StepPlan) -> None:
        if slot in plan.prefill_slots:
            i = plan.prefill_slots.index(slot)
            del plan.prefill_slots[i]
            del plan.prefill_chunks[i]
        if len(plan.decode_slots) and slot in plan.decode_slots:
            plan.decode_slots = plan.decode_slots[plan.decode_slots != slot]

    # ---- the step ------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan:
        self.now = now
        swapped = 0  # blocks copied by an admission pass whose plan is replaced
        if not self.policy.chunked_prefill and len(self.waiting):
            plan = StepPlan(np.empty(0, dtype=np.int64))
            self._admit(plan, self.policy.max_num_batched_tokens)
            if plan.prefill_slots:
                return plan
            swapped = plan.swap_blocks
        plan = self._schedule_running_then_admit()
        if plan.swap_blocks and plan.empty:
            # Only swaps were scheduled: the requests swapped back in decode in this
            # step rather than leave the replica idle (asleep until the next arrival).
            swapped += plan.swap_blocks
            plan = self._schedule_running_then_admit()
        if swapped:
            plan.swap_blocks += swapped
        return plan

    def _schedule_running_then_admit(self) -> StepPlan:
        run, kv = self.running, self.kv
        budget = self.policy.max_num_batched_tokens
        plan = StepPlan(self._decode_slots(budget), [], [])
        # Decodes: one token each; a new block when the context crosses a block edge.
        if len(plan.decode_slots):
            self._allocate_decode_blocks(plan, budget)
            budget -= len(plan.decode_slots)
        if not self.policy.chunked_prefill:
            return plan
        # Partial prefills keep going before anything new is admitted.
        for slot in run.prefilling():
            if budget <= 0:
                break
            if not run.active[slot]:
                continue
            computed = run.computed.item(slot)
            chunk = min(run.target.item(slot) - computed, budget)
            held = run.blocks.item(slot)
            blocks = kv.held(computed, computed + chunk) - held
            if blocks > kv.free and not self._make_room(blocks, plan, requester=slot):
                break
            kv.allocate(blocks)
            run.blocks[slot] = held + blocks
            if self.hashed is not None:
                self.hashed.name_blocks(int(run.rid[slot]), computed + chunk)
            plan.prefill_slots.append(slot)
            plan.prefill_chunks.append(chunk)
            budget -= chunk
        # Nothing new gets in on a step that had to preempt (vLLM v1): the blocks just
        # freed are for the requests already running.
        if budget > 0 and len(self.waiting) and not plan.preempted:
            self._admit(plan, budget)
        return plan

    def _decode_slots(self, budget: int) -> np.ndarray:
        run = self.running
        slots = run.decoding()
        if len(slots) > budget:  # more sequences than tokens: oldest first
            run.materialize()  # the others skip a step: out of lockstep
            slots = slots[np.argsort(run.order[slots], kind="stable")[:budget]]
        return slots

    def _allocate_decode_blocks(self, plan: StepPlan, budget: int) -> None:
        """Give each decode the block its next token needs, preempting one victim at a
        time while the cache is short (each frees blocks and drops a need), so no more
        requests are preempted than the step needs."""
        run, kv = self.running, self.kv
        need = run.next_block_need(plan.decode_slots)
        while need > kv.free:
            victim = run.victim(self.by_priority)
            if victim < 0:
                break
            self._drop_from_plan(victim, plan)
            self._preempt(victim, plan)
            if not len(plan.decode_slots) and run.decode_count:
                plan.decode_slots = self._decode_slots(budget)  # the budget's next in line
            need = run.next_block_need(plan.decode_slots)
        if need:
            kv.allocate(need)
        if need or run.frees_blocks:
            run.take_next_blocks(plan.decode_slots)

    def _admit(self, plan: StepPlan, budget: int) -> None:
        """Admit waiting requests (in the queue's order) while budget, slots and KV allow.

        Three kinds wait: new (or recomputing) requests, which prefill a chunk now;
        swapped-out ones, whose blocks come back over PCIe and which decode from the next
        step on; and ones whose KV cache was sent by a prefill replica (disaggregated
        serving), which compute their last prompt token now and sample their first.
        """
        run, kv, req = self.running, self.kv, self.requests
        chunked = self.policy.chunked_prefill
        # Blocks the next tokens of decoding requests will open: kept free, or such a
        # token could preempt a request just swapped in straight back out. Chunked
        # prefill has given the running decodes theirs before admitting. Blocks their
        # windows will free next step are not free now.
        lookahead = 0 if chunked else max(0, run.next_block_need(run.decoding()))
        while budget > 0 and len(self.waiting) and run.count < self.policy.max_num_seqs:
            rid, level = self.waiting.peek()
            swapped = self.swapped.get(rid)
            cached = self.arrived_with_kv.get(rid)
            ahead = 0
            shared = 0  # cached blocks that other running requests hold: no new block
            if swapped is not None:
                blocks = swapped.blocks
                ahead = max(0, kv.blocks_for(swapped.computed + 1) - blocks)
                need = blocks + ahead
            elif cached is not None:
                need = blocks = kv.blocks_for(cached)
            else:
                target = req.prompt.item(rid) + req.generated.item(rid)
                # Cached prefix: whole blocks, and never the last token (it is recomputed
                # to sample from), as vLLM's prefix cache hits are.
                hit, key, shared = self._cached_tokens(rid, target)
                chunk = min(target - hit, budget) if chunked else target - hit
                if chunk > budget and (plan.prefill_slots or len(plan.decode_slots)):
                    break  # a whole prompt over budget runs alone
                blocks = kv.held(hit, hit + chunk)
                # As vLLM: the whole sequence must fit, and so must the chunk's own
                # allocation, which with sliding groups can exceed the former once the
                # hit passes the window's cap (the request then waits).
                full = self.policy.reserve_full_sequence
                need = max(kv.full_sequence_blocks(hit, target), blocks) if full else blocks
                need -= shared
            alone = run.count == 0
            first = blocks - shared + ahead  # what it needs to run alone
            fits = kv.can_admit(need + lookahead) or (alone and first <= kv.free)
            if not fits:
                # As vLLM v0, a step that admitted nothing may preempt for the head (v0
                # admits it a step later; here at once, so the replica never idles).
                if not self.waiting_preempts or plan.prefill_slots:
                    break
                held = self.hashed.held_hits(rid, hit // kv.block_size) if shared else []
                if not self._preempt_for(rid, level, need + lookahead, first, plan, held):
                    break
                continue  # look again: its victims may have held blocks it counted shared
            lookahead += ahead
            self.waiting.pop(level)
            if swapped is None and cached is None and self.hashed is not None:
                shared = self.hashed.acquire(rid, hit // kv.block_size)
            elif swapped is None and cached is None and hit:
                kv.take_cached(key)  # reused in place, before anything can evict them
            kv.allocate(blocks - shared)
            if swapped is not None:
                del self.swapped[rid]
                self.swap_used -= blocks
                plan.swap_blocks += blocks
                slot = run.admit(rid, swapped.target, swapped.remaining, level, swapped.computed)
                run.blocks[slot] = blocks
                continue
            left = req.output.item(rid) - req.generated.item(rid)
            if cached is not None:  # its last prompt token is computed again to sample
                del self.arrived_with_kv[rid]  # from (vLLM's _update_waiting_for_remote_kv)
                slot = run.admit(rid, cached, left, level, cached - 1)
                run.blocks[slot] = blocks
                plan.prefill_slots.append(slot)
                plan.prefill_chunks.append(1)
                budget -= 1
                continue
            slot = run.admit(rid, target, left, level, hit)
            run.blocks[slot] = blocks
            if math.isnan(req.first_scheduled.item(rid)):
                req.first_scheduled[rid] = self.now
                req.cached_prompt_tokens[rid] = hit
            if self.hashed is not None:
                self.hashed.name_blocks(rid, hit + chunk)
            plan.prefill_slots.append(slot)
            plan.prefill_chunks.append(chunk)
            budget -= chunk

    def _cached_tokens(self, rid: int, target: int) -> tuple[int, CacheKey, int]:
        """Tokens of `rid`'s first `target` found cached, whose blocks they are: its own
        (left by a preemption), else its session's (left by the previous turn, whose
        prompt and output open this turn's prompt), and how many of those blocks other
        running requests hold (only with block hashes, where prompts share blocks)."""
        key = request_key(rid)
        size = self.kv.block_size
        if self.hashed is not None:
            blocks, in_use = self.hashed.find(rid, (target - 1) // size)
            return blocks * size, key, in_use
        if not self.kv.cached_total:  # caching off, or nothing cached: nothing to look up
            return 0, key, 0
        blocks = self.kv.cached_blocks(key)
        session = int(self.requests.session[rid])
        if not blocks and session >= 0:
            key = session_key(session)
            blocks = self.kv.cached_blocks(key)
        return min(blocks * size, (target - 1) // size * size), key, 0

    def free(self, slot: int) -> None:
        """`slot` is done here (completed): release its blocks now (see `detach`)."""
        self._release(*self._take_out(slot), reachable=False)

    def detach(self, slot: int, reachable: bool) -> Callable[[], None]:
        """Take `slot` out of the running set, its blocks still held; the call returned
        releases them. A prefill replica calls it when it hands a request on, as vLLM's
        NixlConnector.request_finished delays freeing the prompt's blocks until the decode
        side has read them. Outside a session, only a handed-off request may ask for its
        blocks again (retried after its decode replica failed): `reachable`."""
        return functools.partial(self._release, *self._take_out(slot), reachable=reachable)

    def _take_out(self, slot: int) -> tuple[int, int, int]:
        """`slot`'s request id, blocks and computed tokens, the slot left empty."""
        run = self.running
        taken = int(run.rid[slot]), run.blocks_of(slot), run.computed_of(slot)
        run.remove(slot)
        return taken

    def _release(self, rid: int, blocks: int, computed: int, *, reachable: bool) -> None:
        """A request's blocks back to the pool. With prefix caching the full blocks stay
        cached, the most recently freed, as vLLM v1 queues them at the tail of its free
        queue: a session's next turn, whose prompt starts with everything this one
        computed, reuses them, and blocks freed earlier (a preempted request's) are
        evicted before them. Blocks no request can ask for again are
        kv.keep_unreachable's, tracked only where something cached before them is."""
        kv = self.kv
        if self.hashed is not None:
            self.hashed.leave(rid, blocks, computed, finished=True)
            return
        kv.release(blocks)
        if not self.policy.prefix_caching:
            return
        session = self.requests.session.item(rid)
        if session < 0 and not reachable:
            if kv.cached_total:  # else nothing is cached it could come before
                kv.keep_unreachable(unreachable_key(rid), computed // kv.block_size)
            return
        key = session_key(session) if session >= 0 else request_key(rid)
        kv.keep_cached(key, computed // kv.block_size)

    def _releasable(self, slots: np.ndarray, held: list[Key]) -> tuple[int, int]:
        """Blocks that preempting every one of `slots` frees, and how many of `held` (a
        newcomer's hits that running requests hold) go free with them: the newcomer
        then takes those from the free blocks rather than sharing them. With shared
        prompt blocks a victim frees its own, and a shared one when it is the last
        holder."""
        leaving = {int(self.running.rid[slot]): self.running.blocks_of(int(slot)) for slot in slots}
        if self.hashed is None:
            return sum(leaving.values()), 0
        freed, unheld = self.hashed.freed_by(leaving)
        return freed, sum(key in unheld for key in held)

    def _preempt_for(
        self, rid: int, level: int, need: int, blocks: int, plan: StepPlan, held: list[Key]
    ) -> bool:
        """Make room for waiting request `rid` of priority `level` (`need` blocks to be
        admitted beside others, `blocks` to run alone, counting its hits in `held` as
        shared) by preempting running requests after it in (priority, arrival) order,
        the last first, as vLLM v0's Scheduler._schedule_priority_preemption; unlike
        it, nobody is preempted (False) when even all of them would not make room."""
        run, kv = self.running, self.kv
        slots = np.flatnonzero(run.active)
        priority, arrival = run.priority[slots], self.requests.arrival[run.rid[slots]]
        at = self.requests.arrival[rid]
        lower = slots[(priority > level) | ((priority == level) & (arrival > at))]
        freed, lost = self._releasable(lower, held)
        freed += kv.free
        alone = len(lower) == run.count
        if freed - need - lost < kv.watermark_blocks and not (alone and blocks + lost <= freed):
            return False
        while True:
            lost = self.hashed.unheld(held) if held else 0
            if kv.can_admit(need + lost) or (run.count == 0 and blocks + lost <= kv.free):
                return True
            victim = run.victim(by_arrival=True)
            self._drop_from_plan(victim, plan)
            self._preempt(victim, plan)
