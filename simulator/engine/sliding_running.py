"""The running set of a replica whose KV cache has sliding-window groups.

A sequence's blocks no longer follow from its length alone: the sliding groups free
the blocks that leave the window before each allocation, and a sequence just out of
its prefill still holds the blocks of its last chunk until its first decode frees them.
So each slot's pool blocks are kept explicitly (also in lockstep) and a step's need is
what the KV manager's rule gives less what each slot holds, which may be negative (the
window freed more than the new token opened). The rest of the lockstep bookkeeping is
RunningSet's.
"""

from __future__ import annotations

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
        # The last next_block_need's slots and what they hold once it is taken, which
        # take_next_blocks then writes rather than computing it again.
        self._asked: tuple[np.ndarray, np.ndarray] | None = None
        # Every decoding slot holds its next token's blocks (take_next_blocks since the
        # set last changed), so a one-step lockstep advance leaves the blocks as they are.
        self._holds_next = False

    def blocks_of(self, slot: int) -> int:
        return int(self.blocks[slot])

    def _next_holding(self, slots: np.ndarray) -> np.ndarray:
        """Pool blocks decoding `slots` hold once their next token has its slot."""
        computed = self.decode_computed_of(slots)
        return self.groups.held(computed, computed + 1)

    def next_block_need(self, slots: np.ndarray) -> int:
        holding = self._next_holding(slots)
        self._asked = (slots, holding)
        return int((holding - self.blocks[slots]).sum())

    def take_next_blocks(self, slots: np.ndarray) -> None:
        asked, self._asked = self._asked, None
        fresh = asked is not None and asked[0] is slots
        self.blocks[slots] = asked[1] if fresh else self._next_holding(slots)
        self._holds_next = len(slots) == self.decode_count

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
        so after a step whose blocks were taken)."""
        kept = steps == 1 and self._holds_next
        self._changed()
        super().advance_lockstep(steps, time)
        if kept:
            return
        dec = self.decoding()
        computed = self.decode_computed_of(dec)
        self.blocks[dec] = self.groups.held(computed - 1, computed)

    def admit(self, rid: int, target: int, remaining: int, priority: int, computed: int = 0) -> int:
        if computed >= target:  # decoding from now on, holding only its own blocks
            self._changed()
        return super().admit(rid, target, remaining, priority, computed)

    def remove(self, slot: int) -> None:
        self._asked = None  # the others still hold what they took
        super().remove(slot)

    def start_decoding(self, slot: int) -> None:
        self._changed()
        super().start_decoding(slot)

    def enter_lockstep(self, time: float) -> None:
        self._changed()
        super().enter_lockstep(time)

    def materialize(self) -> None:
        """As RunningSet's, keeping the per-slot blocks (never derived from lengths)."""
        if not self.lockstep:
            return
        self._changed()
        kept = self.blocks.copy()
        super().materialize()
        self.blocks[:] = kept

    def _changed(self) -> None:
        """The slots or their positions change: what was asked or taken is stale."""
        self._asked = None
        self._holds_next = False
