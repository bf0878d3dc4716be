"""Attainable fractions of peak: the knobs that make a roofline match real kernels.

Every factor here is a named field with a documented default so that calibration
(`infersim calibrate fit`) can replace it with values fitted to measurements.
A curve is a function of operator size, monotone, interpolated in log space and
clamped at the edges of the range it was fitted on.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from functools import lru_cache
from typing import Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hardware_models.dtypes import parse_dtype
from hardware_models.errors import InfersimError
from hardware_models.node import LinkSpec
from hardware_models.object_memo import per_object
from hardware_models.read_only import ReadOnlyModel

# Block-scaled formats run different kernels from their plain dtype (scales per block),
# so a curve keyed by one of these spellings is kept apart from the plain dtype's.
BLOCK_SCALED_SPELLINGS = frozenset({"fp8_block", "nvfp4", "mxfp4"})


class MoeFormat(NamedTuple):
    """How vLLM's fused MoE runs one weight format."""

    compute_dtype: str  # the tensor-core dtype the grouped GEMMs multiply in
    act_bytes: float  # bytes of an activation element the GEMMs read
    weight_bytes: float  # bytes of a weight element, its scales included
    kernels: int  # kernels in the layer's sequence (without the top-k)
    marlin: bool  # Marlin kernels: vLLM's BLOCK_M rule, no tiles for other ranks' pairs
    wna16: bool = False  # vLLM's WNA16 kernels (fused_experts with int4 weights, not Marlin)
    # A grouped-GEMM library of its own (OpenAI's triton_kernels matmul_ogs, FlashInfer's
    # TRT-LLM MoE) rather than vLLM's fused_moe: the gate|up GEMM applies the SwiGLU in its
    # epilogue (writes the product, no activation pass), and its 4-bit weights are widened
    # to 16 bits on the CUDA cores, per row tile, before a 16-bit MMA.
    fused_activation: bool = False
    upcast: bool = False
    # matmul_ogs on Hopper: BLOCK_M by its rule on tokens per expert, and the weights the
    # MMA's 64-row operand (swap_xw), so thin token tiles keep the warpgroup MMA.
    matmul_ogs: bool = False
    # Weight columns a thread block computes: 128 in vLLM's fused_moe configurations and
    # TRT-LLM's MoE tiles (128 weight rows each); matmul_ogs on Hopper 2 x warps x 2 x 8 =
    # 256 (vLLM swizzles its weights for 8 warps; opt_flags_nvidia.compute_block_n).
    block_n: int = 128

    @property
    def vllm_fused_moe(self) -> bool:
        """vLLM's own Triton fused_moe kernel (not Marlin, WNA16 or another library's)."""
        return not (self.marlin or self.wna16 or self.fused_activation)


# The public tables' moe_dtype: fp8 scales per tensor, fp8_block per 128 x 128 block
# (fp32); int4_wo 4-bit weights with a bf16 scale per 128 (Marlin); w4a16_mxfp4 4-bit
# weights with an 8-bit scale per 32 (Marlin); w4a16_nvfp4 (no table yet) with an fp8
# scale per 16 (Marlin's NVFP4 path); int4_wna16 the same weights as int4_wo through
# vLLM's WNA16 kernels, which `fused_experts` runs for an int4_w4a16 configuration
# (the H100 table's int4 rows: moe.wna16_stream_s). 8-bit formats quantise the
# activations before each grouped GEMM (two more kernels). MXFP4 experts (gpt-oss) run
# the kernel vLLM picks for the GPU (hardware_models.mxfp4_moe): w4a16_mxfp4 on Marlin,
# w4a16_mxfp4_triton on OpenAI's matmul_ogs (Hopper), w4a16_mxfp4_trtllm on FlashInfer's
# TRT-LLM MoE with bf16 activations (datacenter Blackwell). Past the top-k: matmul_ogs
# six kernels, triton_kernels' routing in three (routing.py SortTokens: the bitmatrix's
# row sums `_sum_bitmatrix_rows`, `_combined_routing_memset`, `_combined_routing_compute`),
# gate|up with the SwiGLU, down, the weighted combine (`_reduce_grouped`: one launch a
# layer in a published H100 gpt-oss-20b decode profile, benchmarks/README.md "gpt-oss
# MXFP4 backends"); TRT-LLM four (routing metadata, gate|up, down, the combine).
MOE_FORMATS: dict[str, MoeFormat] = {
    "bf16": MoeFormat("bf16", 2.0, 2.0, 5, False),
    "fp8": MoeFormat("fp8", 1.0, 1.0, 7, False),
    "fp8_block": MoeFormat("fp8", 1.0, 1.0 + 4.0 / (128 * 128), 7, False),
    "int4_wo": MoeFormat("bf16", 2.0, 0.5 + 2.0 / 128, 5, True),
    "int4_wna16": MoeFormat("bf16", 2.0, 0.5 + 2.0 / 128, 5, False, True),
    "w4a16_mxfp4": MoeFormat("bf16", 2.0, 0.5 + 1.0 / 32, 5, True),
    "w4a16_nvfp4": MoeFormat("bf16", 2.0, 0.5 + 1.0 / 16, 5, True),
    "w4a16_mxfp4_triton": MoeFormat(
        "bf16",
        2.0,
        0.5 + 1.0 / 32,
        6,
        False,
        fused_activation=True,
        upcast=True,
        matmul_ogs=True,
        block_n=256,
    ),
    "w4a16_mxfp4_trtllm": MoeFormat(
        "bf16", 2.0, 0.5 + 1.0 / 32, 4, False, fused_activation=True, upcast=True
    ),
}
_MOE_ALIASES = {"bfloat16": "bf16", "int4": "int4_wo", "mxfp4": "w4a16_mxfp4"}


def moe_format_key(value: object) -> str:
    """The MOE_FORMATS name of a MoE weight format, or a one-line error naming them."""
    text = str(value).strip().lower()
    text = _MOE_ALIASES.get(text, text)
    if text not in MOE_FORMATS:
        raise InfersimError(
            f"unknown MoE weight format {value!r}; allowed: {', '.join(MOE_FORMATS)}"
        )
    return text


def dtype_key(dtype: object) -> str:
    """The key a per-dtype curve is stored under: block-scaled spellings as written,
    every other alias as its canonical name (bfloat16 -> bf16)."""
    text = str(dtype).strip().lower()
    return text if text in BLOCK_SCALED_SPELLINGS else parse_dtype(text).value


class EfficiencyCurve(BaseModel):
    """Fraction of peak as a function of a size measure (FLOPs or bytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # tuples: a loaded profile's curves are shared and never change (read_only)
    sizes: tuple[float, ...] = Field(min_length=1, description="increasing operator sizes")
    values: tuple[float, ...] = Field(min_length=1, description="efficiency in (0, 1] at each size")

    @field_validator("values")
    @classmethod
    def _in_unit_interval(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        for x in v:
            if not (0.0 < x <= 1.0):
                raise ValueError(f"efficiency {x} is outside (0, 1]")
        return v

    @model_validator(mode="after")
    def _shape(self) -> EfficiencyCurve:
        if len(self.sizes) != len(self.values):
            raise ValueError("sizes and values must have the same length")
        if any(s <= 0 for s in self.sizes):
            raise ValueError("sizes must be positive")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError("sizes must be strictly increasing")
        return self

    @classmethod
    def constant(cls, value: float) -> EfficiencyCurve:
        return cls(sizes=[1.0], values=[value])

    def at(self, size: float | np.ndarray) -> float | np.ndarray:
        """Efficiency at `size`, log-interpolated and clamped to the fitted range."""
        if len(self.sizes) == 1:
            return self.values[0] if np.isscalar(size) else np.full(np.shape(size), self.values[0])
        log_sizes = _log_sizes(tuple(self.sizes))
        if np.isscalar(size):
            return _interp_one(float(np.log(max(float(size), 1e-30))), log_sizes, self.values)
        x = np.log(np.maximum(np.asarray(size, dtype=float), 1e-30))
        y = np.interp(x, log_sizes, self.values)
        return float(y) if np.ndim(y) == 0 else y

    def scalar_at(self) -> Callable[[float], float]:
        """at() for one size as a plain function, the curve's logs taken once: an engine
        reads its curves on every step, where at()'s own lookups (the log sizes' cache
        key, the scalar test) cost more than the interpolation. The same arithmetic, so
        the same floats."""
        values = self.values
        if len(self.sizes) == 1:
            value = values[0]
            return lambda size: value
        log_sizes, log = _log_sizes(tuple(self.sizes)), np.log

        def at_one(size: float) -> float:
            return _interp_one(float(log(max(float(size), 1e-30))), log_sizes, values)

        return at_one


@lru_cache(maxsize=4096)
def _log_sizes(sizes: tuple[float, ...]) -> list[float]:
    """A curve's log sizes, taken once: the engine reads a calibrated curve on every step,
    where converting and taking logs each time cost more than the interpolation."""
    return np.log(np.asarray(sizes, dtype=float)).tolist()


def _interp_one(x: float, xs: list[float], ys: list[float]) -> float:
    """np.interp at one point in plain floats: the same clamping and the same arithmetic
    (so the same number, tests/test_operators.py checks), without numpy's per-call cost."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    j = bisect_right(xs, x) - 1
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    return slope * (x - xs[j]) + ys[j]


def _const(value: float) -> EfficiencyCurve:
    return EfficiencyCurve.constant(value)


class CollectiveFit(BaseModel):
    """How NCCL uses a node's GPU-to-GPU link for one group size, as calibration fits it:
    its fixed cost and its bus bandwidth both change with the number of ranks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_us: float = Field(ge=0, description="per algorithm step (alpha), microseconds")
    efficiency: float = Field(gt=0, le=1, description="fraction of the link bandwidth attained")
    fitted_over: str | None = Field(
        None,
        description="the link it was fitted over (LinkSpec.signature); over any other link "
        "the datasheet figures apply. None: over any link (profiles written before it).",
    )


class GemmKernel(BaseModel):
    """How one dtype's GEMM library lays the work out: which tiles it runs, whether it
    splits k, and what it does before the matmul. Curves cannot express these: at the same
    FLOPs a padded tile or an unsplit k loop changes the time by several times."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dispatch: Literal["fastest", "by_m", "fixed"] = Field(
        default="fastest",
        description="fastest: the tile and split-K factor fastest for the shape (cuBLAS "
        "heuristics); by_m: one CUTLASS configuration per bucket of m (vLLM on Hopper: A "
        "and B swapped up to m = 64, 16 rows of m by 64 of n a tile, 64x64 past m = 16 "
        "when n > 1280; 64x128 up to 128, then 128x128), no split-K; fixed: 128x128 tiles matching "
        "128x128 scale blocks, no split-K (block-scaled fp8)",
    )
    quantize_activations: bool = Field(
        default=False,
        description="a pass first reads the 16-bit activations and writes them in the GEMM "
        "dtype with their scales (dynamic fp8 scaling in serving engines): m x k x 3 bytes "
        "at the streaming bandwidth, which makes an fp8 GEMM's time follow k at small n",
    )
    align_m: int = Field(
        default=1,
        ge=1,
        description="rows the kernel needs m to be a multiple of; other m are first padded "
        "by a copy kernel (block-scaled fp8 needs 4, for 16-byte aligned per-row scales)",
    )
    cluster_m: int = Field(
        default=1,
        ge=1,
        le=4,
        description="thread blocks a CUTLASS cluster stacks along m (by_m past its swapped "
        "buckets, and fixed): a cluster is launched whole, so tile rows round up to a "
        "multiple of it (vLLM's Hopper fp8 kernels use 2x1 clusters: m = 257 computes four "
        "128-row tiles). cuBLAS-style dispatch picks its own and ignores this",
    )
    serial_epilogue: bool | None = Field(
        default=None,
        description="whether each thread block stores its output tile after its k loop "
        "with no other k loop running on its SM meanwhile, so that the stores add to the "
        "math instead of overlapping it (once L2 holds dirty output lines they run at the "
        "DRAM write rate, memory_bandwidth). None: as the chip's architecture runs GEMMs: "
        "serial on NVIDIA chips before Hopper (Volta to Ada cuBLAS kernels: one block per "
        "SM, synchronous stores), overlapped elsewhere. In the A100 table, at m >= 2048 "
        "and n >= 4096, the floor taken off, an output MB costs 0.72-0.91 us at k = 32 "
        "and 2.2-3.0 us at k = 512, where the math alone at 290 TFLOPS is 1.85: the sum, "
        "not the larger. Hopper's warp-specialised kernels store one tile (TMA) while "
        "computing the next: the same H100 shapes take 0.37-0.41 and 0.79-0.94 us/MB "
        "against 0.77 of math, the larger",
    )
    gemv: bool = Field(
        default=False,
        description="a one-row product (m = 1) runs a matrix-vector kernel instead of "
        "tiles: every SM streams its share of B once, with no tile k loop or waves, so "
        "its time is the floor plus B's bytes at the memory efficiency (cuBLAS on the "
        "A100: 3.7 us at n = 256, k = 1024 where m = 2 takes 7.5 us on a tile's k loop)",
    )


class DecodeKernel(BaseModel):
    """The decode-attention fields of an EfficiencyProfile fitted to one KV-cache dtype's
    rows, where that dtype runs a kernel of its own: vLLM picks the attention backend by
    the cache's dtype, and on Ada FlashAttention-2 cannot read an fp8 cache, so fp8
    caches run FlashInfer's decode kernel (the L40S table's kernel_source says so).
    Each field means what the profile field of the same name does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention_decode_memory: EfficiencyCurve
    attention_decode_floor_us: float | None = Field(ge=0)
    decode_cta_latency_us: float = Field(ge=0)
    decode_split_kv: Literal["always", "gqa"]
    decode_cta_us_per_mb: float = Field(ge=0)
    decode_split_overhead_us: float = Field(ge=0)
    decode_gqa_copy_us: float = Field(ge=0)
    decode_l2_bandwidth: float | None = Field(gt=0, le=1)


class PrefillKernel(BaseModel):
    """The prefill-attention fields of an EfficiencyProfile fitted to one KV-cache dtype's
    rows, where that dtype runs a kernel of its own (as DecodeKernel: on Ada an fp8
    cache's prefill is FlashInfer's, a bf16 one's FlashAttention-2's). Each field means
    what the profile field of the same name does."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention_prefill_compute: EfficiencyCurve
    attention_prefill_memory: EfficiencyCurve | None
    attention_prefill_floor_us: float | None = Field(ge=0)
    prefill_cta_latency_us: float = Field(ge=0)
    prefill_pack_gqa: bool


# The per-cache-dtype kernel tables of a profile and the model of each entry.
KV_DTYPE_KERNELS: dict[str, type[BaseModel]] = {
    "decode_by_kv_dtype": DecodeKernel,
    "prefill_by_kv_dtype": PrefillKernel,
}


def _fitted_over(fit: CollectiveFit, link: LinkSpec) -> bool:
    """Whether `fit` applies over `link` (LinkSpec.as_fitted_over)."""
    return link.as_fitted_over(fit.fitted_over) is not None


def _set_or(value: float | None, fallback: float) -> float:
    """An optional field's value where set (fitted), else the one it falls back to."""
    return fallback if value is None else value


class EfficiencyProfile(ReadOnlyModel):
    """How close real kernels on one chip come to its roofline.

    Defaults are uncalibrated, chosen from widely reported behaviour of cuBLAS,
    FlashAttention and NCCL; each is documented next to the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_compute: EfficiencyCurve = Field(
        default_factory=lambda: _const(0.80),
        description="fraction of dense tensor peak a large GEMM sustains, against the FLOPs "
        "its tiles compute (padding included: a 16-row tile at m = 1 does the work of "
        "m = 16); cuBLAS reaches 75-90% on large square shapes (power and clock limits "
        "keep it below 100%)",
    )
    gemm_memory: EfficiencyCurve = Field(
        default_factory=lambda: _const(0.80),
        description="fraction of memory bandwidth a memory-bound GEMM (small m) sustains, "
        "against bytes moved",
    )
    attention_prefill_compute: EfficiencyCurve = Field(
        default_factory=lambda: _const(0.65),
        description="fraction of tensor peak FlashAttention-2/3 forward sustains on the "
        "tiles it computes, against the mean keys attended per query (the length of a "
        "thread block's key loop; FA2 ~50-70% on A100, FA3 ~60-75% on H100 on long "
        "prompts)",
    )
    attention_prefill_memory: EfficiencyCurve | None = Field(
        default=None,
        description="fraction of memory bandwidth prefill attention sustains on its HBM "
        "traffic (queries in, outputs out, each KV head's keys and values once), against "
        "those bytes: short prompts load a tile, compute one key block and store, with "
        "little to overlap the loads with. None: memory_bandwidth",
    )
    attention_decode_memory: EfficiencyCurve = Field(
        default_factory=lambda: _const(0.80),
        description="fraction of memory bandwidth paged decode attention sustains, against "
        "KV bytes read (paged gathers are less regular than streaming copies)",
    )
    memory_bandwidth: float = Field(
        default=0.85,
        gt=0,
        le=1,
        description="fraction of device-memory bandwidth a streaming kernel (copy, "
        "elementwise, norm) sustains; STREAM-like copies reach 85-92% on HBM",
    )
    l2_bandwidth: float = Field(
        default=0.80, gt=0, le=1, description="fraction of L2 bandwidth sustained on hits"
    )
    kernel_floor_us: float = Field(
        default=2.5,
        ge=0,
        description="smallest GPU time of any kernel (ramp-up, one wave, tail), microseconds; "
        "an empty kernel measured with CUDA events takes 2-5 us",
    )
    attention_floor_us: float = Field(
        default=8.0,
        ge=0,
        description="smallest time of a serving-engine attention call, microseconds: the "
        "paged/flash wrappers launch metadata and scheduling kernels around the main one",
    )
    decode_cta_latency_us: float = Field(
        default=3.0,
        ge=0,
        description="fixed time of one decode-attention thread block (a sequence x KV head): "
        "block-table walk, Q load, output write; dominates short contexts",
    )
    prefill_cta_latency_us: float = Field(
        default=1.5,
        ge=0,
        description="fixed time of one prefill-attention thread block (a sequence x head x "
        "query block) beyond its math: Q/O tile load and store, softmax rescale",
    )
    prefill_pack_gqa: bool = Field(
        default=True,
        description="whether prefill attention packs the query heads sharing a KV head "
        "into one thread block's rows (FlashAttention-3 on Hopper does; FlashAttention-2 "
        "runs one query head per block, so short prompts fill its tiles poorly). Read on "
        "Hopper and other non-warp-MMA chips only: on Ampere and Ada the cache dtype's "
        "kernel decides (FA2 for 16-bit caches, FlashInfer, packed, for 8-bit)",
    )
    decode_split_kv: Literal["always", "gqa"] = Field(
        default="always",
        description="when decode attention splits a sequence's KV cache across thread "
        "blocks to fill the SMs (flash-decoding): always (FlashAttention-3), or only when "
        "query heads share a KV head (FlashAttention-2's varlen path splits only its "
        "GQA-swapped decode; with one query head per KV head a block streams a whole cache)",
    )
    decode_cta_us_per_mb: float = Field(
        default=0.0,
        ge=0,
        description="time one decode thread block takes to stream 1 MB of its KV slice, "
        "microseconds: a single block's memory-level parallelism caps its rate (~20-50 "
        "GB/s), so few blocks over long caches leave HBM idle; 0 does not cap it",
    )
    decode_split_overhead_us: float = Field(
        default=0.0,
        ge=0,
        description="extra time of a split-KV decode call, microseconds: the pass that "
        "combines the partial softmax results of the splits",
    )
    decode_gqa_copy_us: float = Field(
        default=0.0,
        ge=0,
        description="extra time of a GQA decode call on FlashAttention-2's swapped path "
        "(decode_split_kv: gqa) with more than one sequence and more than one KV head, "
        "microseconds: the swap of the query-head and token axes is then no view, so the "
        "queries and the outputs are each copied by a kernel of their own",
    )
    decode_l2_bandwidth: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="fraction of L2 bandwidth decode attention sustains when its KV cache "
        "is already in L2: a micro-benchmark calling the kernel again on one cache that "
        "fits (on the L40S's 96 MB L2 caches up to ~64 MB read at 1.4-2.4 TB/s, 2-3x its "
        "864 GB/s GDDR6, and from ~128 MB at ~630 GB/s); a hit is never priced slower "
        "than DRAM. Fitted only where a table's rows beat DRAM (the L40S's, not the H100's "
        "or A100's); None: the tables are priced from DRAM. The simulator always is: in "
        "serving each layer's cache is evicted by the rest of the step",
    )
    decode_by_kv_dtype: dict[str, DecodeKernel] = Field(
        default_factory=dict,
        description="decode attention over a KV cache of this dtype, where it runs a "
        "kernel of its own (a fit on a table of several cache dtypes fits each apart); "
        "no entry: the decode fields above",
    )
    prefill_by_kv_dtype: dict[str, PrefillKernel] = Field(
        default_factory=dict,
        description="prefill attention over a KV cache of this dtype, where it runs a "
        "kernel of its own (as decode_by_kv_dtype); no entry: the prefill fields above",
    )
    launch_overhead_eager_us: float = Field(
        default=4.5,
        ge=0,
        description="host time to launch one kernel in eager PyTorch, microseconds",
    )
    launch_overhead_graph_us: float = Field(
        default=0.8,
        ge=0,
        description="per-kernel cost inside a replayed CUDA graph, microseconds",
    )
    ctas_per_sm: int = Field(
        default=1,
        ge=1,
        description="GEMM thread blocks resident per SM at once (large tiles: 1)",
    )
    gemm_split_k_overhead_us: float | None = Field(
        default=None,
        ge=0,
        description="extra time of a split-K GEMM, microseconds: the partial sums are "
        "reduced by a second kernel or a serialised pass (cuBLAS on skinny GEMMs with a "
        "long k measures ~1-3 us). None: one kernel_floor_us, the reduction kernel's launch "
        "(a free pass made a GEMM of twice the k loop up to 6% faster than the shorter one, "
        "by splitting it where the shorter one could not)",
    )
    gemm_pad_us_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="fixed time of the copies that pad m to the align_m of one dtype's "
        "kernel, microseconds (vLLM's block-scaled fp8 path launches four small kernels: "
        "zeroed padded activations, a row copy, padded scales and their copy; the H100 "
        "table shows m = 5 ~5 us slower than m = 4); no entry: one kernel_floor_us",
    )
    gemm_compute_by_dtype: dict[str, EfficiencyCurve] = Field(
        default_factory=dict,
        description="gemm_compute for one dtype (keys: bf16, fp8, fp8_block, ...); fp8 "
        "kernels reach a lower fraction of their peak than bf16, so calibration fits them "
        "apart. A dtype without an entry uses gemm_compute",
    )
    gemm_memory_by_dtype: dict[str, EfficiencyCurve] = Field(
        default_factory=dict,
        description="gemm_memory for one dtype; a dtype without an entry uses gemm_memory",
    )
    gemm_l2_memory_by_dtype: dict[str, EfficiencyCurve] = Field(
        default_factory=dict,
        description="fraction of the L2's rate a GEMM sustains on operands a benchmark "
        "loop kept warm in L2 (gemm.warm_l2_bytes), per dtype, against the same bytes as "
        "gemm_memory. Fitted apart from gemm_memory, which is fitted on the cold rows "
        "only: a table whose small GEMMs all ran warm (the L40S's) then says nothing false "
        "about the cold ones a serving engine runs. A dtype without an entry uses its "
        "gemm_memory curve",
    )
    gemm_floor_us_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="kernel_floor_us for GEMMs of one dtype: fp8 GEMMs in serving engines "
        "launch scale and quantisation kernels around the matmul",
    )
    gemm_wave_latency_us: float = Field(
        default=0.0,
        ge=0,
        description="fixed time of each wave of GEMM tiles after the first beyond its k "
        "loop, microseconds (the first fills under the kernel floor): pipeline fill and, "
        "where stores overlap the math (serial_epilogue off), the last tile's store. It "
        "makes short k loops "
        "relatively slow at the same FLOPs; 0 is the uncalibrated default",
    )
    gemm_wave_latency_us_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="gemm_wave_latency_us for GEMMs of one dtype",
    )
    gemm_cta_us_per_mb_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="time one GEMM thread block takes to stream 1 MB of its A and B "
        "panels, microseconds, for GEMMs of one dtype: a block's loads in flight cap its "
        "rate (~100-200 GB/s on an H100 SM), which binds when few small tiles run long k "
        "loops (vLLM's 16-row fp8 tiles at small m); no entry: no cap",
    )
    gemm_quant_row_ns_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="time per row of m the activation-quantisation pass of one dtype takes "
        "beyond its bytes, nanoseconds: vLLM's per-token fp8 quantiser launches one thread "
        "block per token (dynamic_per_token_scaled_fp8_quant: grid = tokens, each block "
        "a max reduction, then the scaled write), which on the L40S costs ~5 ns a row at "
        "any k up to 512 and any n; no entry: 0 (blocks cost their bytes only)",
    )
    gemm_store_bandwidth_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="fraction of memory bandwidth the output stores of one dtype's serial "
        "epilogue (GemmKernel.serial_epilogue) drain at, warm loop or cold: vLLM's CUTLASS "
        "2.x fp8 kernel on Ada (an EVT epilogue scaling each output by its token's and "
        "channel's scales) writes its bf16 output at ~160 GB/s where the bf16 GEMM of the "
        "same shape writes 1.7 TB/s into L2; no entry: the plain streaming rate (DRAM's, "
        "or the L2's for a warm loop)",
    )
    gemm_quant_bandwidth_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="fraction of memory bandwidth the activation-quantisation pass of one "
        "dtype streams at (a GemmKernel with quantize_activations): a per-token-group "
        "quantiser writing column-major scales runs well below a plain copy; no entry: "
        "memory_bandwidth",
    )
    gemm_kernel_by_dtype: dict[str, GemmKernel] = Field(
        default_factory=dict,
        description="the GEMM kernel family of one dtype (see GemmKernel); a dtype without "
        "an entry runs as cuBLAS does (fastest tile, split-K, no quantisation pass)",
    )
    attention_prefill_floor_us: float | None = Field(
        default=None,
        ge=0,
        description="attention_floor_us for prefill calls only (None: attention_floor_us)",
    )
    attention_decode_floor_us: float | None = Field(
        default=None,
        ge=0,
        description="attention_floor_us for decode calls only (None: attention_floor_us)",
    )

    collective_by_gpus: dict[int, CollectiveFit] = Field(
        default_factory=dict,
        description="per number of GPUs in a collective: latency and bandwidth fraction "
        "over the node's GPU-to-GPU link in place of the link's own (calibration fits them "
        "to all-reduce rows); a group size without an entry uses the node preset's link",
    )
    moe_compute_by_dtype: dict[str, EfficiencyCurve] = Field(
        default_factory=dict,
        description="fraction of tensor peak the grouped expert GEMMs of a fused MoE layer "
        "sustain on their tiles, against the mean rows an activated expert receives (how "
        "full and how many its row tiles are), per MoE weight format (keys: MOE_FORMATS); "
        "no entry: the largest efficiency of the GEMM compute curve of the format's "
        "compute dtype (full tiles of a large GEMM)",
    )
    moe_memory_by_dtype: dict[str, EfficiencyCurve] = Field(
        default_factory=dict,
        description="fraction of memory bandwidth the grouped expert GEMMs sustain, "
        "against their DRAM bytes (activated experts' weights, routed activations), per "
        "MoE weight format; no entry: the GEMM memory curve of the compute dtype",
    )
    moe_floor_us_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="fixed time of one fused MoE layer, microseconds, per MoE weight "
        "format: the launches and ramp of its whole kernel sequence (block alignment, "
        "quantisation, two grouped GEMMs, activation, combine), one figure however many "
        "experts run; no entry: kernel_floor_us per kernel of the sequence",
    )
    moe_cta_latency_us_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="fixed time of one grouped-GEMM thread block of a fused MoE layer "
        "beyond its k loop (prologue, epilogue), microseconds, per MoE weight format: "
        "thin experts (a wide tensor-parallel split) make many short blocks; for the "
        "WNA16 kernels the time of one k step of a thread block alone on its SM (one "
        "4-warp program cannot hide its loads' latency); no entry: 0",
    )
    moe_cta_us_per_mb_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="time one grouped-GEMM thread block takes to stream (and, for 4-bit "
        "formats, dequantise) 1 MB of its weight panel and rows, microseconds, per MoE "
        "weight format: L2 feeds the tiles (Triton has no multicast), a block's loads in "
        "flight or its dequantisation cap its rate, which binds at large batches, where "
        "few experts leave SMs idle (a rank holding one expert), and for Marlin's 4-bit "
        "kernels; no entry: each SM's share of l2_bandwidth",
    )
    moe_wna16_cuda_us_per_mb: float | None = Field(
        default=None,
        ge=0,
        description="time one SM takes to dequantise 1 MB of 4-bit weights for one m "
        "block in vLLM's CUDA WNA16 kernel (moe_wna16_gemm, which fused_experts runs for "
        "int4_w4a16 weights at up to 6 pairs per local expert), microseconds; each thread "
        "waits on its own 16-byte weight load, so it runs far below the SM's issue rate; "
        "no entry: the instruction-count rate of Triton's WNA16 kernel (moe.py)",
    )
    mla_decode_memory: EfficiencyCurve | None = Field(
        default=None,
        description="fraction of memory bandwidth MLA decode attention (FlashMLA, or "
        "Triton MLA before Hopper) sustains streaming the latent KV cache, against its "
        "bytes. None: attention_decode_memory",
    )
    mla_decode_compute: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="fraction of tensor peak MLA decode sustains where its math binds "
        "(many heads over a long latent cache: every query head multiplies the whole "
        "latent, kv_lora_rank + rope dims); FlashMLA reports ~660 of 989 TFLOPS on H100",
    )
    mla_decode_floor_us: float | None = Field(
        default=None,
        ge=0,
        description="fixed time of an MLA decode attention call, microseconds (None: "
        "attention_decode_floor_us)",
    )
    mla_fp8_kv_us: float = Field(
        default=0.0,
        ge=0,
        description="extra fixed time of an MLA decode-kernel call over an 8-bit latent "
        "cache, microseconds: vLLM quantises the absorbed queries by a kernel of its own "
        "and runs FlashMLA's FP8 kernel (the public H100 module table: ~20 us at short "
        "contexts)",
    )
    mla_decode_query_threshold_by_kv: dict[str, int] = Field(
        default_factory=dict,
        description="most query tokens per sequence the MLA decode kernel takes, per KV "
        "cache dtype: vLLM runs a prefill chunk this short through the absorbed decode "
        "kernel rather than decompressing K and V (its MLA backends' "
        "reorder_batch_threshold: FlashAttention MLA 512, FlashMLA 128). No entry: 1",
    )
    mla_decode_head_block: int = Field(
        default=0,
        ge=0,
        description="query heads one MLA decode thread block serves: every such group "
        "of heads reads the sequence's latent cache again from DRAM. 0: one read per "
        "sequence however many heads (FlashMLA, whose 64-head blocks share it through "
        "L2); 16: vLLM's Triton MLA (BLOCK_H = 16)",
    )
    mla_decode_kv_splits: int = Field(
        default=0,
        ge=0,
        description="slices MLA decode splits each sequence's cache into: 0, as many as "
        "fill the SMs (flash-decoding, FlashMLA); n, always n (vLLM's Triton MLA: 4)",
    )
    mla_prefill_compute: EfficiencyCurve | None = Field(
        default=None,
        description="attention_prefill_compute for MLA prefill, whose decompressed heads "
        "are 192 wide for QK and 128 for V (DeepSeek-V3). None: attention_prefill_compute",
    )
    mla_prefill_floor_us: float | None = Field(
        default=None,
        ge=0,
        description="fixed time of an MLA prefill attention call, microseconds (None: "
        "the prefill attention floor)",
    )
    mla_decode_cta_latency_us: float | None = Field(
        default=None,
        ge=0,
        description="fixed time of one MLA decode thread block, microseconds: a tile of "
        "64 query rows (heads x query tokens) with a 576-wide latent key and 512-wide "
        "value, loaded and stored whole however few heads fill it. None: "
        "decode_cta_latency_us",
    )
    mla_decode_cta_us_per_mb: float = Field(
        default=0.0,
        ge=0,
        description="time one MLA decode thread block takes to stream 1 MB of latent "
        "cache, microseconds: a kernel with a fixed number of KV splits (vLLM's Triton "
        "MLA uses 4) leaves few blocks per sequence, each capped by its loads in flight; "
        "0 does not cap it (FlashMLA splits to fill the SMs)",
    )

    @field_validator(
        "gemm_compute_by_dtype",
        "gemm_memory_by_dtype",
        "gemm_l2_memory_by_dtype",
        "gemm_floor_us_by_dtype",
        "gemm_wave_latency_us_by_dtype",
        "gemm_cta_us_per_mb_by_dtype",
        "gemm_kernel_by_dtype",
        "gemm_pad_us_by_dtype",
        "gemm_quant_row_ns_by_dtype",
        "gemm_store_bandwidth_by_dtype",
        "gemm_quant_bandwidth_by_dtype",
    )
    @classmethod
    def _dtype_keys(cls, v: dict) -> dict:
        return _normalised_keys(v, dtype_key)

    @field_validator(
        "moe_compute_by_dtype",
        "moe_memory_by_dtype",
        "moe_floor_us_by_dtype",
        "moe_cta_latency_us_by_dtype",
        "moe_cta_us_per_mb_by_dtype",
    )
    @classmethod
    def _moe_keys(cls, v: dict) -> dict:
        return _normalised_keys(v, moe_format_key)

    @field_validator("mla_decode_query_threshold_by_kv")
    @classmethod
    def _mla_threshold_keys(cls, v: dict) -> dict:
        for name, tokens in v.items():
            if tokens < 1:
                raise ValueError(f"{name}: a query threshold must be >= 1 token, got {tokens}")
        return _normalised_keys(v, lambda name: parse_dtype(name).value)

    @field_validator("decode_by_kv_dtype", "prefill_by_kv_dtype")
    @classmethod
    def _decode_kernel_keys(cls, v: dict) -> dict:
        return _normalised_keys(v, dtype_key)

    @field_validator("gemm_quant_bandwidth_by_dtype", "gemm_store_bandwidth_by_dtype")
    @classmethod
    def _fractions(cls, v: dict) -> dict:
        for key, value in v.items():
            if not 0 < value <= 1:
                raise ValueError(f"{key}: a share of memory bandwidth is in (0, 1], got {value}")
        return v

    @staticmethod
    def _for_dtype(table: dict, dtype: object, default):
        """`table`'s entry for `dtype` (its own spelling first, then its plain dtype)."""
        keys = (dtype_key(dtype), parse_dtype(str(dtype).strip().lower()).value)
        return next((table[k] for k in keys if k in table), default)

    @staticmethod
    def _own_entry(table: dict, dtype: object, default):
        """`table`'s entry for `dtype`'s own spelling alone: a fixed cost of one kernel
        (Ada's fp8 quantiser and epilogue), which fp8_block's kernel does not share."""
        return table.get(dtype_key(dtype), default)

    def gemm_terms(self, dtype: object) -> tuple[EfficiencyCurve, EfficiencyCurve, float]:
        """(compute curve, memory curve, floor in us) for GEMMs in `dtype`: its own entries
        where calibration fitted them, the dtype-independent fields otherwise."""
        return (
            self._for_dtype(self.gemm_compute_by_dtype, dtype, self.gemm_compute),
            self._for_dtype(self.gemm_memory_by_dtype, dtype, self.gemm_memory),
            self._for_dtype(self.gemm_floor_us_by_dtype, dtype, self.kernel_floor_us),
        )

    def gemm_l2_memory(self, dtype: object) -> EfficiencyCurve:
        """The memory curve of GEMMs in `dtype` whose operands are warm in L2: its own
        fitted entry, else the dtype's (cold) memory curve."""
        return self._for_dtype(self.gemm_l2_memory_by_dtype, dtype, self.gemm_terms(dtype)[1])

    def gemm_floor_fitted(self, dtype: object) -> bool:
        """True when a profile fitted `dtype`'s own GEMM floor."""
        return self._for_dtype(self.gemm_floor_us_by_dtype, dtype, None) is not None

    @property
    def split_k_pass_us(self) -> float:
        """gemm_split_k_overhead_us, or one kernel floor where it is not set."""
        return _set_or(self.gemm_split_k_overhead_us, self.kernel_floor_us)

    def gemm_kernel(
        self, dtype: object, default: GemmKernel | None = None
    ) -> tuple[GemmKernel, float, float]:
        """(kernel family, wave latency in us, thread block us per MB) of GEMMs in `dtype`;
        the family is `default` (else plain cuBLAS) where no profile fitted one."""
        return (
            self._for_dtype(self.gemm_kernel_by_dtype, dtype, default or GemmKernel()),
            self._for_dtype(self.gemm_wave_latency_us_by_dtype, dtype, self.gemm_wave_latency_us),
            self._for_dtype(self.gemm_cta_us_per_mb_by_dtype, dtype, 0.0),
        )

    def gemm_store_bandwidth(self, dtype: object) -> float | None:
        """The fraction of memory bandwidth the serial epilogue of GEMMs in `dtype` stores
        at, or None for the plain streaming rate."""
        return self._own_entry(self.gemm_store_bandwidth_by_dtype, dtype, None)

    def gemm_passes(self, dtype: object) -> tuple[float, float, float]:
        """(fraction of memory bandwidth the activation-quantisation pass reaches, its ns
        per row of m, fixed us of the padding copies) of GEMMs in `dtype`."""
        return (
            self._for_dtype(self.gemm_quant_bandwidth_by_dtype, dtype, self.memory_bandwidth),
            self._own_entry(self.gemm_quant_row_ns_by_dtype, dtype, 0.0),
            self._for_dtype(self.gemm_pad_us_by_dtype, dtype, self.kernel_floor_us),
        )

    def moe_terms(self, moe_format: str) -> tuple[EfficiencyCurve, EfficiencyCurve, float]:
        """(compute curve, memory curve, layer floor in us) of fused MoE layers in
        `moe_format`: fitted entries, else the compute dtype's GEMM efficiencies (the
        compute curve's plateau) and one kernel floor per kernel of the layer's sequence."""
        key = moe_format_key(moe_format)
        fmt = MOE_FORMATS[key]
        gemm_compute, gemm_memory, _ = self.gemm_terms(fmt.compute_dtype)
        # The GEMM curve is against FLOPs: its large-GEMM plateau is what full tiles reach.
        plateau = EfficiencyCurve.constant(max(gemm_compute.values))
        return (
            self.moe_compute_by_dtype.get(key, plateau),
            self.moe_memory_by_dtype.get(key, gemm_memory),
            self.moe_floor_us_by_dtype.get(key, fmt.kernels * self.kernel_floor_us),
        )

    def moe_tiles(self, moe_format: str) -> tuple[float, float | None]:
        """(fixed us of one grouped-GEMM thread block, us per MB it streams) of fused MoE
        layers in `moe_format`: 0 and None (the SM's share of L2) where not fitted."""
        key = moe_format_key(moe_format)
        return (
            self.moe_cta_latency_us_by_dtype.get(key, 0.0),
            self.moe_cta_us_per_mb_by_dtype.get(key),
        )

    def link_for(self, num_gpus: int, link: LinkSpec) -> LinkSpec:
        """`link` with the fitted latency and efficiency for `num_gpus` GPUs, where there is
        a fit over this very link (see links_fitted_elsewhere), as the model the fit was
        made under prices it (LinkSpec.as_fitted_over)."""
        fitted = self.collective_by_gpus.get(int(num_gpus))
        as_fitted = None if fitted is None else link.as_fitted_over(fitted.fitted_over)
        if as_fitted is None:
            return link
        return as_fitted.model_copy(
            update={"latency_us": fitted.latency_us, "efficiency": fitted.efficiency}
        )

    def links_fitted_elsewhere(self, link: LinkSpec) -> list[int]:
        """The group sizes whose collective fits were made over another link than `link`,
        so are not applied to it (a run says so)."""
        return sorted(p for p, f in self.collective_by_gpus.items() if not _fitted_over(f, link))

    @property
    def prefill_memory(self) -> EfficiencyCurve:
        """attention_prefill_memory, or memory_bandwidth where it is not fitted (that
        curve built once per profile: every prefill model reads it)."""
        if self.attention_prefill_memory is None:
            return per_object(self, "prefill_memory", _constant_bandwidth)
        return self.attention_prefill_memory

    @property
    def prefill_floor_us(self) -> float:
        return (
            self.attention_floor_us
            if self.attention_prefill_floor_us is None
            else self.attention_prefill_floor_us
        )

    def for_kv_dtype(self, kv_dtype: object) -> EfficiencyProfile:
        """This profile with the decode and prefill kernels fitted to `kv_dtype` caches in
        their fields, where there are such (KV_DTYPE_KERNELS)."""
        update: dict[str, object] = {}
        for table, kind in KV_DTYPE_KERNELS.items():
            kernel = self._for_dtype(getattr(self, table), kv_dtype, None)
            if kernel is not None:
                update.update({f: getattr(kernel, f) for f in kind.model_fields})
        return self.model_copy(update=update) if update else self

    def kernel_fields(self, table: str) -> BaseModel:
        """The fields an entry of KV_DTYPE_KERNELS' `table` holds, as that entry (what a
        per-dtype fit stores)."""
        kind = KV_DTYPE_KERNELS[table]
        return kind(**{f: getattr(self, f) for f in kind.model_fields})

    @property
    def decode_floor_us(self) -> float:
        return _set_or(self.attention_decode_floor_us, self.attention_floor_us)

    # MLA's own fields where fitted, else the attention kernels' (one place for the
    # fallback: the pricing and the fitter both read these).
    @property
    def mla_decode_memory_curve(self) -> EfficiencyCurve:
        return self.mla_decode_memory or self.attention_decode_memory

    @property
    def mla_decode_floor(self) -> float:
        """mla_decode_floor_us, or decode_floor_us, in microseconds."""
        return _set_or(self.mla_decode_floor_us, self.decode_floor_us)

    def mla_decode_query_threshold(self, kv_dtype: object) -> int:
        """mla_decode_query_threshold_by_kv's entry for `kv_dtype`, else 1."""
        return self.mla_decode_query_threshold_by_kv.get(parse_dtype(kv_dtype).value, 1)

    @property
    def mla_decode_cta_latency(self) -> float:
        """mla_decode_cta_latency_us, or decode_cta_latency_us, in microseconds."""
        return _set_or(self.mla_decode_cta_latency_us, self.decode_cta_latency_us)

    @property
    def mla_prefill_compute_curve(self) -> EfficiencyCurve:
        return self.mla_prefill_compute or self.attention_prefill_compute

    @property
    def mla_prefill_floor(self) -> float:
        """mla_prefill_floor_us, or prefill_floor_us, in microseconds."""
        return _set_or(self.mla_prefill_floor_us, self.prefill_floor_us)


def _normalised_keys(v: dict, key: Callable[[str], str]) -> dict:
    """A per-dtype (or per-format) field with its keys spelled one way: a key `key` cannot
    read, or a negative floor, is a one-line validation error naming it."""
    out = {}
    for name, value in v.items():
        try:
            out[key(name)] = value
        except InfersimError as exc:
            raise ValueError(str(exc)) from None
        if isinstance(value, float | int) and value < 0:
            raise ValueError(f"{name}: a floor must be >= 0 us, got {value}")
    return out


def _constant_bandwidth(profile: EfficiencyProfile) -> EfficiencyCurve:
    return EfficiencyCurve.constant(profile.memory_bandwidth)


def profile_json(profile: EfficiencyProfile) -> str:
    """`profile`'s content as JSON, read out once per profile object: a chip's hash and a
    fit's memo of scores key on it."""
    return per_object(profile, "json", EfficiencyProfile.model_dump_json)
