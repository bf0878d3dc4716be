"""Paged KV-cache block manager (vLLM style): fixed-size blocks, a free count, a watermark.

Only counts are kept: no decision depends on which physical block a request holds, so
the manager is O(1) per operation. With prefix caching, the full blocks a preempted
request leaves behind stay cached while free (vLLM v1 frees them into an LRU pool): they
are reused if the request comes back before other allocations evict them.
"""

from __future__ import annotations

from collections import OrderedDict

from hardware_models.errors import InfeasibleError


class BlockManager:
    def __init__(self, total_blocks: int, block_size: int, watermark: float = 0.01) -> None:
        if total_blocks < 1:
            raise InfeasibleError(
                f"the KV cache holds {total_blocks} blocks of {block_size} tokens: no room "
                "for any request (more GPU memory, a smaller model or fp8 KV would help)"
            )
        self.total = total_blocks
        self.block_size = block_size
        self.free = total_blocks
        self.watermark_blocks = int(watermark * total_blocks)
        self._cached: OrderedDict[int, int] = OrderedDict()  # request -> cached full blocks
        self._cached_total = 0

    @property
    def used(self) -> int:
        return self.total - self.free

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_admit(self, blocks: int) -> bool:
        """New requests must leave the watermark free so running ones can keep growing."""
        return self.free - blocks >= self.watermark_blocks

    def allocate(self, blocks: int) -> None:
        if blocks > self.free:
            raise RuntimeError(f"KV over-allocation: {blocks} blocks asked, {self.free} free")
        self.free -= blocks
        self._evict()

    def keep_cached(self, rid: int, blocks: int) -> None:
        """`rid` was preempted leaving `blocks` full blocks (already released) in the cache."""
        if blocks > 0:
            self._cached[rid] = blocks
            self._cached_total += blocks
            self._evict()

    def cached_blocks(self, rid: int) -> int:
        return self._cached.get(rid, 0)

    def take_cached(self, rid: int) -> int:
        """Full blocks of `rid` still cached (they count as free until reallocated)."""
        blocks = self._cached.pop(rid, 0)
        self._cached_total -= blocks
        return blocks

    def _evict(self) -> None:
        """Allocations take free blocks, cached ones last: evict least recently freed
        requests' blocks (each request's tail first) until the cache fits in the free."""
        while self._cached_total > self.free:
            rid, blocks = next(iter(self._cached.items()))
            drop = min(blocks, self._cached_total - self.free)
            self._cached_total -= drop
            if drop == blocks:
                del self._cached[rid]
            else:
                self._cached[rid] = blocks - drop

    def release(self, blocks: int) -> None:
        self.free += blocks
        if self.free > self.total:
            raise RuntimeError(f"KV over-release: {self.free} free of {self.total}")
