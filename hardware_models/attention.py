"""Attention costs: flash-style prefill and paged decode, closed form over batch sums.

The simulator calls these once per engine step with sums over the running batch
(tokens, attended query-key pairs, context tokens), so their Python cost does not grow
with the batch size. Arguments may be numpy arrays to price many steps at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.block_scaling import WARP_MMA_FAMILIES, gemm_family
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.efficiency import EfficiencyCurve
from hardware_models.gemm import l2_hit_fraction
from hardware_models.op_cost import Bound, OpCost

# Query rows x keys of one prefill thread block's tile. vLLM's FlashAttention-2 always
# reads a paged cache, which runs its split-KV kernel (flash_api.cpp: force_split_kernel
# = paged_KV) on 64-row tiles with 256, 128 or 64 keys for head dims up to 64, 128 and
# above (run_mha_fwd_splitkv_dispatch), on Ampere and Ada alike. FlashAttention-3's
# (Hopper) are not modelled as tiles: its calls count 128-row query blocks and pay half
# a block per row at the diagonal (see prefill_kernel).
FA2_PAGED_QUERY_BLOCK = 64
PACKED_TILE = (128, 128)
# FlashInfer's FA2-style prefill (FA2DetermineCtaTileQ) picks its query tile by the
# call's mean packed rows a sequence: 128 above 64 (head dims under 256), 64 above 16,
# else 16; its key tile is sized to shared memory, 64 keys taken here.
FLASHINFER_KEY_BLOCK = 64
# Keys in one decode key tile: a split-KV slice is never shorter.
DECODE_KEY_BLOCK = 128


def causal_pairs(q_len: int, kv_len: int, window: int | None = None) -> int:
    """Query-key pairs a causal (optionally sliding-window) pass computes for one sequence.

    The q_len new tokens sit at the end of a kv_len-token context (kv_len >= q_len).
    """
    context = kv_len - q_len
    if window is None or window >= kv_len:
        return q_len * context + q_len * (q_len + 1) // 2
    # Positions p = context+1 .. kv_len each see min(p, window) keys: those below the
    # window its ramp, first .. ramp_end - 1, an arithmetic series (summed in closed form,
    # in integers: the engine counts every chunk of a sliding-window model this way).
    first = context + 1
    full_from = max(first, window)
    ramp_end = min(full_from, kv_len + 1)
    ramp = (first + ramp_end - 1) * (ramp_end - first) // 2 if ramp_end > first else 0
    return ramp + (kv_len - full_from + 1) * window if kv_len >= full_from else ramp


def causal_pairs_many(q_len, kv_len, window) -> np.ndarray:
    """causal_pairs over arrays of sequences (window 0 or NaN: none), in closed form: the
    ramp below a sliding window is an arithmetic series. Exact while the counts stay
    below 2^53, as the integer version's products do."""
    q, kv = np.asarray(q_len, dtype=float), np.asarray(kv_len, dtype=float)
    window = np.nan_to_num(np.asarray(window, dtype=float))
    context = kv - q
    full = q * context + q * (q + 1) // 2
    first = context + 1
    full_from = np.maximum(first, window)
    ramp_end = np.minimum(full_from, kv + 1)  # the ramp is first .. ramp_end - 1
    ramp = np.where(ramp_end > first, (first + ramp_end - 1) * (ramp_end - first) // 2, 0.0)
    windowed = ramp + np.where(kv >= full_from, (kv - full_from + 1) * window, 0.0)
    return np.where((window > 0) & (window < kv), windowed, full)


def keys_per_query(attended_pairs, new_tokens):
    """Mean keys each query attends: the length of a flash thread block's inner loop, which
    sets how well its fixed prologue and epilogue are amortised (the prefill curve's axis).
    Scalars or numpy arrays."""
    return np.maximum(attended_pairs / np.maximum(new_tokens, 1), 1.0)


def prefill_kernel(gpu: AcceleratorSpec, kv_dtype: Dtype) -> tuple[bool, bool]:
    """(packs the query heads of a KV head into its rows, priced in whole tiles) for the
    prefill kernel vLLM runs on `gpu` over a `kv_dtype` cache. On the warp-MMA chips
    that is FlashAttention-2, one query head per block, or for an 8-bit cache, which FA2
    cannot read, FlashInfer, which packs them: both read from their source, in whole
    tiles (PrefillAttention.__call__). Elsewhere (FlashAttention-3 on Hopper) packing
    is the profile's fitted choice, and a call pays the pairs it attends plus half a
    128-row block per row at the diagonal, which the H100's table fits better than
    128 x 128 tiles (held-out 11.3% against 12.2%)."""
    if gemm_family(gpu) in WARP_MMA_FAMILIES:
        return runs_flashinfer(gpu, kv_dtype), True
    return gpu.efficiency.for_kv_dtype(kv_dtype).prefill_pack_gqa, False


def runs_flashinfer(gpu: AcceleratorSpec, kv_dtype: str | Dtype) -> bool:
    """Whether vLLM's attention over a `kv_dtype` cache on `gpu` is FlashInfer's: an
    8-bit cache on the warp-MMA chips, which FlashAttention-2 cannot read (vLLM's FA
    backend takes an fp8 cache only with FA3, on Hopper)."""
    eight_bit = bytes_per_element(parse_dtype(kv_dtype)) < 2
    return eight_bit and gemm_family(gpu) in WARP_MMA_FAMILIES


def flashinfer_query_block(rows, head_dim, ops=np):
    """FlashInfer's query tile for a call of `rows` packed rows a sequence (see
    FLASHINFER_KEY_BLOCK)."""
    if ops is np:
        return np.where((rows > 64) & (head_dim < 256), 128.0, np.where(rows > 16, 64.0, 16.0))
    return 128 if rows > 64 and head_dim < 256 else 64 if rows > 16 else 16


def last_block_keys(tokens, context, window, block_tokens, block_n):
    """Keys, in whole key tiles, the last query block of a sequence computes: all it
    attends, or with a sliding `window` (> 0) the window's plus its rows' span. Arrays
    (tile_keys_plain: one call's in plain floats)."""
    span = np.minimum(context + tokens, window + block_tokens)
    keys = np.where(window > 0, span, context + tokens)
    return np.ceil(keys / block_n) * block_n


def prefill_tile(pack_gqa: bool, head_dim: int, whole_tiles: bool) -> tuple[int, int]:
    """(query rows, keys) of the prefill kernel's thread-block tile (see prefill_kernel):
    FlashInfer's (packed, whole tiles; its query tile is the largest, chosen per call by
    flashinfer_query_block), FlashAttention-3's blocks (not whole tiles), or FA2's."""
    if pack_gqa and whole_tiles:
        return PACKED_TILE[0], FLASHINFER_KEY_BLOCK
    if pack_gqa or not whole_tiles:
        return PACKED_TILE
    return FA2_PAGED_QUERY_BLOCK, 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


def tile_keys(tokens, context, window, block_tokens, block_n):
    """Keys one (sequence, head) unit's query blocks compute in all, each block over whole
    key tiles: a block's rows hold `block_tokens` of the `tokens` new tokens after
    `context` cached ones (per sequence) and read the keys up to its last row's, or with
    a sliding `window` (> 0) at most window + block_tokens of them. Blocks before the last
    leave half a tile's slack past their rows on average (none where their rows span whole
    tiles); the last block's is exact, which is what a prompt of one block pays. Arrays
    (tile_keys_plain: one call's in plain floats)."""
    blocks = np.ceil(tokens / block_tokens)
    last = context + tokens
    cap = np.where(window > 0, window + block_tokens, last)
    last = np.minimum(last, cap)
    # Blocks before the last end at context + j * block_tokens (j = 1 .., each up to cap).
    below = np.floor(np.minimum(np.maximum((cap - context) / block_tokens, 0.0), blocks - 1))
    before = below * context + block_tokens * below * (below + 1) / 2
    before = before + (blocks - 1 - below) * cap
    slack = (blocks - 1) * np.maximum(block_n - block_tokens, 0.0) / 2
    return before + slack + np.ceil(last / block_n) * block_n


def tile_keys_plain(
    tokens: float, context: float, window: int, block_tokens: float, block_n: int
) -> tuple[float, float]:
    """(tile_keys, last_block_keys) of one call in plain floats: the same operations in
    the same order, so the same numbers, at a fraction of the cost (the engine prices a
    prefill on every mixed step). Comparisons stand in for min and max, each returning
    what the builtin would (its first argument unless the second is strictly beyond it),
    and the last block's keys are the last term of the sum, worked out once."""
    blocks = math.ceil(tokens / block_tokens)
    last = context + tokens
    cap = window + block_tokens if window else last
    if cap < last:
        last = cap
    below = (cap - context) / block_tokens
    if below < 0.0:
        below = 0.0
    if blocks - 1 < below:
        below = blocks - 1
    below = math.floor(below)
    before = below * context + block_tokens * below * (below + 1) / 2
    before = before + (blocks - 1 - below) * cap
    gap = block_n - block_tokens
    if gap < 0.0:
        gap = 0.0
    slack = (blocks - 1) * gap / 2
    last_keys = math.ceil(last / block_n) * block_n
    return before + slack + last_keys, last_keys


class PrefillAttention:
    """Flash-style prefill attention for one head configuration, constants worked out
    once (the simulator prices it every engine step).

    Work units are (sequence, head, query block): one query head a block (FA2), or with
    the query heads that share a KV head packed into the block's rows (FlashAttention-3's
    and FlashInfer's pack-GQA), so a short prompt does not pay one block per query head;
    a partly empty last wave idles SMs. On the warp-MMA chips each block computes whole
    tiles and the slowest block bounds the call (see prefill_kernel).
    A call in which every sequence brings one token runs the decode kernel (the
    libraries dispatch on the longest query, 1) and is priced as one: on the public H100
    and A100 tables such calls measure within 1% of decode calls of the same shape.
    """

    def __init__(
        self,
        gpu: AcceleratorSpec,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str | Dtype = "bf16",
        kv_dtype: str | Dtype = "bf16",
        window: int | None = None,
        compute_curve: EfficiencyCurve | None = None,
        floor_us: float | None = None,
    ) -> None:
        """`compute_curve` and `floor_us` replace the profile's attention_prefill_compute
        and prefill floor for a kernel fitted on its own (MLA prefill)."""
        dtype, kv_dtype = parse_dtype(dtype), parse_dtype(kv_dtype)
        eff = gpu.efficiency.for_kv_dtype(kv_dtype)  # the cache dtype's kernel, if fitted
        self.flops_per_pair = 4.0 * num_heads * head_dim  # QK^T and PV
        # Work is done in (query block x key block) tiles. Query rows are the new tokens
        # of one sequence, times the query heads of a KV head when the kernel packs them
        # (FlashAttention-3's pack-GQA; FA2 runs one query head per thread block).
        # The kernel vLLM runs (prefill_kernel): whether it packs a KV head's query heads
        # into its rows, and whether it is priced in whole tiles.
        self.pack_gqa, self.whole_tiles = prefill_kernel(gpu, kv_dtype)
        self.row_group = num_heads / num_kv_heads if self.pack_gqa else 1.0
        self.row_heads = num_kv_heads if self.pack_gqa else num_heads
        self.block_m, self.block_n = prefill_tile(self.pack_gqa, head_dim, self.whole_tiles)
        self.head_dim = head_dim
        self.flashinfer = self.pack_gqa and self.whole_tiles
        # FLOPs of one tile row against one key: a row is one query of one head.
        self.flops_per_row_key = 4.0 * head_dim
        self.window = window or 0
        self.q_bytes_per_token = num_heads * head_dim * bytes_per_element(dtype)
        self.kv_bytes_per_token = 2.0 * num_kv_heads * head_dim * bytes_per_element(kv_dtype)
        math_dtype = dtype if gpu.supports(dtype) else Dtype.BF16
        self.peak = gpu.peak_flops(math_dtype)
        self.curve = compute_curve or eff.attention_prefill_compute
        self._compute_at = self.curve.scalar_at()
        # With a constant efficiency, peak x efficiency is worked out once (the same
        # product __call__ would form first).
        constant = len(self.curve.sizes) == 1
        self._attainable = self.peak * self.curve.values[0] if constant else None
        self.sm_count = gpu.sm_count
        self.cta_seconds = eff.prefill_cta_latency_us * 1e-6
        self.bandwidth = gpu.memory_bandwidth
        self.gpu = gpu
        self.l2_rate = gpu.l2_bandwidth * eff.l2_bandwidth
        self.memory_curve = eff.prefill_memory
        self._memory_at = self.memory_curve.scalar_at()
        constant_memory = len(self.memory_curve.sizes) == 1
        self._memory_rate = (
            self.bandwidth * self.memory_curve.values[0] if constant_memory else None
        )
        self.floor = (eff.prefill_floor_us if floor_us is None else floor_us) * 1e-6
        # One token a sequence runs the decode kernel (see the class docstring).
        heads = {"num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim}
        self.decode = DecodeAttention(gpu, **heads, dtype=dtype, kv_dtype=kv_dtype, window=window)
        self._grids: dict[tuple[int, int], tuple[int, float, int, int, float]] = {}

    def _attainable_rate(self, attended_pairs, new_tokens):
        """FLOP/s the key loops run at: the curve's efficiency at the mean keys per query
        (with a constant curve, __call__ takes _attainable instead)."""
        # keys_per_query in plain floats: numpy's conversions and operations, so the
        # same number, without its per-call cost (priced on every prefill step).
        keys = float(attended_pairs) / float(max(new_tokens, 1))
        return self.peak * self._compute_at(max(keys, 1.0))

    def __call__(
        self, num_seqs: int, new_tokens: int, attended_pairs: float, context_tokens: int
    ) -> tuple[float, float, float, float, float]:
        """(seconds, flops, dram_bytes, compute_seconds, memory_seconds); for a call of
        one token per sequence the decode kernel's time, thread-block waves and KV stream."""
        flops = self.flops_per_pair * attended_pairs
        if new_tokens <= num_seqs:
            seqs = max(num_seqs, 1)
            keys = decode_keys_read(context_tokens / seqs, self.window)
            parts = self.decode.parts(seqs, seqs * float(keys))
            dram = context_tokens * self.kv_bytes_per_token + new_tokens * self.decode.bytes_per_seq
            return float(parts.seconds), flops, dram, float(parts.fixed), float(parts.memory)
        q_bytes = new_tokens * self.q_bytes_per_token
        dram = 2.0 * q_bytes + context_tokens * self.kv_bytes_per_token
        grid = self._grids.get((num_seqs, new_tokens))
        if grid is None:
            grid = self._grids[num_seqs, new_tokens] = self._grid(num_seqs, new_tokens)
        seqs, tokens, block_m, waves, wave_eff = grid
        attainable = self._attainable
        if attainable is None:
            attainable = self._attainable_rate(attended_pairs, new_tokens)
        if self.whole_tiles:
            # Every block computes whole tiles: all its rows (a short prompt's last block
            # is mostly padding) against its keys rounded up to whole key tiles.
            context = context_tokens / seqs - tokens
            keys, last_keys = tile_keys_plain(
                tokens, context, self.window, block_m / self.row_group, self.block_n
            )
            tiles = num_seqs * self.row_heads * block_m * keys * self.flops_per_row_key
            # No SM finishes before the block with the most keys (a causal prompt's last).
            longest = block_m * last_keys * self.flops_per_row_key * self.sm_count
        else:
            wasted = new_tokens * block_m / 2
            if self.window:
                wasted += max(new_tokens - num_seqs * self.window, 0) * block_m / 2
            tiles, longest = flops + wasted * self.flops_per_pair, 0.0
        # Each thread block pays a fixed prologue/epilogue (Q load, O store) besides its
        # key loop; an SM runs its blocks one after another, so the two add up. The
        # comparisons are max()'s: its first argument unless the second is larger.
        spread = tiles / wave_eff
        compute = (longest if longest > spread else spread) / attainable
        compute = compute + waves * self.cta_seconds
        rate = self._memory_rate
        if rate is None:
            rate = self.bandwidth * self._memory_at(max(dram, 1.0))
        memory = dram / rate
        seconds = memory if memory > compute else compute
        return seconds + self.floor, flops, dram, compute, memory

    def _grid(self, num_seqs: int, new_tokens: int) -> tuple[int, float, int, int, float]:
        """(sequences, new tokens a sequence, query block rows, waves of thread blocks,
        the waves' share of busy SMs) of a prefill call's grid, which its shape alone
        decides: __call__ keeps them by (num_seqs, new_tokens), as a chunked prefill's
        calls have few shapes (perf_10k: 776 in 26,433 calls)."""
        seqs = max(num_seqs, 1)
        tokens = new_tokens / seqs
        rows = tokens * self.row_group
        block_m = self.block_m
        if self.flashinfer:
            block_m = flashinfer_query_block(rows, self.head_dim, math)
        blocks = math.ceil(rows / block_m)
        units = max(1, num_seqs * self.row_heads * blocks)
        waves = math.ceil(units / self.sm_count)
        return seqs, tokens, block_m, waves, units / (waves * self.sm_count)

    def many(self, num_seqs, new_tokens, attended_pairs, context_tokens) -> tuple[np.ndarray, ...]:
        """__call__ over arrays of calls, the same arithmetic in the same order (so the
        same floats): a calibration fit prices every prefill row for each candidate."""
        layout = np.zeros(np.shape(num_seqs), dtype=int)
        return prefill_many([self], layout, num_seqs, new_tokens, attended_pairs, context_tokens)


def prefill_many(
    models: list[PrefillAttention],
    layout,
    num_seqs,
    new_tokens,
    attended_pairs,
    context_tokens,
    warm_l2: bool = False,
) -> tuple[np.ndarray, ...]:
    """PrefillAttention.many over calls of several head layouts and KV-cache dtypes at
    once: call i runs `models[layout[i]]`. One pass of numpy over every call instead of
    one per layout (a fit prices tens of layouts per candidate); each call's arithmetic
    is its model's, in the same order, so the floats are those of __call__: its own
    constants, curves and floor (a profile's per-cache-dtype kernel), and for one token a
    sequence its decode kernel. The models must share one GPU and tile rule: the SM
    count, bandwidth, L2 and `whole_tiles` are read from the first. `warm_l2`: a
    benchmark's repeated call finds part of its bytes in L2 (the measured tables)."""
    if not models:
        return tuple(np.empty(0) for _ in range(5))
    first = models[0]
    layout = np.asarray(layout, dtype=int)
    seqs, new, pairs, context = (
        np.asarray(a, dtype=float) for a in (num_seqs, new_tokens, attended_pairs, context_tokens)
    )

    def const(name: str) -> np.ndarray:
        return per_call(models, layout, name)

    flops_per_pair, window = const("flops_per_pair"), const("window")
    flops = flops_per_pair * pairs
    q_bytes = new * const("q_bytes_per_token")
    dram = 2.0 * q_bytes + context * const("kv_bytes_per_token")
    per_seq = np.maximum(seqs, 1)
    tokens = new / per_seq
    row_group, block_m = const("row_group"), const("block_m")
    rows = tokens * row_group
    flashinfer = const("flashinfer") > 0
    if flashinfer.any():
        block_m = np.where(flashinfer, flashinfer_query_block(rows, const("head_dim")), block_m)
    units = np.maximum(1, seqs * const("row_heads") * np.ceil(rows / block_m))
    waves = np.ceil(units / first.sm_count)
    wave_eff = units / (waves * first.sm_count)
    keys_q = keys_per_query(pairs, new)
    attainable = const("peak") * _per_kernel(
        models, layout, lambda m, at: m.curve.at(keys_q[at]), _prefill_curves
    )
    block_n, span = const("block_n"), block_m / row_group
    keys = tile_keys(tokens, context / per_seq - tokens, window, span, block_n)
    tiles = seqs * const("row_heads") * block_m * keys * const("flops_per_row_key")
    longest = block_m * last_block_keys(tokens, context / per_seq - tokens, window, span, block_n)
    longest = longest * const("flops_per_row_key") * first.sm_count
    if not first.whole_tiles:
        wasted = new * block_m / 2
        far_edge = wasted + np.maximum(new - seqs * window, 0) * block_m / 2
        wasted = np.where(window > 0, far_edge, wasted)
        tiles, longest = flops + wasted * flops_per_pair, 0.0
    compute = np.maximum(tiles / wave_eff, longest) / attainable
    compute = compute + waves * const("cta_seconds")
    read = np.maximum(dram, 1.0)
    eff = _per_kernel(models, layout, lambda m, at: m.memory_curve.at(read[at]), _prefill_curves)
    rate = first.bandwidth * eff
    memory = dram / rate
    if warm_l2:
        # A benchmark's repeated call finds what the last one left in a single L2
        # (gemm.l2_hit_fraction): those bytes move at the L2's rate.
        hit = l2_hit_fraction(first.gpu, dram)
        if hit.any():
            memory = dram * (1.0 - hit) / rate + dram * hit / first.l2_rate
    seconds = np.maximum(compute, memory) + const("floor")
    # One token a sequence: the decode kernel's terms, as __call__ prices it.
    one = new <= seqs
    if one.any():
        calls = np.maximum(seqs[one], 1)
        keys = decode_keys_read(context[one] / calls, window[one])
        decoders = [m.decode for m in models]
        decode = decode_parts_many(decoders, layout[one], calls, calls * keys)
        seconds[one], compute[one], memory[one] = decode.seconds, decode.fixed, decode.memory
        kv_bytes = context[one] * const("kv_bytes_per_token")[one]
        dram[one] = kv_bytes + new[one] * per_call(decoders, layout, "bytes_per_seq")[one]
    return seconds, flops, dram, compute, memory


def attention_prefill_cost(
    gpu: AcceleratorSpec,
    *,
    num_seqs: int,
    new_tokens: int,
    attended_pairs: float,
    context_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str | Dtype = "bf16",
    kv_dtype: str | Dtype = "bf16",
    window: int | None = None,
) -> OpCost:
    """Flash attention over `num_seqs` sequences with `new_tokens` queries in total.

    `attended_pairs` is the sum of query-key pairs (see causal_pairs); `context_tokens`
    the sum of keys each sequence reads (its full kv length); `window` the sliding window
    the pairs were counted with (None: full causal).
    """
    model = PrefillAttention(
        gpu,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        kv_dtype=kv_dtype,
        window=window,
    )
    seconds, flops, dram, compute, memory = model(
        num_seqs, new_tokens, attended_pairs, context_tokens
    )
    query_blocks = max(1, math.ceil(new_tokens / max(num_seqs, 1) / model.block_m))
    floor = model.decode.floor if new_tokens <= num_seqs else model.floor
    l2 = dram + context_tokens * model.kv_bytes_per_token * (query_blocks - 1)
    return OpCost.from_terms("attention_prefill", seconds, flops, dram, l2, compute, memory, floor)


def uniform_prefill_args(
    batch: int, q_len: int, kv_len: int, window: int | None
) -> tuple[int, int, float, int]:
    """(num_seqs, new_tokens, attended_pairs, context_tokens) of `batch` equal sequences,
    as PrefillAttention and attention_prefill_cost take them."""
    return batch, batch * q_len, batch * causal_pairs(q_len, kv_len, window), batch * kv_len


def uniform_prefill_cost(
    gpu: AcceleratorSpec,
    *,
    batch: int,
    q_len: int,
    kv_len: int,
    window: int | None,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str | Dtype = "bf16",
    kv_dtype: str | Dtype = "bf16",
) -> OpCost:
    """Prefill of `batch` equal sequences (q_len new tokens after kv_len - q_len cached):
    the shape benchmarks and the `roofline` command describe."""
    seqs, new_tokens, pairs, context = uniform_prefill_args(batch, q_len, kv_len, window)
    return attention_prefill_cost(
        gpu,
        num_seqs=seqs,
        new_tokens=new_tokens,
        attended_pairs=pairs,
        context_tokens=context,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        kv_dtype=kv_dtype,
        window=window,
    )


def decode_keys_read(kv_len, window):
    """Keys a decoding sequence's kernel reads: its cache or, with a sliding window (> 0),
    the window plus half a key tile on average, since the tile holding the window's far
    edge is read whole. Scalars or numpy arrays."""
    kv = np.asarray(kv_len, dtype=float)
    window = np.nan_to_num(np.asarray(window, dtype=float))
    windowed = (window > 0) & (kv > window)
    return np.where(windowed, np.minimum(kv, window + DECODE_KEY_BLOCK / 2), kv)


class DecodeParts(NamedTuple):
    """A decode call's time and the terms it is made of (scalars or numpy arrays)."""

    seconds: Any
    memory: Any  # the KV stream at the bandwidth that serves it
    fixed: Any  # thread-block waves: fixed latency plus each block's own stream
    overhead: Any  # the call's floor plus the split-KV combine pass
    kv_bytes: Any  # KV cache bytes read: the bandwidth curve's axis
    in_l2: Any  # whether the reads hit a warm L2 (warm_l2 pricing only), else DRAM


class DecodeAttention:
    """Paged decode attention for one head configuration, with its coefficients worked
    out once: the simulator prices it every engine step, often for many steps at once.

    Each sequence reads its whole KV cache once (memory-bound), and each (sequence, KV
    head) thread block has a fixed cost, run in waves over the SMs. When there are fewer
    such blocks than SMs, the kernel splits each cache into slices to fill them
    (flash-decoding) and combines the partial results in a second pass; one block streams
    its slice at a capped rate, so a kernel that cannot split (FlashAttention-2 without
    GQA) leaves HBM idle on few long caches. In serving every read is priced from DRAM:
    between two calls of one layer the rest of the step (every other layer's weights
    and caches) streams through L2. A micro-benchmark that calls the kernel again on the
    same cache finds it in L2 when it fits (`decode_parts_many(warm_l2=True)`, how the
    calibration tables are priced): on the L40S, whose 96 MB L2 is large next to its
    GDDR6 bandwidth, that makes caches up to ~64 MB read 2-3x faster than DRAM allows.
    """

    def __init__(
        self,
        gpu: AcceleratorSpec,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str | Dtype = "bf16",
        kv_dtype: str | Dtype = "bf16",
        window: int | None = None,
    ) -> None:
        eff = gpu.efficiency.for_kv_dtype(kv_dtype)
        self._curve = eff.attention_decode_memory
        self._curve_at = self._curve.scalar_at()
        self._constant_eff = len(self._curve.sizes) == 1
        self.flops_per_key = 4.0 * num_heads * head_dim
        self.kv_bytes_per_key = (
            2.0 * num_kv_heads * head_dim * bytes_per_element(parse_dtype(kv_dtype))
        )
        self.bytes_per_seq = 2.0 * num_heads * head_dim * bytes_per_element(parse_dtype(dtype))
        self.bandwidth = gpu.memory_bandwidth
        self.l2_bytes = gpu.l2.size_mb * 2**20
        # A warm L2's read rate, where a table showed one (see decode_parts_many).
        share = eff.decode_l2_bandwidth
        self.l2_rate = None if share is None else gpu.l2_bandwidth * share
        # FlashAttention-2 packs a KV head's query heads into one block's rows by swapping
        # the query-head and token axes, which it does only without a sliding window
        # (flash_api.cpp: seqlenq_ngroups_swapped needs window_size_left < 0): a windowed
        # call runs one block per query head, and splits no cache (FA2's varlen path
        # splits only the swapped decode). On the L40S's table that makes a 32-head,
        # 8-KV-head call with a 128-key window 2.4-3.4x slower than without at batch
        # 64-2048, over the same few keys.
        fa2 = eff.decode_split_kv == "gqa"
        unswapped = fa2 and bool(window)
        self.num_kv_heads = num_kv_heads
        self.block_heads = num_heads if unswapped else num_kv_heads  # blocks per sequence
        self.blocks_per_wave = gpu.sm_count / self.block_heads
        self.cta_seconds = eff.decode_cta_latency_us * 1e-6
        self.floor = eff.decode_floor_us * 1e-6
        # Split-KV and per-block streaming (see the class docstring).
        self.sm_count = gpu.sm_count
        self.splits_kv = not unswapped and (not fa2 or num_heads > num_kv_heads)
        self.cta_seconds_per_byte = eff.decode_cta_us_per_mb * 1e-12
        self.split_seconds = eff.decode_split_overhead_us * 1e-6
        # FA2's swapped GQA path reshapes (batch, 1, kv_heads x group) queries to (batch x
        # group, kv_heads): a view only for one sequence or one KV head, else a copy of
        # the queries and one of the outputs, each a kernel of its own.
        swaps = fa2 and not unswapped and num_heads > num_kv_heads > 1
        self.copy_seconds = eff.decode_gqa_copy_us * 1e-6 if swaps else 0.0
        # Without those terms the original closed form holds (and the engine's fast path).
        self._plain = not (self.cta_seconds_per_byte or self.split_seconds or self.copy_seconds)
        self._one_step: dict[int, Callable[[int], tuple[float, float, float]]] = {}

    def parts(self, num_seqs, context_tokens) -> DecodeParts:
        """The call's time term by term; numpy arrays price many calls at once."""
        layout = np.zeros(np.shape(num_seqs), dtype=int)
        return decode_parts_many([self], layout, num_seqs, context_tokens)

    def one_step_for(self, seqs: int) -> Callable[[int], tuple[float, float, float]]:
        """`one_step` for `seqs` decodes as a function of the context: the terms that
        depend on the batch alone are worked out once per batch size (memoised: sizes
        repeat), and each step does the rest in plain floats, the same operations in the
        same order as `parts` (so the same number): a calibrated profile's split and
        streaming terms would otherwise cost the engine numpy's per-call overhead."""
        one_step = self._one_step.get(seqs)
        if one_step is None:
            one_step = self._one_step[seqs] = self._build_one_step(seqs)
        return one_step

    def _build_one_step(self, seqs: int) -> Callable[[int], tuple[float, float, float]]:
        curve_at, bandwidth, splits_kv = self._curve_at, self.bandwidth, self.splits_kv
        per_key, seq_bytes = self.kv_bytes_per_key, seqs * self.bytes_per_seq
        flops_per_key, floor = self.flops_per_key, self.floor
        waves = math.ceil(seqs / self.blocks_per_wave)
        if self._plain:
            constant = self._curve.values[0] if self._constant_eff else None
            fixed = waves * self.cta_seconds

            def plain(context: int) -> tuple[float, float, float]:
                kv_bytes = context * per_key
                dram = kv_bytes + seq_bytes
                eff = constant if constant is not None else curve_at(max(kv_bytes, 1.0))
                memory = dram / (bandwidth * eff)
                return max(memory, fixed) + floor, context * flops_per_key, dram

            return plain
        blocks = max(seqs * self.block_heads, 1.0)
        per_seq = max(seqs, 1.0)
        most_splits = max(math.floor(self.sm_count / blocks), 1.0)
        slice_per_key = per_key / self.num_kv_heads
        cta_seconds, cta_seconds_per_byte = self.cta_seconds, self.cta_seconds_per_byte
        copy_seconds = self.copy_seconds if seqs > 1.0 else 0.0
        # The floor, plus the split pass's overhead when it splits, as parts adds them.
        overheads = (floor + 0.0 + copy_seconds, floor + self.split_seconds + copy_seconds)

        def split(context: int) -> tuple[float, float, float]:
            kv_bytes = context * per_key
            dram = kv_bytes + seq_bytes
            memory = dram / (bandwidth * curve_at(max(kv_bytes, 1.0)))
            keys = context / per_seq
            splits = 1.0
            if splits_kv:
                splits = min(most_splits, max(math.ceil(keys / DECODE_KEY_BLOCK), 1.0))
            slice_bytes = max(keys / splits - DECODE_KEY_BLOCK, 0.0) * slice_per_key
            fixed = waves * (cta_seconds + slice_bytes * cta_seconds_per_byte)
            seconds = max(memory, fixed) + overheads[splits > 1.0]
            return seconds, context * flops_per_key, dram

        return split

    def __call__(self, num_seqs, context_tokens):
        """(seconds, flops, dram_bytes) for `num_seqs` decodes attending `context_tokens`
        keys in total; numpy arrays price many steps at once."""
        kv_bytes = context_tokens * self.kv_bytes_per_key
        dram = kv_bytes + num_seqs * self.bytes_per_seq
        if not self._plain:
            return (
                self.parts(num_seqs, context_tokens).seconds,
                context_tokens * self.flops_per_key,
                dram,
            )
        if self._constant_eff:
            eff = self._curve.values[0]
        else:
            eff = self._curve.at(np.maximum(kv_bytes, 1.0))
        memory = dram / (self.bandwidth * eff)
        waves = num_seqs / self.blocks_per_wave
        waves = math.ceil(waves) if isinstance(num_seqs, int) else np.ceil(waves)
        fixed = waves * self.cta_seconds
        seconds = np.maximum(memory, fixed) + self.floor
        return seconds, context_tokens * self.flops_per_key, dram

    def batch_terms(self, num_seqs: int) -> tuple[float, float, float] | None:
        """For `num_seqs` decodes and a constant efficiency: (bytes of the queries and
        outputs, attainable bandwidth, seconds of the thread-block waves), the parts of
        `one_step` that do not depend on the context, exactly as it computes them (None
        when the efficiency, the splits or the block streams depend on the context)."""
        if not (self._constant_eff and self._plain):
            return None
        waves = math.ceil(num_seqs / self.blocks_per_wave) * self.cta_seconds
        return num_seqs * self.bytes_per_seq, self.bandwidth * self._curve.values[0], waves

    def one_step(self, num_seqs: int, context_tokens: int) -> tuple[float, float, float]:
        """`__call__` for one step, in plain floats: the same numbers without the cost of
        numpy scalars (the engine prices a step this way tens of thousands of times)."""
        return self.one_step_for(num_seqs)(context_tokens)


def per_call(models: list, layout: np.ndarray, name: str) -> np.ndarray:
    """Attribute `name` of the model each call runs (`models[layout[i]]`), as an array."""
    return np.array([getattr(m, name) for m in models], dtype=float)[layout]


def _prefill_curves(model: PrefillAttention) -> tuple[int, int]:
    return id(model.curve), id(model.memory_curve)


def _per_kernel(
    models: list,
    layout: np.ndarray,
    value: Callable,
    kernel: Callable = lambda model: id(model._curve),
) -> np.ndarray:
    """`value(model, calls)` for each model's calls, where the models' kernels (told
    apart by `kernel`: their curves) differ, as a profile's per-cache-dtype kernels do;
    one pass when they share one."""
    curves = {kernel(m) for m in models}
    if len(curves) == 1:
        return np.asarray(value(models[0], ...), dtype=float)
    out = np.empty(len(layout))
    for index, model in enumerate(models):
        calls = np.flatnonzero(layout == index)
        if len(calls):
            out[calls] = value(model, calls)
    return out


def decode_parts_many(
    models: list[DecodeAttention], layout, num_seqs, context_tokens, warm_l2: bool = False
) -> DecodeParts:
    """DecodeAttention.parts over calls of several head layouts at once (call i runs
    `models[layout[i]]`), each call's arithmetic its model's in the same order, so the
    same floats; the models share one GPU, and each reads its cache dtype's decode
    kernel of one efficiency profile (EfficiencyProfile.for_kv_dtype). With `warm_l2`, a
    call whose bytes fit in L2 reads them from there (a benchmark's repeated call on one
    cache; see DecodeAttention)."""
    if not models:
        return DecodeParts(*(np.empty(0) for _ in DecodeParts._fields))
    first = models[0]
    layout = np.asarray(layout, dtype=int)
    seqs = np.asarray(num_seqs, dtype=float)
    context = np.asarray(context_tokens, dtype=float)

    def const(name: str) -> np.ndarray:
        return per_call(models, layout, name)

    kv_bytes_per_key, num_kv_heads = const("kv_bytes_per_key"), const("num_kv_heads")
    kv_bytes = context * kv_bytes_per_key
    dram = kv_bytes + seqs * const("bytes_per_seq")
    eff = _per_kernel(models, layout, lambda m, at: m._curve.at(np.maximum(kv_bytes[at], 1.0)))
    memory = dram / (const("bandwidth") * eff)
    in_l2 = np.zeros(np.shape(dram), dtype=bool)
    rates = [m.l2_rate for m in models]
    if warm_l2 and any(rate is not None for rate in rates):
        # A streamed set larger than L2 evicts itself before it is read again: all or
        # none. A hit is never slower than the DRAM stream it saves.
        rate = np.array([np.inf if r is None else r for r in rates])[layout]
        in_l2 = (dram <= first.l2_bytes) & np.isfinite(rate)
        memory = np.where(in_l2, np.minimum(dram / rate, memory), memory)
    waves = np.ceil(seqs / const("blocks_per_wave"))
    blocks = np.maximum(seqs * const("block_heads"), 1.0)
    keys = context / np.maximum(seqs, 1.0)
    # As many slices as fill the SMs once, none shorter than one key tile.
    tiles = np.maximum(np.ceil(keys / DECODE_KEY_BLOCK), 1.0)
    split = np.minimum(np.maximum(np.floor(first.sm_count / blocks), 1.0), tiles)
    splits = np.where(const("splits_kv") > 0, split, 1.0)
    # A block's first key tile loads with its fixed latency; the rest stream at its rate.
    streamed = np.maximum(keys / splits - DECODE_KEY_BLOCK, 0.0)
    slice_bytes = streamed * (kv_bytes_per_key / num_kv_heads)
    fixed = waves * (const("cta_seconds") + slice_bytes * const("cta_seconds_per_byte"))
    overhead = (
        const("floor")
        + np.where(splits > 1.0, const("split_seconds"), 0.0)
        + np.where(seqs > 1.0, const("copy_seconds"), 0.0)
    )
    seconds = np.maximum(memory, fixed) + overhead
    return DecodeParts(seconds, memory, fixed, overhead, kv_bytes, in_l2)


def attention_decode_seconds(
    gpu: AcceleratorSpec,
    *,
    num_seqs: int | np.ndarray,
    context_tokens: float | np.ndarray,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str | Dtype = "bf16",
    kv_dtype: str | Dtype = "bf16",
) -> tuple[np.ndarray | float, np.ndarray | float, np.ndarray | float]:
    """(seconds, flops, dram_bytes) of one decode step; vectorised over numpy arrays."""
    model = DecodeAttention(
        gpu,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        kv_dtype=kv_dtype,
    )
    return model(num_seqs, context_tokens)


def attention_decode_cost(
    gpu: AcceleratorSpec,
    *,
    num_seqs: int,
    context_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str | Dtype = "bf16",
    kv_dtype: str | Dtype = "bf16",
) -> OpCost:
    """One decode step of paged attention: each sequence reads its whole KV cache once."""
    seconds, flops, dram = attention_decode_seconds(
        gpu,
        num_seqs=num_seqs,
        context_tokens=context_tokens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        kv_dtype=kv_dtype,
    )
    floor = gpu.efficiency.for_kv_dtype(kv_dtype).decode_floor_us * 1e-6
    work = float(seconds) - floor
    return OpCost(
        name="attention_decode",
        seconds=float(seconds),
        flops=float(flops),
        dram_bytes=float(dram),
        l2_bytes=float(dram),
        bound=Bound.LATENCY if floor >= work else Bound.MEMORY,
        memory_seconds=work,
        overhead_seconds=floor,
    )
