"""GEMM cost: roofline with tile and wave quantisation, split-K and L2 reuse.

A GEMM C[m, n] = A[m, k] @ B[k, n] is cut into output tiles; each SM computes one tile
at a time, so the last wave runs partly empty (wave quantisation) and padded tile edges
do useless work (tile quantisation). Like cuBLAS, the model tries a few tile shapes and
split-K factors and keeps the fastest. DRAM traffic counts the A row-panels and B
column-panels each wave needs (tiles running together share them through L2); when the
operands fit in L2 they are read once.
"""

from __future__ import annotations

import math
from functools import lru_cache

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.op_cost import OpCost, classify

# (tile_m, tile_n) shapes cuBLAS/CUTLASS kernels commonly use on tensor cores.
TILE_SHAPES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (64, 128), (64, 64))
SPLIT_K_FACTORS: tuple[int, ...] = (1, 2, 4, 8, 16)
# Share of L2 a GEMM can count on for keeping its operands resident.
L2_RESIDENT_FRACTION = 0.5


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


@lru_cache(maxsize=65536)
def gemm_cost(
    gpu: AcceleratorSpec,
    m: int,
    n: int,
    k: int,
    dtype: str | Dtype = "bf16",
    weight_dtype: str | Dtype | None = None,
) -> OpCost:
    """Time of one (m x k) @ (k x n) GEMM on `gpu`, computed in `dtype`.

    `dtype` may name a block-scaled variant (fp8_block): it computes as its plain dtype
    but takes the efficiency curves a calibration profile fitted for that spelling.
    `weight_dtype` is the storage type of B when it differs (weight-only quantisation,
    e.g. int4 weights dequantised to bf16 in the kernel): it changes bytes, not math.
    """
    if min(m, n, k) < 1:
        raise ValueError(f"GEMM dimensions must be >= 1, got m={m} n={n} k={k}")
    eff = gpu.efficiency
    compute_curve, memory_curve, floor_us = eff.gemm_terms(dtype)
    dtype = parse_dtype(dtype)
    bpe = bytes_per_element(dtype)
    bpe_b = bpe if weight_dtype is None else bytes_per_element(parse_dtype(weight_dtype))
    out_bpe = bytes_per_element(output_dtype(dtype))
    flops = 2.0 * m * n * k
    peak_per_sm = gpu.peak_flops(dtype) / gpu.sm_count
    compute_eff = compute_curve.at(flops)
    concurrent = gpu.sm_count * eff.ctas_per_sm
    operands = m * k * bpe + k * n * bpe_b
    compulsory = operands + m * n * out_bpe
    fits_in_l2 = operands <= gpu.l2_bytes * L2_RESIDENT_FRACTION
    mem_bw = gpu.memory_bandwidth * memory_curve.at(compulsory)
    split_overhead = eff.gemm_split_k_overhead_us * 1e-6

    best: tuple[float, float, float, float, float] | None = None
    for tm, tn in TILE_SHAPES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        for split in SPLIT_K_FACTORS:
            if split > 1 and (tiles * split > 2 * concurrent or k // split < 256):
                continue
            k_part = math.ceil(k / split)
            waves = math.ceil(tiles * split / concurrent)
            compute = waves * 2.0 * tm * tn * k_part / (peak_per_sm * compute_eff)
            partials = 0.0 if split == 1 else 2 * m * n * split * 4.0  # fp32 workspace
            if fits_in_l2:
                dram = compulsory + partials
            else:
                dram = (
                    _wave_traffic(m, n, k, tm, tn, concurrent, bpe, bpe_b)
                    + m * n * out_bpe
                    + partials
                )
            l2 = tiles * split * (tm * bpe + tn * bpe_b) * k_part + m * n * out_bpe
            # Tensor-core kernels stage tiles through shared memory and (on Hopper) TMA
            # multicast, so L2 bandwidth shapes DRAM reuse but is not the binding roof.
            # Split-K pays for reducing its partial sums (a second pass) on top.
            extra = split_overhead if split > 1 else 0.0
            total = max(compute, dram / mem_bw) + extra
            if best is None or total < best[0]:
                best = (total, compute, dram, l2, extra)
    assert best is not None
    total, compute, dram, l2, extra = best
    floor = floor_us * 1e-6 + extra
    return OpCost(
        name="gemm",
        seconds=total + floor_us * 1e-6,
        flops=flops,
        dram_bytes=dram,
        l2_bytes=l2,
        bound=classify(compute, dram / mem_bw, 0.0, floor),
        compute_seconds=compute,
        memory_seconds=dram / mem_bw,
        overhead_seconds=floor,
    )
