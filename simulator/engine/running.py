"""The requests holding KV-cache blocks on a replica, as slot arrays.

Columnar so that a decode step over the whole batch is a few numpy operations, whatever
the batch size. Which slots decode and which are still prefilling is kept up to date
as slots change state (admission, finished prefill, removal) rather than recomputed
from masks every step: the scheduler asks for both sets on every engine step.

Lockstep. While every decoding request takes a token in every step (the usual case),
the decoding requests move together: each step adds one cached token and takes one
from what is left to produce, the block a sequence needs next follows from its length,
and all their last tokens came at the same time. The set then counts the steps taken
in lockstep (`epoch`) and stores, for decoding slots, `computed` less the epoch and
`remaining` plus it (constant while they move together), counts sequences by stored
`computed % block_size` (so a step's new blocks are one lookup), and writes the request
table's last-token time and generated count only when a request leaves. A decode step
is O(1) bookkeeping, whatever the batch size (also with sliding-window KV cache groups,
sliding_running.py; with Llama 4's chunked ones, one vector pass over the decodes).
Anything irregular (a request swapped back in, decodes that pause or exceed the token
budget) first writes everything out with `materialize()`, and per-slot updates take
over until a step in which every decoding request took a token.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.engine.requests import RequestTable


class RunningSet:
    frees_blocks = False  # True where sequences also give blocks back (sliding_running.py)

    def __init__(self, capacity: int, block_size: int, requests: RequestTable) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.requests = requests
        self.rid = np.full(capacity, -1, dtype=np.int64)
        # In lockstep, decoding slots hold these two less / plus the epoch: read them
        # through computed_of / remaining_of (or materialize() first).
        self.computed = np.zeros(capacity, dtype=np.int64)  # tokens whose KV is cached
        self.remaining = np.zeros(capacity, dtype=np.int64)  # tokens still to produce
        self.target = np.zeros(capacity, dtype=np.int64)  # tokens to prefill before decoding
        self.blocks = np.zeros(capacity, dtype=np.int64)  # not kept in lockstep: blocks_of
        self.priority = np.zeros(capacity, dtype=np.int64)
        self.order = np.zeros(capacity, dtype=np.int64)  # admission sequence number
        self.active = np.zeros(capacity, dtype=bool)
        self.is_decoding = np.zeros(capacity, dtype=bool)
        self._free_slots = list(range(capacity - 1, -1, -1))
        self._admitted = 0
        self.count = 0
        self._prefilling: list[int] = []  # oldest admission first
        self._decoding: np.ndarray | None = np.empty(0, dtype=np.int64)  # None: stale
        self.decode_count = 0
        self.decode_computed = 0  # sum of the decoding slots' cached tokens
        self.lockstep = False
        self.lockstep_time = math.nan  # when every decoding request last took a token
        self._epoch = 0  # lockstep steps taken (0 out of lockstep)
        # Lockstep slots by stored computed % block_size, and for each epoch % block_size
        # the residue of each run step's block edge (see run_block_needs).
        self._by_edge = np.zeros(block_size, dtype=np.int64)
        steps = np.arange(block_size)
        self._edge_at = (-steps[:, None] - steps[None, :]) % block_size
        self._cycle = steps  # j % block_size for j < len: run_block_needs grows it
        self._min_remaining: int | None = None  # least stored remaining in lockstep
        self._next_blocks_taken = False  # the scheduler gave each its next token's block

    # ---- membership ------------------------------------------------------------------
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
        if computed >= target:  # resumed from swap: its last token is older than the rest
            self.materialize()
            self._mark_decoding(slot, computed)
        else:
            self._prefilling.append(slot)  # the newest admission goes last
        return slot

    def remove(self, slot: int) -> None:
        """Free `slot` (its blocks are the caller's to release, see blocks_of)."""
        if self.is_decoding[slot]:
            if self.lockstep:
                self._write_tokens(self.rid[slot], self.remaining_of(slot))
                self._by_edge[int(self.computed[slot]) % self.block_size] -= 1
                self._min_remaining = None
            self.decode_computed -= self.computed_of(slot)
            self.decode_count -= 1
            self.is_decoding[slot] = False
            self._decoding = None
        else:
            self._prefilling.remove(slot)
        self.rid[slot] = -1
        self.active[slot] = False
        self.blocks[slot] = 0
        self._free_slots.append(slot)
        self.count -= 1

    def prefill(self, slot: int, chunk: int) -> bool:
        """Cache `chunk` more prompt tokens of `slot`; True when its prefill is done (the
        caller samples its token, then calls start_decoding)."""
        computed = self.computed.item(slot) + chunk
        self.computed[slot] = computed
        return computed >= self.target.item(slot)

    def start_decoding(self, slot: int) -> None:
        """`slot` finished its prefill and took a token at the end of this step (in
        lockstep, at `lockstep_time`, like every other decoding request)."""
        self._prefilling.remove(slot)
        computed = int(self.computed[slot])
        if self.lockstep:  # stored less / plus the epoch, like the others
            computed -= self._epoch
            self.computed[slot] = computed
            self.remaining[slot] += self._epoch
            self._by_edge[computed % self.block_size] += 1
            if self._min_remaining is not None:
                self._min_remaining = min(self._min_remaining, int(self.remaining[slot]))
        self._mark_decoding(slot, computed + self._epoch)

    def _mark_decoding(self, slot: int, computed: int) -> None:
        self.is_decoding[slot] = True
        self.decode_count += 1
        self.decode_computed += computed
        self._decoding = None

    # ---- reading -------------------------------------------------------------------
    def computed_of(self, slot: int) -> int:
        computed = int(self.computed[slot])
        return computed + self._epoch if self.is_decoding[slot] else computed

    def remaining_of(self, slot: int) -> int:
        remaining = int(self.remaining[slot])
        return remaining - self._epoch if self.is_decoding[slot] else remaining

    def blocks_of(self, slot: int) -> int:
        """KV blocks `slot` holds."""
        if not (self.lockstep and self.is_decoding[slot]):
            return int(self.blocks[slot])
        tokens = self.computed_of(slot) + self._next_blocks_taken
        return -(-tokens // self.block_size)

    def decoding(self) -> np.ndarray:
        """Slots whose prefill is done, ascending: each takes one token per step. The
        array is shared until the set changes; callers must not modify it."""
        if self._decoding is None:
            self._decoding = self.is_decoding.nonzero()[0]
        return self._decoding

    def decode_computed_of(self, slots: np.ndarray) -> np.ndarray:
        """Cached tokens of decoding `slots`."""
        return self.computed[slots] + self._epoch

    def prefilling(self) -> list[int]:
        """Slots part-way through their prefill, oldest admission first (a copy)."""
        return self._prefilling.copy()

    def min_remaining(self) -> int:
        """Fewest tokens any decoding request has left to produce."""
        if not self.lockstep:
            return int(self.remaining[self.decoding()].min())
        if self._min_remaining is None:
            self._min_remaining = int(self.remaining[self.decoding()].min())
        return self._min_remaining - self._epoch

    def finished(self) -> list[int]:
        """Decoding slots with nothing left to produce, ascending."""
        dec = self.decoding()
        return dec[self.remaining[dec] - self._epoch <= 0].tolist()

    def victim(self, by_arrival: bool = False) -> int:
        """Slot to preempt, as vLLM's Scheduler.schedule picks it: under FCFS the most
        recently admitted request (running.pop(), the tail of its running list); under
        priority scheduling (`by_arrival`) max(running, key=(priority, arrival_time)),
        the first admitted of equals as max() returns the first. -1: none runs."""
        slots = np.flatnonzero(self.active)
        if len(slots) == 0:
            return -1
        order = self.order[slots]
        if by_arrival:
            arrival = self.requests.arrival[self.rid[slots]]
            return int(slots[np.lexsort((-order, arrival, self.priority[slots]))[-1]])
        # Highest priority number first (all 0 under FCFS, which refuses others).
        return int(slots[np.argmax(self.priority[slots] * (1 << 40) + order)])

    # ---- decode steps ----------------------------------------------------------------
    def next_block_need(self, slots: np.ndarray) -> int:
        """Blocks the next tokens of decoding `slots` open (in lockstep, every decoding
        slot is one of them)."""
        if self.lockstep:
            return int(self._by_edge[-self._epoch % self.block_size])
        blocks = -(-(self.computed[slots] + 1) // self.block_size)
        return int((blocks - self.blocks[slots]).sum())

    def take_next_blocks(self, slots: np.ndarray) -> None:
        """Decoding `slots` now hold the block of their next token."""
        if self.lockstep:
            self._next_blocks_taken = True
        else:
            self.blocks[slots] = -(-(self.computed[slots] + 1) // self.block_size)

    def _block_need_pattern(self) -> np.ndarray:
        """New blocks the decoding requests need at lockstep step j from now, at index
        j % block_size (the pattern repeats): at step j a sequence of c cached tokens
        writes token c + j, which opens a block when it is a multiple of the block size."""
        bs = self.block_size
        if self.lockstep:
            by_edge = self._by_edge
        else:
            by_edge = np.bincount(self.computed[self.decoding()] % bs, minlength=bs)
        # Stored computed % bs == r opens a block at steps j with (r + epoch + j) % bs == 0.
        return by_edge[self._edge_at[self._epoch % bs]]

    def run_block_needs(self, steps: int) -> np.ndarray:
        """New blocks the decoding requests need at each of `steps` steps from now, the
        first excluded (the scheduler gave it)."""
        if steps > len(self._cycle):
            grown = 1 << (steps - 1).bit_length()  # the next power of two
            self._cycle = np.arange(grown, dtype=np.int32) % self.block_size
        # Step j needs pattern[j % block_size]: one gather (a fresh array), about a tenth
        # of np.tile's time for a short run's 64 steps.
        need = self._block_need_pattern()[self._cycle[:steps]]
        need[0] = 0
        return need

    def advance(self, slots: np.ndarray, steps: int) -> None:
        """Decoding `slots` each cached `steps` more tokens and took `steps` tokens (one
        by one, outside lockstep)."""
        self.computed[slots] += steps
        self.remaining[slots] -= steps
        self.decode_computed += len(slots) * steps

    def advance_lockstep(self, steps: int, time: float) -> None:
        """Every decoding request took `steps` tokens, the last at `time`."""
        self._epoch += steps
        self.decode_computed += self.decode_count * steps
        self.lockstep_time = time
        self._next_blocks_taken = False

    def enter_lockstep(self, time: float) -> None:
        """Every decoding request took a token at `time`, and the arrays and the request
        table are up to date: from now on they move together."""
        if self.lockstep:
            raise RuntimeError("already in lockstep")
        self.lockstep = True
        self.lockstep_time = time
        self._min_remaining = None
        bs = self.block_size
        if self.decode_count:
            self._by_edge = np.bincount(self.computed[self.decoding()] % bs, minlength=bs)
        else:
            self._by_edge = np.zeros(bs, dtype=np.int64)

    def materialize(self) -> None:
        """Leave lockstep: bring the arrays and the request table up to date (before
        per-slot updates, or where the simulation may stop)."""
        if not self.lockstep:
            return
        if self.decode_count:
            dec = self.decoding()
            if self._epoch:
                self.computed[dec] += self._epoch
                self.remaining[dec] -= self._epoch
            tokens = self.computed[dec] + self._next_blocks_taken
            self.blocks[dec] = -(-tokens // self.block_size)
            self._write_tokens(self.rid[dec], self.remaining[dec])
        self.lockstep = False
        self._epoch = 0
        self._next_blocks_taken = False

    def _write_tokens(self, rids: np.ndarray | int, remaining: np.ndarray | int) -> None:
        req = self.requests
        req.last_token[rids] = self.lockstep_time
        req.generated[rids] = req.output[rids] - remaining
