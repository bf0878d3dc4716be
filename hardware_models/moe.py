"""A fused mixture-of-experts layer as vLLM runs it, priced for one rank's share.

vLLM's fused_moe (Triton, or Marlin for 4-bit weights; `fused_experts` called with
4-bit weights directly runs its WNA16 kernels instead) runs one short kernel sequence
for the whole layer, however many experts there are: align the (token, expert) pairs
into blocks of BLOCK_M rows per expert, [quantise the activations], one grouped GEMM
for gate and up over every block, the activation (SiLU x up), [quantise], one grouped
GEMM for down, and the top-k weighted sum. So the layer pays one sequence's fixed cost,
not one per expert, and it reads the weights of the experts that receive a token only.
MXFP4 experts (gpt-oss) may run another library's kernels (hardware_models.mxfp4_moe):
OpenAI's matmul_ogs or FlashInfer's TRT-LLM MoE, the same sequence with the activation
fused into gate|up's epilogue and the 4-bit weights widened on the CUDA cores.

A grouped GEMM's work follows its tiles: expert e's n_e rows fill ceil(n_e / BLOCK_M)
row tiles, so the time depends on how the T x top-k choices spread over the experts
(`Routing`): the expected number of experts activated, the rows each gets, the padding
of each expert's last tile. With expert parallelism a rank holds E / ep experts and
still sees every token of its group (vLLM's all-gather dispatch): the pairs routed to
other ranks' experts cost no GEMM work but the intermediate buffers are sized T x top-k
(their tiles write zeros, the activation and the combine run over every pair), which
at 16k tokens over 256 ranks is most of the time on the public H100 table.

Costs are closed form over the token count (the routing's expected loads memoised per
count, power-law ones from seeded draws of the tables' generator) and vectorised over
arrays of layers: the simulator prices a layer every engine step (MoeLayer.step and
moe_cost price 256 token counts in one pass and look them up), a calibration fit whole
tables at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.block_scaling import HOPPER, WARP_MMA_FAMILIES, gemm_family
from hardware_models.dtypes import parse_dtype
from hardware_models.efficiency import MOE_FORMATS, MoeFormat, moe_format_key
from hardware_models.errors import InfersimError
from hardware_models.gemm import shared_memory_share
from hardware_models.op_cost import OpCost, classify

# Rows of a grouped-GEMM tile: Triton's tuned configurations pick among 16-128 per token
# count (the model keeps the fastest, as the tuning did); Marlin takes 8-64 by a rule.
BLOCK_MS: tuple[int, ...] = (8, 16, 32, 48, 64, 128)
TRITON_BLOCK_MS: tuple[int, ...] = (16, 32, 64, 128)
MARLIN_BLOCK_MS: tuple[int, ...] = (8, 16, 32, 48, 64)
# Columns of a tile: how many thread blocks share a row tile, and how many times a routed
# activation row is read from L2.
BLOCK_N = 128
# Triton runs Hopper's warpgroup MMA only on tiles of a multiple of 64 rows (its
# AccelerateMatmul pass: MMA v3 wants M % 64 == 0 and warps in fours); a thinner tile's
# dot is the warp MMA, its operands loaded from shared memory by every warp as before
# Hopper, which caps its math (gemm.shared_memory_share).
WGMMA_ROWS = 64
# Seeded draws of the power-law generator averaged per token count (the tables average 5).
POWER_LAW_DRAWS = 16
# Token counts MoeLayer.step prices in one array pass.
STEP_CHUNK = 256
# Bytes of one routing logit and of one (expert id, weight) pair the top-k kernel writes.
LOGIT_BYTES = 4.0
TOPK_PAIR_BYTES = 8.0
# Bytes a quantisation pass moves per element: read 16-bit, write 8-bit.
QUANT_PASS_BYTES = 3.0
ROUTING_KINDS = ("balanced", "round_robin", "power_law")
# Bytes of one L2 sector, what unaligned_sector charges per operand element.
SECTOR_BYTES = 32.0


class Routing(NamedTuple):
    """How the T x top-k choices spread over the experts.

    - balanced: each token picks top-k distinct experts uniformly at random (a router
      balanced in expectation, as load-balancing losses aim for): an expert is hit by
      Binomial(T, k / E) tokens, so T tokens activate E (1 - (1 - k/E)^T) of them.
    - round_robin: the pairs are dealt evenly by a stride over the experts, min(E, T k)
      experts with loads that differ by at most one, expert 0 always among them (the
      public tables' "balanced" rows, aiconfigurator's generator).
    - power_law: expert loads follow a truncated power law of exponent `alpha` (the
      tables' "power_law_<alpha>" rows): loads drawn on [1, 0.8 T] when T k > E, else on
      [0.01, 2], scaled to T k pairs, averaged over seeded draws of the tables' own
      generator; with expert parallelism the rank priced is the most loaded one, as the
      slowest rank sets the step.
    """

    kind: str = "balanced"
    alpha: float = 0.0

    @classmethod
    def parse(cls, value: Routing | str, alpha: float | None = None) -> Routing:
        """A Routing from its name ("power_law_1.2" carries its alpha), or an error."""
        if isinstance(value, Routing):
            return value
        text = str(value).strip().lower()
        allowed = f"allowed: {', '.join(ROUTING_KINDS)} (power_law as power_law_<alpha>, alpha > 1)"
        if text.startswith("power_law_"):
            try:
                text, alpha = "power_law", float(text.removeprefix("power_law_"))
            except ValueError:
                raise InfersimError(
                    f"unknown MoE routing {value!r}: its alpha is not a number; {allowed}"
                ) from None
        if text not in ROUTING_KINDS:
            raise InfersimError(f"unknown MoE routing {value!r}; {allowed}")
        if text == "power_law":
            if alpha is None or not alpha > 1.0:
                raise InfersimError(
                    f"power_law routing needs alpha > 1, got {alpha} (e.g. power_law_1.2)"
                )
            return cls("power_law", float(alpha))
        return cls(text, 0.0)


class ExpertLoad(NamedTuple):
    """Expected work on one rank: experts activated, (token, expert) pairs, and the row
    tiles of each BLOCK_MS (the sum over its experts of ceil(n_e / BLOCK_M))."""

    active: float
    pairs: float
    tiles: tuple[float, ...]
    max_rows: float  # rows of the most loaded expert on the rank


def local_experts(num_experts: int, ep: int) -> int:
    """Experts on the first (largest) EP rank: vLLM gives the remainder to the first."""
    return math.ceil(num_experts / ep)


@lru_cache(maxsize=16384)
def expert_load(
    tokens: int, topk: int, num_experts: int, ep: int, routing: Routing, slowest: bool = True
) -> ExpertLoad:
    """The expected ExpertLoad of the rank priced (see Routing) for `tokens` tokens; under
    balanced routing over ep > 1 ranks the slowest one's, or the mean one's when not
    `slowest` (the useful work per rank)."""
    local = local_experts(num_experts, ep)
    if tokens <= 0:
        return ExpertLoad(0.0, 0.0, tuple(0.0 for _ in BLOCK_MS), 0.0)
    if routing.kind == "balanced" and ep > 1 and slowest:
        return slowest_rank_load(tokens, topk, num_experts, ep)
    if routing.kind == "balanced":
        p = topk / num_experts
        # E[ceil(n / B)] = sum over j >= 0 of P(n > j B), n ~ Binomial(tokens, p).
        pmf = _binomial_pmf(tokens, p)
        sf = np.cumsum(pmf[::-1])[::-1] - pmf  # P(n > x)
        tiles = tuple(local * float(sf[::b].sum()) for b in BLOCK_MS)
        active = local * (1.0 - (1.0 - p) ** tokens)
        # The most loaded of `local` experts: the load its rank among them reaches.
        most = float(np.searchsorted(1.0 - sf, local / (local + 1.0)))
        return ExpertLoad(active, local * tokens * p, tiles, most)
    loads = _loads(tokens, topk, num_experts, ep, routing)  # one row per draw
    tiles = tuple(float(np.ceil(loads / b).sum(axis=1).mean()) for b in BLOCK_MS)
    return ExpertLoad(
        float((loads > 0).sum(axis=1).mean()),
        float(loads.sum(axis=1).mean()),
        tiles,
        float(loads.max(axis=1).mean()),
    )


# ---- the slowest of ep ranks under balanced routing ----------------------------------
def slowest_rank_load(tokens: int, topk: int, num_experts: int, ep: int) -> ExpertLoad:
    """Balanced routing's ExpertLoad of the most loaded of `ep` ranks, which sets the step
    (every rank waits for the combine): the expected maximum over the ranks of their
    activated experts, their (token, expert) pairs and their row tiles, each a rank's sum
    over its experts. An expert's load is Binomial(tokens, topk / num_experts); a rank's
    sum is the `local`-fold convolution of it (activated experts: Binomial(local, q)),
    taken as independent between experts and between ranks, and E[max] = sum over x of
    1 - F(x)^ep. Against 300 seeded draws of DeepSeek-V3's routing (E=256, k=8, ep=8) the
    slowest rank's experts are 2.54 / 10.6 / 24.2 at 1 / 8 / 32 tokens (draws 2.61 / 10.7
    / 24.1; the mean rank's 1.0 / 7.2 / 20.4), pairs within 3% (tests/test_moe_cost.py)."""
    local = local_experts(num_experts, ep)
    p = topk / num_experts
    hit = _binomial_pmf(local, 1.0 - (1.0 - p) ** tokens)  # activated experts of a rank
    active = float(np.sum(1.0 - np.minimum(np.cumsum(hit)[:local], 1.0) ** ep))
    per_expert = _binomial_pmf(tokens, p)
    rows = np.arange(len(per_expert))
    pairs = _expected_max_of_sums(per_expert, local, ep)
    tiles = tuple(
        _expected_max_of_sums(np.bincount(-(-rows // b), weights=per_expert), local, ep)
        for b in BLOCK_MS
    )
    # The most loaded of the rank's experts: the load its rank among them reaches.
    top = float(np.searchsorted(np.cumsum(per_expert), local / (local + 1.0)))
    return ExpertLoad(active, pairs, tiles, top)


def _binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(X = x), X ~ Binomial(n, p), for x from 0 to 15 standard deviations past the mean
    (the rest is below 1e-15); log C(n, x) as a running sum, as (1 - p)^n underflows at
    thousands of tokens."""
    top = min(n, int(n * p + 15 * math.sqrt(n * p * (1 - p)) + 2))
    x = np.arange(top + 1, dtype=float)
    if p >= 1.0:
        return (x == n).astype(float)
    log_choose = np.concatenate(([0.0], np.cumsum(np.log(n - x[:-1]) - np.log(x[:-1] + 1))))
    return np.exp(log_choose + x * math.log(p) + (n - x) * math.log1p(-p))


def _expected_max_of_sums(pmf: np.ndarray, count: int, ep: int) -> float:
    """E[max of `ep` independent sums of `count` independent draws from `pmf` (on 0, 1,
    ...)]: the sum's pmf by FFT convolution, then sum over x of 1 - F(x)^ep."""
    support = (len(pmf) - 1) * count + 1
    size = 1 << (support - 1).bit_length()
    total = np.fft.irfft(np.fft.rfft(pmf, size) ** count, size)[:support]
    total = np.clip(total, 0.0, None)
    cdf = np.minimum(np.cumsum(total / total.sum())[:-1], 1.0)
    return float(np.sum(1.0 - cdf**ep))


# ---------------------------------------------------------------------------------------


def _loads(tokens: int, topk: int, num_experts: int, ep: int, routing: Routing) -> np.ndarray:
    """Rows per expert of the rank priced (one row per draw) for round_robin and
    power_law routing."""
    local = local_experts(num_experts, ep)
    if routing.kind == "round_robin":
        return _round_robin_loads(tokens, topk, num_experts, local)[None, :]
    return _power_law_loads(tokens, topk, num_experts, ep, routing.alpha)


def _round_robin_loads(tokens: int, topk: int, num_experts: int, local: int) -> np.ndarray:
    """Rows per expert of the first rank's `local` experts as aiconfigurator's balanced
    generator deals them (collector helper.py, balanced_logits): token i takes experts
    i + j x stride (stride = ceil(E / top-k), j < top-k), or, with fewer tokens than
    the stride, i x stride / T + j x stride, spreading them over the experts. So one
    token already activates expert 0, on the rank timed: an EP rank is never idle."""
    stride = math.ceil(num_experts / topk)
    i = np.arange(tokens, dtype=float)[:, None]
    j = np.arange(topk, dtype=float)[None, :]
    start = i if tokens >= stride else i * stride / tokens
    chosen = np.floor((start + j * stride) % num_experts).astype(np.int64)
    return np.bincount(chosen.ravel(), minlength=num_experts)[:local].astype(float)


def _power_law_loads(tokens: int, topk: int, num_experts: int, ep: int, alpha: float):
    """Rows per expert of the most loaded rank, as aiconfigurator's generator draws them
    (collector/helper.py, power_law_logits_v3): loads from a power law truncated to
    [1, 0.8 T] when T k > E, else [0.01, 2], scaled to T k pairs and rounded, the
    rounding's remainder given to the largest (or taken from the smallest); the rank
    with the most
    pairs is the one timed. One row per seeded draw (POWER_LAW_DRAWS, the same seed
    every call: the same answer in any order)."""
    pairs = tokens * topk
    local = local_experts(num_experts, ep)
    lo, hi = (1.0, 0.8 * tokens) if pairs > num_experts else (0.01, 2.0)
    hi = max(hi, lo * (1 + 1e-9))
    rng = np.random.default_rng(0)
    u = rng.random((POWER_LAW_DRAWS, num_experts))
    a = 1.0 - alpha
    x = ((hi**a - lo**a) * u + lo**a) ** (1.0 / a)
    loads = np.round(x / x.sum(axis=1, keepdims=True) * pairs)
    out = np.zeros((POWER_LAW_DRAWS, local))
    padded = np.zeros(local * ep)
    for d in range(POWER_LAW_DRAWS):
        row = loads[d]
        # Most loaded first; ties (at small T most loads round to 0) in no set order,
        # here by the unrounded draw: which experts take the remainder is random.
        order = np.lexsort((-x[d], -row))
        delta = int(pairs - row.sum())
        if delta > 0:
            row[order[:delta]] += 1
        elif delta < 0:
            last = order[::-1][:-delta]
            short = row[last] <= 0
            row[last[~short]] -= 1
            row[np.argmax(row)] -= short.sum()
        padded[:num_experts] = row
        groups = padded.reshape(ep, local)
        out[d] = groups[np.argmax(groups.sum(axis=1))]
    return out


@dataclass(frozen=True)
class MoeShape:
    """One MoE layer as a rank runs it (see moe_cost for the fields)."""

    hidden_size: int
    inter_size: int
    topk: int
    num_experts: int
    tp: int = 1
    ep: int = 1
    moe_format: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "inter_size", "topk", "num_experts", "tp", "ep"):
            if getattr(self, name) < 1:
                raise InfersimError(f"MoE {name} must be >= 1, got {getattr(self, name)}")
        if self.topk > self.num_experts:
            raise InfersimError(f"MoE topk ({self.topk}) exceeds num_experts ({self.num_experts})")
        if self.ep > self.num_experts:
            raise InfersimError(
                f"MoE ep ({self.ep}) exceeds num_experts ({self.num_experts}): a rank "
                "would hold no expert"
            )
        if self.inter_size % self.tp:
            raise InfersimError(
                f"MoE inter_size {self.inter_size} is not divisible by tp {self.tp}"
            )
        object.__setattr__(self, "moe_format", moe_format_key(self.moe_format))


class MoeParts(NamedTuple):
    """A layer's time term by term (numpy arrays over token counts)."""

    seconds: np.ndarray
    compute_s: np.ndarray  # grouped-GEMM time where the tile math binds
    memory_s: np.ndarray  # grouped-GEMM time where the DRAM traffic binds
    l2_s: np.ndarray  # grouped-GEMM time where the thread blocks' panel streams bind
    pass_s: np.ndarray  # activation, quantisation, combine and routing passes
    floor_s: float  # the kernel sequence's fixed cost
    flops: np.ndarray  # useful FLOPs of both grouped GEMMs
    rows_per_expert: np.ndarray  # mean rows of an activated expert (the compute curve's axis)
    gemm_bytes: np.ndarray  # DRAM bytes of both grouped GEMMs (the memory curve's axis)
    dram_bytes: np.ndarray
    l2_bytes: np.ndarray


def tile_share(gpu: AcceleratorSpec, fmt: MoeFormat, block: int) -> float:
    """The share of the tensor peak a Triton tile of `block` rows x BLOCK_N can reach.
    Before Hopper each warp loads its operands from shared memory, which caps a thin
    tile's math (gemm.shared_memory_share); on Hopper so do 16-bit tiles too thin for
    the warpgroup MMA (WGMMA_ROWS). 8-bit tiles on Hopper are left uncapped: Triton
    promotes their operands to 16 bits for the warp MMA, and pricing that made the
    H100's 8-bit fits worse (benchmarks/README.md, "Warp-MMA pass"). Marlin's tiles are
    its own (1), and so are matmul_ogs's on Hopper (the weights fill the MMA's rows)."""
    family = gemm_family(gpu)
    thin = family == HOPPER and block % WGMMA_ROWS != 0 and fmt.act_bytes == 2.0
    # matmul_ogs swaps the operands on Hopper: the widened weights are the MMA's 64-row
    # side, the tokens its narrow one, so thin token tiles keep the warpgroup MMA.
    thin = thin and not fmt.matmul_ogs
    if fmt.marlin or not (family in WARP_MMA_FAMILIES or thin):
        return 1.0
    peak = gpu.peak_flops(parse_dtype(fmt.compute_dtype))
    return shared_memory_share(
        block,
        BLOCK_N,
        fmt.act_bytes,
        fmt.weight_bytes,
        peak / gpu.sm_count,
        gpu.shared_memory_bandwidth_per_sm,
        triton_warp_tile(block, BLOCK_N),
    )


def triton_warp_tile(block_m: int, block_n: int, warps: int = 4) -> tuple[int, int]:
    """A warp's part of a Triton warp-MMA tile (AccelerateMatmul's warpsPerTileV2):
    warps are doubled along m while m / 16 per warp is at least n / 16 per warp, else
    along n, until there are `warps` (4, what vLLM's configurations mostly give a
    tile; 16 x 128 runs in 16 x 32 warps where CUTLASS's split would be 16 x 64)."""
    wm, wn = 1, 1
    while wm * wn < warps:
        if block_m // 16 // wm >= block_n // 16 // wn and wm < block_m // 16:
            wm *= 2
        else:
            wn *= 2
    return block_m // wm, block_n // wn


def marlin_block_m(tokens, topk, local) -> np.ndarray:
    """vLLM's Marlin BLOCK_M rule: the first of 8, 16, 32, 48, 64 at which tokens x topk
    / the rank's experts / BLOCK_M falls below 0.9 (64 past them); the index of that
    size in BLOCK_MS per token count."""
    density = np.asarray(tokens, dtype=float) * topk / local
    chosen = np.full(density.shape, BLOCK_MS.index(MARLIN_BLOCK_MS[-1]))
    for block in reversed(MARLIN_BLOCK_MS):
        chosen = np.where(density / block < 0.9, BLOCK_MS.index(block), chosen)
    return chosen


def matmul_ogs_block_m(tokens, topk, num_experts) -> np.ndarray:
    """triton_kernels' BLOCK_M rule on NVIDIA GPUs (matmul_ogs_details/opt_flags.py,
    make_default_opt_flags_nvidia), from the rows per expert (tokens x top-k // experts,
    at least 1): up to 64, twice them to the next power of two in 16-64 (ragged and
    likely memory bound: fewer weight re-reads), else them to the next power of two in
    16-128; the index of that size in BLOCK_MS per token count."""
    per_expert = np.maximum(np.floor(np.asarray(tokens, dtype=float) * topk / num_experts), 1.0)
    low = np.clip(2.0 ** np.ceil(np.log2(2.0 * per_expert)), 16, 64)
    high = np.clip(2.0 ** np.ceil(np.log2(per_expert)), 16, 128)
    block = np.where(per_expert <= 64, low, high)
    return np.searchsorted(np.array(BLOCK_MS), block)


# What widening one MXFP4 weight to bf16 before a 16-bit MMA costs the CUDA cores
# (matmul_ogs on Hopper, FlashInfer's castBfloat16 kernels on Blackwell), in lane
# instructions; every row tile widens its expert's weights again. Taken from a published
# kernel time, not counted: a third-party write-up in the search corpus (TRT-LLM's
# `bmm_Bfloat16_MxE2m1Bfloat16_castBfloat16` kernels, the family FlashInfer's MoE runs)
# measures gpt-oss-120b's gate|up grouped GEMM on one B200 at 128 decoding sequences at
# 711.8 us a layer, 5x its 4-bit bytes' DRAM time; this rate reproduces it under this
# model's accounting (balanced routing: 125.7 experts of 5760 x 2880, one row tile each).
# Counted over that kernel's padded operand (5888 x 3072) it is 11.7. The conversion
# itself (e2m1 bit operations, the e8m0 scale) is a few instructions; the rest is what
# the write-up names: widened tiles take 4x the on-chip bytes, so the kernel runs
# smaller tiles and a shorter pipeline. Checked against measurements it was not taken
# from in benchmarks/README.md, "gpt-oss MXFP4 backends" (the write-up's whole layer,
# vLLM's matmul_ogs on an H100 and on 8 x H200).
MXFP4_UPCAST_INSTRUCTIONS = 12.8


def upcast_s(gpu: AcceleratorSpec, tiles, n, k) -> np.ndarray:
    """Seconds the CUDA cores take to widen the 4-bit weights of `tiles` row tiles of an
    n x k grouped GEMM, spread over the SMs (it runs alongside the asynchronous MMAs, so
    it binds only where it is the longer)."""
    return tiles * n * k * MXFP4_UPCAST_INSTRUCTIONS * sm_lane_seconds(gpu) / gpu.sm_count


# Marlin's MoE kernel configurations (vLLM csrc/moe/marlin_moe_wna16/ops.cu): one
# 16-row m block takes 128 x 128 (k x n) weight tiles and up to 4 thread blocks per SM,
# larger m blocks 64 x 256 tiles and up to 2; a width the first does not divide falls
# back to 128 columns.
MARLIN_SMALL = (128, 128, 4)
MARLIN_LARGE = (64, 256, 2)


def marlin_stream_s(
    sm_count: int,
    block: int,
    tiles: np.ndarray,
    n: np.ndarray,
    k: np.ndarray,
    all_pairs: np.ndarray,
    fmt: MoeFormat,
    cta_s: float,
    s_per_byte: float,
) -> np.ndarray:
    """Seconds of one Marlin grouped GEMM (`tiles` m blocks of `block` rows, n x k per
    expert) as its thread blocks run it. Marlin is stream-K: the grid (SMs x blocks per
    SM, fewer when there are few tokens) splits the m blocks x n tiles x k tiles evenly,
    each thread block streaming its share of k tiles (weights dequantised on the CUDA
    cores, activation rows) through its SM; the thread blocks that share one output
    slice then reduce it in turn through global memory, one fixed step each. Few
    activated experts leave many thread blocks per slice: a long serial reduction, which
    is why an expert's tile costs more when fewer experts share the SMs."""
    thread_k, thread_n, per_sm = MARLIN_SMALL if block <= 16 else MARLIN_LARGE
    thread_n = np.where(n % thread_n == 0, thread_n, BLOCK_N)
    n_tiles = np.ceil(n / thread_n)
    k_tiles = np.ceil(k / thread_k)
    # vLLM caps the blocks per SM where n tiles x tokens x top-k x 4 is below the grid.
    per_sm = np.clip(np.floor(n_tiles * all_pairs * 4 / sm_count), 1, per_sm)
    grid = sm_count * per_sm
    iters = np.ceil(tiles * n_tiles * k_tiles / grid)
    panel = (thread_n * fmt.weight_bytes + block * fmt.act_bytes) * thread_k
    # Thread blocks per slice: k_tiles / iters of them reduce one after another.
    chain = np.where(iters > 0, np.ceil(k_tiles / np.maximum(iters, 1)), 0.0)
    return iters * per_sm * panel * s_per_byte + chain * cta_s


# vLLM's WNA16 kernels (model_executor/layers/fused_moe/fused_moe.py, csrc/moe/
# moe_wna16.cu), which `fused_experts` runs for int4_w4a16 weights with a group size:
# the CUDA kernel while tokens x top-k / local experts <= 6 (should_moe_wna16_use_cuda),
# else Triton's fused_moe_kernel_gptq_awq. Their untuned tiles (get_default_config,
# get_moe_wna16_block_config): Triton BLOCK_M 16 / 32 / 64 up to 20 / 40 / more tokens,
# BLOCK_N x BLOCK_K 64 x 32 (32 x 64 for one token); the CUDA kernel min(16, tokens)
# rows, one thread a column, blocks split over k.
WNA16_CUDA_DENSITY = 6.0
WNA16_TRITON_TILES = ((16, 20), (32, 40), (64, math.inf))  # (BLOCK_M, up to tokens)
# Lane instructions per weight element, counted from Triton's WNA16 kernel: a byte load,
# shift and mask, int-to-float, the zero-point subtract, a scale load and its
# conversion, the multiply, the conversion to bf16 and the 64-bit pointer updates of both
# loads. Per element and row, the CUDA kernel's half2 subtract, multiply and
# multiply-add (two elements each), an activation load from shared memory and its float
# conversions and sums (2.5: 20 per 8 elements). The first sets only the unfitted rate
# (a count: the H100 table runs Triton's kernel at about half the rate it gives); the
# second prices the CUDA kernel's rows at the SM's issue rate, fitted or not.
WNA16_DEQUANT_INSTRUCTIONS = 16.0
WNA16_ROW_INSTRUCTIONS = 2.5


def wna16_block_m(tokens, topk, local) -> tuple[np.ndarray, np.ndarray]:
    """(whether the CUDA kernel runs, the index of its BLOCK_M in BLOCK_MS) per token
    count, by vLLM's rule (WNA16_CUDA_DENSITY, WNA16_TRITON_TILES). The CUDA kernel's
    min(16, tokens) rows hold any expert's rows in one block (an expert gets at most
    one row a token), as 8 or 16 do."""
    tokens = np.asarray(tokens, dtype=float)
    cuda = tokens * topk / local <= WNA16_CUDA_DENSITY
    triton = np.full(tokens.shape, BLOCK_MS.index(WNA16_TRITON_TILES[-1][0]))
    for block, most in reversed(WNA16_TRITON_TILES[:-1]):
        triton = np.where(tokens <= most, BLOCK_MS.index(block), triton)
    small = np.where(tokens <= 8, BLOCK_MS.index(8), BLOCK_MS.index(16))
    return cuda, np.where(cuda, small, triton)


def sm_lane_seconds(gpu: AcceleratorSpec) -> float:
    """Seconds an SM takes to issue one lane instruction on its CUDA cores."""
    return 2.0 / (gpu.fp32_flops_per_sm_per_clock * gpu.boost_clock_mhz * 1e6)


class Wna16Rates(NamedTuple):
    """What an SM takes in the WNA16 kernels (seconds): per weight byte dequantised by
    Triton's kernel and by the CUDA one, per element and row of the CUDA kernel's
    multiply-adds, and one k step of a Triton program alone on its SM."""

    triton_byte: float
    cuda_byte: float
    row_element: float
    lone_step: float


def wna16_rates(gpu: AcceleratorSpec, fmt: MoeFormat, moe_format: str) -> Wna16Rates:
    """The fitted WNA16 rates of `gpu`, or unfitted: Triton's dequantisation at its
    instruction count (WNA16_DEQUANT_INSTRUCTIONS), the CUDA kernel's the same, no lone
    step."""
    eff = gpu.efficiency
    lane = sm_lane_seconds(gpu)
    step_us, us_per_mb = eff.moe_tiles(moe_format)
    unfitted = WNA16_DEQUANT_INSTRUCTIONS * lane / fmt.weight_bytes
    triton = unfitted if us_per_mb is None else us_per_mb * 1e-12
    cuda = eff.moe_wna16_cuda_us_per_mb
    return Wna16Rates(
        triton,
        unfitted if cuda is None else cuda * 1e-12,
        WNA16_ROW_INSTRUCTIONS * lane,
        step_us * 1e-6,
    )


def wna16_stream_s(
    sm_count: int,
    tokens: np.ndarray,
    cuda: np.ndarray,
    tiles: np.ndarray,
    pairs: np.ndarray,
    n: np.ndarray,
    k: np.ndarray,
    fmt: MoeFormat,
    rates: Wna16Rates,
) -> np.ndarray:
    """Seconds of one WNA16 grouped GEMM (`tiles` m blocks, n x k per expert). Neither
    kernel keeps dequantised weights between m blocks: each block re-reads its expert's
    4-bit weights and re-dequantises them on the CUDA cores, so the time follows the
    weight elements x m blocks an SM handles, not the bytes the layer reads (Mixtral's
    layer takes the same 1.7 ms from 32 to 256 tokens, one 64-row block an expert, and
    twice that from 320). Triton: tiles x n / BLOCK_N programs looping over k in BLOCK_K
    steps, the busiest SM running ceil(programs / SMs) of them at its dequantisation
    rate, and no k step faster than one program alone on an SM takes (few programs: a
    rank holding one expert). CUDA: blocks split over k fill the SMs; each m block's
    elements at the kernel's own rate, plus every row's multiply-adds per element."""
    one = tokens <= 1
    block_n = np.where(one, 32, 64)
    block_k = np.where(one, 64, 32)
    waves = np.ceil(tiles * np.ceil(n / block_n) / sm_count)
    step = np.maximum(
        waves * block_n * block_k * fmt.weight_bytes * rates.triton_byte,
        np.where(tiles > 0, rates.lone_step, 0.0),
    )
    triton = np.ceil(k / block_k) * step
    on_cuda = (tiles * fmt.weight_bytes * rates.cuda_byte + pairs * rates.row_element) * (
        n * k / sm_count
    )
    return np.where(cuda, on_cuda, triton)


def unaligned_sector(k) -> np.ndarray:
    """L2 bytes charged per operand element of a grouped GEMM whose rows are `k`
    elements long: 0 when k is a multiple of 16 (vectorised loads, counted by the panel
    streams), else one 32-byte sector per element. Triton specialises an integer
    argument only on divisibility by 16, so a row stride it cannot prove so gets scalar
    loads; a warp's scalar loads of contiguous bf16 still coalesce into ~2 sectors per
    32 elements, so a sector per element is not the mechanism but an empirical bound:
    on the public H100 and A100 tables the down projections of experts split to 58, 116
    or 232 columns (Nemotron's, 8-32 ways) take about the same time on both chips (their
    L2 bandwidths are the same), 2-7x what their bytes would, and this bound, from the
    chips' L2 figures, matches that; the cause inside the kernel is not established."""
    return np.where(np.asarray(k, dtype=np.int64) % 16 == 0, 0.0, SECTOR_BYTES)


class MoeRows(NamedTuple):
    """Layers to price at once, one value per layer (numpy arrays): the token count,
    the shape on the rank (inter = the rank's share of an expert's width) and the
    expected load of the rank (ExpertLoad's fields, tiles one column per BLOCK_MS)."""

    tokens: np.ndarray
    hidden: np.ndarray
    inter: np.ndarray
    topk: np.ndarray
    num_experts: np.ndarray
    local: np.ndarray
    active: np.ndarray
    pairs: np.ndarray
    tiles: np.ndarray


def load_rows(
    tokens, hidden, inter_size, topk, num_experts, tp, ep, routings, slowest: bool = True
) -> MoeRows:
    """MoeRows of layers given per layer (arrays, routings one Routing each); `slowest` as
    expert_load's."""
    tokens, hidden, inter_size, topk, num_experts, tp, ep = (
        np.atleast_1d(np.asarray(a, dtype=np.int64))
        for a in (tokens, hidden, inter_size, topk, num_experts, tp, ep)
    )
    if (tokens < 0).any():
        raise InfersimError(f"MoE num_tokens must be >= 0, got {int(tokens.min())}")
    loads = [
        expert_load(int(t), int(k), int(e), int(p), r, slowest)
        for t, k, e, p, r in zip(tokens, topk, num_experts, ep, routings, strict=True)
    ]
    return MoeRows(
        tokens=tokens.astype(float),
        hidden=hidden.astype(float),
        inter=(inter_size // tp).astype(float),
        topk=topk.astype(float),
        num_experts=num_experts.astype(float),
        local=-(-num_experts // ep).astype(float),
        active=np.array([ld.active for ld in loads]),
        pairs=np.array([ld.pairs for ld in loads]),
        tiles=np.array([ld.tiles for ld in loads]).reshape(len(tokens), len(BLOCK_MS)),
    )


def moe_parts(
    gpu: AcceleratorSpec, moe_format: str, rows: MoeRows, include_routing: bool = True
) -> MoeParts:
    """Layers in one weight format, priced term by term (see the module docstring): the
    grouped GEMMs at each BLOCK_M Triton may run (the fastest kept) or the one Marlin's
    rule takes; each the largest of its tile math, its DRAM traffic and its thread
    blocks' panel streams; plus the passes over every (token, choice) row and the fixed
    cost of the kernel sequence."""
    eff = gpu.efficiency
    fmt = MOE_FORMATS[moe_format_key(moe_format)]
    peak = gpu.peak_flops(parse_dtype(fmt.compute_dtype))
    compute_curve, memory_curve, floor_us = eff.moe_terms(moe_format)
    cta_us, cta_us_per_mb = eff.moe_tiles(moe_format)
    cta_s = cta_us * 1e-6
    # Unfitted: each SM's share of the L2 bandwidth (Triton's tiles, without Hopper's
    # multicast, are fed from L2: 128 x 128 bf16 tiles at 64 FLOPs per byte reach
    # ~470 TFLOPS at the H100's 7.3 TB/s, where the public table saturates near 450).
    # Marlin's weight tiles are each read by one thread block, from DRAM: its share.
    if cta_us_per_mb is None and fmt.marlin:
        cta_s_per_byte = gpu.sm_count / (gpu.memory_bandwidth * eff.memory_bandwidth)
    elif cta_us_per_mb is None:
        cta_s_per_byte = gpu.sm_count / (gpu.l2_bandwidth * eff.l2_bandwidth)
    else:
        cta_s_per_byte = cta_us_per_mb * 1e-12
    floor_s = (floor_us + (eff.kernel_floor_us if include_routing else 0.0)) * 1e-6
    l2_rate = gpu.l2_bandwidth * eff.l2_bandwidth
    w_bpe, a_bpe = fmt.weight_bytes, fmt.act_bytes
    r = rows
    count = len(r.tokens)
    all_pairs = r.tokens * r.topk  # every (token, choice) row of the buffers
    # vLLM's Triton fused_moe writes every row of its outputs (other ranks' pairs as
    # zeros); Marlin, the WNA16 kernels (their blocks aligned with ignore_invalid_experts)
    # and the other libraries' skip the blocks of experts the rank does not hold.
    written = all_pairs if fmt.vllm_fused_moe else r.pairs
    if fmt.wna16:
        wna16_cuda, wna16_block = wna16_block_m(r.tokens, r.topk, r.local)
        rates = wna16_rates(gpu, fmt, moe_format)
    gemms = ((2.0 * r.inter, r.hidden), (r.hidden, r.inter))  # gate|up, then down: (n, k)
    flops = sum(2.0 * r.pairs * n * k for n, k in gemms)
    # A fused SwiGLU stores gate|up's product: half its columns.
    stored = (r.inter if fmt.fused_activation else 2.0 * r.inter, r.hidden)
    dram = [
        r.active * n * k * w_bpe + r.pairs * k * a_bpe + written * out * 2.0
        for (n, k), out in zip(gemms, stored, strict=True)
    ]
    gemm_bytes = dram[0] + dram[1]
    rows_per_expert = r.pairs / np.maximum(r.active, 1.0)
    c_eff = compute_curve.at(np.maximum(rows_per_expert, 1.0))
    m_eff = memory_curve.at(np.maximum(gemm_bytes, 1.0))
    index = np.arange(count)
    totals = np.zeros((len(BLOCK_MS), 3, count))  # per BLOCK_M: the binding terms
    l2_bytes = np.zeros((len(BLOCK_MS), count))
    block_n = fmt.block_n
    for j, block in enumerate(BLOCK_MS):
        tiles = r.tiles[:, j]
        share = tile_share(gpu, fmt, block)
        for (n, k), moved in zip(gemms, dram, strict=True):
            compute = 2.0 * tiles * block * n * k / (peak * share * c_eff)
            if fmt.upcast:
                compute = np.maximum(compute, upcast_s(gpu, tiles, n, k))
            memory = moved / (gpu.memory_bandwidth * m_eff)
            # Each thread block (a row tile x block_n columns) streams its expert's
            # weight panel and its rows through L2 into the SM at a capped rate.
            rows = np.minimum(r.pairs / np.maximum(tiles, 1.0), block)
            panel = (block_n * w_bpe + rows * a_bpe) * k
            if fmt.wna16:
                stream = wna16_stream_s(
                    gpu.sm_count, r.tokens, wna16_cuda, tiles, r.pairs, n, k, fmt, rates
                )
            elif fmt.marlin:
                stream = marlin_stream_s(
                    gpu.sm_count, block, tiles, n, k, r.tokens * r.topk, fmt, cta_s, cta_s_per_byte
                )
            else:
                waves = np.ceil(tiles * np.ceil(n / block_n) / gpu.sm_count)
                stream = waves * (cta_s + panel * cta_s_per_byte)
            if fmt.vllm_fused_moe:
                # Rows of K elements Triton cannot vectorise: the sector-per-element bound
                # (the other libraries' weights are padded to 64 columns or more by vLLM).
                elements = tiles * np.ceil(n / block_n) * (block_n + rows) * k
                stream = np.maximum(stream, elements * unaligned_sector(k) / l2_rate)
            l2 = tiles * np.ceil(n / block_n) * panel
            terms = np.stack([compute, memory, stream])
            which = np.argmax(terms, axis=0)
            totals[j, which, index] += terms[which, index]
            l2_bytes[j] += l2
    by_block = totals.sum(axis=1)
    if fmt.wna16:
        chosen = wna16_block
    elif fmt.marlin:
        chosen = marlin_block_m(r.tokens, r.topk, r.local)
    elif fmt.matmul_ogs:
        chosen = matmul_ogs_block_m(r.tokens, r.topk, r.num_experts)
    else:
        allowed = np.array([b in TRITON_BLOCK_MS for b in BLOCK_MS])
        chosen = np.argmin(np.where(allowed[:, None], by_block, np.inf), axis=0)
    compute_s, memory_s, stream_s = totals[chosen, :, index].T
    pass_bytes = _pass_bytes(r, all_pairs, fmt, include_routing)
    # With an expert map vLLM zeroes the down GEMM's T x top-k output before it runs
    # (fused_moe and fused_marlin_moe alike): one more pass over every pair's row.
    zeroed = np.where(r.local < r.num_experts, all_pairs * r.hidden * 2.0, 0.0)
    pass_bytes = pass_bytes + zeroed
    if fmt.wna16:
        # The CUDA WNA16 kernel zeroes its whole output before it accumulates (atomics).
        outputs = all_pairs * (2.0 * r.inter + r.hidden) * 2.0
        pass_bytes = pass_bytes + np.where(wna16_cuda, outputs, 0.0)
    pass_s = pass_bytes / (gpu.memory_bandwidth * eff.memory_bandwidth)
    return MoeParts(
        seconds=by_block[chosen, index] + pass_s + floor_s,
        compute_s=compute_s,
        memory_s=memory_s,
        l2_s=stream_s,
        pass_s=pass_s,
        floor_s=floor_s,
        flops=flops,
        rows_per_expert=rows_per_expert,
        gemm_bytes=gemm_bytes,
        dram_bytes=gemm_bytes + pass_bytes,
        l2_bytes=l2_bytes[chosen, index],
    )


def _pass_bytes(r: MoeRows, all_pairs, fmt: MoeFormat, include_routing: bool) -> np.ndarray:
    """DRAM bytes of the passes around the GEMMs, over every (token, choice) row: the
    activation (read gate|up, write the product) unless gate|up's epilogue applies it,
    the weighted combine, the 8-bit formats' quantisation of the hidden states and of the
    product, the top-k kernel."""
    activation = 0.0 if fmt.fused_activation else all_pairs * (2.0 * r.inter * 2.0 + r.inter * 2.0)
    out = activation + all_pairs * r.hidden * 2.0 + r.tokens * r.hidden * 2.0
    if fmt.act_bytes < 2:
        out = out + (r.tokens * r.hidden + all_pairs * r.inter) * QUANT_PASS_BYTES
    if include_routing:
        out = out + r.tokens * (r.num_experts * LOGIT_BYTES + r.topk * TOPK_PAIR_BYTES)
    return out


class MoeLayer:
    """The cost of one MoE layer shape on one GPU (the simulator prices one every step)."""

    def __init__(
        self,
        gpu: AcceleratorSpec,
        shape: MoeShape,
        routing: Routing | str = "balanced",
        *,
        include_routing: bool = True,
    ) -> None:
        self.gpu = gpu
        self.shape = shape
        self.routing = Routing.parse(routing)
        self.include_routing = include_routing
        fmt = MOE_FORMATS[shape.moe_format]
        self.weight_bpe = fmt.weight_bytes
        self.kernels = fmt.kernels + int(include_routing)
        floor_us = gpu.efficiency.moe_terms(shape.moe_format)[2]
        extra = gpu.efficiency.kernel_floor_us if include_routing else 0.0
        self.floor_s = (floor_us + extra) * 1e-6
        self._chunks: dict[int, tuple[MoeParts, MoeParts]] = {}

    def parts(self, num_tokens, slowest: bool = True) -> MoeParts:
        """The layer's terms for each token count (an int or an array of them), on the
        slowest rank (or the mean one: see expert_load)."""
        s = self.shape
        tokens = np.atleast_1d(np.asarray(num_tokens, dtype=np.int64))
        ones = np.ones(len(tokens), dtype=np.int64)
        rows = load_rows(
            tokens,
            *(ones * v for v in (s.hidden_size, s.inter_size, s.topk, s.num_experts, s.tp, s.ep)),
            [self.routing] * len(tokens),
            slowest,
        )
        return moe_parts(self.gpu, s.moe_format, rows, self.include_routing)

    def _chunk(self, num_tokens: int) -> tuple[MoeParts, MoeParts, int]:
        """The parts of the STEP_CHUNK token counts around `num_tokens` (priced in one
        array pass, then kept) on the slowest rank and on the mean one (the same with
        ep = 1), and its row among them: an engine asks for a count every step, and one
        count alone costs about a millisecond of numpy."""
        chunk, offset = divmod(int(num_tokens), STEP_CHUNK)
        both = self._chunks.get(chunk)
        if both is None:
            counts = np.arange(chunk * STEP_CHUNK, (chunk + 1) * STEP_CHUNK)
            slowest = self.parts(counts)
            mean = slowest if self.shape.ep == 1 else self.parts(counts, slowest=False)
            both = self._chunks[chunk] = (slowest, mean)
        return both[0], both[1], offset

    def step(self, num_tokens: int) -> tuple[float, float, float]:
        """(seconds on the slowest rank, flops and dram_bytes of the mean one)."""
        p, work, i = self._chunk(num_tokens)
        return float(p.seconds[i]), float(work.flops[i]), float(work.dram_bytes[i])

    def cost(self, num_tokens: int) -> OpCost:
        """The layer for `num_tokens` tokens as an OpCost: the time of the slowest rank,
        the work (FLOPs, DRAM bytes) of the mean one, so that ranks x work is the layer's."""
        if num_tokens < 0:
            raise InfersimError(f"MoE num_tokens must be >= 0, got {num_tokens}")
        p, work, i = self._chunk(num_tokens)
        compute = float(p.compute_s[i])
        memory = float(p.memory_s[i] + p.pass_s[i])
        return OpCost(
            name="moe",
            seconds=float(p.seconds[i]),
            flops=float(work.flops[i]),
            dram_bytes=float(work.dram_bytes[i]),
            l2_bytes=float(p.l2_bytes[i]),
            bound=classify(compute, memory, float(p.l2_s[i]), p.floor_s),
            compute_seconds=compute,
            memory_seconds=memory,
            overhead_seconds=p.floor_s,
            kernels=self.kernels,
        )


@lru_cache(maxsize=256)
def _layer(
    gpu: AcceleratorSpec, shape: MoeShape, routing: Routing, include_routing: bool
) -> MoeLayer:
    return MoeLayer(gpu, shape, routing, include_routing=include_routing)


@lru_cache(maxsize=65536)
def _cost(
    gpu: AcceleratorSpec, shape: MoeShape, routing: Routing, include_routing: bool, tokens: int
) -> OpCost:
    return _layer(gpu, shape, routing, include_routing).cost(tokens)


def moe_cost(
    gpu: AcceleratorSpec,
    *,
    num_tokens: int,
    hidden_size: int,
    inter_size: int,
    topk: int,
    num_experts: int,
    tp: int = 1,
    ep: int = 1,
    moe_format: str = "bf16",
    routing: Routing | str = "balanced",
    alpha: float | None = None,
    include_routing: bool = True,
) -> OpCost:
    """One fused MoE layer on one rank: `num_tokens` tokens (every token of the rank's
    EP group: vLLM dispatches by all-gather), `hidden_size`, `inter_size` per expert
    (split over `tp` ranks), `topk` experts per token out of `num_experts` (split over
    `ep` ranks), weights in `moe_format` (bf16, fp8, fp8_block, int4_wo, w4a16_mxfp4),
    tokens spread by `routing` (balanced, round_robin, power_law with `alpha`).
    `include_routing` adds the top-k softmax kernel over the router logits; the gate
    GEMM that makes them, and any shared expert, are dense GEMMs for the caller."""
    shape = MoeShape(hidden_size, inter_size, topk, num_experts, tp, ep, moe_format)
    return _cost(gpu, shape, Routing.parse(routing, alpha), include_routing, int(num_tokens))
