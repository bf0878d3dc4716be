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

    def blocks_of(self, slot: int) -> int:
        return int(self.blocks[slot])

    def _next_holding(self, slots: np.ndarray) -> np.ndarray:
        """Pool blocks decoding `slots` hold once their next token has its slot."""
        computed = self.decode_computed_of(slots)
        return self.groups.held(computed, computed + 1)

    def next_block_need(self, slots: np.ndarray) -> int:
        return int((self._next_holding(slots) - self.blocks[slots]).sum())

    def take_next_blocks(self, slots: np.ndarray) -> None:
        self.blocks[slots] = self._next_holding(slots)

    def block_need_pattern(self, steps: int = 1) -> np.ndarray:
        """Net pool blocks the decoding requests take at each of the next `steps` lockstep
        steps (index j: step j from now; step 0's as if none were taken yet)."""
        dec = self.decoding()
        computed = self.decode_computed_of(dec)[:, None] + np.arange(steps)[None, :]
        totals = self.groups.held(computed, computed + 1).sum(axis=0)
        need = np.empty(steps, dtype=np.int64)
        need[0] = totals[0] - self.blocks[dec].sum()
        need[1:] = np.diff(totals)
        return need

    def run_block_needs(self, steps: int) -> np.ndarray:
        need = self.block_need_pattern(steps)
        need[0] = 0
        return need

    def advance_lockstep(self, steps: int, time: float) -> None:
        """As RunningSet's; each slot now holds what its last token's step took."""
        super().advance_lockstep(steps, time)
        dec = self.decoding()
        computed = self.decode_computed_of(dec)
        self.blocks[dec] = self.groups.held(computed - 1, computed)

    def materialize(self) -> None:
        """As RunningSet's, keeping the per-slot blocks (never derived from lengths)."""
        if not self.lockstep:
            return
        kept = self.blocks.copy()
        super().materialize()
        self.blocks[:] = kept
