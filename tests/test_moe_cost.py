"""The fused MoE layer's cost: routing occupancy, one kernel floor, weights read only for
activated experts, expert parallelism, weight formats."""

from __future__ import annotations

import numpy as np
import pytest

from hardware_models import InfersimError, load_gpu
from hardware_models.efficiency import MOE_FORMATS
from hardware_models.moe import (
    BLOCK_MS,
    MoeLayer,
    MoeShape,
    Routing,
    expert_load,
    marlin_stream_s,
    moe_cost,
    tile_share,
    triton_warp_tile,
    unaligned_sector,
    wna16_block_m,
    wna16_rates,
    wna16_stream_s,
)

H100 = load_gpu("h100-sxm")
DSV3 = {"hidden_size": 7168, "inter_size": 2048, "topk": 8, "num_experts": 256}


def _monte_carlo(tokens: int, topk: int, experts: int, ep: int, draws: int = 400):
    """Seeded draws of uniform top-k routing: (active, pairs, tiles per BLOCK_M) on the
    slowest of the ep ranks (the largest of each over the ranks, per draw)."""
    rng = np.random.default_rng(0)
    local = -(-experts // ep)
    out = np.zeros((draws, 2 + len(BLOCK_MS)))
    for d in range(draws):
        keys = rng.random((tokens, experts))
        chosen = np.argpartition(keys, topk, axis=1)[:, :topk]
        counts = np.bincount(chosen.ravel(), minlength=local * ep).reshape(ep, local)
        out[d, 0] = (counts > 0).sum(axis=1).max()
        out[d, 1] = counts.sum(axis=1).max()
        out[d, 2:] = [np.ceil(counts / b).sum(axis=1).max() for b in BLOCK_MS]
    return out.mean(axis=0), out.std(axis=0) / np.sqrt(draws)


@pytest.mark.parametrize(
    ("tokens", "experts", "ep", "rel"),
    [(1, 64, 1, 0.01), (8, 64, 1, 0.01), (1024, 64, 1, 0.01),
     (32, 64, 8, 0.04), (200, 64, 4, 0.04),
     (1, 256, 8, 0.04), (8, 256, 8, 0.04), (32, 256, 8, 0.04), (256, 256, 8, 0.04)],
)  # fmt: skip
def test_balanced_occupancy_matches_monte_carlo(tokens, experts, ep, rel):
    """E (1 - (1 - k/E)^T) activated experts and the binomial tile counts agree with a
    seeded Monte Carlo draw to within 4 standard errors and 1% of the value; with ep > 1
    the slowest rank's (the expected maximum over the ranks), to within 4%: the closed
    form takes experts and ranks as independent, where the draws' loads are slightly
    negatively correlated (a token's k experts are distinct, the pairs add up to T k)."""
    load = expert_load(tokens, 8, experts, ep, Routing("balanced"))
    mean, sem = _monte_carlo(tokens, 8, experts, ep)
    expected = np.array([load.active, load.pairs, *load.tiles])
    tolerance = 4 * sem + rel * np.abs(mean) + 1e-9
    assert np.all(np.abs(expected - mean) <= tolerance), (expected, mean, tolerance)


def test_the_slowest_rank_not_the_mean_one_is_priced():
    """DeepSeek-V3 over 8 EP ranks, one token: the mean rank holds 1 of the 8 experts it
    activates, but the slowest of the 8 holds ~2.6 (seeded draws), and the step waits
    for it."""
    load = expert_load(1, 8, 256, 8, Routing("balanced"))
    assert 2.3 < load.active < 2.8 and 2.3 < load.pairs < 2.8
    assert expert_load(256, 8, 256, 8, Routing("balanced")).active == pytest.approx(32, 1e-3)
    layer = MoeLayer(H100, MoeShape(**DSV3, ep=8), "balanced")
    slowest, mean = layer.parts(1).seconds[0], layer.parts(1, slowest=False).seconds[0]
    assert layer.cost(1).seconds == slowest > 1.2 * mean


def test_round_robin_spreads_pairs_evenly():
    load = expert_load(4, 8, 256, 8, Routing("round_robin"))  # 32 pairs, 4 on rank 0
    assert load.active == 4 and load.pairs == 4
    full = expert_load(4096, 8, 256, 1, Routing("round_robin"))  # 128 rows per expert
    assert full.active == 256 and full.tiles[BLOCK_MS.index(128)] == 256


def test_power_law_is_skewed_and_keeps_every_pair():
    load = expert_load(4096, 8, 256, 1, Routing("power_law", 1.2))
    assert load.pairs == 4096 * 8
    assert load.max_rows > 10 * load.pairs / 256  # one expert far above the mean
    ranked = expert_load(4096, 8, 256, 8, Routing("power_law", 1.2))
    assert ranked.pairs > 4096 * 8 / 8  # the rank priced is the most loaded one


def test_one_kernel_floor_not_one_per_expert():
    """Doubling the experts that run leaves the fixed cost where it is."""
    few = MoeLayer(H100, MoeShape(**{**DSV3, "num_experts": 16}), "round_robin")
    many = MoeLayer(H100, MoeShape(**{**DSV3, "num_experts": 256}), "round_robin")
    assert few.floor_s == many.floor_s
    tiny = moe_cost(H100, num_tokens=1, **DSV3, ep=256)
    assert tiny.overhead_seconds == few.floor_s
    assert tiny.overhead_seconds < 100e-6  # not 256 launches


def test_weights_read_only_for_activated_experts():
    """One token activates top-k experts: the weight bytes are theirs, not all 256."""
    cost = moe_cost(H100, num_tokens=1, **DSV3, routing="round_robin", include_routing=False)
    per_expert = 3 * 7168 * 2048 * 2.0
    assert 8 * per_expert <= cost.dram_bytes < 9 * per_expert
    full = moe_cost(H100, num_tokens=4096, **DSV3, routing="round_robin")
    assert full.dram_bytes > 256 * per_expert


def test_time_grows_with_tokens():
    layer = MoeLayer(H100, MoeShape(**DSV3, ep=8), "balanced")
    tokens = np.array([1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384])
    seconds = layer.parts(tokens).seconds
    assert np.all(np.diff(seconds) > 0)


def test_step_lookup_gives_the_layers_own_prices():
    layer = MoeLayer(H100, MoeShape(**DSV3, ep=8), "balanced")
    for tokens in (0, 1, 255, 256, 3000):
        parts, work = layer.parts(tokens), layer.parts(tokens, slowest=False)
        assert layer.step(tokens) == (
            float(parts.seconds[0]),
            float(work.flops[0]),
            float(work.dram_bytes[0]),
        )


def test_expert_parallelism_reduces_each_ranks_experts():
    one = moe_cost(H100, num_tokens=64, **DSV3, ep=1)
    eight = moe_cost(H100, num_tokens=64, **DSV3, ep=8)
    assert eight.flops == pytest.approx(one.flops / 8, rel=0.01)  # the mean rank's work
    assert eight.seconds < one.seconds / 4


def test_weight_formats_scale_the_bytes():
    """fp8 weights are half of bf16's bytes and int4 a quarter (plus their scales)."""
    args = {**DSV3, "num_tokens": 1, "routing": "round_robin", "include_routing": False}
    weights = {}
    for fmt in ("bf16", "fp8", "fp8_block", "int4_wo"):
        layer = MoeLayer(H100, MoeShape(**DSV3, moe_format=fmt), "round_robin")
        weights[fmt] = layer.weight_bpe
        assert moe_cost(H100, **args, moe_format=fmt).flops == pytest.approx(
            2 * 8 * 3 * 7168 * 2048
        )
    assert weights["fp8"] == weights["bf16"] / 2
    assert weights["fp8"] < weights["fp8_block"] < 1.001 * weights["fp8"]
    assert weights["bf16"] / 4 < weights["int4_wo"] < weights["bf16"] / 3.8


def test_marlin_is_stream_k_with_a_serial_reduction():
    """Marlin splits m blocks x n tiles x k tiles evenly over the grid: the streaming
    time follows the total work, and the thread blocks sharing a slice reduce it one
    after another, so an m block costs more when few of them share the SMs."""
    fmt = MOE_FORMATS["int4_wo"]
    n, k, pairs = np.array([4096.0]), np.array([7168.0]), np.array([4096.0])

    def stream(tiles: float, cta_s: float, per_byte: float) -> float:
        args = (132, 16, np.array([tiles]), n, k, pairs, fmt, cta_s, per_byte)
        return float(marlin_stream_s(*args)[0])

    # Streaming alone: 32 n tiles x 56 k tiles per m block over 132 x 4 thread blocks.
    assert stream(64, 0.0, 1e-10) == pytest.approx(8 * stream(8, 0.0, 1e-10), rel=0.05)
    # Reduction alone: 2 m blocks leave 8 thread blocks per slice, 64 leave 1.
    assert stream(2, 1e-6, 0.0) == pytest.approx(8e-6)
    assert stream(64, 1e-6, 0.0) == pytest.approx(1e-6)
    assert stream(0, 1e-6, 1e-10) == 0.0


def test_wna16_kernel_and_block_by_vllms_rule():
    """fused_experts runs the CUDA WNA16 kernel while tokens x top-k / local experts is at
    most 6 (min(16, tokens) rows a block), else Triton's with 16 / 32 / 64 rows up to
    20 / 40 / more tokens."""
    tokens = np.array([1, 3, 4, 16, 20, 21, 40, 41, 4096])
    cuda, block = wna16_block_m(tokens, 2, 1)
    assert cuda.tolist() == [True, True, False, False, False, False, False, False, False]
    assert [BLOCK_MS[b] for b in block] == [8, 8, 16, 16, 16, 32, 32, 64, 64]
    # Mixtral's 8 experts, top-2: the CUDA kernel up to 24 tokens.
    cuda, block = wna16_block_m(np.array([8, 16, 24, 25]), 2, 8)
    assert cuda.tolist() == [True, True, True, False]
    assert [BLOCK_MS[b] for b in block] == [8, 16, 16, 32]


def test_wna16_dequantises_per_m_block():
    """Neither WNA16 kernel keeps dequantised weights between m blocks: Triton's time is
    its busiest SM's programs x k steps x tile, with no k step faster than a lone
    program's; the CUDA kernel's the m blocks' elements and each row's multiply-adds."""
    fmt = MOE_FORMATS["int4_wna16"]
    rates = wna16_rates(H100, fmt, "int4_wna16")
    n, k = np.array([28672.0]), np.array([4096.0])  # Mixtral's gate|up

    def triton(tiles: float, tokens: float = 64.0) -> float:
        args = (132, np.array([tokens]), np.array([False]), np.array([tiles]), np.array([tiles]))
        return float(wna16_stream_s(*args, n, k, fmt, rates)[0])

    # 8 m blocks x 448 programs of 64 columns: 28 on the busiest SM, 128 k steps of 32.
    assert triton(8.0) == pytest.approx(28 * 128 * 64 * 32 * fmt.weight_bytes * rates.triton_byte)
    assert triton(16.0) == pytest.approx(triton(8.0) * 55 / 28)  # twice the blocks
    lone = rates._replace(lone_step=1e-6)
    one = (132, np.array([64.0]), np.array([False]), np.array([1.0]), np.array([1.0]), n, k)
    assert float(wna16_stream_s(*one, fmt, lone)[0]) == pytest.approx(128e-6)
    cuda = (132, np.array([4.0]), np.array([True]), np.array([8.0]), np.array([8.0]), n, k)
    per_sm = 28672 * 4096 / 132
    expected = (8 * fmt.weight_bytes * rates.cuda_byte + 8 * rates.row_element) * per_sm
    assert float(wna16_stream_s(*cuda, fmt, rates)[0]) == pytest.approx(expected)
    # Unfitted: 16 lane instructions per element at 128 lanes a clock, 1980 MHz.
    assert rates.triton_byte == pytest.approx(16 / (128 * 1.98e9) / fmt.weight_bytes)


def test_wna16_layer_is_flat_while_each_expert_fits_one_block():
    """Mixtral (8 experts, top-2) in WNA16: from 32 to 256 tokens each expert's rows fit
    one 64-row block and the layer costs about the same (the H100 table: 1.71-1.75 ms);
    from 320 tokens two blocks, about twice (3.34 ms)."""
    shape = {"hidden_size": 4096, "inter_size": 14336, "topk": 2, "num_experts": 8}
    layer = MoeLayer(H100, MoeShape(**shape, moe_format="int4_wna16"), "round_robin")
    seconds = layer.parts(np.array([48, 256, 320])).seconds
    assert seconds[1] == pytest.approx(seconds[0], rel=0.05)
    assert seconds[2] == pytest.approx(2 * seconds[1], rel=0.1)


def test_thin_triton_tiles_run_the_warp_mma_on_hopper():
    """Triton gives Hopper's warpgroup MMA only tiles of a multiple of 64 rows: a 16- or
    32-row bf16 tile is a warp MMA fed from shared memory, capped as on the A100 (where
    64-row tiles are capped too); 64 and 128 rows, 8-bit tiles and Marlin's are not
    capped on the H100."""
    bf16, fp8, int4 = (MOE_FORMATS[k] for k in ("bf16", "fp8", "int4_wo"))
    assert tile_share(H100, bf16, 16) < tile_share(H100, bf16, 32) < 1.0
    assert tile_share(H100, bf16, 64) == tile_share(H100, bf16, 128) == 1.0
    assert tile_share(H100, fp8, 16) == tile_share(H100, int4, 16) == 1.0
    a100 = load_gpu("a100-80gb-sxm")
    assert tile_share(a100, bf16, 64) < 1.0  # on Ampere at 64 rows too


def test_triton_splits_a_warp_mma_tile_over_its_warps_as_its_compiler_does():
    """AccelerateMatmul's warpsPerTileV2 with 4 warps: thin tiles spread their warps
    along n (16 x 128 in 16 x 32 warps), square ones along both."""
    assert triton_warp_tile(16, 128) == (16, 32)
    assert triton_warp_tile(32, 128) == (32, 32)
    assert triton_warp_tile(64, 128) == (32, 64)
    assert triton_warp_tile(128, 128) == (64, 64)
    assert triton_warp_tile(64, 64, warps=8) == (16, 32)


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80gb-sxm"])
def test_rows_triton_cannot_vectorise_are_read_a_sector_per_element(gpu):
    """Nemotron's 1856-wide experts split 32 ways leave the down projection rows of 58
    elements, which Triton cannot prove 16-aligned: that layer costs more than the
    one of 2048-wide experts (64 columns, more bytes) by half on either chip."""
    assert unaligned_sector(np.array([58, 64, 116, 2048])).tolist() == [32.0, 0.0, 32.0, 0.0]
    spec = load_gpu(gpu)
    nemotron = {"hidden_size": 2688, "topk": 6, "num_experts": 128, "tp": 32}
    odd = moe_cost(spec, num_tokens=4096, inter_size=1856, **nemotron).seconds
    even = moe_cost(spec, num_tokens=4096, inter_size=2048, **nemotron).seconds
    assert odd > 1.5 * even


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"moe_format": "int3"}, "unknown MoE weight format"),
        ({"routing": "zipf"}, "unknown MoE routing"),
        ({"routing": "power_law"}, "alpha > 1"),
        ({"ep": 512}, "exceeds num_experts"),
        ({"tp": 3}, "not divisible by tp"),
    ],
)
def test_bad_input_is_one_line_error(kwargs, message):
    with pytest.raises(InfersimError, match=message):
        moe_cost(H100, num_tokens=8, **{**DSV3, **kwargs})
