"""Paged KV-cache block manager (vLLM style): fixed-size blocks, a free count, a watermark.

Only counts are kept: without prefix caching no decision depends on which physical
block a request holds, so the manager is O(1) per operation.
"""

from __future__ import annotations

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

    def release(self, blocks: int) -> None:
        self.free += blocks
        if self.free > self.total:
            raise RuntimeError(f"KV over-release: {self.free} free of {self.total}")
