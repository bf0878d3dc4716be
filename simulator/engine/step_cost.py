"""StepCostModel: the time of one engine step for a mixed batch, from operator costs.

A step runs every layer once over all scheduled tokens: prefill chunks and decodes share
the GEMMs (their cost depends only on the token count, memoised), while attention is
priced from batch sums (decode: sequences and total context; prefill: tokens, attended
query-key pairs and keys read). A model with sliding-window layers (Mistral, and mixed
with full layers gpt-oss and Gemma 2/3) prices those layers from the same sums taken
over each sequence's last `window` keys, with the windowed kernel. Python work per step
is therefore independent of the batch size. Decode-only steps of a given batch size
(most steps) have everything but their attended keys worked out once (DecodeSteps), and
a run of them can be priced in one vectorised call; every way gives the same numbers, to
the last bit.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import DecodeAttention, PrefillAttention, causal_pairs
from hardware_models.collectives import collective_cost, group_link
from hardware_models.custom_all_reduce import TpAllReduce
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.errors import InfeasibleError
from hardware_models.gemm import gemm_cost, gemm_costs_many
from hardware_models.node import CrossNodeLink, LinkSpec, NodeSpec
from hardware_models.op_cost import Bound, OpCost
from hardware_models.pointwise import (
    GELU,
    LAYERNORM,
    RESIDUAL_ADD,
    RMSNORM,
    ROTARY,
    SILU_MUL,
    elementwise_cost,
    embedding_cost,
)
from simulator.architecture import ModelArchitecture
from simulator.engine.latent_attention import (
    MlaDecodeAttention,
    MlaPrefillAttention,
    PrefillChunk,
    mla_shape,
)
from simulator.engine.moe_layer import ExpertLayout, moe_note, routed_experts_cost
from simulator.engine.mxfp4_layout import is_mxfp4_moe
from simulator.engine.weight_format import (
    check_block_shards,
    check_weight_support,
    weight_format,
)
from simulator.memory_planner import stage_layers


class StepBound(IntEnum):
    """What limited a step; stored as a small int in the per-step table."""

    COMPUTE = 0
    MEMORY = 1
    COMMUNICATION = 2
    HOST = 3
    LATENCY = 4


_STEP_BOUNDS = tuple(StepBound)  # by value, so a list index names its bound
_MEMORY = int(StepBound.MEMORY)
# The members themselves, looked up once: an enum class attribute costs a lookup through
# the enum's metaclass, and the engine names one for every step it prices.
_HOST_BOUND, _MEMORY_BOUND = StepBound.HOST, StepBound.MEMORY

# GEMMs are priced for a block of consecutive token counts at once (gemm_costs_many)
# once a block has asked for more counts than one at a time costs less for. An array
# pass's cost is mostly fixed (numpy calls per tile layout), so a block as wide as the
# usual token budget is priced in one pass: a pass of 512 counts costs about what 60
# shapes do one at a time, and under twice a pass of 128.
_GEMM_BLOCK = 512
_GEMM_ALONE = 16

_BOUND_OF = {
    Bound.COMPUTE: StepBound.COMPUTE,
    Bound.MEMORY: StepBound.MEMORY,
    Bound.L2: StepBound.MEMORY,
    Bound.LATENCY: StepBound.LATENCY,
    Bound.COMMUNICATION: StepBound.COMMUNICATION,
}


@dataclass(frozen=True, slots=True)
class EngineOverheads:
    """Host-side costs of one engine step (scheduling, input preparation, sampling)."""

    step_us: float = 150.0
    per_seq_us: float = 4.0
    cuda_graphs: bool = True
    async_scheduling: bool = True
    fused_kernels: bool = True


@dataclass(slots=True)
class _Part:
    """Seconds split by bound, plus the work behind them."""

    seconds: list[float]  # indexed by StepBound (compute, memory, comm, host, latency)
    flops: float = 0.0
    dram_bytes: float = 0.0
    kernels: int = 0

    @classmethod
    def empty(cls) -> _Part:
        return cls([0.0] * len(StepBound))

    def add(self, cost: OpCost, times: float = 1.0) -> None:
        self.seconds[_BOUND_OF[cost.bound]] += cost.seconds * times
        self.flops += cost.flops * times
        self.dram_bytes += cost.dram_bytes * times
        self.kernels += int(cost.kernels * times)

    def plus(self, other: _Part) -> _Part:
        return _Part(
            [a + b for a, b in zip(self.seconds, other.seconds, strict=True)],
            self.flops + other.flops,
            self.dram_bytes + other.dram_bytes,
            self.kernels + other.kernels,
        )


class StepCost(NamedTuple):
    """One step's price (a named tuple: the engine builds one per step). `flops` and
    `dram_bytes` are the replica's, all its GPUs' work, so that utilisation divided by
    the replica's peak is per GPU."""

    seconds: float
    gpu_seconds: float
    flops: float
    dram_bytes: float
    bound: StepBound


class WindowSums(NamedTuple):
    """A step's attention sums over each sequence's last `window` keys: what its
    sliding-window layers attend (see window_sums)."""

    decode_context: int = 0
    prefill_pairs: float = 0.0
    prefill_context: int = 0


_NO_WINDOW = WindowSums()


def window_keys(kv_len, window: int):
    """Keys one sliding-window layer attends for a decoding sequence of `kv_len` keys
    (scalars or numpy arrays)."""
    return np.minimum(kv_len, window)


def window_sums(window: int, decode_kv: np.ndarray, chunks: list[tuple[int, int]]) -> WindowSums:
    """WindowSums of a step: decodes over `decode_kv` keys each, prefill `chunks` of
    (new tokens, kv length). A chunk's queries see the window before each of them: the
    banded causal pairs, and keys read from the chunk's start less the window."""
    pairs = sum(causal_pairs(chunk, kv, window) for chunk, kv in chunks)
    context = sum(min(kv, chunk + window - 1) for chunk, kv in chunks)
    return WindowSums(int(np.sum(window_keys(decode_kv, window))), pairs, context)


class DecodeSteps:
    """Decode-only steps of a fixed number of sequences: step() for them with everything
    but the attended keys worked out once. `one` (or `price`, its plain-tuple form)
    prices a step, `many` a run of steps in one vectorised call; all give step()'s
    numbers to the last bit (the same operations in the same order), so that runs match
    stepping one by one exactly."""

    def __init__(self, model: StepCostModel, seqs: int, padded: int = 0, moe: int = 0) -> None:
        fixed = model._rank_fixed(max(seqs, padded), seqs, moe)
        self.seqs = seqs
        self.parts = tuple(fixed.seconds)  # by StepBound; attention adds to MEMORY
        self.layers = model._full_layers
        self.launch = model._launch_seconds(fixed.kernels)
        self.host = model.host_seconds(seqs)
        self.overlap = model._async  # host work hidden under the GPU's
        # Priced per GPU; recorded for the replica, its tp ranks doing the same work.
        ranks = model.tp
        self.fixed_flops, self.fixed_dram = fixed.flops * ranks, fixed.dram_bytes * ranks
        self.rank_layers = self.layers * ranks
        self.attention = attention = model._decode_attention
        self._terms = attention.batch_terms(seqs)
        self._one_step = attention.one_step_for(seqs)  # one_step for this batch
        if self._terms is not None:  # the plain closed form's constants (see price)
            self._per_key, self._attn_floor = attention.kv_bytes_per_key, attention.floor
            self._flops_per_key = attention.flops_per_key
        # Sliding-window layers: their own kernel over the windowed keys (None: none).
        self.window_layers = model._window_layers
        self.window_rank_layers = self.window_layers * ranks
        self.window_attention = model._window_decode
        self._window_step = (
            self.window_attention.one_step_for(seqs) if self.window_attention else None
        )
        # The bound when the memory part does not lead: the first largest other part.
        others = list(self.parts)
        others[_MEMORY] = -math.inf
        self._other_bound = others.index(max(others))
        self._other = _STEP_BOUNDS[self._other_bound]
        self._before = max(self.parts[:_MEMORY])
        self._after = max(self.parts[_MEMORY + 1 :])

    def one(self, context: int, window_context: int = 0) -> StepCost:
        """The step whose decodes attend `context` keys in total in full-attention
        layers and `window_context` in sliding-window ones."""
        return StepCost(*self.price(context, window_context))

    def price(
        self, context: int, window_context: int = 0
    ) -> tuple[float, float, float, float, StepBound]:
        """one() as a plain tuple in StepCost's order (cheaper to build, and the replica
        prices runs of decode steps with it one step at a time)."""
        terms = self._terms
        if not self.layers:  # every layer slides
            attn_s = attn_f = attn_d = 0.0
        elif terms is None:
            attn_s, attn_f, attn_d = self._one_step(context)
        else:  # DecodeAttention.one_step with its constant terms worked out once
            seq_bytes, bandwidth, waves = terms
            attn_d = context * self._per_key + seq_bytes
            memory = attn_d / bandwidth
            attn_s = (memory if memory >= waves else waves) + self._attn_floor
            attn_f = context * self._flops_per_key
        b0, b1, b2, b3, b4 = self.parts
        layers = self.layers
        memory = b1 + attn_s * layers
        window_f = window_d = 0.0
        if self._window_step is not None:
            window_s, window_f, window_d = self._window_step(window_context)
            memory = memory + window_s * self.window_layers
        gpu_seconds = b0 + memory + b2 + b3 + b4 + self.launch  # sum() of the parts, in order
        host = self.host
        if self.overlap:
            seconds = gpu_seconds if gpu_seconds >= host else host
        else:
            seconds = gpu_seconds + host
        if host >= gpu_seconds:
            bound = _HOST_BOUND
        elif memory > self._before and memory >= self._after:
            bound = _MEMORY_BOUND
        else:
            bound = self._other
        ranks = self.rank_layers
        flops = self.fixed_flops + attn_f * ranks
        dram = self.fixed_dram + attn_d * ranks
        if self._window_step is not None:
            flops = flops + window_f * self.window_rank_layers
            dram = dram + window_d * self.window_rank_layers
        return seconds, gpu_seconds, flops, dram, bound

    def many(
        self, contexts: np.ndarray, window_contexts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | int]:
        """Consecutive steps, `contexts[j]` keys attended at step j (`window_contexts[j]`
        in sliding-window layers): per-step (seconds, flops, dram_bytes) arrays and the
        bound (an array, or one value for them all)."""
        if self.layers:
            attn_s, attn_f, attn_d = self.attention(self.seqs, contexts)
        else:
            attn_s = attn_f = attn_d = 0.0
        b0, b1, b2, b3, b4 = self.parts
        layers = self.layers
        memory = b1 + attn_s * layers
        window = None
        if self.window_attention is not None:
            window = self.window_attention(self.seqs, window_contexts)
            memory = memory + window[0] * self.window_layers
        gpu_seconds = b0 + memory
        for part in (b2, b3, b4):
            if part:  # adding an exact 0.0 changes nothing
                gpu_seconds = gpu_seconds + part
        gpu_seconds = gpu_seconds + self.launch
        host = self.host
        seconds = np.maximum(gpu_seconds, host) if self.overlap else gpu_seconds + host
        flops = self.fixed_flops + attn_f * self.rank_layers
        dram = self.fixed_dram + attn_d * self.rank_layers
        if window is not None:
            flops = flops + window[1] * self.window_rank_layers
            dram = dram + window[2] * self.window_rank_layers
        return seconds, flops, dram, self._bounds(memory, gpu_seconds)

    def _bounds(self, memory: np.ndarray, gpu_seconds: np.ndarray) -> np.ndarray | int:
        """one()'s bound at each step. Usually the memory part leads at every step (it
        does at the smallest) and the GPU's time hides the host's at every step: one
        value then does for the whole run."""
        smallest = memory.min()
        if smallest > self._before and smallest >= self._after and self.host < gpu_seconds.min():
            return _MEMORY
        leads = (memory > self._before) & (memory >= self._after)
        bound = np.where(leads, _MEMORY, self._other_bound)
        return np.where(self.host >= gpu_seconds, int(StepBound.HOST), bound).astype(np.int8)


@functools.lru_cache(maxsize=4096)
def _gemm_block(
    gpu: AcceleratorSpec, n: int, k: int, dtype: str | Dtype, weight_dtype: Dtype | None, block: int
) -> tuple[OpCost, ...]:
    """gemm_cost of an n x k weight for the token counts of `block` (see _GEMM_BLOCK), in
    one array pass; cached across runs, as gemm_cost is (a sweep or a plan runs many
    in one process)."""
    counts = np.arange(block * _GEMM_BLOCK + 1, (block + 1) * _GEMM_BLOCK + 1)
    return tuple(gemm_costs_many(gpu, counts, n, k, dtype, weight_dtype))


class StepCostModel:
    """Prices engine steps for one replica: a model sharded tp x pp over one GPU type.

    With attention data parallelism (`dp` > 1, an MoE model) this prices one dp rank's
    step: every rank runs the step padded to the same token count (vLLM pads each rank's
    batch to the largest across ranks, `padded_tokens`), and each MoE layer runs over all
    dp ranks' tokens, dispatched to the tp x dp GPUs holding the experts and combined
    back (`all2all_backend`: vLLM's all-gather + reduce-scatter over the dp ranks, or an
    all-to-all to the experts' GPUs as DeepEP and pplx do)."""

    def __init__(
        self,
        arch: ModelArchitecture,
        gpu: AcceleratorSpec,
        node: NodeSpec,
        *,
        weight_dtype: str | Dtype = Dtype.BF16,
        kv_dtype: str | Dtype = Dtype.BF16,
        activation_dtype: str | Dtype = Dtype.BF16,
        tp: int = 1,
        pp: int = 1,
        overheads: EngineOverheads | None = None,
        expert_parallel: bool = False,
        moe_routing: str = "balanced",
        dp: int = 1,
        all2all_backend: str = "allgather_reducescatter",
        custom_all_reduce: bool = True,
        symm_mem_all_reduce: bool = True,
        mxfp4_use_marlin: bool = False,
        first_gpu: int = 0,
        group_gpu: int | None = None,
    ) -> None:
        arch.check_tp(tp)
        # How to build this model again placed elsewhere (placed()).
        self._settings = {
            "weight_dtype": weight_dtype, "kv_dtype": kv_dtype,
            "activation_dtype": activation_dtype, "tp": tp, "pp": pp, "overheads": overheads,
            "expert_parallel": expert_parallel, "moe_routing": moe_routing, "dp": dp,
            "all2all_backend": all2all_backend, "custom_all_reduce": custom_all_reduce,
            "symm_mem_all_reduce": symm_mem_all_reduce, "mxfp4_use_marlin": mxfp4_use_marlin,
        }  # fmt: skip
        # The cluster GPU the replica (a dp rank) starts on: replicas are packed in order
        # over nodes of node.gpus_per_node, so a replica may start mid-node or straddle two.
        self.first_gpu = first_gpu
        # Its dp group's (the MoE dispatch group's) first GPU: first_gpu less the dp ranks
        # before it, each tp x pp GPUs; the group, too, may straddle two nodes.
        self.group_gpu = first_gpu if group_gpu is None else group_gpu
        # placed(), by the rank's and its dp group's places in a node
        self._placed: dict[tuple[int, int], StepCostModel] = {}
        self.mxfp4_use_marlin = mxfp4_use_marlin  # VLLM_MXFP4_USE_MARLIN=1
        self.arch, self.gpu, self.node, self.tp, self.pp = arch, gpu, node, tp, pp
        self.dp = dp if arch.is_moe else 1  # dense ranks are independent replicas
        self.experts = ExpertLayout.of(arch, tp, expert_parallel, self.dp)
        self.all2all_backend = all2all_backend
        self.moe_routing = moe_routing
        self.weight_format = weight_format(weight_dtype)  # fp8_block kept as spelled
        check_block_shards(arch, self.weight_format, tp, self.experts.moe_tp)
        check_weight_support(gpu, self.weight_format, "model.weight_dtype")
        self.weight_dtype = parse_dtype(weight_dtype)
        self.kv_dtype = parse_dtype(kv_dtype)
        self.act_dtype = parse_dtype(activation_dtype)
        # The linear layers' weights (attention, dense MLP, shared experts): in the
        # checkpoint's format, but an MXFP4 MoE checkpoint (gpt-oss) quantises its routed
        # experts only (vLLM's Mxfp4Config, mxfp4_layout): its linear layers keep 16-bit
        # weights and math, as the memory plan stores them.
        experts_only = is_mxfp4_moe(self.weight_format, arch.is_moe)
        self.linear_format = self.act_dtype.value if experts_only else self.weight_format
        linear_dtype = parse_dtype(self.linear_format)
        native = self._tensor_native(linear_dtype)
        self.compute_dtype = linear_dtype if native else self.act_dtype
        # The GEMM kernels' key: a block-scaled format runs its own kernels where the
        # chip multiplies its dtype natively (elsewhere its weights are dequantised).
        self.gemm_dtype: str | Dtype = self.linear_format if native else self.compute_dtype
        self.overheads = overheads or EngineOverheads()
        self.heads = arch.num_attention_heads // tp
        self.kv_heads = arch.kv_heads_per_shard(tp)
        self.tp_link = self._link(tp, "tensor parallelism")
        # vLLM's dispatch of the layers' all-reduces: custom, symmetric memory or NCCL,
        # per pipeline stage (its tp group's place on a PCIe tree decides peer access).
        self.stage_all_reduces = self._stage_all_reduces(
            custom_all_reduce, symm_mem_all_reduce, first_gpu
        )
        self.tp_all_reduce = self.stage_all_reduces[0][0] if self.stage_all_reduces else None
        self.handoffs = self._handoffs(first_gpu)
        self.ep_link = self._dispatch_link(self.group_gpu)
        # Constants of every step, looked up once (step() runs tens of thousands of times).
        self._layers = arch.num_layers
        self._window_layers = arch.num_sliding_layers
        self._full_layers = arch.num_layers - self._window_layers
        self._step_us, self._per_seq_us = self.overheads.step_us, self.overheads.per_seq_us
        self._async = self.overheads.async_scheduling
        eff = gpu.efficiency
        self._per_kernel_us = (
            eff.launch_overhead_graph_us
            if self.overheads.cuda_graphs
            else eff.launch_overhead_eager_us
        )
        self._dense_cache: dict[int, _Part] = {}
        # What _dense needs for every token count, read once: (name, n, k, layers, dtypes)
        # of the model's GEMMs (Architecture.gemms; m is the token count; gemm_dtypes, a
        # checkpoint's unquantized layers apart), and the pointwise chains.
        self._gemm_shapes = self._gemm_formats()
        self._chains = self._pointwise_chains()
        self._gemm_blocks: dict[int, list[list[OpCost]]] = {}  # see _gemms
        self._gemm_misses: dict[int, int] = {}
        self._head_cache: dict[int, _Part] = {}
        self._fixed_cache: dict[tuple[int, int], _Part] = {}
        self._moe_cache: dict[tuple[int, int], _Part] = {}
        self._rank_cache: dict[tuple[int, int, int], _Part] = {}
        self._decode_steps: dict[int | tuple[int, int, int], DecodeSteps] = {}
        self._prefill_attention, self._decode_attention = self._attention()
        self._window_prefill, self._window_decode = (
            self._attention(arch.sliding_window) if self._window_layers else (None, None)
        )
        # The kinds of attention layer a step runs, looked up once: (layers, prefill and
        # decode kernels, whether they slide), only the kinds the model has.
        kinds = (
            (self._full_layers, self._prefill_attention, self._decode_attention, False),
            (self._window_layers, self._window_prefill, self._window_decode, True),
        )
        self._attention_kinds = tuple(kind for kind in kinds if kind[0])
        # MLA prices each prefill chunk by its length (step's `prefill_chunks`).
        self.prices_by_sequence = arch.is_mla

    # ---- configuration -------------------------------------------------------------
    def _tensor_native(self, dtype: Dtype) -> bool:
        """fp8/int8/fp4 weights run natively where the chip has tensor support for them."""
        return bytes_per_element(dtype) < 2 and dtype in self.gpu.tensor_flops_per_core_per_clock

    def _link(self, group: int, purpose: str) -> LinkSpec | CrossNodeLink | None:
        """The link `group` GPUs' collectives run on (collectives.group_link)."""
        if group <= 1:
            return None
        link = group_link(self.node, self.gpu, group)
        if link is not None:
            return link
        if group <= self.node.gpus_per_node:
            raise InfeasibleError(
                f"{purpose} over {group} GPUs needs a GPU-to-GPU link, but node "
                f"{self.node.name} has none ({self.node.gpus_per_node} GPU per node)"
            )
        raise InfeasibleError(
            f"{purpose} over {group} GPUs spans nodes of {self.node.gpus_per_node} GPUs, "
            f"but node {self.node.name} has no inter-node link"
        )

    def _dispatch_link(self, group_gpu: int) -> LinkSpec | CrossNodeLink | None:
        """The link of the MoE dispatch over the tp x dp GPUs of a dp group starting on
        cluster GPU `group_gpu` (stage s of dp rank d from group_gpu + (d x pp + s) x tp
        on): the node's own where each stage's group sits in one node, else across nodes
        with the most GPUs one node holds of the stage's group spread widest (a group of
        12 from GPU 6 on nodes of 8: 2 + 8 + 2, 8 a node; one of 6 from GPU 6: 2 + 4, 4).
        vLLM's gather runs over the dp ranks, tp GPUs apart (one a node where tp fills
        nodes); an all-to-all over the experts' GPUs."""
        tp, dp, per_node = self.tp, self.dp, self.node.gpus_per_node
        purpose = "parallelism.dp: the MoE dispatch (tp x dp)"
        link = self._link(tp * dp, purpose)
        if link is None:
            return None
        spreads = []
        for s in range(self.pp):
            nodes = Counter(
                (group_gpu + (d * self.pp + s) * tp + i) // per_node
                for d in range(dp)
                for i in range(tp)
            )
            spreads.append((len(nodes), -max(nodes.values())))
        spanned, most = max(spreads)
        if spanned == 1 or link is self.node.inter_node_link:  # (nodes of one GPU: every hop)
            return link
        if not isinstance(link, CrossNodeLink):  # a group narrower than a node straddling two
            inter = self.node.inter_node_link
            if inter is None:
                raise InfeasibleError(
                    f"{purpose} over {tp * dp} GPUs straddles two nodes of {per_node} GPUs, "
                    f"but node {self.node.name} has no inter-node link"
                )
            intra = self.gpu.efficiency.link_for(per_node, self.node.intra_node_link)
            link = CrossNodeLink(intra, inter, per_node)
        gathered = -most if self.all2all_backend == "all_to_all" else max(1, -most // tp)
        return link._replace(gpus_per_node=gathered)

    def placement(
        self, first_gpu: int, group_gpu: int | None = None
    ) -> tuple[list, list, LinkSpec | CrossNodeLink | None]:
        """What prices differently with a dp rank's place, from cluster GPU `first_gpu` on
        in a dp group from `group_gpu` on (first_gpu's own when None): its stage hand-offs
        (the GPUs they start on only over a PCIe tree, where the place matters), its
        stages' all-reduce plans and its MoE dispatch's link. They depend on its and its
        group's places in their nodes only."""
        custom, symm_mem = (self._settings[k] for k in ("custom_all_reduce", "symm_mem_all_reduce"))
        handoffs = [
            (link, n, *(ends if link.fabric else (0, 0)))
            for link, n, *ends in self._handoffs(first_gpu)
        ]
        return (
            handoffs,
            self._stage_all_reduces(custom, symm_mem, first_gpu),
            self._dispatch_link(first_gpu if group_gpu is None else group_gpu),
        )

    @functools.cached_property
    def where(self) -> tuple[list, list, LinkSpec | CrossNodeLink | None]:
        """This model's placement(): what placed() compares."""
        return self.placement(self.first_gpu, self.group_gpu)

    def placed(self, first_gpu: int, group_gpu: int | None = None) -> StepCostModel:
        """This model for a dp rank starting on cluster GPU `first_gpu`, in a dp group
        from `group_gpu` on (first_gpu's own when None): itself when its stages'
        hand-offs, all-reduces and MoE dispatch run as this one's do, else one built
        there (one per placement, shared by the ranks placed alike)."""
        group_gpu = first_gpu if group_gpu is None else group_gpu
        key = (first_gpu % self.node.gpus_per_node, group_gpu % self.node.gpus_per_node)
        if key not in self._placed:
            where = self.placement(*key)
            alike = (model for model in self._placed.values() if model.where == where)
            self._placed[key] = next(alike, None) or (
                self if where == self.where else self._built_at(*key)
            )
        return self._placed[key]

    def placed_ranks(self, replicas: int, dp: int) -> list[list[StepCostModel]]:
        """Each of `replicas` replicas' dp ranks' models (placed()), the replicas packed in
        order over the nodes as Simulation places them: replica r from cluster GPU r x its
        tp x pp x `dp` GPUs on, its rank d tp x pp x d GPUs later."""
        rank = self.tp * self.pp
        size = rank * dp
        return [
            [self.placed(r * size + d * rank, r * size) for d in range(dp)] for r in range(replicas)
        ]

    def _built_at(self, first_gpu: int, group_gpu: int) -> StepCostModel:
        settings = self._settings
        return StepCostModel(
            self.arch, self.gpu, self.node, **settings, first_gpu=first_gpu, group_gpu=group_gpu
        )

    def _stage_all_reduces(
        self, custom: bool, symm_mem: bool, first_gpu: int
    ) -> list[tuple[TpAllReduce, int]]:
        """The tp all-reduce plan of each pipeline stage as (plan, the layers of the
        stages sharing it), in stage order; empty without tensor parallelism. Stages sit
        in order on the replica's GPUs (stage s from cluster GPU first_gpu + s * tp on), so
        on a PCIe tree a later stage's group can straddle a switch and lose the peer access
        the first has."""
        if self.tp_link is None:
            return []
        plans: list[list] = []  # [plan, layers]
        for s, layers in enumerate(stage_layers(self.arch, self.pp)):
            plan = TpAllReduce.plan(
                self.gpu,
                self.node,
                self.tp,
                self.tp_link,
                activation_dtype=self.act_dtype,
                custom=custom,
                symm_mem=symm_mem,
                cuda_graphs=self.overheads.cuda_graphs,
                first_gpu=(first_gpu + s * self.tp) % self.node.gpus_per_node,
            )
            same = next((entry for entry in plans if entry[0] == plan), None)
            if same is None:
                plans.append([plan, len(layers)])
            else:
                same[1] += len(layers)
        return [(plan, layers) for plan, layers in plans]

    def _handoffs(self, first_gpu: int) -> list[tuple[LinkSpec, int, int, int]]:
        """The pp - 1 stage hand-offs as (link, how many, the node GPUs the sending and the
        receiving stage start on). Stages sit in order on the replica's GPUs (from
        first_gpu on) and each tp rank sends to the same rank of the next stage (GPU g to
        g + tp), all at once: a hand-off crosses nodes when one of those pairs does, and
        inside a node its place matters on a PCIe tree (switch neighbours, or across
        sockets). A send/recv is priced on the link's own latency and efficiency (a
        calibration profile's links are all-reduce fits)."""
        tp, per_node = self.tp, self.node.gpus_per_node
        inside: Counter[int] = Counter()
        crossing = 0
        for s in range(self.pp - 1):
            start = first_gpu + s * tp
            if any((start + i) // per_node != (start + tp + i) // per_node for i in range(tp)):
                crossing += 1
            else:
                inside[start % per_node] += 1
        intra, inter = self.node.intra_node_link, self.node.inter_node_link
        handoffs: list[tuple[LinkSpec, int, int, int]] = []
        if inside:
            if intra is None:
                raise InfeasibleError(
                    f"pipeline parallelism hands activations between GPUs of node "
                    f"{self.node.name}, which has no GPU-to-GPU link ({per_node} GPU per node)"
                )
            handoffs += [(intra, n, first, first + tp) for first, n in sorted(inside.items())]
        if crossing:  # the receiving stage starts a node
            if inter is None:
                raise InfeasibleError(
                    f"pipeline parallelism over {tp * self.pp} GPUs spans nodes of {per_node} "
                    f"GPUs, but node {self.node.name} has no inter-node link"
                )
            handoffs.append((inter, crossing, 0, 0))
        return handoffs

    def _hand_off(
        self, act_bytes: float, link: LinkSpec, first: int, receiving: int
    ) -> list[tuple[OpCost, int]]:
        """One stage hand-off as vLLM V1 runs it (gpu_worker.execute_model's
        send_tensor_dict / recv_tensor_dict with all_gather_group = the tp group): each
        intermediate tensor goes sliced, every tp rank sending its 1/tp of it to the same
        rank of the next stage ("send-allgather"), and the next stage's tp group
        all-gathers the slices back. The tensors are the hidden states and, in models
        built on RMSNorm's fused residual add (Llama, Qwen, Mixtral, DeepSeek, gpt-oss),
        the residual; LayerNorm models (GPT-2, OPT, Falcon) pass the hidden states only.
        Each tensor is a call of its own: (cost, times) pairs, the all-gather over the tp
        group's link, as the logits'. A tensor whose elements do not split evenly over
        the tp ranks goes whole from every rank, ungathered, as vLLM sends it. Not
        modelled: the CPU-side metadata send_tensor_dict makes first (the tensors' names,
        shapes and dtypes, pickled over the CPU group), a host round trip per hand-off."""
        tensors = 2 if self.arch.norm == "rmsnorm" else 1
        elements = round(act_bytes / bytes_per_element(self.act_dtype))
        if self.tp_link is None or elements % self.tp:
            whole = collective_cost("send_recv", act_bytes, 2 * self.tp, link, first_gpu=first)
            return [(whole, tensors)]
        sliced = act_bytes / self.tp
        send = collective_cost("send_recv", sliced, 2 * self.tp, link, first_gpu=first)
        gather = collective_cost(
            "all_gather", act_bytes, self.tp, self.tp_link, first_gpu=receiving
        )
        return [(send, tensors), (gather, tensors)]

    def _attention(self, window: int | None = None) -> tuple:
        """(prefill, decode) attention of one layer on one rank: GQA/MHA, or MLA; with a
        sliding `window`, the kernels as they run over a window."""
        a, dtypes = self.arch, {"dtype": self.act_dtype, "kv_dtype": self.kv_dtype}
        if a.is_mla and window:
            raise InfeasibleError(
                f"{a.name}: sliding-window layers with multi-head latent attention are not "
                "modelled (no such model is published)"
            )
        if a.is_mla:
            shape = mla_shape(a, self.tp)
            prefill = MlaPrefillAttention(
                self.gpu,
                shape,
                compute_dtype=self.gemm_dtype,
                weight_dtype=self.linear_format,
                **dtypes,
            )
            return prefill, MlaDecodeAttention(self.gpu, shape, **dtypes)
        heads = {"num_heads": self.heads, "num_kv_heads": self.kv_heads, "head_dim": a.head_dim}
        return (
            PrefillAttention(self.gpu, **heads, **dtypes, window=window),
            DecodeAttention(self.gpu, **heads, **dtypes, window=window),
        )

    # ---- memoised parts ------------------------------------------------------------
    def _pointwise_chains(self) -> list[tuple[list, float, int]]:
        """(chain, elements per token, layers) of the model's layers, fused or not."""
        a, h, tp = self.arch, self.arch.hidden_size, self.tp
        norm = RMSNORM if a.norm == "rmsnorm" else LAYERNORM
        act = SILU_MUL if a.gated_mlp else GELU
        if a.is_mla:  # RoPE on each head's rope part of q and on the shared key
            rope = (self.heads + 1) * a.qk_rope_head_dim
        else:
            rope = (self.heads + self.kv_heads) * a.head_dim
        # The dense MLP's activation, and the shared experts' in MoE layers (the routed
        # experts' runs inside the fused MoE kernel).
        acts = [(-(-a.intermediate_size // tp), a.num_dense_layers)]
        if a.num_shared_experts:
            acts.append((-(-a.shared_intermediate_size // tp), a.num_moe_layers))
        layers = a.num_layers
        by_act = [([act], inter, n) for inter, n in acts if n]
        # MLA normalises its compressed query and latent KV (q_a_layernorm and
        # kv_a_layernorm, vLLM's DeepseekV2MLAAttention): two norm kernels more a layer.
        latent = [([norm], a.q_lora_rank or 0, layers), ([norm], a.kv_lora_rank, layers)]
        by_act += [chain for chain in latent if a.is_mla and chain[1]]
        if self.overheads.fused_kernels:
            return [([RESIDUAL_ADD, norm], h, layers), ([ROTARY], rope, layers),
                    ([RESIDUAL_ADD, norm], h, layers), *by_act]  # fmt: skip
        return [([norm], h, layers), ([ROTARY], rope, layers), ([RESIDUAL_ADD], h, layers),
                ([norm], h, layers), *by_act, ([RESIDUAL_ADD], h, layers)]  # fmt: skip

    def _dense(self, tokens: int) -> _Part:
        """Everything in a step whose cost depends only on the scheduled token count."""
        part = self._dense_cache.get(tokens)
        if part is not None:
            return part
        part = _Part.empty()
        for (*_, times, _), cost in zip(self._gemm_shapes, self._gemms(tokens), strict=True):
            part.add(cost, times)
        if self.arch.is_moe and self.dp == 1:  # with dp > 1, _moe_over_ranks
            part.add(self._routed_experts(tokens), self.arch.num_moe_layers)
        fused = self.overheads.fused_kernels
        for chain, per_token, times in self._chains:
            cost = elementwise_cost(
                self.gpu, chain, tokens * per_token, self.act_dtype, fused=fused
            )
            part.add(cost, times)
        act_bytes = tokens * self.arch.hidden_size * bytes_per_element(self.act_dtype)
        for plan, layers in self.stage_all_reduces:  # two a layer
            part.add(plan.cost(act_bytes), 2 * layers)
        for link, count, first, receiving in self.handoffs:
            for cost, times in self._hand_off(act_bytes, link, first, receiving):
                part.add(cost, times * count)
        part.add(embedding_cost(self.gpu, tokens, self.arch.hidden_size, self.act_dtype))
        self._dense_cache[tokens] = part
        return part

    def _gemms(self, tokens: int) -> list[OpCost]:
        """The costs of the model's GEMMs (_gemm_shapes) at `tokens` tokens. A step's
        token counts fill most of the range up to the budget, so once a block of
        _GEMM_BLOCK counts has asked for more than _GEMM_ALONE of them, the whole block
        is priced in one array pass (gemm_costs_many: the same OpCosts as gemm_cost, to
        the bit)."""
        block, row = divmod(tokens - 1, _GEMM_BLOCK)
        priced = self._gemm_blocks.get(block)
        if priced is not None:
            return priced[row]
        gpu, shapes = self.gpu, self._gemm_shapes
        misses = self._gemm_misses[block] = self._gemm_misses.get(block, 0) + 1
        if misses <= _GEMM_ALONE:
            return [gemm_cost(gpu, tokens, n, k, *dtypes) for _, n, k, _, dtypes in shapes]
        by_gemm = [_gemm_block(gpu, n, k, *dtypes, block) for _, n, k, _, dtypes in shapes]
        priced = self._gemm_blocks[block] = [list(costs) for costs in zip(*by_gemm, strict=True)]
        return priced[row]

    def _gemm_formats(self) -> list[tuple[str, int, int, int, tuple]]:
        """(name, n, k, layers, gemm_dtypes) of the model's GEMMs on one rank, a GEMM the
        checkpoint keeps in 16 bits in some layers (Architecture.unquantized: vLLM's
        UnquantizedLinearMethod for a skipped module) split off in the activation dtype."""
        unquantized = (self.act_dtype, None)
        shapes = []
        for name, _, n, k, times in self.arch.gemms(1, self.tp):
            kept = self.arch.unquantized_layers(name)
            if times > kept:
                shapes.append((name, n, k, times - kept, self.gemm_dtypes(name)))
            if kept:
                shapes.append((name, n, k, kept, unquantized))
        return shapes

    def gemm_dtypes(self, name: str) -> tuple[str | Dtype, str | None]:
        """(kernel dtype, weight format) of the model's GEMM `name` (Architecture.gemms):
        the linear layers' format as spelled (its block scales' bytes), but the MoE gate
        in the activation dtype, as vLLM builds it with quant_config=None."""
        if name == "router":
            return self.act_dtype, None
        return self.gemm_dtype, self.linear_format

    def _moe_over_ranks(self, total: int, tokens: int) -> _Part:
        """The MoE layers of a dp rank's step: the routed experts over all ranks' `total`
        tokens, with the dispatch of this rank's `tokens` and the combine back."""
        key = (total, tokens)
        part = self._moe_cache.get(key)
        if part is not None:
            return part
        part = _Part.empty()
        part.add(self._routed_experts(total), self.arch.num_moe_layers)
        self._add_dispatch(part, total, tokens)
        self._moe_cache[key] = part
        return part

    def _add_dispatch(self, part: _Part, total: int, tokens: int) -> None:
        """Each MoE layer's token dispatch to the experts' GPUs and combine back."""
        assert self.ep_link is not None
        a, dp = self.arch, self.dp
        row = a.hidden_size * bytes_per_element(self.act_dtype)
        if self.all2all_backend == "all_to_all":
            # Each token goes once to every GPU holding one of its top-k experts (DeepEP
            # and pplx send a token to a rank once): expected distinct GPUs under
            # balanced routing, ep x (1 - (1 - 1/ep)^k).
            group = self.tp * dp
            copies = group * (1.0 - (1.0 - 1.0 / group) ** a.experts_per_token)
            nbytes = tokens * copies * row
            ops = (("all_to_all", nbytes), ("all_to_all", nbytes))
        else:  # every rank gathers all ranks' tokens, then reduces and scatters back
            nbytes, group = total * row, dp
            ops = (("all_gather", nbytes), ("reduce_scatter", nbytes))
        for op, size in ops:
            part.add(collective_cost(op, size, group, self.ep_link), a.num_moe_layers)

    def _routed_experts(self, tokens: int) -> OpCost:
        return routed_experts_cost(
            self.arch,
            self.gpu,
            tokens,
            self.experts,
            weight_dtype=self.weight_format,
            routing=self.moe_routing,
            mxfp4_use_marlin=self.mxfp4_use_marlin,
        )

    def _lm_head(self, sampled: int) -> _Part:
        part = self._head_cache.get(sampled)
        if part is not None:
            return part
        part = _Part.empty()
        if sampled > 0:
            _, m, n, k = self.arch.lm_head_gemm(sampled, self.tp)
            part.add(gemm_cost(self.gpu, m, n, k, self.act_dtype))
            if self.tp_link is not None:
                logits = sampled * self.arch.vocab_size * 4.0
                part.add(collective_cost("all_gather", logits, self.tp, self.tp_link))
        self._head_cache[sampled] = part
        return part

    def _fixed(self, tokens: int, sampled: int) -> _Part:
        """Dense layers for `tokens` plus the LM head for `sampled` positions, memoised."""
        key = (tokens, sampled)
        part = self._fixed_cache.get(key)
        if part is None:
            part = self._fixed_cache[key] = self._dense(tokens).plus(self._lm_head(sampled))
            part.kernels += self.arch.num_layers  # the attention kernel of each layer
        return part

    def _rank_fixed(self, tokens: int, sampled: int, moe_tokens: int) -> _Part:
        """_fixed, plus with dp > 1 the MoE layers over all ranks' `moe_tokens` (at
        least this rank's `tokens` times dp), memoised."""
        if self.dp == 1:
            return self._fixed(tokens, sampled)
        key = (tokens, sampled, moe_tokens)
        part = self._rank_cache.get(key)
        if part is None:
            moe = self._moe_over_ranks(max(moe_tokens, tokens), tokens)
            part = self._rank_cache[key] = self._fixed(tokens, sampled).plus(moe)
        return part

    def host_seconds(self, seqs: int) -> float:
        """The engine core's CPU time for a step of `seqs` sequences (one thread)."""
        return (self._step_us + self._per_seq_us * seqs) * 1e-6

    def _launch_seconds(self, kernels: int) -> float:
        return kernels * self._per_kernel_us * 1e-6

    # ---- public --------------------------------------------------------------------
    def step(
        self,
        *,
        decode_seqs: int,
        decode_context: int,
        prefill_seqs: int = 0,
        prefill_tokens: int = 0,
        prefill_pairs: float = 0.0,
        prefill_context: int = 0,
        sampled: int | None = None,
        padded_tokens: int = 0,
        moe_tokens: int = 0,
        window: WindowSums | None = None,
        prefill_chunks: Sequence[PrefillChunk] | None = None,
    ) -> StepCost:
        """One step: `decode_seqs` decodes attending `decode_context` keys in total, plus
        prefill chunks (`prefill_tokens` new tokens over `prefill_seqs` sequences; each
        chunk's (new tokens, pairs, keys) in `prefill_chunks`, which MLA prices by
        sequence). A dp rank's step runs over `padded_tokens` when that is more (vLLM
        pads every rank to the largest's count), and its MoE layers over all ranks'
        `moe_tokens`. `window`: the same sums over each sequence's last sliding_window
        keys, for a model with sliding-window layers (see window_sums)."""
        tokens = decode_seqs + prefill_tokens
        if padded_tokens > tokens:  # vLLM pads a dp rank's pass (a dummy one is all padding)
            tokens = padded_tokens
        if tokens < 1:
            raise ValueError("a step must schedule at least one token")
        if self._window_layers and window is None and (decode_seqs or prefill_tokens):
            raise ValueError(f"{self.arch.name} has sliding-window layers: pass `window`")
        if decode_seqs and not (prefill_tokens or prefill_seqs) and sampled in (None, decode_seqs):
            steps = self.decode_steps(decode_seqs, tokens, moe_tokens)
            return steps.one(decode_context, window.decode_context if window else 0)
        sampled = decode_seqs + prefill_seqs if sampled is None else sampled
        fixed = self._fixed_cache.get((tokens, sampled)) if self.dp == 1 else None
        if fixed is None:
            fixed = self._rank_fixed(tokens, sampled, moe_tokens)
        # The parts by StepBound (compute, memory, comm, host, latency) as locals: the
        # attention adds to compute or memory, as `+=` on a copy of the list would.
        b0, b1, b2, b3, b4 = fixed.seconds
        flops, dram, kernels = fixed.flops, fixed.dram_bytes, fixed.kernels
        pairs, context, keys = prefill_pairs, prefill_context, decode_context
        for layers, prefill, decode, slides in self._attention_kinds:
            if slides:  # the same sums over each sequence's window
                sums = window or _NO_WINDOW
                pairs, context, keys = sums.prefill_pairs, sums.prefill_context, sums.decode_context
            if prefill_tokens:
                if prefill_chunks and self.prices_by_sequence:  # each chunk's kernel by its length
                    terms = prefill.by_sequence(prefill_chunks, decode_seqs)
                else:
                    terms = prefill(prefill_seqs, prefill_tokens, pairs, context)
                seconds, f, d, compute, memory = terms
                if compute >= memory:
                    b0 += seconds * layers
                else:
                    b1 += seconds * layers
                flops += f * layers
                dram += d * layers
                if decode_seqs:
                    kernels += layers  # prefill and decode attention are separate kernels
            if decode_seqs:
                seconds, f, d = decode.one_step_for(decode_seqs)(keys)
                b1 += seconds * layers
                flops += f * layers
                dram += d * layers
        # sum() of the parts term by term, then _launch_seconds and host_seconds inline
        # (the same arithmetic: sum() starts from the integer 0, and 0 + x is x).
        gpu_seconds = b0 + b1 + b2 + b3 + b4 + kernels * self._per_kernel_us * 1e-6
        host = (self._step_us + self._per_seq_us * (decode_seqs + prefill_seqs)) * 1e-6
        if self._async:  # max(gpu_seconds, host): the first unless the second is larger
            seconds = host if host > gpu_seconds else gpu_seconds
        else:
            seconds = gpu_seconds + host
        # Else the first largest part, as max(range(...), key=...) would pick.
        if host >= gpu_seconds:
            bound = _HOST_BOUND
        else:
            parts = (b0, b1, b2, b3, b4)
            bound = _STEP_BOUNDS[parts.index(max(parts))]
        ranks = self.tp  # the replica's work: every TP rank does one rank's
        return StepCost(seconds, gpu_seconds, flops * ranks, dram * ranks, bound)

    def decode_steps(self, seqs: int, padded: int = 0, moe: int = 0) -> DecodeSteps:
        """Decode-only steps of `seqs` sequences (memoised: batch sizes repeat); a dp
        rank's run over at least `padded` tokens, its MoE layers over `moe`."""
        key = seqs if self.dp == 1 else (seqs, padded, moe)
        steps = self._decode_steps.get(key)
        if steps is None:
            steps = self._decode_steps[key] = DecodeSteps(self, seqs, padded, moe)
        return steps

    def decode_run(
        self, seqs: int, contexts: np.ndarray, window_contexts: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | int]:
        """Consecutive decode-only steps with a fixed batch: `contexts[j]` is the total
        keys attended at step j (`window_contexts[j]` in sliding-window layers). Per-step
        (seconds, flops, dram_bytes) arrays and the bound (an array, or one value for the
        whole run), as step() prices each."""
        return self.decode_steps(seqs).many(contexts, window_contexts)

    def moe_kernel_note(self) -> str | None:
        """Which kernel the routed experts run, where vLLM picks it by GPU (MXFP4
        experts: moe_layer.mxfp4_backend); None otherwise."""
        if not self.arch.is_moe:
            return None
        return moe_note(self.weight_format, self.gpu, self.mxfp4_use_marlin)

    def all_reduce_note(self) -> str | None:
        """Which backend the layers' all-reduces take, by size and tokens (None: tp = 1);
        pipeline stages whose groups differ (on a PCIe tree) are told apart."""
        if not self.stage_all_reduces:
            return None
        row = self.arch.hidden_size * bytes_per_element(self.act_dtype)
        if len(self.stage_all_reduces) == 1:
            return self.tp_all_reduce.describe(row)
        return " | ".join(
            f"{layers} of {self.arch.num_layers} layers: {plan.describe(row)}"
            for plan, layers in self.stage_all_reduces
        )

    @property
    def peak_flops(self) -> float:
        """Dense peak of all GPUs in the replica for the compute dtype (MFU denominator)."""
        return self.gpu.peak_flops(self.compute_dtype) * self.tp * self.pp

    @property
    def peak_bandwidth(self) -> float:
        return self.gpu.memory_bandwidth * self.tp * self.pp
