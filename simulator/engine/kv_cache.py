"""Paged KV-cache block manager (vLLM style): fixed-size blocks, a free count, a watermark.

Only counts are kept: no decision depends on which physical block a request holds, so
the manager is O(1) per operation. With prefix caching, full blocks that were released
stay cached while free (vLLM v1 frees them into an LRU pool) and are reused if asked for
before other allocations evict them. Two kinds of owners leave blocks behind: a request
preempted by recompute (it reuses them when it comes back), and a multi-turn session whose
turn finished (its next turn's prompt starts with that conversation, so it reuses them).
"""

from __future__ import annotations

from collections import OrderedDict

from hardware_models.errors import InfeasibleError
from simulator.engine.kv_groups import KvCacheGroups

CacheKey = tuple[str, int] | tuple[int, int]
"""Whose blocks: ("request", request id) or ("session", session id); with hashed prefix
caching, a block's identity instead (`prefix_hashes.Key`)."""


def request_key(rid: int) -> CacheKey:
    return ("request", rid)


def session_key(session: int) -> CacheKey:
    return ("session", session)


def unreachable_key(rid: int) -> CacheKey:
    """Blocks of a request done here that nobody asks for again (see keep_unreachable)."""
    return ("unreachable", rid)


class BlockManager:
    def __init__(self, total_blocks: int, block_size: int, watermark: float = 0.0) -> None:
        if total_blocks < 1:
            raise InfeasibleError(
                f"the KV cache holds {total_blocks} blocks of {block_size} tokens: no room "
                "for any request (more GPU memory, a smaller model or fp8 KV would help)"
            )
        self.total = total_blocks
        self.block_size = block_size
        self.free = total_blocks
        self.watermark_blocks = int(watermark * total_blocks)
        # owner -> cached full blocks, least recently freed first
        self._cached: OrderedDict[CacheKey, int] = OrderedDict()
        self._cached_total = 0

    @property
    def used(self) -> int:
        return self.total - self.free

    @property
    def cached_total(self) -> int:
        """Free blocks that still hold a reusable prefix."""
        return self._cached_total

    def blocks_for(self, tokens: int) -> int:
        """Blocks of a sequence of `tokens` tokens at full length: for swapped-out and
        arrived KV caches and run-to-completion batches, which the hybrid manager
        never serves (build._hybrid_off_reason)."""
        return -(-tokens // self.block_size)

    def held(self, computed: int, tokens: int) -> int:
        """Blocks a sequence holds once its first `tokens` tokens have slots, `computed`
        of them cached before this step: one per `block_size` tokens here."""
        return -(-tokens // self.block_size)

    def peak_blocks(self, tokens: int) -> int:
        """Most blocks a sequence of `tokens` tokens ever holds at once."""
        return -(-tokens // self.block_size)

    def full_sequence_blocks(self, hit: int, tokens: int) -> int:
        """Blocks admitting a sequence of `tokens` tokens, `hit` of them cached, asks to
        be free when its whole sequence must fit: all of them here."""
        return -(-tokens // self.block_size)

    def can_admit(self, blocks: int) -> bool:
        """New requests must leave the watermark free so running ones can keep growing."""
        return self.free - blocks >= self.watermark_blocks

    def allocate(self, blocks: int) -> None:
        if blocks > self.free:
            raise RuntimeError(f"KV over-allocation: {blocks} blocks asked, {self.free} free")
        self.free -= blocks
        if self._cached_total > self.free:  # only then is there anything to evict
            self._evict()

    def keep_cached(self, key: CacheKey, blocks: int) -> None:
        """`key` left `blocks` full blocks (already released) in the cache; they replace
        what it had cached before (the same prefix, or a shorter one) and are the most
        recently freed."""
        self.take_cached(key)
        if blocks > 0:
            self._cached[key] = blocks
            self._cached_total += blocks
            self._evict()

    def keep_unreachable(self, key: CacheKey, blocks: int) -> None:
        """Full blocks left cached by an owner nobody asks for again (`unreachable_key`: a
        request outside a session that completed, or was handed off where no failed
        request is retried). Their one effect is their place in
        the LRU order: an allocation evicts the blocks cached before them first. What
        survives of an owner depends only on the blocks freed after it, so with no other
        owner cached before them they change nothing and are not kept (nor are such
        blocks once they lead the order): prefix caching costs nothing where no prefix
        can hit (no preemption, no session), and results are those of keeping them."""
        cached = self._cached
        while cached and next(iter(cached))[0] == "unreachable":
            self.take_cached(next(iter(cached)))
        if cached:
            self.keep_cached(key, blocks)

    def cached_blocks(self, key: CacheKey) -> int:
        return self._cached.get(key, 0)

    def take_cached(self, key: CacheKey) -> int:
        """Full blocks of `key` still cached (they count as free until reallocated)."""
        blocks = self._cached.pop(key, 0)
        self._cached_total -= blocks
        return blocks

    def _evict(self) -> None:
        """Allocations take free blocks, cached ones last: evict least recently freed
        owners' blocks (each owner's tail first) until the cache fits in the free."""
        while self._cached_total > self.free:
            key, blocks = next(iter(self._cached.items()))
            drop = min(blocks, self._cached_total - self.free)
            self._cached_total -= drop
            if drop == blocks:
                del self._cached[key]
            else:
                self._cached[key] = blocks - drop

    def release(self, blocks: int) -> None:
        self.free += blocks
        if self.free > self.total:
            raise RuntimeError(f"KV over-release: {self.free} free of {self.total}")


class HybridBlockManager(BlockManager):
    """vLLM V1's hybrid KV cache manager over one pool: a sequence holds blocks in every
    KV cache group (see kv_groups.py), so the counts here are pool blocks over all groups;
    sliding groups free the blocks that leave the window. A released sequence leaves
    its full groups' blocks and its window's cached; an eviction that takes any of them
    breaks the hit (the window before a shorter prefix was freed long before)."""

    def __init__(
        self,
        total_blocks: int,
        groups: KvCacheGroups,
        max_num_batched_tokens: int,
        watermark: float = 0.0,
    ) -> None:
        super().__init__(total_blocks, groups.block_size, watermark)
        self.groups = groups
        self.budget = max_num_batched_tokens
        self._prefix: dict[CacheKey, int] = {}  # owner -> the prefix blocks it cached

    def held(self, computed: int, tokens: int) -> int:
        return int(self.groups.held(computed, tokens))

    def peak_blocks(self, tokens: int) -> int:
        return self.groups.peak(tokens, self.budget)

    def full_sequence_blocks(self, hit: int, tokens: int) -> int:
        return self.groups.full_sequence(hit, tokens, self.budget)

    def keep_cached(self, key: CacheKey, blocks: int) -> None:
        """`blocks`: the prefix blocks `key` computed (whole blocks of tokens)."""
        super().keep_cached(key, self.groups.cached_prefix_blocks(blocks))
        if blocks > 0:
            self._prefix[key] = blocks

    def cached_blocks(self, key: CacheKey) -> int:
        """Prefix blocks of `key` that still hit: all it cached, or none once evicted."""
        blocks = self._prefix.get(key, 0)
        if blocks and super().cached_blocks(key) == self.groups.cached_prefix_blocks(blocks):
            return blocks
        if blocks and not super().cached_blocks(key):  # evicted whole: forget it
            del self._prefix[key]
        return 0

    def take_cached(self, key: CacheKey) -> int:
        self._prefix.pop(key, None)
        return super().take_cached(key)
