"""GEMM cost: roofline with tile and wave quantisation, split-K and L2 reuse.

A GEMM C[m, n] = A[m, k] @ B[k, n] is cut into output tiles; each SM computes one tile
at a time, so the last wave runs partly empty (wave quantisation) and padded tile edges
do useless work (tile quantisation). Like cuBLAS, the model tries a few tile shapes and
split-K factors and keeps the fastest. The compute efficiency is read at the FLOPs the
tiles compute, padding included: a 16-row tile runs the same k loop at m = 1 as at
m = 16 (the L40S's fp8 rows take 5.2 us at every m up to 16 for n = 32, k = 1,024), so
a curve read at the useful FLOPs priced m = 1 16x slower than m = 16. DRAM traffic
counts the A row-panels and B column-panels each wave needs (tiles running together
share them through L2); when the operands fit in L2 they are read once, and where a
benchmark's loop kept them in L2 they come from there (gemm_cost's `loop_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.block_scaling import (
    WARP_MMA_FAMILIES,
    TileBucket,
    gemm_family,
    operand_bytes,
    quantisation_pass_bytes,
    scaled_format,
    scales_on_cuda_cores,
    serving_rule,
    stored_bytes,
)
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.efficiency import EfficiencyCurve, GemmKernel, dtype_key
from hardware_models.op_cost import OpCost

# (tile_m, tile_n) shapes cuBLAS/CUTLASS kernels commonly use on tensor cores.
TILE_SHAPES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (64, 128), (64, 64))
# cuBLAS splits the k loop of skinny GEMMs widely: on the A100, m = 2-64, n = 32-128,
# k = 65536 runs in the time 32-64 slices give (16 left them 20-134% slow). It splits in
# whatever count fills the SMs, not only in powers of two: m = 512, n = 1024,
# k = 10240 runs at 203 TFLOPS, which its 32 tiles of 128 x 128 reach only as 96 slices
# on the 108 SMs (two slices each leave 41% of them idle, four take two waves).
SPLIT_K_FACTORS: tuple[int, ...] = (*range(1, 17), 24, 32, 48, 64)
# CUTLASS dispatch by m bucket (vLLM's fp8 scaled_mm on Hopper): (largest m, tile for
# n <= NARROW_N, tile for wider n). Up to m = 64 it swaps A and B, so that a 16- or
# 64-wide side of the tile covers m and a 64-row side covers n.
TILES_BY_M: tuple[tuple[int, tuple[int, int], tuple[int, int]], ...] = (
    (16, (16, 64), (16, 64)),
    (64, (16, 64), (64, 64)),
    (128, (64, 128), (64, 128)),
)
NARROW_N = 1280
TILE_LARGE = (128, 128)
# Past the swapped buckets m lies along the kernel's M, where a thread-block cluster
# (GemmKernel.cluster_m) rounds the tile rows up to a whole number of clusters.
SWAPPED_UP_TO_M = TILES_BY_M[1][0]
# Elements the padding copies move per quantised activation element: zero the padded
# buffer, then read and write the rows into it.
PAD_PASS_ELEMENTS = 3.0
# Share of L2 a GEMM can count on for keeping its operands resident.
L2_RESIDENT_FRACTION = 0.5


# A warm loop's hit share falls from 1 to 0 as it grows from (1 - x) to (1 + x) times the
# L2 it can keep warm: an L2 is no true LRU (hashed slices, non-LRU replacement), so a loop
# a little over capacity keeps some lines and one a little under loses some. The L40S's
# bf16 rows at m <= 8: six weight copies of 76 MB run warm, 88-101 MB mixed, 110 MB cold.
L2_HIT_RAMP = 0.15


def warm_l2_bytes(gpu: AcceleratorSpec) -> float:
    """Bytes a loop that re-runs the same kernels can keep in L2 from one run to the
    next, in binary MiB as caches are sized: a single L2 whole (the L40S's 96 MiB: its
    benchmark cycles six copies of a GEMM's weights, which at m <= 8 run at 1.0-2.3 TB/s,
    above GDDR6's 864 GB/s, up to ~90 MB of copies, and at GDDR6's rate from ~110 MB;
    benchmarks/README.md, "Calibration for any GPU"). None of a partitioned one
    (L2Spec.partitions): a line is cached by the partition of the SM that read it, and
    the next run's thread blocks land on either side; the H100's and A100's tables never
    beat their HBM rate at any size, and pricing half their L2 as warm made both fits
    worse, so they keep the cold price."""
    if gpu.l2.partitions > 1:
        return 0.0
    return gpu.l2.size_mb * 2**20


def l2_hit_fraction(gpu: AcceleratorSpec, loop_bytes):
    """Share of a loop's reads and writes that find their lines still in L2 (see
    L2_HIT_RAMP); NaN loop bytes (a benchmark not known) count as cold."""
    capacity = warm_l2_bytes(gpu)
    if capacity == 0.0:
        return np.zeros_like(loop_bytes, dtype=float)
    over = (capacity * (1 + L2_HIT_RAMP) - loop_bytes) / (2 * L2_HIT_RAMP * capacity)
    return np.nan_to_num(np.clip(over, 0.0, 1.0))


def warp_tile(tm: int, tn: int) -> tuple[int, int]:
    """The part of a (tm, tn) tile one warp computes: CUTLASS's Ampere tensor-op tiles
    split each side in two, a side over 128 in four (128 x 128 in 64 x 64 warps, 64 x 64
    in 32 x 32, 256 x 128 in 64 x 64), and an MMA is at least 16 x 8."""
    return max(16, tm // (4 if tm > 128 else 2)), max(8, tn // (4 if tn > 128 else 2))


def shared_memory_share(
    tm: int,
    tn: int,
    bpe_a: float,
    bpe_b: float,
    peak_per_sm: float,
    smem_per_sm: float,
    warp: tuple[int, int] | None = None,
) -> float:
    """The share of the tensor peak a warp-MMA tile can reach before shared memory caps
    it: per step of k the tile's A and B columns are written into shared memory once and
    read by every warp that uses them (`warp`: a warp's part of the tile, where the
    kernel names it; else warp_tile's). A 64 x 64 bf16 tile on the A100 moves 768 bytes
    per step, 6 clocks at 128 bytes/clock, for 4 clocks of tensor math: 2/3 of peak."""
    wm, wn = warp or warp_tile(tm, tn)
    per_k_bytes = bpe_a * tm * (1 + tn / wn) + bpe_b * tn * (1 + tm / wm)
    smem_s = per_k_bytes / smem_per_sm
    if smem_s == 0.0:  # a bandwidth so large that its time underflows: no cap
        return 1.0
    return min(1.0, (2.0 * tm * tn / peak_per_sm) / smem_s)


def output_dtype(dtype: Dtype) -> Dtype:
    """8-bit and 4-bit GEMMs write 16-bit results; others write their own type."""
    return Dtype.BF16 if bytes_per_element(dtype) < 2 else dtype


def _wave_traffic(
    m: int, n: int, k: float, tm: int, tn: int, concurrent: int, bpe_a: float, bpe_b: float
) -> float:
    """DRAM bytes when each wave of `concurrent` tiles loads its own A and B panels."""
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    # A wave covers a roughly square block of tiles (rasterised swizzle).
    side_n = min(tiles_n, max(1, round(math.sqrt(concurrent))))
    side_m = min(tiles_m, max(1, concurrent // side_n))
    waves_m, waves_n = math.ceil(tiles_m / side_m), math.ceil(tiles_n / side_n)
    a_panel_loads = waves_n * m * k  # A re-read once per column-block of waves
    b_panel_loads = waves_m * n * k
    return a_panel_loads * bpe_a + b_panel_loads * bpe_b


class Layout(NamedTuple):
    """How a kernel lays an m x n x k GEMM out on the SMs."""

    tile: tuple[int, int]  # (rows of m, columns of n) per thread block
    split: int  # split-K factor
    cluster_m: int  # tiles a cluster stacks along m


@lru_cache(maxsize=4)
def _every_layout(tiles: tuple, splits: tuple) -> tuple[Layout, ...]:
    """Every tile with every split, built once (the engine prices thousands of shapes)."""
    return tuple(Layout(tile, split, 1) for tile in tiles for split in splits)


def candidate_layouts(
    kernel: GemmKernel, m: int, n: int, fixed: Sequence[TileBucket] = ()
) -> Sequence[Layout]:
    """The layouts a kernel family may run: every tile and split for cuBLAS-style
    heuristics (which pick their own clusters), one clustered tile and no split-K for
    CUTLASS dispatch (`fixed`: the family's tile for m's bucket, else 128 x 128)."""
    if kernel.dispatch == "fastest":
        return _every_layout(TILE_SHAPES, SPLIT_K_FACTORS)
    if kernel.dispatch == "by_m":
        tile = next(
            (narrow if n <= NARROW_N else wide for top, narrow, wide in TILES_BY_M if m <= top),
            TILE_LARGE,
        )
        return [Layout(tile, 1, 1 if m <= SWAPPED_UP_TO_M else kernel.cluster_m)]
    bucket = next((b for b in fixed if m <= b.up_to_m and n <= b.up_to_n), None)
    if bucket is None:
        return [Layout(TILE_LARGE, 1, kernel.cluster_m)]
    return [Layout(bucket.tile, 1, bucket.cluster_m)]


def tile_rows(m, tm: int, cluster_m: int):
    """Tile rows launched for m rows: a cluster of `cluster_m` tiles is launched whole, so
    m = 257 on 128-row tiles in pairs computes 4 tile rows, twice m = 256's 2 (the H100
    fp8 table: 2.0-2.3x at n >= 8192). Ints or float arrays (ceil as negated floor)."""
    rows = -(-m // tm)
    return -(-rows // cluster_m) * cluster_m


@dataclass(frozen=True, slots=True)
class GemmParts:
    """A GEMM's time term by term, so a fit can tell what each efficiency scales."""

    math_s: float  # the tiles' k loops at the compute efficiency
    stream_s: float  # the tiles' k loops at one thread block's streaming rate
    latency_s: float  # waves after the first x wave latency, in series with the k loops
    epilogue_s: float  # output-tile stores in series with the k loops (serial_epilogue)
    memory_s: float  # DRAM traffic at the memory efficiency
    fixed_s: float  # floor + split-K reduction + quantisation and padding passes
    flops: float
    work_flops: float  # the FLOPs its tiles compute, padding included: the compute curve's x
    dram_bytes: float
    l2_bytes: float
    kernels: int

    @property
    def compute_s(self) -> float:
        return max(self.math_s, self.stream_s) + self.latency_s + self.epilogue_s

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s) + self.fixed_s


@dataclass(frozen=True, slots=True)
class _Setup:
    """What gemm_parts needs of a GPU and a dtype pair, looked up once: the engine prices
    a few thousand GEMM shapes per run, and the per-dtype lookups cost more than the math."""

    compute_curve: EfficiencyCurve  # by the FLOPs the tiles compute (GemmParts.work_flops)
    compute_at: Callable[[float], float]  # compute_curve.at for one size
    memory_curve: EfficiencyCurve
    l2_memory_curve: EfficiencyCurve  # operands a loop keeps warm in L2
    floor_us: float
    kernel: GemmKernel
    fixed_tiles: tuple[TileBucket, ...]  # a `fixed` kernel's tile by m (block_scaling)
    wave_latency_us: float
    cta_us_per_mb: float
    bpe: float
    bpe_b: float
    out_bpe: float
    peak_per_sm: float
    concurrent: int
    pass_bandwidth: float  # the padding copies and cold serial epilogue stores stream at this rate
    l2_s_per_byte: float  # warm stores into L2, at its sustained rate
    store_bandwidth: float | None  # a kernel's own serial epilogue store rate, warm or cold
    quant_bandwidth: float  # the activation-quantisation pass streams at this rate
    quant_bytes: float  # bytes that pass moves per activation element, scales included
    quant_row_s: float  # that pass's time per row of m beyond its bytes (a block per token)
    pad_s: float  # fixed time of the padding copies
    serial_epilogue: bool  # output stores in series with the k loops (GemmKernel)
    tile_share: dict[tuple[int, int], float]  # shared_memory_share by tile (1 if uncapped)
    split_pass_us: float  # the split-K reduction pass (EfficiencyProfile.split_k_pass_us)


@lru_cache(maxsize=256)
def _setup(gpu: AcceleratorSpec, dtype: str | Dtype, weight_dtype: str | Dtype | None) -> _Setup:
    eff = gpu.efficiency
    compute_curve, memory_curve, floor_us = eff.gemm_terms(dtype)
    fmt = scaled_format(dtype)
    rule = serving_rule(gpu, fmt.name if fmt is not None else dtype_key(dtype))
    kernel, wave_latency_us, cta_us_per_mb = eff.gemm_kernel(
        dtype, rule.kernel if rule is not None else None
    )
    if kernel.quantize_activations and not eff.gemm_floor_fitted(dtype):
        floor_us *= 2  # two kernels, each with its launch floor: the quantisation, the GEMM
    quant_fraction, quant_row_ns, pad_us = eff.gemm_passes(dtype)
    store = eff.gemm_store_bandwidth(dtype)
    plain = parse_dtype(dtype)
    # Operands carry their block scales: activations one per 1 x block_k group, weights
    # their share of a block (fp8_block's 128 x 128 blocks: 1/4096 byte a weight).
    bpe = operand_bytes(dtype)
    if weight_dtype is not None:
        bpe_b = stored_bytes(weight_dtype)
    else:
        bpe_b = bpe if fmt is None else fmt.weight_bytes
    peak_per_sm = gpu.peak_flops(plain) / gpu.sm_count
    if fmt is not None and scales_on_cuda_cores(gpu, dtype):
        # Each block of k ends with the accumulators rescaled by the A and B blocks'
        # scales: one FMA per output element on the CUDA cores, in series with the
        # tensor math, per 2 x block_k tensor FLOPs.
        scale_s_per_flop = 1.0 / (fmt.block_k * gpu.peak_vector_flops())
        peak_per_sm = 1.0 / (1.0 / peak_per_sm + scale_s_per_flop * gpu.sm_count)
    warp_mma = gemm_family(gpu) in WARP_MMA_FAMILIES
    fixed = rule.tiles if rule is not None and rule.tiles is not None else None
    fixed = fixed or (TileBucket(math.inf, TILE_LARGE, kernel.cluster_m),)
    # Each tile's warp split: the fixed buckets' own where they name one (a family's
    # buckets give a tile one warp split), else warp_tile's.
    tiles: dict[tuple[int, int], tuple[int, int] | None] = dict.fromkeys(
        (*TILE_SHAPES, TILE_LARGE, *(t for _, *pair in TILES_BY_M for t in pair))
    )
    tiles.update((b.tile, b.warp) for b in fixed if b.warp is not None or b.tile not in tiles)
    return _Setup(
        compute_curve=compute_curve,
        compute_at=compute_curve.scalar_at(),
        memory_curve=memory_curve,
        l2_memory_curve=eff.gemm_l2_memory(dtype),
        floor_us=floor_us,
        kernel=kernel,
        fixed_tiles=fixed,
        wave_latency_us=wave_latency_us,
        cta_us_per_mb=cta_us_per_mb,
        bpe=bpe,
        bpe_b=bpe_b,
        out_bpe=bytes_per_element(output_dtype(plain)),
        peak_per_sm=peak_per_sm,
        concurrent=gpu.sm_count * eff.ctas_per_sm,
        pass_bandwidth=gpu.memory_bandwidth * eff.memory_bandwidth,
        l2_s_per_byte=1.0 / (gpu.l2_bandwidth * eff.l2_bandwidth),
        store_bandwidth=None if store is None else gpu.memory_bandwidth * store,
        quant_bandwidth=gpu.memory_bandwidth * quant_fraction,
        quant_bytes=quantisation_pass_bytes(dtype),
        quant_row_s=quant_row_ns * 1e-9,
        pad_s=pad_us * 1e-6,
        serial_epilogue=warp_mma if kernel.serial_epilogue is None else kernel.serial_epilogue,
        split_pass_us=eff.split_k_pass_us,
        tile_share={
            (tm, tn): shared_memory_share(
                tm, tn, bpe, bpe_b, peak_per_sm, gpu.shared_memory_bandwidth_per_sm, warp
            )
            if warp_mma
            else 1.0
            for (tm, tn), warp in tiles.items()
        },
    )


Num = float | np.ndarray  # one shape's value, or one per shape


class _ShapeTerms(NamedTuple):
    """What a GEMM shape costs whatever its layout (scalars, or arrays of shapes)."""

    flops: Num
    compulsory: Num  # operand and output bytes, each moved once
    fits_in_l2: bool | np.ndarray  # its panels are read from DRAM once (or not at all)
    mem_bw: Num  # the rate of the levels its bytes move through, at the memory curve
    store_bw: Num  # the rate output stores drain at (a serial epilogue's)
    pad: bool | np.ndarray  # m is not a multiple of the kernel's align_m
    pass_bytes: Num
    pass_s: Num  # the kernels before the matmul


def _memory_rates(gpu: AcceleratorSpec, c: _Setup, compulsory, loop_bytes):
    """(the rate a GEMM's compulsory bytes move at, at the memory curves; the rate its
    serial epilogue's stores drain at; the rate its activation-quantisation pass
    streams at; whether its operands are warm): DRAM's, or for the share of a warm loop
    that hits in L2 the L2's, at its own curve. The outputs too: a loop rewrites the
    same output lines, which stay in L2 as dirty lines (the L40S writes outputs of up
    to ~60 MB at 1.4-2 TB/s). So do the activations the quantiser reads and the 8-bit
    copy it writes, both part of the loop (benchmark_loops.gemm_loop_bytes): the pass
    keeps its share of the bandwidth, of L2's where they hit. A cold GEMM gets the DRAM
    figures themselves, not a round trip through a blend. A kernel whose epilogue has
    a store rate of its own (_Setup.store_bandwidth) stores at it, warm or cold."""
    dram = gpu.memory_bandwidth * c.memory_curve.at(compulsory)
    if loop_bytes is None:
        return dram, c.store_bandwidth or c.pass_bandwidth, c.quant_bandwidth, False
    hit = l2_hit_fraction(gpu, loop_bytes)
    quant_share = c.quant_bandwidth / gpu.memory_bandwidth
    quant = np.where(
        hit > 0,
        quant_share / (hit * c.l2_s_per_byte + (1.0 - hit) / gpu.memory_bandwidth),
        c.quant_bandwidth,
    )
    l2_s = 1.0 / (gpu.l2_bandwidth * c.l2_memory_curve.at(compulsory))
    rate = np.where(hit > 0, 1.0 / (hit * l2_s + (1.0 - hit) / dram), dram)
    store = np.where(
        hit > 0, 1.0 / (hit * c.l2_s_per_byte + (1.0 - hit) / c.pass_bandwidth), c.pass_bandwidth
    )
    if c.store_bandwidth is not None:
        store = np.full_like(store, c.store_bandwidth)
    if rate.ndim == 0:
        return float(rate), float(store), float(quant), bool(hit > 0.5)
    return rate, store, quant, hit > 0.5


def _shape_terms(gpu: AcceleratorSpec, c: _Setup, m, n, k, loop_bytes=None) -> _ShapeTerms:
    """The layout-independent terms, one arithmetic for the scalar and array paths.
    Before the matmul, dynamic scaling streams the activations once more in a kernel of
    its own (its launch is part of the dtype's fitted floor), and a kernel that needs
    aligned rows gets them padded by copies. Bytes a loop keeps warm in L2 (gemm_cost's
    `loop_bytes`) move at the L2's rate (_memory_rates)."""
    flops = 2.0 * m * n * k
    operands = m * k * c.bpe + k * n * c.bpe_b
    compulsory = operands + m * n * c.out_bpe
    pad = m % c.kernel.align_m != 0
    quantised = c.kernel.quantize_activations
    quant_bytes = m * k * c.quant_bytes * quantised
    pad_bytes = m * k * PAD_PASS_ELEMENTS * c.bpe * pad
    mem_bw, store_bw, quant_bw, warm = _memory_rates(gpu, c, compulsory, loop_bytes)
    return _ShapeTerms(
        flops=flops,
        compulsory=compulsory,
        fits_in_l2=warm | (operands <= gpu.l2_bytes * L2_RESIDENT_FRACTION),
        mem_bw=mem_bw,
        store_bw=store_bw,
        pad=pad,
        pass_bytes=quant_bytes + pad_bytes,
        pass_s=quant_bytes / quant_bw
        + m * c.quant_row_s * quantised
        + pad_bytes / c.pass_bandwidth
        + c.pad_s * pad,
    )


def gemm_parts(
    gpu: AcceleratorSpec,
    m: int,
    n: int,
    k: int,
    dtype: str | Dtype = "bf16",
    weight_dtype: str | Dtype | None = None,
    loop_bytes: float | None = None,
) -> GemmParts:
    """gemm_cost's terms, uncached (see gemm_cost)."""
    if min(m, n, k) < 1:
        raise ValueError(f"GEMM dimensions must be >= 1, got m={m} n={n} k={k}")
    c = _setup(gpu, dtype, weight_dtype)
    bpe, bpe_b, out_bpe, concurrent = c.bpe, c.bpe_b, c.out_bpe, c.concurrent
    terms = _shape_terms(gpu, c, m, n, k, loop_bytes)
    flops, compulsory, fits_in_l2, mem_bw, store_bw = terms[:5]
    pad, pass_bytes, pass_s = terms.pad, terms.pass_bytes, terms.pass_s
    if c.kernel.gemv and m == 1:
        # No tiles: every SM streams its share of B once. Two FLOPs per weight element
        # read is far below any GPU's machine balance, so no compute term.
        return GemmParts(
            math_s=0.0,
            stream_s=0.0,
            latency_s=0.0,
            epilogue_s=0.0,
            memory_s=compulsory / mem_bw,
            fixed_s=c.floor_us * 1e-6 + pass_s,
            flops=flops,
            work_flops=flops,
            dram_bytes=compulsory + pass_bytes,
            l2_bytes=compulsory,
            kernels=1 + c.kernel.quantize_activations + pad,
        )

    best: tuple[float, tuple] | None = None
    # Splits of one tile share its count, its work and so its compute efficiency.
    per_tile: dict[tuple[int, int, int], tuple[int, float, float]] = {}
    for (tm, tn), split, cluster_m in candidate_layouts(c.kernel, m, n, c.fixed_tiles):
        known = per_tile.get((tm, tn, cluster_m))
        if known is None:
            tiles = tile_rows(m, tm, cluster_m) * math.ceil(n / tn)
            work = 2.0 * tiles * tm * tn * k
            known = per_tile[tm, tn, cluster_m] = (tiles, work, c.compute_at(work))
        tiles, work, compute_eff = known
        if split > 1 and (tiles * split > 2 * concurrent or k // split < 256):
            continue
        k_part = math.ceil(k / split)
        share = c.tile_share[(tm, tn)]
        waves = math.ceil(tiles * split / concurrent)
        math_s = waves * 2.0 * tm * tn * k_part / (c.peak_per_sm * share * compute_eff)
        # One thread block pulls its A and B panels at a capped rate (its loads in
        # flight), which a small tile over a long k cannot hide behind its math.
        stream_s = waves * (tm * bpe + tn * bpe_b) * k_part * c.cta_us_per_mb * 1e-12
        partials = 0.0 if split == 1 else 2 * m * n * split * 4.0  # fp32 workspace
        if fits_in_l2:
            dram = compulsory + partials
        else:
            dram = (
                _wave_traffic(m, n, k, tm, tn, concurrent, bpe, bpe_b) + m * n * out_bpe + partials
            )
        # Tensor-core kernels stage tiles through shared memory and (on Hopper) TMA
        # multicast, so L2 bandwidth shapes DRAM reuse but is not the binding roof.
        # Split-K pays for reducing its partial sums (a second pass) on top; each wave
        # fills its pipeline besides its k loop, and before Hopper the tiles' stores
        # follow their k loops (a serial epilogue) instead of overlapping them.
        latency_s = (waves - 1) * c.wave_latency_us * 1e-6
        epilogue_s = _epilogue_s(c, m, n, split, store_bw)
        memory_s = dram / mem_bw
        fixed_s = (c.floor_us + (c.split_pass_us if split > 1 else 0.0)) * 1e-6
        fixed_s += pass_s
        seconds = max(max(math_s, stream_s) + latency_s + epilogue_s, memory_s) + fixed_s
        if best is None or seconds < best[0]:
            l2 = tiles * split * (tm * bpe + tn * bpe_b) * k_part + m * n * out_bpe
            best = (
                seconds,
                (math_s, stream_s, latency_s, epilogue_s, memory_s, fixed_s, dram, l2, work),
            )
    assert best is not None
    math_s, stream_s, latency_s, epilogue_s, memory_s, fixed_s, dram, l2, work = best[1]
    return GemmParts(
        math_s=math_s,
        stream_s=stream_s,
        latency_s=latency_s,
        epilogue_s=epilogue_s,
        memory_s=memory_s,
        fixed_s=fixed_s,
        flops=flops,
        work_flops=work,
        dram_bytes=dram + pass_bytes,
        l2_bytes=l2,
        kernels=1 + c.kernel.quantize_activations + pad,
    )


class GemmPartsArray(NamedTuple):
    """GemmParts of many shapes at once (numpy arrays), with its derived terms."""

    math_s: np.ndarray
    stream_s: np.ndarray
    latency_s: np.ndarray
    epilogue_s: np.ndarray
    memory_s: np.ndarray
    fixed_s: np.ndarray
    compute_s: np.ndarray
    seconds: np.ndarray
    flops: np.ndarray
    work_flops: np.ndarray
    dram_bytes: np.ndarray
    l2_bytes: np.ndarray
    kernels: np.ndarray


def _layouts_many(
    kernel: GemmKernel, m: np.ndarray, n: np.ndarray, fixed: Sequence[TileBucket] = ()
):
    """candidate_layouts for many shapes: (layout, rows that may run it) per layout, in
    the scalar loop's order."""
    every = np.ones(len(m), dtype=bool)
    if kernel.dispatch == "fastest":
        return [(layout, every) for layout in _every_layout(TILE_SHAPES, SPLIT_K_FACTORS)]
    if kernel.dispatch == "fixed":
        if not fixed:
            return [(Layout(TILE_LARGE, 1, kernel.cluster_m), every)]
        below = np.zeros(len(m), dtype=bool)  # served by an earlier bucket
        out = []
        for bucket in fixed:
            rows = (m <= bucket.up_to_m) & (n <= bucket.up_to_n) & ~below
            below |= rows
            out.append((Layout(bucket.tile, 1, bucket.cluster_m), rows))
        return out
    bucket = np.full(len(m), len(TILES_BY_M))  # past the last bucket: TILE_LARGE
    for i in reversed(range(len(TILES_BY_M))):
        bucket = np.where(m <= TILES_BY_M[i][0], i, bucket)
    chosen = {(TILE_LARGE, kernel.cluster_m): bucket == len(TILES_BY_M)}
    for i, (top, narrow, wide) in enumerate(TILES_BY_M):
        cluster_m = 1 if top <= SWAPPED_UP_TO_M else kernel.cluster_m
        for tile, side in ((narrow, n <= NARROW_N), (wide, n > NARROW_N)):
            rows = (bucket == i) & side
            key = (tile, cluster_m)
            chosen[key] = chosen.get(key, np.zeros(len(m), dtype=bool)) | rows
    return [(Layout(tile, 1, cluster_m), rows) for (tile, cluster_m), rows in chosen.items()]


def gemm_launches(gpu: AcceleratorSpec, m: np.ndarray, dtype: str | Dtype = "bf16") -> np.ndarray:
    """Kernels one GEMM call launches per shape of m rows: the activation quantisation,
    the padding copy where m is not a multiple of the kernel's align_m, the matmul."""
    kernel = _setup(gpu, dtype, None).kernel
    m = np.asarray(m, dtype=float)
    return 1 + int(kernel.quantize_activations) + (m % kernel.align_m != 0)


def gemm_parts_many(
    gpu: AcceleratorSpec,
    m: np.ndarray,
    n: np.ndarray,
    k: np.ndarray,
    dtype: str | Dtype = "bf16",
    weight_dtype: str | Dtype | None = None,
    loop_bytes: np.ndarray | None = None,
) -> GemmPartsArray:
    """gemm_parts over arrays of shapes, the same arithmetic in the same order (so the
    same floats and the same layout wins): a calibration fit prices thousands of shapes
    for every candidate it tries, which one shape at a time takes minutes."""
    m, n, k = (np.asarray(a, dtype=float) for a in (m, n, k))
    c = _setup(gpu, dtype, weight_dtype)
    bpe, bpe_b, out_bpe, concurrent = c.bpe, c.bpe_b, c.out_bpe, c.concurrent
    if loop_bytes is not None:
        loop_bytes = np.asarray(loop_bytes, dtype=float)
    terms = _shape_terms(gpu, c, m, n, k, loop_bytes)
    flops, compulsory, fits_in_l2, mem_bw, store_bw = terms[:5]
    pad, pass_bytes, pass_s = terms.pad, terms.pass_bytes, terms.pass_s
    store_bw = np.broadcast_to(store_bw, m.shape)
    # The fastest layout so far per shape, updated only where a later one is strictly
    # faster (the first of equals wins, as in the scalar loop). Tile counts depend on the
    # tile alone, so splits of one tile share them.
    per_layout = ("math_s", "stream_s", "latency_s", "epilogue_s", "memory_s", "fixed_s",
                  "compute_s", "seconds", "dram_bytes", "l2_bytes", "work_flops")  # fmt: skip
    out = {name: np.zeros(len(m)) for name in per_layout}
    out["seconds"].fill(np.inf)
    per_tile: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for ((tm, tn), split, cluster_m), allowed in _layouts_many(c.kernel, m, n, c.fixed_tiles):
        key = (tm, tn, cluster_m)
        if key not in per_tile:
            tiles = tile_rows(m, tm, cluster_m) * np.ceil(n / tn)
            work = 2.0 * tiles * tm * tn * k
            per_tile[key] = (tiles, work, c.compute_curve.at(work))
        tiles, work, compute_eff = per_tile[key]
        if split > 1:
            allowed = allowed & ~((tiles * split > 2 * concurrent) | (k // split < 256))
        # Price only the shapes that may run this layout: most splits suit few of them.
        sel = np.flatnonzero(allowed)
        if sel.size == 0:
            continue
        ms, ns, ks, tiles, work = m[sel], n[sel], k[sel], tiles[sel], work[sel]
        k_part = np.ceil(ks / split)
        share = c.tile_share[(tm, tn)]
        waves = np.ceil(tiles * split / concurrent)
        math_s = waves * 2.0 * tm * tn * k_part / (c.peak_per_sm * share * compute_eff[sel])
        stream_s = waves * (tm * bpe + tn * bpe_b) * k_part * c.cta_us_per_mb * 1e-12
        partials = 0.0 if split == 1 else 2 * ms * ns * split * 4.0
        traffic = _wave_traffic_many(ms, ns, ks, tm, tn, concurrent, bpe, bpe_b)
        dram = np.where(
            fits_in_l2[sel], compulsory[sel] + partials, traffic + ms * ns * out_bpe + partials
        )
        latency_s = (waves - 1) * c.wave_latency_us * 1e-6
        epilogue_s = np.zeros_like(ms) + _epilogue_s(c, ms, ns, split, store_bw[sel])
        memory_s = dram / mem_bw[sel]
        fixed_s = (c.floor_us + (c.split_pass_us if split > 1 else 0.0)) * 1e-6
        fixed_s = fixed_s + pass_s[sel]
        compute_s = np.maximum(math_s, stream_s) + latency_s + epilogue_s
        seconds = np.maximum(compute_s, memory_s) + fixed_s
        faster = seconds < out["seconds"][sel]
        won = sel[faster]
        l2 = tiles * split * (tm * bpe + tn * bpe_b) * k_part + ms * ns * out_bpe
        for name, value in zip(
            per_layout,
            (math_s, stream_s, latency_s, epilogue_s, memory_s, fixed_s, compute_s, seconds,
             dram, l2, work),
            strict=True,
        ):  # fmt: skip
            out[name][won] = value[faster]
    if c.kernel.gemv:
        gemv = m == 1
        memory_s = compulsory / mem_bw
        fixed_s = c.floor_us * 1e-6 + pass_s
        gemv_terms = {
            "math_s": 0.0,
            "stream_s": 0.0,
            "latency_s": 0.0,
            "epilogue_s": 0.0,
            "memory_s": memory_s,
            "fixed_s": fixed_s,
            "compute_s": 0.0,
            "seconds": np.maximum(0.0, memory_s) + fixed_s,
            "dram_bytes": compulsory,
            "l2_bytes": compulsory,
            "work_flops": flops,
        }
        out = {name: np.where(gemv, gemv_terms[name], out[name]) for name in out}
    out["dram_bytes"] = out["dram_bytes"] + pass_bytes
    kernels = 1 + c.kernel.quantize_activations + np.asarray(pad, dtype=int)
    return GemmPartsArray(**out, flops=flops, kernels=kernels)


def _epilogue_s(c: _Setup, m, n, split: int, store_bw):
    """Time of the output-tile stores where they run after each tile's k loop rather than
    under the next one's (GemmKernel.serial_epilogue): the result (fp32 partial sums
    per split under split-K) at the streaming bandwidth. Once L2 holds dirty output
    lines, each store waits on a DRAM write, and an SM with one thread block has no k
    loop running meanwhile; unless a warm loop keeps the output's lines in L2, where
    the stores overwrite them at the L2's rate (`store_bw`, _memory_rates)."""
    if not c.serial_epilogue:
        return 0.0
    out_bytes = m * n * (c.out_bpe if split == 1 else 4.0 * split)
    return out_bytes / store_bw


def _wave_traffic_many(m, n, k, tm: int, tn: int, concurrent: int, bpe_a, bpe_b) -> np.ndarray:
    """_wave_traffic over arrays of shapes."""
    tiles_m, tiles_n = np.ceil(m / tm), np.ceil(n / tn)
    side_n = np.minimum(tiles_n, max(1, round(math.sqrt(concurrent))))
    side_m = np.minimum(tiles_m, np.maximum(1, concurrent // side_n))
    waves_m, waves_n = np.ceil(tiles_m / side_m), np.ceil(tiles_n / side_n)
    return waves_n * m * k * bpe_a + waves_m * n * k * bpe_b


def gemm_costs_many(
    gpu: AcceleratorSpec,
    m: np.ndarray,
    n: int,
    k: int,
    dtype: str | Dtype = "bf16",
    weight_dtype: str | Dtype | None = None,
) -> list[OpCost]:
    """gemm_cost for each row count in `m` (one n x k weight), priced in one array pass:
    the same OpCosts, in plain floats, for a tenth of the time when there are hundreds
    (an engine step prices its GEMMs at every token count up to its budget)."""
    ones = np.ones(len(m))
    parts = gemm_parts_many(gpu, m, ones * n, ones * k, dtype, weight_dtype)
    columns = zip(
        parts.seconds.tolist(), parts.flops.tolist(), parts.dram_bytes.tolist(),
        parts.l2_bytes.tolist(), parts.compute_s.tolist(), parts.memory_s.tolist(),
        parts.fixed_s.tolist(), parts.kernels.tolist(),
        strict=True,
    )  # fmt: skip
    return [OpCost.from_terms("gemm", *terms) for terms in columns]


@lru_cache(maxsize=65536)
def gemm_cost(
    gpu: AcceleratorSpec,
    m: int,
    n: int,
    k: int,
    dtype: str | Dtype = "bf16",
    weight_dtype: str | Dtype | None = None,
    loop_bytes: float | None = None,
) -> OpCost:
    """Time of one (m x k) @ (k x n) GEMM on `gpu`, computed in `dtype`.

    `dtype` may name a block-scaled variant (fp8_block): it computes as its plain dtype
    but takes the curves and kernel family a calibration profile fitted for that spelling.
    `weight_dtype` is the storage type of B when it differs (weight-only quantisation,
    e.g. int4 weights dequantised to bf16 in the kernel): it changes bytes, not the FLOPs,
    though before Hopper fewer bytes through shared memory can lift a small tile's cap.

    `loop_bytes` is what the caller's loop touches between two runs of this GEMM, the
    GEMM's own operands included: where they fit a single L2 (warm_l2_bytes) the
    operands are still there and are read, and the output rewritten, at the L2's rate.
    A benchmark that re-runs one GEMM over a few weight copies keeps them warm; a
    serving engine's forward pass cycles through every layer's weights, far more than
    any L2, hence None (from DRAM) by default.
    """
    p = gemm_parts(gpu, m, n, k, dtype, weight_dtype, loop_bytes)
    terms = (p.seconds, p.flops, p.dram_bytes, p.l2_bytes, p.compute_s, p.memory_s, p.fixed_s)
    return OpCost.from_terms("gemm", *terms, p.kernels)
