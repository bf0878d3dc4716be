"""The requests holding KV-cache blocks on a replica, as slot arrays.

Columnar so that a decode step over the whole batch is a few numpy operations, whatever
the batch size.
"""

from __future__ import annotations

import numpy as np


class RunningSet:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rid = np.full(capacity, -1, dtype=np.int64)
        self.computed = np.zeros(capacity, dtype=np.int64)  # tokens whose KV is cached
        self.target = np.zeros(capacity, dtype=np.int64)  # tokens to prefill before decoding
        self.remaining = np.zeros(capacity, dtype=np.int64)  # tokens still to produce
        self.blocks = np.zeros(capacity, dtype=np.int64)
        self.priority = np.zeros(capacity, dtype=np.int64)
        self.order = np.zeros(capacity, dtype=np.int64)  # admission sequence number
        self.active = np.zeros(capacity, dtype=bool)
        self._free_slots = list(range(capacity - 1, -1, -1))
        self._admitted = 0
        self.count = 0

    @property
    def has_free_slot(self) -> bool:
        return bool(self._free_slots)

    def admit(self, rid: int, target: int, remaining: int, priority: int, computed: int = 0) -> int:
        slot = self._free_slots.pop()
        self.rid[slot] = rid
        self.computed[slot] = computed
        self.target[slot] = target
        self.remaining[slot] = remaining
        self.blocks[slot] = 0
        self.priority[slot] = priority
        self.order[slot] = self._admitted
        self.active[slot] = True
        self._admitted += 1
        self.count += 1
        return slot

    def remove(self, slot: int) -> None:
        self.rid[slot] = -1
        self.active[slot] = False
        self.blocks[slot] = 0
        self._free_slots.append(slot)
        self.count -= 1

    def slots(self) -> np.ndarray:
        return np.flatnonzero(self.active)

    def decoding(self) -> np.ndarray:
        """Slots whose prefill is done: each takes one token per step."""
        return np.flatnonzero(self.active & (self.computed >= self.target))

    def prefilling(self) -> list[int]:
        """Slots part-way through their prefill, oldest admission first."""
        slots = np.flatnonzero(self.active & (self.computed < self.target)).tolist()
        if len(slots) > 1:
            slots.sort(key=self.order.__getitem__)
        return slots

    def victim(self, protect: int = -1) -> int:
        """Slot to preempt: the least important, most recently admitted request."""
        slots = self.slots()
        slots = slots[slots != protect]
        if len(slots) == 0:
            return -1
        # Highest priority number first, then latest admission.
        key = self.priority[slots] * (1 << 40) + self.order[slots]
        return int(slots[np.argmax(key)])
