"""A prefix cache keyed by block content, shared by every request: vLLM's automatic prefix
caching, for workloads whose prompts say which blocks they share (Mooncake's hash_ids).

Used only when the workload has block hashes; otherwise kv_cache.BlockManager's counted
cache (a request's or a session's own blocks) is the whole story.

Identity of a block. A trace hash names one block of `block_tokens` prompt tokens (512 in
Mooncake's traces) while the engine's blocks hold `block_size` tokens (16 by default). As
in vLLM, an engine block's identity is its own tokens *and everything before it*: engine
block k (tokens k*block_size ... (k+1)*block_size - 1) is identified by the chain of trace
hashes up to the trace block holding its last token, and by k. Two requests thus share
engine block k exactly when their hash lists agree up to that trace block, whatever the
two block sizes. Only engine blocks wholly inside the hashed tokens (`covered`) and full
are shared; the rest of a request (its unhashed prompt tail, its output) is its own.

Accounting. `used` counts physical blocks: a running request's own blocks, plus one per
shared identity in use however many requests hold it, so two requests on the same system
prompt use its blocks once. A running request's `run.blocks` stays its logical count
(what its sequence spans); this manager knows which of those are shared. As vLLM does,
a full prompt block gets its identity when it is scheduled (so a request admitted in the
same step already hits it), and a request that leaves puts its blocks in the free queue
tail first: the blocks freed longest ago are evicted first, and of one request its last
blocks first. A request's own full blocks stay cached too (as one entry): its recompute
after a preemption reuses them behind its shared prefix.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

import numpy as np

from simulator.engine.kv_cache import BlockManager

Key = tuple[int, int]
"""(prefix chain id >= 0, engine block index) for a shared block; (-1 - request id, -1)
for the entry holding a request's own cached blocks."""


class PromptBlockHashes(Protocol):
    """Per request, its prompt's block hashes (workload.generate.PromptHashes)."""

    ids: tuple[np.ndarray, ...]
    block_tokens: int
    covered: np.ndarray


class BlockKeys:
    """Each request's engine-block identities, from its trace block hashes. Pure: one
    instance serves every replica of a pool (same block size)."""

    def __init__(self, hashes: PromptBlockHashes, block_size: int) -> None:
        self.block_size = block_size
        self._ids, self._trace_block = hashes.ids, hashes.block_tokens
        self._shared = np.asarray(hashes.covered, dtype=np.int64) // block_size
        self._chains: dict[tuple[int, int], int] = {}
        self._keys_of: dict[int, list[Key]] = {}

    def shared_blocks(self, rid: int) -> int:
        """How many leading engine blocks of `rid` have a shared identity."""
        return int(self._shared[rid]) if rid < len(self._shared) else 0

    def of(self, rid: int) -> list[Key]:
        """Identity of each of the first shared_blocks(rid) engine blocks of `rid`
        (worked out once, while the request lives)."""
        keys = self._keys_of.get(rid)
        if keys is None:
            chain, size, trace = self._intern(self._ids[rid]), self.block_size, self._trace_block
            keys = [
                (chain[((k + 1) * size - 1) // trace], k) for k in range(self.shared_blocks(rid))
            ]
            self._keys_of[rid] = keys
        return keys

    def forget(self, rid: int) -> None:
        """`rid` is finished: its identities will not be asked for again."""
        self._keys_of.pop(rid, None)

    def _intern(self, hashes: np.ndarray) -> list[int]:
        """Chain id of each prefix of the hash list: equal prefixes, equal ids."""
        chain, parent = [], -1
        for h in hashes.tolist():
            parent = self._chains.setdefault((parent, h), len(self._chains))
            chain.append(parent)
        return chain


def own_key(rid: int) -> Key:
    return (-1 - rid, -1)


class HashedBlockManager(BlockManager):
    """BlockManager whose cache is keyed by block identity (see the module docstring)."""

    def __init__(
        self, total_blocks: int, block_size: int, watermark: float, keys: BlockKeys
    ) -> None:
        super().__init__(total_blocks, block_size, watermark)
        self.keys = keys
        self._refs: dict[Key, int] = {}  # shared blocks in use -> requests holding them
        # Cached free blocks live in the base class's LRU (`_cached`, evicted by its
        # `_evict`): a shared block as key -> 1, a request's own blocks as one entry.
        self._held: dict[int, list[Key]] = {}  # request -> shared blocks it holds
        self._named: dict[int, int] = {}  # request -> leading blocks given an identity

    def freed_by(self, leaving: dict[int, int]) -> tuple[int, set[Key]]:
        """Blocks freed if every request of `leaving` (request -> its blocks) left, and
        the shared ones among them: a shared block is freed when all its holders leave."""
        holders = Counter(key for rid in leaving for key in self._held.get(rid, ()))
        unheld = {key for key, count in holders.items() if count == self._refs[key]}
        own = sum(blocks - len(self._held.get(rid, ())) for rid, blocks in leaving.items())
        return own + len(unheld), unheld

    def held_hits(self, rid: int, hit: int) -> list[Key]:
        """Of `rid`'s first `hit` blocks, those other requests hold now (they take no
        new block while those requests run)."""
        return [key for key in self.keys.of(rid)[:hit] if key in self._refs]

    def unheld(self, keys: list[Key]) -> int:
        """How many of `keys` no request holds any more."""
        return sum(key not in self._refs for key in keys)

    def find(self, rid: int, most: int) -> tuple[int, int]:
        """Leading blocks of `rid` (at most `most`) found cached, and how many of those
        are in use by other requests (they take no new block)."""
        keys = self.keys.of(rid)
        shared = len(keys)
        block = in_use = 0
        while block < min(most, shared):
            key = keys[block]
            if key in self._refs:
                in_use += 1
            elif key not in self._cached:
                return block, in_use
            block += 1
        if block == shared:  # its own blocks, left by a preemption, follow its prefix
            block += min(self._cached.get(own_key(rid), 0), most - block)
        return block, in_use

    def acquire(self, rid: int, hit: int) -> int:
        """`rid` is admitted reusing its first `hit` blocks, as `find` found them.
        Returns how many of them are in use by other requests now: the caller allocates
        the others (they were counted free)."""
        held = self.keys.of(rid)[:hit]
        in_use = 0
        for key in held:
            if key in self._refs:
                self._refs[key] += 1
                in_use += 1
            else:
                del self._cached[key]
                self._cached_total -= 1
                self._refs[key] = 1
        self._held[rid] = held
        self._named[rid] = len(held)
        own = self._cached.pop(own_key(rid), 0)  # reused (or overwritten by its recompute)
        self._cached_total -= own
        return in_use

    def name_blocks(self, rid: int, tokens: int) -> None:
        """`rid`'s first `tokens` are scheduled: its full prompt blocks among them get
        their identity and become shareable, unless a copy is already cached (then
        this one stays its own)."""
        upto = min(tokens // self.block_size, self.keys.shared_blocks(rid))
        start = self._named.get(rid, 0)
        if upto <= start:
            return
        held = self._held.setdefault(rid, [])
        for key in self.keys.of(rid)[start:upto]:
            if key not in self._refs and key not in self._cached:
                self._refs[key] = 1
                held.append(key)
        self._named[rid] = upto

    def leave(self, rid: int, blocks: int, computed: int, *, finished: bool) -> None:
        """`rid` leaves the replica's GPU memory (finished, handed off or preempted)
        holding `blocks` blocks over `computed` tokens: release what no one else holds,
        and keep its full blocks cached, tail first."""
        held = self._held.pop(rid, [])
        self._named.pop(rid, None)
        unheld = []
        for key in held:
            count = self._refs[key] - 1
            if count:
                self._refs[key] = count
            else:
                del self._refs[key]
                unheld.append(key)
        self.release(blocks - len(held) + len(unheld))
        own = computed // self.block_size - self.keys.shared_blocks(rid)
        if own > 0:
            self._cached[own_key(rid)] = own
            self._cached_total += own
        for key in reversed(unheld):
            self._cached[key] = 1
        self._cached_total += len(unheld)
        if finished:
            self.keys.forget(rid)
        self._evict()
