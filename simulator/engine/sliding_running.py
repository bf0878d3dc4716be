"""The running set of a replica whose KV cache has sliding-window groups.

A sequence's blocks no longer follow from its length alone: the sliding groups free
the blocks that leave the window before each allocation, and a sequence just out of
its prefill still holds the blocks of its last chunk until its first decode frees them.
A step's need is what the KV manager's rule gives less what each slot holds, which may
be negative (the window freed more than the new token opened).

Lockstep, as RunningSet's, in O(1) a step for sliding windows. Once a sequence of c
cached tokens has decoded, it holds held(c - 1, c) blocks; its next token takes
  (full + sliding) x [c % block == 0] - sliding x [c >= window][(c + 1 - window) % block == 0]
(a block opens at the edge; behind the window one is freed). So the set counts slots by
stored computed % block as RunningSet does (`_by_edge`), and those past the window by
the residue at which they free (`_old_free`); a slot below the window joins those when
the epoch takes it past (`_young`, by the epoch it does). A sequence just out of its
prefill holds its chunk's extra blocks until its first decode (`_excess`). Chunked local
attention (Llama 4) frees a whole chunk at its edge: its slots keep explicit blocks, one
vector pass a step.
"""

from __future__ import annotations

import heapq

import numpy as np

from simulator.engine.kv_cache import HybridBlockManager
from simulator.engine.requests import RequestTable
from simulator.engine.running import RunningSet


class SlidingRunningSet(RunningSet):
    frees_blocks = True

    def __init__(
        self, capacity: int, block_size: int, requests: RequestTable, kv: HybridBlockManager
    ) -> None:
        super().__init__(capacity, block_size, requests)
        self.groups = kv.groups
        self._counts = not kv.groups.chunked  # lockstep by counts (else explicit blocks)
        # Every decoding slot holds its next token's blocks (take_next_blocks since the
        # set last changed), so a one-step lockstep advance leaves them as they are.
        self._holds_next = False
        # Explicit blocks: the last next_block_need's slots and what they hold once it is
        # taken, which take_next_blocks then writes rather than computing it again.
        self._asked: tuple[np.ndarray, np.ndarray] | None = None
        # Counted lockstep (see the module doc).
        self._old_free = np.zeros(block_size, dtype=np.int64)
        self._young: list[tuple[int, int, int]] = []  # (epoch past the window, order, slot)
        self._excess: dict[int, int] = {}
        self._excess_total = 0

    @property
    def _counted(self) -> bool:
        return self.lockstep and self._counts

    def _settled(self, computed):
        """Blocks a sequence of `computed` cached tokens holds once it has decoded."""
        return self.groups.held(computed - 1, computed)

    # ---- reading ---------------------------------------------------------------------
    def blocks_of(self, slot: int) -> int:
        if not (self._counted and self.is_decoding[slot]):
            return int(self.blocks[slot])
        if self._holds_next:
            return int(self._settled(self.computed_of(slot) + 1))
        return int(self._settled(self.computed_of(slot))) + self._excess.get(slot, 0)

    # ---- decode steps ----------------------------------------------------------------
    def _next_holding(self, slots: np.ndarray) -> np.ndarray:
        """Pool blocks decoding `slots` hold once their next token has its slot."""
        computed = self.decode_computed_of(slots)
        return self.groups.held(computed, computed + 1)

    def next_block_need(self, slots: np.ndarray) -> int:
        if self._counted:
            if self._holds_next:
                return 0
            self._mature()
            g, e, bs = self.groups, self._epoch, self.block_size
            opens = int(self._by_edge[-e % bs])
            frees = int(self._old_free[(g.window - 1 - e) % bs])
            return (g.full + g.sliding) * opens - g.sliding * frees - self._excess_total
        holding = self._next_holding(slots)
        self._asked = (slots, holding)
        return int((holding - self.blocks[slots]).sum())

    def take_next_blocks(self, slots: np.ndarray) -> None:
        self._holds_next = len(slots) == self.decode_count
        if self._counted:
            self._excess.clear()
            self._excess_total = 0
            return
        asked, self._asked = self._asked, None
        fresh = asked is not None and asked[0] is slots
        self.blocks[slots] = asked[1] if fresh else self._next_holding(slots)

    def run_block_needs(self, steps: int) -> np.ndarray:
        """Net pool blocks the decoding requests take at each of the next `steps` lockstep
        steps, the first excluded (the scheduler gave it; may be negative: the windows
        free more than the new tokens open)."""
        dec = self.decoding()
        computed = self.decode_computed_of(dec)[:, None] + np.arange(steps)[None, :]
        totals = self.groups.held(computed, computed + 1).sum(axis=0)
        need = np.empty(steps, dtype=np.int64)
        need[0] = 0
        need[1:] = np.diff(totals)
        return need

    def advance(self, slots: np.ndarray, steps: int) -> None:
        self._changed()
        super().advance(slots, steps)

    def advance_lockstep(self, steps: int, time: float) -> None:
        """As RunningSet's; each slot now holds what its last token's step took (already
        so after a step whose blocks were taken; counted, held(c - 1, c) by the count)."""
        kept = steps == 1 and self._holds_next
        self._changed()
        super().advance_lockstep(steps, time)
        if self._counts:
            self._excess.clear()
            self._excess_total = 0
            return
        if kept:
            return
        dec = self.decoding()
        self.blocks[dec] = self._settled(self.decode_computed_of(dec))

    # ---- membership ------------------------------------------------------------------
    def admit(self, rid: int, target: int, remaining: int, priority: int, computed: int = 0) -> int:
        if computed >= target:  # decoding from now on, holding only its own blocks
            self.materialize()  # the others' blocks as this step took them, then the change
            self._changed()
        return super().admit(rid, target, remaining, priority, computed)

    def remove(self, slot: int) -> None:
        self._asked = None  # the others still hold what they took
        if self._counted and self.is_decoding[slot]:
            self._mature()
            if self.computed_of(slot) >= self.groups.window:
                self._old_free[self._free_residue(slot)] -= 1
            self._excess_total -= self._excess.pop(slot, 0)  # a young one's entry lapses
        super().remove(slot)

    def start_decoding(self, slot: int) -> None:
        counted = self._counted
        if counted:
            excess = int(self.blocks[slot] - self._settled(int(self.computed[slot])))
        self._changed()
        super().start_decoding(slot)
        if counted:
            self._count(slot)
            if excess:
                self._excess[slot] = excess
                self._excess_total += excess

    def enter_lockstep(self, time: float) -> None:
        self._changed()
        super().enter_lockstep(time)
        if not self._counts:
            return
        self._old_free[:] = 0
        self._young.clear()
        self._excess.clear()
        dec = self.decoding()
        excess = self.blocks[dec] - self._settled(self.computed[dec])
        extra = excess != 0
        self._excess = dict(zip(dec[extra].tolist(), excess[extra].tolist(), strict=True))
        self._excess_total = int(excess.sum())
        for slot in dec.tolist():
            self._count(slot)

    def materialize(self) -> None:
        """As RunningSet's, keeping the per-slot blocks (never derived from lengths)."""
        if not self.lockstep:
            return
        if not self._counts:
            self._changed()
            kept = self.blocks.copy()
            super().materialize()
            self.blocks[:] = kept
            return
        taken = self._holds_next
        self._changed()
        super().materialize()
        dec = self.decoding()
        self.blocks[dec] = self._settled(self.computed[dec] + taken)
        if not taken:
            for slot, excess in self._excess.items():
                self.blocks[slot] += excess
        self._excess.clear()
        self._excess_total = 0

    # ---- counted lockstep ------------------------------------------------------------
    def _free_residue(self, slot: int) -> int:
        """`_old_free` index of a slot: at epoch e it frees a block when this is
        (window - 1 - e) % block, i.e. when (c + 1 - window) % block == 0."""
        return int(self.computed[slot]) % self.block_size

    def _count(self, slot: int) -> None:
        """Count a slot that decodes in lockstep from now on (stored computed)."""
        stored = int(self.computed[slot])
        if stored + self._epoch >= self.groups.window:
            self._old_free[stored % self.block_size] += 1
        else:
            heapq.heappush(self._young, (self.groups.window - stored, int(self.order[slot]), slot))

    def _mature(self) -> None:
        """Slots the epoch has taken past the window start freeing blocks behind it."""
        young, epoch = self._young, self._epoch
        while young and young[0][0] <= epoch:
            _, order, slot = heapq.heappop(young)
            if self.is_decoding[slot] and self.order[slot] == order:
                self._old_free[int(self.computed[slot]) % self.block_size] += 1

    def _changed(self) -> None:
        """The slots or their positions change: what was asked or taken is stale."""
        self._asked = None
        self._holds_next = False
