"""KV cache groups of a model with sliding-window layers, as vLLM V1 forms them.

vLLM V1's hybrid KV cache manager gives each attention type its own block tables: the
layers are split into groups of `layers` layers each (padding the last group of a type),
all groups share one block pool whose blocks hold one block_size-token page of `layers`
layers, and a request holds blocks in every group. A full-attention group holds blocks
for the whole sequence; a sliding-window group frees the blocks that fall out of the
window before each allocation (`remove_skipped_blocks`), so it holds about the window
plus the tokens being computed. With every layer of one kind there is a single group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.architecture import ModelArchitecture

_GROUP_SIZE_SLACK = 1.5
"""vLLM takes the larger type's layer count as the group size when it is below this
many times the smaller's (12 sliding + 13 full: one padding layer, not 12)."""


@dataclass(frozen=True, slots=True)
class KvCacheGroups:
    """`full` groups of full-attention layers and `sliding` groups of sliding-window ones
    (`window` keys), `layers` layers a group (its last may be padding), blocks of
    `block_size` tokens."""

    full: int
    sliding: int
    window: int
    layers: int
    block_size: int
    chunked: bool = False  # Llama 4's chunked local attention: `window` is the chunk

    def skipped_blocks(self, computed):
        """Leading blocks of a sliding group no query attends once `computed` tokens are
        cached: they hold only keys before the window, or, chunked, before the current
        chunk (vLLM's get_num_skipped_tokens; scalar or array)."""
        if self.chunked:
            return computed // self.window * self.window // self.block_size
        return np.maximum(computed - self.window + 1, 0) // self.block_size

    def held(self, computed, tokens):
        """Pool blocks a sequence holds over all groups once its first `tokens` tokens
        have slots, `computed` of them cached before this step (scalar or array): the
        full groups every block, the sliding ones those not skipped."""
        blocks = -(-tokens // self.block_size)
        sliding = np.maximum(blocks - self.skipped_blocks(computed), 0)
        return self.full * blocks + self.sliding * sliding

    def window_cap(self, budget: int) -> int:
        """Most blocks a sliding group holds for one sequence when a step computes at
        most `budget` tokens (vLLM's max_admission_blocks_per_request): the window and
        the step's tokens, and a block more as the window need not start on a block
        edge; chunked, the chunk and the step's tokens."""
        if self.chunked:
            return -(-(self.window + budget) // self.block_size)
        return -(-(self.window - 1 + budget) // self.block_size) + 1

    def peak(self, tokens: int, budget: int) -> int:
        """Most pool blocks a sequence of `tokens` tokens holds at once."""
        blocks = -(-tokens // self.block_size)
        return self.full * blocks + self.sliding * min(blocks, self.window_cap(budget))

    def full_sequence(self, hit: int, tokens: int, budget: int) -> int:
        """Pool blocks admission asks free for a sequence of `tokens` tokens whose first
        `hit` (whole blocks) are cached (vLLM's full_sequence_must_fit): the full groups'
        every block; a sliding group's capped at what it can hold at once, less the
        hit's blocks, plus the hit's window blocks, which leave the free queue."""
        blocks, cached = -(-tokens // self.block_size), hit // self.block_size
        window_hit = cached - self.skipped_blocks(hit)
        sliding = max(min(blocks, self.window_cap(budget)) - cached, 0) + window_hit
        return self.full * blocks + self.sliding * int(sliding)

    def cached_prefix_blocks(self, prefix_blocks: int) -> int:
        """Pool blocks a released sequence leaves cached for a hit on its first
        `prefix_blocks` blocks: every full group's, and in each sliding group those a
        hit there needs, the window's cdiv(window - 1, block) before the hit (vLLM's
        contiguous blocks) or, chunked, the current chunk's; those before were freed."""
        window = prefix_blocks - self.skipped_blocks(prefix_blocks * self.block_size)
        return self.full * prefix_blocks + self.sliding * int(window)

    def describe(self) -> str:
        groups = [f"{self.full} full"] if self.full else []
        kind = "chunked local" if self.chunked else "sliding"
        groups.append(f"{self.sliding} {kind} ({self.window} tokens)")
        return f"{' + '.join(groups)} groups of {self.layers} layers"


def chunked_local_attention(arch: ModelArchitecture) -> bool:
    """Llama 4's chunked local attention (modelled as a window of the chunk), for which
    vLLM turns its hybrid KV cache manager off by default (a latency regression), unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1."""
    return arch.family == "llama4" and arch.num_sliding_layers < arch.num_layers


def vllm_default_groups(arch: ModelArchitecture, block_size: int) -> KvCacheGroups | None:
    """The KV cache groups vLLM V1 serves the model with by default (None: every layer
    in every block)."""
    if not arch.num_sliding_layers or chunked_local_attention(arch):
        return None
    return kv_cache_groups(arch, block_size)


def group_layers(arch: ModelArchitecture) -> list[list[int]]:
    """The model's layers in vLLM's KV cache groups: full-attention groups first, then
    sliding ones. The group size is the smaller type's layer count (the larger's when it
    is under 1.5 times that); a type's i-th group takes every n-th of its layers from the
    i-th on, so pipeline stages get even shares of every group."""
    full = [i for i in range(arch.num_layers) if not arch.is_sliding_layer(i)]
    sliding = [i for i in range(arch.num_layers) if arch.is_sliding_layer(i)]
    kinds = [layers for layers in (full, sliding) if layers]
    smallest, largest = min(map(len, kinds)), max(map(len, kinds))
    size = largest if largest < smallest * _GROUP_SIZE_SLACK else smallest
    groups = []
    for layers in kinds:
        count = math.ceil(len(layers) / size)
        groups += [layers[i::count] for i in range(count)]
    return groups


def kv_cache_groups(arch: ModelArchitecture, block_size: int) -> KvCacheGroups:
    """vLLM V1's KV cache groups of a model with sliding-window (or chunked local
    attention) layers."""
    if not arch.num_sliding_layers or arch.sliding_window is None:
        raise ValueError(f"{arch.name} has no sliding-window layers: one full group")
    groups = group_layers(arch)
    sliding = sum(arch.is_sliding_layer(group[0]) for group in groups)
    return KvCacheGroups(
        full=len(groups) - sliding,
        sliding=sliding,
        window=arch.sliding_window,
        layers=max(map(len, groups)),
        block_size=block_size,
        chunked=chunked_local_attention(arch),
    )


def page_layers(arch: ModelArchitecture, stage: range) -> int:
    """Layers one pool block holds a page of on a GPU holding the layers in `stage`:
    the most any group has there (each group's blocks hold its layers' pages)."""
    return max(sum(layer in stage for layer in group) for group in group_layers(arch))
