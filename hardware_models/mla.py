"""Multi-head latent attention (MLA, DeepSeek-V2/V3) as vLLM runs it.

MLA caches one latent vector per token and layer, kv_lora_rank + qk_rope_head_dim
values (576 for DeepSeek-V3: 1,152 bytes in bf16, where the decompressed keys and values
of its 128 heads would take 81,920), so its KV cache is small and decode streams little.
vLLM runs the two phases differently:

- decode absorbs the up-projections into the query and the output (W_UK, W_UV as two
  batched matmuls per step): attention runs over the latent itself, as multi-query
  attention with one 576-wide key (whose first 512 values are also the value) shared
  by every head. Each head multiplies the whole latent, so many heads over long caches
  turn it compute-bound (FlashMLA on H100), and a kernel whose thread blocks serve a
  few heads each re-reads the latent per group (Triton MLA, BLOCK_H = 16). FlashMLA
  and FlashAttention's MLA kernel give each thread block a tile of 64 query rows
  (heads x query tokens): 1 to 64 heads cost one tile's math. With an 8-bit cache
  vLLM quantises the absorbed queries first (a kernel of its own) and runs FlashMLA's
  FP8 kernel; with a 16-bit one, on Hopper, FlashAttention's MLA kernel.
- prefill decompresses K and V for the sequence (kv_b_proj over its cached tokens)
  and runs flash attention with qk_nope + qk_rope wide keys and v_head_dim wide values
  per head: the FLOPs and K/V bytes of multi-head attention with head_dim (qk + v) / 2,
  which is how it is priced (attention.PrefillAttention, with MLA's own efficiency).
  A chunk of up to the backend's reorder_batch_threshold tokens a sequence (512 for
  FlashAttention MLA, 128 for FlashMLA, 1 for Triton MLA) runs the decode kernel
  instead, absorbed: the public H100 module table steps at exactly those lengths.

`MlaShape` describes the layer after tensor parallelism (num_heads per rank);
`mla_decode_cost` / `mla_prefill_cost` price the attention kernels, `mla_module_cost`
adds the projections (a calibration table of whole modules measures those too).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import DECODE_KEY_BLOCK, PrefillAttention
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_cost
from hardware_models.op_cost import OpCost, classify
from hardware_models.pointwise import RMSNORM, ROTARY, Pointwise, elementwise_cost


@dataclass(frozen=True)
class MlaShape:
    """One MLA layer on one tensor-parallel rank."""

    num_heads: int  # query heads on this rank (after TP)
    hidden_size: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None  # None: queries projected directly (DeepSeek-V2-Lite)

    def __post_init__(self) -> None:
        for name in (
            "num_heads",
            "hidden_size",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        ):
            if getattr(self, name) < 1:
                raise InfersimError(f"MLA {name} must be >= 1, got {getattr(self, name)}")
        if self.q_lora_rank is not None and self.q_lora_rank < 1:
            raise InfersimError(f"MLA q_lora_rank must be >= 1 or None, got {self.q_lora_rank}")

    @property
    def latent_dim(self) -> int:
        """Values cached per token and layer: the compressed KV plus the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def kv_bytes_per_token(self, kv_dtype: str | Dtype = "bf16") -> float:
        """KV-cache bytes one token takes in one layer: the latent, shared by all heads
        (and, unlike GQA, not split over tensor-parallel ranks: each holds it whole)."""
        return self.latent_dim * bytes_per_element(parse_dtype(kv_dtype))

    def decode_flops_per_key(self) -> float:
        """FLOPs per cached token of one decoding query, absorbed: every head scores the
        latent (kv_lora + rope) and sums the kv_lora values."""
        return 2.0 * self.num_heads * (self.latent_dim + self.kv_lora_rank)

    def prefill_head_dim(self) -> float:
        """head_dim of the multi-head attention with prefill's FLOPs and K/V bytes."""
        return (self.qk_head_dim + self.v_head_dim) / 2


# DeepSeek-V3 / R1 per rank at TP1 (the public MLA tables' model).
DEEPSEEK_V3 = MlaShape(
    num_heads=128,
    hidden_size=7168,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    q_lora_rank=1536,
)


class MlaDecodeParts(NamedTuple):
    """An MLA decode call term by term (numpy arrays)."""

    seconds: np.ndarray
    memory: np.ndarray  # the latent stream from DRAM at the bandwidth that serves it
    compute: np.ndarray  # the heads' math at the tensor rate MLA decode sustains
    fixed: np.ndarray  # thread-block waves: fixed latency plus each block's capped stream
    floor: float
    dram_bytes: np.ndarray
    flops: np.ndarray


# Query rows (heads x query tokens of one sequence) of one FlashMLA / FlashAttention-3
# MLA thread block: the tensor cores compute whole 64-row tiles, so 1 to 64 heads cost
# one tile's math per key (vLLM's Triton MLA tiles by its head block instead).
MLA_TILE_ROWS = 64


class MlaDecode:
    """Absorbed MLA attention (vLLM's decode kernel) for one layer shape, constants
    worked out once: one query token per sequence, or a few (a short prefill chunk that
    vLLM's MLA backends run through the decode kernel, see `query_threshold`)."""

    def __init__(
        self,
        gpu: AcceleratorSpec,
        shape: MlaShape,
        kv_dtype: str | Dtype = "bf16",
        dtype: str | Dtype = "bf16",
    ) -> None:
        eff = gpu.efficiency
        kv = parse_dtype(kv_dtype)
        self.shape = shape
        self.kv_bytes_per_key = shape.kv_bytes_per_token(kv)
        act = bytes_per_element(parse_dtype(dtype))
        # Absorbed queries (latent wide) in, the latent output out: per query token.
        self.bytes_per_seq = shape.num_heads * (shape.latent_dim + shape.kv_lora_rank) * act
        self.flops_per_key = shape.decode_flops_per_key()
        self.bandwidth = gpu.memory_bandwidth
        self.curve = eff.mla_decode_memory_curve
        self._curve_at = self.curve.scalar_at()
        self.compute_rate = gpu.peak_flops(Dtype.BF16) * eff.mla_decode_compute
        block = eff.mla_decode_head_block
        self.reads = 1 if block == 0 else math.ceil(shape.num_heads / block)
        self.tile_rows = block or MLA_TILE_ROWS
        self.pad = float(self._pad(float(shape.num_heads)))
        self.head_tiles = math.ceil(shape.num_heads / self.tile_rows)
        self.splits = eff.mla_decode_kv_splits
        self.sm_count = gpu.sm_count
        self.cta_seconds = eff.mla_decode_cta_latency * 1e-6
        self.cta_seconds_per_byte = eff.mla_decode_cta_us_per_mb * 1e-12
        # An 8-bit cache runs vLLM's FP8 path: the absorbed queries are quantised by a
        # kernel of their own (_decode_concat_quant_fp8_op) before FlashMLA's FP8 kernel.
        fp8_us = eff.mla_fp8_kv_us if bytes_per_element(kv) < 2 else 0.0
        self.floor = (eff.mla_decode_floor + fp8_us) * 1e-6
        self.query_threshold = eff.mla_decode_query_threshold(kv)
        # FlashMLA, the backend of 8-bit caches, takes uniform query lengths only
        # (QueryLenSupport.UNIFORM): vLLM's MLA metadata builder then sends every query
        # of a length other than the step's first (after its decodes) down the prefill
        # path, so a short chunk beside one-token decodes is decompressed.
        self.uniform_queries = bytes_per_element(kv) < 2
        self._one_step: dict[int, Callable[[int], tuple[float, float, float]]] = {}

    def _pad(self, rows):
        """Rows the tensor cores compute per useful row: whole tiles of query rows."""
        return np.ceil(rows / self.tile_rows) * self.tile_rows / rows

    def parts(
        self, num_seqs, context_tokens, new_tokens=None, attended_pairs=None
    ) -> MlaDecodeParts:
        """`num_seqs` sequences attending `context_tokens` cached tokens in total, one
        query token each, or `new_tokens` over them attending `attended_pairs`."""
        seqs = np.maximum(np.asarray(num_seqs, dtype=float), 1.0)
        context = np.asarray(context_tokens, dtype=float)
        if new_tokens is None:
            queries, pairs, pad, head_tiles = seqs, context, self.pad, self.head_tiles
        else:
            queries = np.asarray(new_tokens, dtype=float)
            pairs = np.asarray(attended_pairs, dtype=float)
            rows = self.shape.num_heads * np.maximum(queries / seqs, 1.0)
            pad, head_tiles = self._pad(rows), np.ceil(rows / self.tile_rows)
        latent = context * self.kv_bytes_per_key
        dram = latent * self.reads + queries * self.bytes_per_seq
        memory = dram / (self.bandwidth * self.curve.at(np.maximum(dram, 1.0)))
        flops = pairs * self.flops_per_key
        compute = flops * pad / self.compute_rate
        # Thread blocks: (sequence, tile of query rows, KV slice).
        groups = seqs * head_tiles
        keys = context / seqs
        tiles = np.maximum(np.ceil(keys / DECODE_KEY_BLOCK), 1.0)
        if self.splits:
            splits = np.minimum(float(self.splits), tiles)
        else:
            splits = np.minimum(np.maximum(np.floor(self.sm_count / groups), 1.0), tiles)
        waves = np.ceil(groups * splits / self.sm_count)
        slice_bytes = np.maximum(keys / splits - DECODE_KEY_BLOCK, 0.0) * self.kv_bytes_per_key
        fixed = waves * (self.cta_seconds + slice_bytes * self.cta_seconds_per_byte)
        seconds = np.maximum(np.maximum(memory, compute), fixed) + self.floor
        return MlaDecodeParts(seconds, memory, compute, fixed, self.floor, dram, flops)

    def one_step_for(self, num_seqs: int) -> Callable[[int], tuple[float, float, float]]:
        """(seconds, flops, dram_bytes) of `num_seqs` decodes as a function of their
        cached tokens, in plain floats (`terms`; the engine prices a decode step this
        way on every step)."""
        one_step = self._one_step.get(num_seqs)
        if one_step is None:
            seqs, pad, tiles, terms = (
                max(float(num_seqs), 1.0),
                self.pad,
                self.head_tiles,
                self.terms,
            )

            def one_step(context_tokens: int) -> tuple[float, float, float]:
                context = float(context_tokens)
                seconds, _, _, dram, flops = terms(seqs, context, seqs, context, pad, tiles)
                return seconds, flops, dram

            self._one_step[num_seqs] = one_step
        return one_step

    def chunk_terms(
        self, num_seqs: int, new_tokens: int, attended_pairs: float, context_tokens: int
    ) -> tuple[float, float, float, float, float]:
        """(seconds, compute, memory, dram_bytes, flops) of one call in plain floats:
        `num_seqs` decodes, or a short prefill chunk of `new_tokens` over them."""
        seqs, context = max(float(num_seqs), 1.0), float(context_tokens)
        if new_tokens <= num_seqs:
            return self.terms(seqs, context, seqs, context, self.pad, self.head_tiles)
        rows = self.shape.num_heads * max(new_tokens / seqs, 1.0)
        tiles = math.ceil(rows / self.tile_rows)
        pad = tiles * self.tile_rows / rows
        return self.terms(seqs, context, float(new_tokens), float(attended_pairs), pad, tiles)

    def terms(
        self, seqs: float, context: float, queries: float, pairs: float, pad: float, tiles: float
    ) -> tuple[float, float, float, float, float]:
        """`parts` for one call in plain floats, its operations in the same order (so
        the same numbers) without numpy's per-call cost: (seconds, compute, memory,
        dram_bytes, flops)."""
        dram = context * self.kv_bytes_per_key * self.reads + queries * self.bytes_per_seq
        memory = dram / (self.bandwidth * self._curve_at(max(dram, 1.0)))
        flops = pairs * self.flops_per_key
        compute = flops * pad / self.compute_rate
        groups = seqs * tiles
        keys = context / seqs
        tiles_kv = max(float(math.ceil(keys / DECODE_KEY_BLOCK)), 1.0)
        if self.splits:
            splits = min(float(self.splits), tiles_kv)
        else:
            splits = min(max(float(math.floor(self.sm_count / groups)), 1.0), tiles_kv)
        waves = float(math.ceil(groups * splits / self.sm_count))
        slice_bytes = max(keys / splits - DECODE_KEY_BLOCK, 0.0) * self.kv_bytes_per_key
        fixed = waves * (self.cta_seconds + slice_bytes * self.cta_seconds_per_byte)
        seconds = max(max(memory, compute), fixed) + self.floor
        return seconds, compute, memory, dram, flops


def absorbed_call(num_seqs, new_tokens, query_threshold: int):
    """Whether `num_seqs` chunks of equal length, `new_tokens` in all, run vLLM's MLA
    decode kernel: each at most the backend's query threshold (reorder_batch_threshold)."""
    return new_tokens <= num_seqs * query_threshold


class MlaPrefill:
    """MLA prefill attention for one layer shape: decompressed K/V through flash
    attention, except where vLLM runs the decode kernel instead: one token per sequence,
    and chunks of up to the backend's `query_threshold` tokens per sequence (its
    reorder_batch_threshold: FlashAttention MLA 512, FlashMLA 128), absorbed."""

    def __init__(
        self,
        gpu: AcceleratorSpec,
        shape: MlaShape,
        kv_dtype: str | Dtype = "bf16",
        dtype: str | Dtype = "bf16",
    ) -> None:
        eff = gpu.efficiency
        # Decompressed K and V are written in the compute dtype whatever the cache holds.
        self.flash = PrefillAttention(
            gpu,
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_heads,
            head_dim=shape.prefill_head_dim(),  # type: ignore[arg-type]
            dtype=dtype,
            kv_dtype=dtype,
            compute_curve=eff.mla_prefill_compute_curve,
            floor_us=eff.mla_prefill_floor,
        )
        self.decode = MlaDecode(gpu, shape, kv_dtype, dtype)

    def absorbed(self, num_seqs, new_tokens):
        """Whether calls of `num_seqs` equal chunks (a table row's) run the decode kernel
        (no decompression): scalars or arrays. A step of chunks of several lengths is
        classified per sequence (simulator.engine.latent_attention)."""
        return absorbed_call(num_seqs, new_tokens, self.decode.query_threshold)

    def many(self, num_seqs, new_tokens, attended_pairs, context_tokens) -> tuple[np.ndarray, ...]:
        """(seconds, flops, dram_bytes, compute_s, memory_s) per call (numpy arrays)."""
        seqs, new, pairs, context = (
            np.atleast_1d(np.asarray(a, dtype=float))
            for a in (num_seqs, new_tokens, attended_pairs, context_tokens)
        )
        out = tuple(np.zeros(len(seqs)) for _ in range(5))
        one = new <= seqs
        short = self.absorbed(seqs, new) & ~one
        flash = ~(one | short)
        for rows, args in (
            (one, (seqs[one], context[one])),
            (short, (seqs[short], context[short], new[short], pairs[short])),
        ):
            if rows.any():
                d = self.decode.parts(*args)
                terms = (d.seconds, d.flops, d.dram_bytes, d.compute, d.memory)
                for part, value in zip(out, terms, strict=True):
                    part[rows] = value
        if flash.any():
            terms = self.flash.many(seqs[flash], new[flash], pairs[flash], context[flash])
            for part, value in zip(out, terms, strict=True):
                part[flash] = value
        return out


def mla_decode_cost(
    gpu: AcceleratorSpec,
    shape: MlaShape,
    *,
    num_seqs: int,
    context_tokens: int,
    kv_dtype: str | Dtype = "bf16",
    dtype: str | Dtype = "bf16",
) -> OpCost:
    """One absorbed MLA decode step: each sequence streams its latent cache once (per
    head group for kernels that re-read it) and every head multiplies it."""
    p = MlaDecode(gpu, shape, kv_dtype, dtype).parts(num_seqs, context_tokens)
    compute, memory = float(p.compute), float(p.memory)
    return OpCost(
        name="mla_decode",
        seconds=float(p.seconds),
        flops=float(p.flops),
        dram_bytes=float(p.dram_bytes),
        l2_bytes=float(p.dram_bytes),
        bound=classify(max(compute, float(p.fixed)), memory, 0.0, p.floor),
        compute_seconds=compute,
        memory_seconds=memory,
        overhead_seconds=p.floor,
    )


def mla_prefill_cost(
    gpu: AcceleratorSpec,
    shape: MlaShape,
    *,
    num_seqs: int,
    new_tokens: int,
    attended_pairs: float,
    context_tokens: int,
    kv_dtype: str | Dtype = "bf16",
    dtype: str | Dtype = "bf16",
) -> OpCost:
    """MLA prefill attention over `num_seqs` sequences (arguments as
    attention_prefill_cost: query-key pairs, keys read)."""
    model = MlaPrefill(gpu, shape, kv_dtype, dtype)
    seconds, flops, dram, compute, memory = (
        float(a[0]) for a in model.many(num_seqs, new_tokens, attended_pairs, context_tokens)
    )
    floor = model.decode.floor if model.absorbed(num_seqs, new_tokens) else model.flash.floor
    return OpCost.from_terms("mla_prefill", seconds, flops, dram, dram, compute, memory, floor)


def mla_projection_gemms(shape: MlaShape, decode: bool) -> list[tuple[str, bool, int, int, bool]]:
    """(name, over the cached tokens rather than the new ones, n, k, in the weight dtype)
    of the module's GEMMs: the down-projections (q and kv fused when the queries have a
    LoRA), the query up-projection, then for decode the absorbed W_UK and W_UV (batched
    over heads, kept in bf16 by vLLM even for quantised checkpoints: priced as one GEMM
    of the same FLOPs and weight bytes), for prefill kv_b_proj decompressing every
    cached token, and the output projection."""
    h = shape.num_heads
    out: list[tuple[str, bool, int, int, bool]] = []
    if shape.q_lora_rank is not None:
        out.append(("qkv_a", False, shape.q_lora_rank + shape.latent_dim, shape.hidden_size, True))
        out.append(("q_b", False, h * shape.qk_head_dim, shape.q_lora_rank, True))
    else:
        out.append(("q", False, h * shape.qk_head_dim, shape.hidden_size, True))
        out.append(("kv_a", False, shape.latent_dim, shape.hidden_size, True))
    if decode:
        out.append(("w_uk", False, h * shape.kv_lora_rank, shape.qk_nope_head_dim, False))
        out.append(("w_uv", False, h * shape.v_head_dim, shape.kv_lora_rank, False))
    else:
        n = h * (shape.qk_nope_head_dim + shape.v_head_dim)
        out.append(("kv_b", True, n, shape.kv_lora_rank, True))
    out.append(("o", False, shape.hidden_size, h * shape.v_head_dim, True))
    return out


# vLLM's RMSNorm and DeepSeek's YaRN rotary as PyTorch runs their forward_native, one
# kernel an op, in units of the bf16 activation (fp32 is 2): what an uncompiled module
# runs (vLLM disables its custom ops where torch.compile would fuse them, and the
# public module tables time the module without compiling it).
EAGER_RMSNORM = (
    Pointwise("to_fp32", reads=1, writes=2, flops_per_element=0),
    Pointwise("pow", reads=2, writes=2, flops_per_element=1),
    Pointwise("mean", reads=2, writes=0, flops_per_element=1),
    Pointwise("scale", reads=2, writes=2, flops_per_element=1),
    Pointwise("to_bf16", reads=2, writes=1, flops_per_element=0),
    Pointwise("weight", reads=1, writes=1, flops_per_element=1),
)
EAGER_ROTARY_GPTJ = (
    Pointwise("mul_cos", reads=1, writes=1, flops_per_element=1),
    Pointwise("neg", reads=0.5, writes=0.5, flops_per_element=0.5),
    Pointwise("stack", reads=1, writes=1, flops_per_element=0),
    Pointwise("mul_sin", reads=1, writes=1, flops_per_element=1),
    Pointwise("add", reads=2, writes=1, flops_per_element=1),
    Pointwise("copy_back", reads=1, writes=1, flops_per_element=0),
)


def mla_pointwise_costs(
    gpu: AcceleratorSpec, shape: MlaShape, tokens: int, eager: bool = False
) -> list[OpCost]:
    """The module's two latent RMSNorms and the rotary embedding of `tokens` tokens:
    vLLM's fused kernels, or with `eager` their PyTorch-native ops (EAGER_RMSNORM)."""
    norms = [tokens * rank for rank in (shape.q_lora_rank or 0, shape.kv_lora_rank) if rank]
    rope = tokens * (shape.num_heads + 1) * shape.qk_rope_head_dim
    if not eager:
        return [elementwise_cost(gpu, [RMSNORM], sum(norms)), elementwise_cost(gpu, [ROTARY], rope)]
    return [
        *(elementwise_cost(gpu, EAGER_RMSNORM, n) for n in norms),
        elementwise_cost(gpu, EAGER_ROTARY_GPTJ, rope),
    ]


def mla_module_cost(
    gpu: AcceleratorSpec,
    shape: MlaShape,
    *,
    num_seqs: int,
    new_tokens: int,
    attended_pairs: float,
    context_tokens: int,
    gemm_dtype: str = "bf16",
    kv_dtype: str | Dtype = "bf16",
) -> OpCost:
    """The whole MLA module of one layer (vLLM's DeepseekV2MLAAttention forward) over
    `num_seqs` chunks of equal length (a table row's): projections, the two latent
    norms, rotary, attention and the output projection. `gemm_dtype` is the linear
    layers' kernel dtype (bf16, fp8, fp8_block)."""
    # The absorbed kernel's calls (decodes, short chunks) take W_UK / W_UV, not kv_b.
    threshold = gpu.efficiency.mla_decode_query_threshold(kv_dtype)
    decode = bool(absorbed_call(num_seqs, new_tokens, threshold))
    parts: list[OpCost] = []
    for _, cached, n, k, quantised in mla_projection_gemms(shape, decode):
        m = max(context_tokens if cached else new_tokens, 1)
        parts.append(gemm_cost(gpu, m, n, k, gemm_dtype if quantised else "bf16"))
    parts += mla_pointwise_costs(gpu, shape, new_tokens)
    if new_tokens <= num_seqs:
        parts.append(
            mla_decode_cost(
                gpu, shape, num_seqs=num_seqs, context_tokens=context_tokens, kv_dtype=kv_dtype
            )
        )
    else:
        parts.append(
            mla_prefill_cost(
                gpu,
                shape,
                num_seqs=num_seqs,
                new_tokens=new_tokens,
                attended_pairs=attended_pairs,
                context_tokens=context_tokens,
                kv_dtype=kv_dtype,
            )
        )
    return OpCost.from_terms(
        "mla_module",
        seconds=sum(p.seconds for p in parts),
        flops=sum(p.flops for p in parts),
        dram_bytes=sum(p.dram_bytes for p in parts),
        l2_bytes=sum(p.l2_bytes for p in parts),
        compute=sum(p.compute_seconds for p in parts),
        memory=sum(p.memory_seconds for p in parts),
        overhead=sum(p.overhead_seconds for p in parts),
        kernels=sum(p.kernels for p in parts),
    )
