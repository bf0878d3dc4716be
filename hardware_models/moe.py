"""A fused mixture-of-experts layer as vLLM runs it, priced for one rank's share.

vLLM's fused_moe (Triton, or Marlin for 4-bit weights) runs one short kernel sequence
for the whole layer, however many experts there are: align the (token, expert) pairs
into blocks of BLOCK_M rows per expert, [quantise the activations], one grouped GEMM
for gate and up over every block, the activation (SiLU x up), [quantise], one grouped
GEMM for down, and the top-k weighted sum. So the layer pays one sequence's fixed cost,
not one per expert, and it reads the weights of the experts that receive a token only.

A grouped GEMM's work follows its tiles: expert e's n_e rows fill ceil(n_e / BLOCK_M)
row tiles, so the time depends on how the T x top-k choices spread over the experts
(`Routing`): the expected number of experts activated, the rows each gets, the padding
of each expert's last tile. With expert parallelism a rank holds E / ep experts and
still sees every token of its group (vLLM's all-gather dispatch): the pairs routed to
other ranks' experts cost no GEMM work but the intermediate buffers are sized T x top-k
(their tiles write zeros, the activation and the combine run over every pair), which
at 16k tokens over 256 ranks is most of the time on the public H100 table.

Costs are closed form over the token count and memoised per shape: the simulator
prices a layer every engine step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from scipy.stats import binom

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import parse_dtype
from hardware_models.efficiency import MOE_FORMATS, moe_format_key
from hardware_models.errors import InfersimError
from hardware_models.op_cost import OpCost, classify

# Rows of a grouped-GEMM tile: Triton's tuned configurations pick among 16-128 per token
# count (the model keeps the fastest, as the tuning did); Marlin takes 8-64 by a rule.
BLOCK_MS: tuple[int, ...] = (8, 16, 32, 48, 64, 128)
TRITON_BLOCK_MS: tuple[int, ...] = (16, 32, 64, 128)
MARLIN_BLOCK_MS: tuple[int, ...] = (8, 16, 32, 48, 64)
# Columns of a tile: how many thread blocks share a row tile, and how many times a routed
# activation row is read from L2.
BLOCK_N = 128
# Seeded draws of the power-law generator averaged per token count (the tables average 5).
POWER_LAW_DRAWS = 16
# Bytes of one routing logit and of one (expert id, weight) pair the top-k kernel writes.
LOGIT_BYTES = 4.0
TOPK_PAIR_BYTES = 8.0
# Bytes a quantisation pass moves per element: read 16-bit, write 8-bit.
QUANT_PASS_BYTES = 3.0
ROUTING_KINDS = ("balanced", "round_robin", "power_law")


class Routing(NamedTuple):
    """How the T x top-k choices spread over the experts.

    - balanced: each token picks top-k distinct experts uniformly at random (a router
      balanced in expectation, as load-balancing losses aim for): an expert is hit by
      Binomial(T, k / E) tokens, so T tokens activate E (1 - (1 - k/E)^T) of them.
    - round_robin: the pairs are dealt evenly, min(E, T k) experts with loads that
      differ by at most one (the public tables' "balanced" rows, aiconfigurator's
      generator).
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
        if text.startswith("power_law_"):
            text, alpha = "power_law", float(text.removeprefix("power_law_"))
        if text not in ROUTING_KINDS:
            raise InfersimError(
                f"unknown MoE routing {value!r}; allowed: {', '.join(ROUTING_KINDS)} "
                "(power_law with alpha > 1, or spelled power_law_<alpha>)"
            )
        if text == "power_law":
            if alpha is None or not alpha > 1.0:
                raise InfersimError(f"power_law routing needs alpha > 1, got {alpha}")
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
def expert_load(tokens: int, topk: int, num_experts: int, ep: int, routing: Routing) -> ExpertLoad:
    """The expected ExpertLoad of the rank priced (see Routing) for `tokens` tokens."""
    local = local_experts(num_experts, ep)
    if tokens <= 0:
        return ExpertLoad(0.0, 0.0, tuple(0.0 for _ in BLOCK_MS), 0.0)
    if routing.kind == "balanced":
        p = topk / num_experts
        # E[ceil(n / B)] = sum over j >= 0 of P(n > j B), n ~ Binomial(tokens, p).
        tiles = tuple(
            local * float(binom.sf(np.arange(0, tokens, b), tokens, p).sum()) for b in BLOCK_MS
        )
        active = local * (1.0 - (1.0 - p) ** tokens)
        top = float(binom.ppf(local / (local + 1.0), tokens, p))
        return ExpertLoad(active, local * tokens * p, tiles, top)
    loads = _loads(tokens, topk, num_experts, ep, routing)  # one row per draw
    tiles = tuple(float(np.ceil(loads / b).sum(axis=1).mean()) for b in BLOCK_MS)
    return ExpertLoad(
        float((loads > 0).sum(axis=1).mean()),
        float(loads.sum(axis=1).mean()),
        tiles,
        float(loads.max(axis=1).mean()),
    )


def _loads(tokens: int, topk: int, num_experts: int, ep: int, routing: Routing) -> np.ndarray:
    """Rows per expert of the rank priced (one row per draw) for round_robin and
    power_law routing."""
    pairs = tokens * topk
    local = local_experts(num_experts, ep)
    if routing.kind == "round_robin":
        share = pairs * local / num_experts  # the rank's even share of the pairs
        base = math.floor(share / local)
        extra = round(share - base * local)
        return np.array([[base + 1] * extra + [base] * (local - extra)], dtype=float)
    return _power_law_loads(tokens, topk, num_experts, ep, routing.alpha)


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
    gemm_bytes: np.ndarray  # DRAM bytes of both grouped GEMMs (the memory curve's axis)
    dram_bytes: np.ndarray
    l2_bytes: np.ndarray


def marlin_block_m(tokens, topk: int, local: int) -> np.ndarray:
    """vLLM's Marlin BLOCK_M rule: the first of 8, 16, 32, 48, 64 at which tokens x topk
    / the rank's experts / BLOCK_M falls below 0.9 (64 past them); the index of that
    size in BLOCK_MS per token count."""
    density = np.asarray(tokens, dtype=float) * topk / local
    chosen = np.full(density.shape, BLOCK_MS.index(MARLIN_BLOCK_MS[-1]))
    for block in reversed(MARLIN_BLOCK_MS):
        chosen = np.where(density / block < 0.9, BLOCK_MS.index(block), chosen)
    return chosen


class MoeLayer:
    """The cost of one MoE layer shape on one GPU, constants worked out once."""

    def __init__(
        self,
        gpu: AcceleratorSpec,
        shape: MoeShape,
        routing: Routing | str = "balanced",
        *,
        include_routing: bool = True,
    ) -> None:
        eff = gpu.efficiency
        self.shape = shape
        self.routing = Routing.parse(routing)
        self.format = MOE_FORMATS[shape.moe_format]
        self.act_bpe, self.weight_bpe = self.format.act_bytes, self.format.weight_bytes
        self.quantizes = self.act_bpe < 2
        self.peak = gpu.peak_flops(parse_dtype(self.format.compute_dtype))
        self.sm_count = gpu.sm_count
        self.bandwidth = gpu.memory_bandwidth
        self.pass_bandwidth = gpu.memory_bandwidth * eff.memory_bandwidth
        self.l2_bandwidth = gpu.l2_bandwidth * eff.l2_bandwidth
        self.compute_curve, self.memory_curve, floor_us = eff.moe_terms(shape.moe_format)
        cta_us, cta_us_per_mb = eff.moe_tiles(shape.moe_format)
        self.cta_seconds, self.cta_seconds_per_byte = cta_us * 1e-6, cta_us_per_mb * 1e-12
        self.include_routing = include_routing
        # The top-k kernel is one more launch when the layer routes its own tokens.
        extra = eff.kernel_floor_us if include_routing else 0.0
        self.floor_s = (floor_us + extra) * 1e-6
        self.kernels = self.format.kernels + int(include_routing)
        inter = shape.inter_size // shape.tp
        # (n, k) of the two grouped GEMMs: gate and up fused, then down.
        self.gemms = ((2 * inter, shape.hidden_size), (shape.hidden_size, inter))
        self.inter = inter
        self.local = local_experts(shape.num_experts, shape.ep)

    def parts(self, num_tokens) -> MoeParts:
        """The layer's terms for each token count (an int or an array of them)."""
        tokens = np.atleast_1d(np.asarray(num_tokens, dtype=np.int64))
        if (tokens < 0).any():
            raise InfersimError(f"MoE num_tokens must be >= 0, got {int(tokens.min())}")
        s = self.shape
        loads = [expert_load(int(t), s.topk, s.num_experts, s.ep, self.routing) for t in tokens]
        active = np.array([ld.active for ld in loads])
        pairs = np.array([ld.pairs for ld in loads])
        tiles = np.array([ld.tiles for ld in loads]).reshape(len(tokens), len(BLOCK_MS))
        all_pairs = tokens.astype(float) * s.topk  # every (token, choice) row of the buffers
        # Triton writes every row of its outputs (other ranks' pairs as zeros); Marlin
        # skips the blocks of experts it does not hold.
        written = pairs if self.format.marlin else all_pairs
        flops = sum(2.0 * pairs * n * k for n, k in self.gemms)
        gemm_bytes = sum(
            active * n * k * self.weight_bpe + pairs * k * self.act_bpe + written * n * 2.0
            for n, k in self.gemms
        )
        c_eff = self.compute_curve.at(np.maximum(flops, 1.0))
        m_eff = self.memory_curve.at(np.maximum(gemm_bytes, 1.0))
        rows = np.arange(len(tokens))
        totals = np.zeros((len(BLOCK_MS), 3, len(tokens)))  # per BLOCK_M: the binding terms
        l2_bytes = np.zeros((len(BLOCK_MS), len(tokens)))
        for j, block in enumerate(BLOCK_MS):
            for n, k in self.gemms:
                padded = tiles[:, j] * block
                compute = 2.0 * padded * n * k / (self.peak * c_eff)
                dram = active * n * k * self.weight_bpe + pairs * k * self.act_bpe
                memory = (dram + written * n * 2.0) / (self.bandwidth * m_eff)
                # Every row tile streams its expert's weight panel, each column tile its
                # rows: from L2 in aggregate, and per thread block at its capped rate.
                panel = (BLOCK_N * self.weight_bpe + block * self.act_bpe) * k
                l2 = tiles[:, j] * (
                    n * k * self.weight_bpe + block * k * self.act_bpe * n / BLOCK_N
                )
                waves = np.ceil(tiles[:, j] * math.ceil(n / BLOCK_N) / self.sm_count)
                stream = waves * (self.cta_seconds + panel * self.cta_seconds_per_byte)
                stream = np.maximum(stream, l2 / self.l2_bandwidth)
                terms = np.stack([compute, memory, stream])
                which = np.argmax(terms, axis=0)
                totals[j, which, rows] += terms[which, rows]
                l2_bytes[j] += l2
        gemm_by_block = totals.sum(axis=1)
        if self.format.marlin:
            chosen = marlin_block_m(tokens, s.topk, self.local)
        else:
            allowed = np.array([b in TRITON_BLOCK_MS for b in BLOCK_MS])
            chosen = np.argmin(np.where(allowed[:, None], gemm_by_block, np.inf), axis=0)
        compute_s, memory_s, stream_s = totals[chosen, :, rows].T
        pass_bytes = self._pass_bytes(tokens.astype(float), all_pairs)
        pass_s = pass_bytes / self.pass_bandwidth
        seconds = gemm_by_block[chosen, rows] + pass_s + self.floor_s
        return MoeParts(
            seconds=seconds,
            compute_s=compute_s,
            memory_s=memory_s,
            l2_s=stream_s,
            pass_s=pass_s,
            floor_s=self.floor_s,
            flops=flops,
            gemm_bytes=gemm_bytes,
            dram_bytes=gemm_bytes + pass_bytes,
            l2_bytes=l2_bytes[chosen, rows],
        )

    def _pass_bytes(self, tokens: np.ndarray, all_pairs: np.ndarray) -> np.ndarray:
        """DRAM bytes of the passes around the GEMMs, over every (token, choice) row."""
        s, inter = self.shape, self.inter
        act = all_pairs * (2 * inter * 2.0 + inter * 2.0)  # read gate|up, write product
        combine = all_pairs * s.hidden_size * 2.0 + tokens * s.hidden_size * 2.0
        out = act + combine
        if self.quantizes:  # the hidden states, then the product, to 8 bits
            out = out + (tokens * s.hidden_size + all_pairs * inter) * QUANT_PASS_BYTES
        if self.include_routing:
            out = out + tokens * (s.num_experts * LOGIT_BYTES + s.topk * TOPK_PAIR_BYTES)
        return out

    def cost(self, num_tokens: int) -> OpCost:
        """The layer for `num_tokens` tokens as an OpCost."""
        p = self.parts(num_tokens)
        compute = float(p.compute_s[0])
        memory = float(p.memory_s[0] + p.pass_s[0])
        return OpCost(
            name="moe",
            seconds=float(p.seconds[0]),
            flops=float(p.flops[0]),
            dram_bytes=float(p.dram_bytes[0]),
            l2_bytes=float(p.l2_bytes[0]),
            bound=classify(compute, memory, float(p.l2_s[0]), p.floor_s),
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
