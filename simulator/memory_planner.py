"""Per-GPU memory of a serving replica: weights, activations, overhead, and what is left
for the KV cache. The KV cache's capacity in tokens is what limits batch size under load.

Accounting follows vLLM: `gpu_memory_utilization` of device memory is the budget, and the
KV cache gets whatever weights, the profiled activation peak and non-torch overhead leave.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.block_scaling import stored_bytes
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.errors import InfeasibleError, InfersimError
from hardware_models.presets import load_node, nodes_with_gpu
from simulator.architecture import ModelArchitecture
from simulator.engine.kv_groups import KvCacheGroups, page_layers
from simulator.engine.moe_layer import ExpertLayout
from simulator.engine.mxfp4_layout import ExpertDims, is_mxfp4_moe, mxfp4_expert_dims
from simulator.engine.weight_format import (
    check_block_shards,
    check_weight_support,
    weight_format,
)
from simulator.inputs import gpu_of, model_of, positive_int
from simulator.vllm_defaults import EMULATED_VLLM_VERSION, batch_limits

GB = 1e9
GIB = 2**30
"""vLLM's unit for the memory it is told in gigabytes (--swap-space, kv_cache_memory_bytes'
logs, its non-torch figures): GiB_bytes, vllm/utils/mem_constants.py."""

DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's default cap on sequences per step: the number of positions that get logits."""

# vLLM's non-torch memory (what its memory profiler counts outside PyTorch's allocator:
# cuBLAS workspaces, NCCL's and the custom all-reduce's buffers), in GiB, as its start-up
# logs print it; no source gives it in closed form. One GPU: 0.16 on an H100 (vllm PR
# #12126), 0.20 per RTX 3090 at tp>1 over PCIe (PR #14447), 0.25 per RTX 4090 at tp=2 (issue
# #13061). Over NVLink, NCCL (its NVLink SHARP and per-peer channel buffers) and vLLM's
# custom all-reduce add what one vLLM version (0.6.4, PR #10511 and issue #10702) shows
# against its own tp=1 figure: +1.79 GiB at tp=2 on H100, +3.89 at tp=8 on H200, i.e.
# 1.44 GiB plus 0.35 a peer.
_NON_TORCH_GIB = 0.2
_NVLINK_COMM_GIB = 1.44
_NVLINK_COMM_PER_PEER_GIB = 0.35

# vLLM's profile run (vllm/v1/worker/gpu_model_runner.py `profile_run`, V1 0.9-0.14) is a
# forward pass over max_num_batched_tokens tokens, then `_dummy_sampler_run` over one
# position per sequence (max_num_seqs of them). Its torch peak is the larger of the two.
# The fused-MoE layer works through its tokens in chunks of VLLM_FUSED_MOE_CHUNK_SIZE
# (vllm/envs.py: 32768).
_FUSED_MOE_CHUNK_TOKENS = 32768
# The dummy sampler sets temperature, top-k and top-p (gpu_model_runner._dummy_sampler_run),
# so the sampler (vllm/v1/sample/ops/topk_topp_sampler.py) filters and samples every row.
# Its peak per logit (sampler_bytes_per_logit) depends on the top-k/top-p path by version.
_TRITON_SAMPLER_VERSION = (0, 17, 0)
# From 0.17 apply_top_k_top_p runs a Triton kernel that masks the logits in place (no sort;
# vllm PR #33538, Feb 2026; in _dummy_sampler_run's traceback on 0.16.0rc2.dev377, issue
# #35390): the bf16 logits compute_logits returns (2), their fp32 copy (4), the fp32
# softmax (4) and random_sample's exponential noise (4). The kernel's own [programs x
# vocab] scratch (~80 MiB, PR #33538) is left out. FlashInfer's sampler, where on, holds
# as much (masked logits and their softmax).
_TRITON_SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4 + 4
# Before, its PyTorch path sorted the logits: besides the bf16 and fp32 logits (2 + 4), the
# sort's fp32 values and int64 indices (4 + 8), the top-p softmax, its cumulative sum and
# the bool mask (4 + 4 + 1). A lower bound: torch.sort's own scratch is not counted (PR
# #32558 measures the PyTorch path at ~1.25 GB for 256 x 131072 fp32 logits).
_SORT_SAMPLER_BYTES_PER_LOGIT = 2 + 4 + (4 + 8) + (4 + 4 + 1)


def sampler_bytes_per_logit(vllm_version: tuple[int, int, int] = EMULATED_VLLM_VERSION) -> int:
    """Bytes a logit of vLLM's dummy sampler run holds at its peak, for that vLLM version."""
    if vllm_version >= _TRITON_SAMPLER_VERSION:
        return _TRITON_SAMPLER_BYTES_PER_LOGIT
    return _SORT_SAMPLER_BYTES_PER_LOGIT


def default_gpus_per_node(gpu: AcceleratorSpec) -> int | None:
    """GPUs a node of the GPU's first node preset holds, the node a run takes when the
    scenario names none (build.resolve_node); None for a GPU no preset is built
    from."""
    names = nodes_with_gpu(gpu.name)
    return load_node(names[0]).gpus_per_node if names else None


def framework_overhead_bytes(
    gpu: AcceleratorSpec,
    tp: int,
    asked_gb: float | None = None,
    gpus_per_node: int | None = None,
) -> float:
    """vLLM's non-torch memory on one GPU of a tp group: cuBLAS and driver allocations,
    plus NCCL's and the custom all-reduce's buffers when the group talks over NVLink;
    `asked_gb` (engine.framework_overhead_gb, estimate's --framework-overhead-gb), when
    given, replaces the modelled figure. CUDA graphs are not in it: vLLM captures them
    after sizing the KV cache, out of the (1 - gpu_memory_utilization) reserve, unless
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is set (vllm PR #30515, 0.13: opt-in).
    The per-peer share counts the peers a GPU reaches over NVLink, those on its node
    (`gpus_per_node`; default: the GPU's node preset, else the whole group): ranks on
    other nodes are reached over the network, where vLLM's custom all-reduce does not
    start (CustomAllreduce: a group spanning nodes, or of more than 8 GPUs, gets NCCL
    only) and NCCL keeps buffers for its ring and tree neighbours alone."""
    if asked_gb is not None:
        return asked_gb * GIB
    gib = _NON_TORCH_GIB
    if tp > 1 and gpu.nvlink is not None:
        per_node = gpus_per_node or default_gpus_per_node(gpu) or tp
        gib += _NVLINK_COMM_GIB + _NVLINK_COMM_PER_PEER_GIB * (min(tp, per_node) - 1)
    return gib * 2**30


# Block-quantised formats store one scale per group of weights. Assumed: int4 as in
# GPTQ/AWQ (group 128, fp16 scale) and a plain fp4 as MXFP4 (group 32, 8-bit scale:
# gpt-oss's checkpoint, and the fused-MoE format fp4 experts run, efficiency.MOE_FORMATS
# w4a16_mxfp4); the block-scaled formats as hardware_models.block_scaling stores them
# (fp8_block: one fp32 scale per 128 x 128 block; nvfp4: an fp8 scale per 16; mxfp4: an
# e8m0 scale per 32). nvfp4's per-tensor fp32 scale is 4 bytes a matrix: left out.
_INT4_SCALE_BYTES_PER_WEIGHT = 2 / 128


def weight_bytes_per_param(dtype: str | Dtype) -> float:
    """Storage per quantised weight, including its share of the group scale."""
    fmt = weight_format(dtype)
    if fmt == Dtype.INT4.value:
        return bytes_per_element(fmt) + _INT4_SCALE_BYTES_PER_WEIGHT
    return stored_bytes(fmt)


class StageWeights(NamedTuple):
    """Weight bytes on one GPU of a pipeline stage."""

    total: float
    experts: float  # of which routed experts


def _layer_weight_bytes(
    arch: ModelArchitecture,
    tp: int,
    experts: ExpertLayout,
    w_format: str,
    a_bytes: float,
    gpu: AcceleratorSpec | None = None,
) -> tuple[float, float, float]:
    """Bytes of one dense layer, of one MoE layer, and of its routed experts on one GPU.

    Weight matrices are stored in the weight dtype: the attention's split over tp (GQA's
    K/V projections replicate when tp > KV heads; MLA's down-projections replicate), the
    dense MLP and the shared experts split over tp, and the routed experts as `experts`
    places them (sliced over tp, or whole over the EP group). The router, norms, biases
    and sinks stay in the activation dtype, as vLLM's quantised loaders keep them. An
    MXFP4 MoE checkpoint (gpt-oss) quantises its experts only, padded for the kernel
    that runs them on `gpu` (simulator.engine.mxfp4_layout).
    """
    w_bytes = weight_bytes_per_param(w_format)
    attention = sum(n * k for _, _, n, k in arch.attention_gemms(1, tp))
    dense_mlp = arch.mlp_matrix_params(math.ceil(arch.intermediate_size / tp))
    shared = arch.mlp_matrix_params(math.ceil(arch.shared_intermediate_size / tp))
    linear_bytes = w_bytes
    dims = ExpertDims(arch.hidden_size, experts.expert_width(arch))
    if is_mxfp4_moe(w_format, arch.is_moe):
        linear_bytes = a_bytes
        dims = mxfp4_expert_dims(gpu, *dims)
    expert = arch.mlp_matrix_params(dims.width) * dims.hidden // arch.hidden_size
    routed = experts.experts_per_gpu * expert
    # Everything but the matrices (router included), kept whole on every GPU.
    whole_dense = (
        arch.dense_layer_params
        - arch.attention_linear_params
        - arch.mlp_matrix_params(arch.intermediate_size)
    )
    whole_moe = (
        arch.moe_layer_params
        - arch.attention_linear_params
        - arch.mlp_matrix_params(arch.shared_intermediate_size)
        - arch.num_experts * arch.mlp_matrix_params(arch.expert_intermediate_size)
    )
    dense_layer = (attention + dense_mlp) * linear_bytes + whole_dense * a_bytes
    moe_layer = (attention + shared) * linear_bytes + routed * w_bytes + whole_moe * a_bytes
    return dense_layer, moe_layer, routed * w_bytes


def _unquantized_extra(
    arch: ModelArchitecture, tp: int, w_format: str, a_bytes: float
) -> list[tuple[str, float]]:
    """(GEMM name, the bytes one layer's shard adds) for each GEMM the checkpoint keeps in
    16 bits in some layers (ModelArchitecture.unquantized): its weights stored in the
    activation dtype, not the weight format, as vLLM's quantised loaders leave a skipped
    module an UnquantizedLinearMethod. Nothing for an MXFP4 MoE checkpoint, whose linear
    layers are 16-bit already."""
    if not arch.unquantized or is_mxfp4_moe(w_format, arch.is_moe):
        return []
    narrower = a_bytes - weight_bytes_per_param(w_format)
    shards = {name: n * k for name, _, n, k, _ in arch.gemms(1, tp)}
    return [(name, shards[name] * narrower) for name in arch.unquantized if narrower > 0]


def stage_layers(arch: ModelArchitecture, pp: int) -> list[range]:
    """The layers of each pipeline stage, as vLLM's get_pp_indices splits them: layers // pp
    each, the remainder one apiece to the stages before the last, from the second last
    back (the last stage also holds the final norm and the LM head). DeepSeek-V3's 61
    layers over pp=4 are 15, 15, 16, 15; no stage is ever empty."""
    if pp < 1:
        raise InfersimError(f"pp must be >= 1, got {pp}")
    if pp > arch.num_layers:
        raise InfersimError(f"{arch.name}: pp={pp} exceeds num_layers ({arch.num_layers})")
    sizes = [arch.num_layers // pp] * pp
    for i in range(2, arch.num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def stage_weights(
    arch: ModelArchitecture,
    *,
    weight_dtype: str | Dtype,
    activation_dtype: str | Dtype = Dtype.BF16,
    tp: int = 1,
    pp: int = 1,
    expert_parallel: bool = False,
    dp: int = 1,
    gpu: AcceleratorSpec | None = None,
) -> list[StageWeights]:
    """Weight bytes on one GPU of each pipeline stage.

    With pp stages the first adds the embedding and the last the final norm and the LM
    head (a copy of the embedding when tied and pp > 1); the vocabulary splits over tp.
    With attention data parallelism the routed experts spread over all tp x dp GPUs.
    `gpu` picks the padding of MXFP4 experts (the kernel vLLM runs them with there).
    """
    arch.check_tp(tp)
    experts = ExpertLayout.of(arch, tp, expert_parallel, dp)
    check_block_shards(arch, weight_format(weight_dtype), tp, experts.moe_tp)
    a_bytes = bytes_per_element(activation_dtype)
    dense, moe, routed = _layer_weight_bytes(
        arch, tp, experts, weight_format(weight_dtype), a_bytes, gpu
    )
    vocab_shard = math.ceil(arch.vocab_size / tp) * arch.hidden_size
    head = 0 if (pp == 1 and arch.tie_word_embeddings) else vocab_shard
    stages = stage_layers(arch, pp)
    kept = _unquantized_extra(arch, tp, weight_format(weight_dtype), a_bytes)
    weights = []
    for index, layers in enumerate(stages):
        moe_layers = sum(arch.is_moe_layer(i) for i in layers)
        total = moe_layers * moe + (len(layers) - moe_layers) * dense
        total += sum(arch.unquantized_layers(name, layers) * extra for name, extra in kept)
        ends = (vocab_shard if index == 0 else 0) + (
            head + arch.final_norm_params if index == len(stages) - 1 else 0
        )
        weights.append(StageWeights(total + ends * a_bytes, moe_layers * routed))
    return weights


def stage_weight_bytes(arch: ModelArchitecture, **layout: Any) -> float:
    """Weights on the most loaded GPU: the largest of stage_weights(arch, **layout)."""
    return max(stage.total for stage in stage_weights(arch, **layout))


def kv_bytes_per_token_on_gpu(
    arch: ModelArchitecture, layers: range, kv_dtype: str | Dtype, tp: int = 1
) -> float:
    """KV bytes one token takes on one GPU holding `layers`: its K/V heads' share (GQA),
    or the whole MLA latent, which every TP rank keeps. Sliding-window layers count at
    full length, as vLLM allocates without its hybrid KV cache manager (with it, a block
    holds one KV cache group's layers: plan_memory's `kv_groups`)."""
    return len(layers) * arch.kv_elements_per_token_layer_shard(tp) * bytes_per_element(kv_dtype)


def activation_bytes(
    arch: ModelArchitecture,
    tokens: int,
    *,
    tp: int = 1,
    activation_dtype: str | Dtype = Dtype.BF16,
    sampled_tokens: int | None = None,
    expert_parallel: bool = False,
    dp: int = 1,
    vllm_version: tuple[int, int, int] = EMULATED_VLLM_VERSION,
) -> float:
    """Peak transient memory of vLLM's profile run over `tokens` tokens, on one TP rank:
    the larger of the forward pass's and the sampler's peaks.

    The forward pass holds the live buffers at the widest point of a layer:
    - residual stream and normed input: 2 x tokens x hidden;
    - the larger of the attention intermediates (QKV output + attention output; MLA's
      decompressed K and V) and the MLP's (gate_up output + activated product), sharded
      by tp. An MoE layer's routed experts see tokens x experts_per_token rows, in chunks
      of VLLM_FUSED_MOE_CHUNK_SIZE tokens, each row an expert's width (sliced over tp,
      or whole with `expert_parallel`; every rank sees all dp ranks' tokens once
      dispatched). The fused-MoE workspaces (vLLM's modular kernel, TritonExperts
      `workspace_shapes` in fused_moe.py, 0.10-0.14): workspace13 (rows x max(width,
      hidden)) holds the activated product, workspace2 (rows x max(gate_up width,
      hidden)) the gate/up output and then the down output, besides the layer's output
      (tokens x hidden) and the shared experts' MLP.
    Layers run one after another and free their intermediates, so only one counts.
    The sampler then takes one position per sequence (`sampled_tokens`: min(tokens,
    256) by default): logits over the full vocabulary on every rank (gathered), and the
    top-k/top-p sampler's buffers (sampler_bytes_per_logit of `vllm_version`), with the
    forward's hidden states still held.
    """
    if tokens < 1:
        raise InfersimError(f"tokens must be >= 1, got {tokens}")
    a_bytes = bytes_per_element(activation_dtype)
    q_shard = arch.q_dim / tp
    if arch.is_mla:  # prefill decompresses each head's K and V from the latent
        heads = arch.num_attention_heads / tp
        attention = tokens * (2 * q_shard + 2 * heads * arch.v_head_dim + arch.mla_latent_dim)
    else:
        attention = tokens * (2 * q_shard + 2 * arch.kv_heads_per_shard(tp) * arch.head_dim)
    width = (3 if arch.gated_mlp else 2) * math.ceil(arch.intermediate_size / tp)
    mlp = tokens * width
    if arch.is_moe:
        width = ExpertLayout.of(arch, tp, expert_parallel, dp).expert_width(arch)
        gate_up = (2 if arch.gated_mlp else 1) * width
        rows = min(dp * tokens, _FUSED_MOE_CHUNK_TOKENS) * arch.experts_per_token
        shared = (3 if arch.gated_mlp else 2) * math.ceil(arch.shared_intermediate_size / tp)
        routed = rows * (max(width, arch.hidden_size) + max(gate_up, arch.hidden_size))
        mlp = max(mlp, routed + tokens * (arch.hidden_size + shared))
    residual = 2 * tokens * arch.hidden_size
    forward = (residual + max(attention, mlp)) * a_bytes
    sampled = min(tokens, DEFAULT_MAX_NUM_SEQS) if sampled_tokens is None else sampled_tokens
    sampler = sampled * arch.vocab_size * sampler_bytes_per_logit(vllm_version)
    return max(forward, tokens * arch.hidden_size * a_bytes + sampler)


@dataclass(frozen=True)
class SettingNames:
    """How a command spells the settings a refusal suggests changing (pp None: the
    command cannot set it)."""

    max_model_len: str = "serving.max_model_len"
    gpu_memory_utilization: str = "serving.gpu_memory_utilization"
    tp: str = "parallelism.tp"
    pp: str | None = "parallelism.pp"
    kv_dtype: str = "model.kv_dtype"
    max_num_seqs: str = "serving.max_num_seqs"
    max_num_batched_tokens: str = "serving.max_num_batched_tokens"


RUN_SETTINGS = SettingNames()
PLAN_SETTINGS = SettingNames(tp="plan.tp", pp="plan.pp")
ESTIMATE_SETTINGS = SettingNames(
    max_model_len="--max-model-len",
    gpu_memory_utilization="--gpu-memory-utilization",
    tp="--tp",
    pp=None,
    kv_dtype="--kv-dtype",
    max_num_seqs="--max-num-seqs",
    max_num_batched_tokens="--max-num-batched-tokens",
)


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on the most loaded GPU of one replica. `usable` is the vLLM budget."""

    model: str
    gpu: str
    weight_dtype: str
    kv_dtype: str
    tp: int
    pp: int
    capacity: float
    gpu_memory_utilization: float
    weights: float
    activations: float
    framework_overhead: float
    kv_bytes_per_token: float
    usable: float
    kv_capacity_bytes: float
    kv_capacity_tokens: int
    expert_weights: float = 0.0  # of `weights`, the routed experts'
    expert_parallel: bool = False
    dp: int = 1  # attention data-parallel ranks; the KV capacity is one rank's
    # With vLLM V1's hybrid KV cache manager: the KV cache groups, whose blocks all hold
    # `kv_bytes_per_token` a token (one group's layers), and the pool's capacity in
    # tokens of one group; None: every layer's KV in every block.
    kv_groups: KvCacheGroups | None = None
    # With a max_model_len to serve: it, and the longest max_model_len (up to it) whose
    # one sequence the KV cache holds on every GPU (vLLM's estimate_max_model_len).
    max_model_len: int | None = None
    longest_fitting_len: int | None = None

    def refusal(self, settings: SettingNames = RUN_SETTINGS) -> str:
        """Why vLLM refuses to start this replica (empty: it starts): the KV cache cannot
        hold one sequence of max_model_len tokens, as vLLM's check_enough_kv_cache_memory
        (vllm/v1/core/kv_cache_utils.py) judges at start-up. The way out names each
        setting as the command spells it (`settings`) and offers only what can still
        change: no higher utilization at 1.0, no fp8 KV cache when it is fp8 already."""
        if self.max_model_len is None or self.longest_fitting_len == self.max_model_len:
            return ""
        per = " of a group" if self.kv_groups else ""
        longest = (
            f"the largest max_model_len that fits is {self.longest_fitting_len}"
            if self.longest_fitting_len
            else "not even one token fits"
        )
        return (
            f"{self.model} on {self.gpu} (tp={self.tp}, pp={self.pp}): the KV cache "
            f"({self.kv_capacity_bytes / GB:.2f} GB, KV capacity{per} "
            f"{self.kv_capacity_tokens} tokens) cannot hold one sequence of "
            f"max_model_len={self.max_model_len} tokens, so vLLM refuses to start "
            f"(check_enough_kv_cache_memory); {longest}: {self._ways_out(settings)}"
        )

    def _ways_out(self, settings: SettingNames) -> str:
        """The changes that give one sequence room, each named as `settings` spell it."""
        ways = [f"set {settings.max_model_len} to at most that"] if self.longest_fitting_len else []
        if self.gpu_memory_utilization < 1:
            now = f"now {self.gpu_memory_utilization:g}"
            ways.append(f"raise {settings.gpu_memory_utilization} ({now})")
        degrees = [f"{settings.tp} (now {self.tp})"]
        if settings.pp is not None:
            degrees.append(f"{settings.pp} (now {self.pp})")
        ways.append(f"raise {' or '.join(degrees)}")
        if bytes_per_element(self.kv_dtype) > bytes_per_element(Dtype.FP8):
            ways.append(f"set {settings.kv_dtype} to fp8 (now {self.kv_dtype})")
        return ", or ".join(ways)

    def check_starts(self, settings: SettingNames = RUN_SETTINGS) -> None:
        """Raise MaxModelLenRefused where vLLM would refuse to start (see `refusal`)."""
        if self.refusal():
            raise MaxModelLenRefused(self, settings)

    def breakdown(self) -> list[tuple[str, float]]:
        """(item, GB) rows that add up to the GPU's capacity."""
        return [
            ("weights", self.weights / GB),
            ("activations", self.activations / GB),
            ("framework overhead", self.framework_overhead / GB),
            ("KV cache", self.kv_capacity_bytes / GB),
            (f"reserved (1 - {self.gpu_memory_utilization:g})", (self.capacity - self.usable) / GB),
        ]

    def table(self) -> str:
        title = (
            f"{self.model} on {self.gpu} ({self.weight_dtype} weights, {self.kv_dtype} KV, "
            f"tp={self.tp}, pp={self.pp}{f', dp={self.dp}' if self.dp > 1 else ''}"
            f"{', expert parallel' if self.expert_parallel else ''})"
            ", per GPU"
        )
        rows = [f"  {item:<28}{gb:>9.2f} GB" for item, gb in self.breakdown()]
        footer = []
        if self.expert_weights:
            footer.append(
                f"  {'of weights: routed experts':<28}{self.expert_weights / GB:>9.2f} GB"
            )
        per = " (a group)" if self.kv_groups else ""
        footer += [
            f"  {'capacity (CUDA-visible)':<28}{self.capacity / GB:>9.2f} GB",
            f"  {'KV bytes per token' + per:<28}{self.kv_bytes_per_token:>9.0f} B",
            f"  {'KV capacity' + per:<28}{self.kv_capacity_tokens:>9d} tokens",
        ]
        if self.kv_groups:
            footer.append(f"  {'KV cache groups':<28} {self.kv_groups.describe()}")
        if self.longest_fitting_len is not None:
            footer.append(f"  {'longest max_model_len':<28}{self.longest_fitting_len:>9d} tokens")
        return "\n".join([title, *rows, *footer])


def _batch_defaults(
    gpu: AcceleratorSpec,
    vllm_version: tuple[int, int, int],
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    max_model_len: int,
) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) as `run` resolves unset ones
    (ServingSection.with_vllm_defaults): `vllm serve`'s defaults for `gpu` at the memory
    CUDA reports, each bounded by the other as EngineArgs does (chunked prefill, V1's
    default)."""
    chosen = batch_limits(
        vllm_version,
        gpu.display_name,
        gpu.cuda_memory_bytes / 2**30,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        chunked_prefill=True,
        max_model_len=max_model_len,
    )
    seqs = chosen["max_num_seqs"].value if max_num_seqs is None else max_num_seqs
    tokens = (
        chosen["max_num_batched_tokens"].value
        if max_num_batched_tokens is None
        else max_num_batched_tokens
    )
    return int(seqs), int(tokens)


class MaxModelLenRefused(InfeasibleError):
    """vLLM refuses to start: the KV cache cannot hold one sequence of max_model_len
    tokens (MemoryPlan.refusal, its settings spelled as `settings`); `longest` is the
    largest max_model_len that fits."""

    def __init__(self, plan: MemoryPlan, settings: SettingNames) -> None:
        super().__init__(plan.refusal(settings))
        self.plan = plan
        self.longest = plan.longest_fitting_len or 0

    def named(self, settings: SettingNames) -> MaxModelLenRefused:
        """The same refusal with its settings spelled as another command sets them."""
        return MaxModelLenRefused(self.plan, settings)


def plan_memory(
    arch: ModelArchitecture | str | os.PathLike[str],
    gpu: AcceleratorSpec | str | os.PathLike[str],
    *,
    weight_dtype: str | Dtype = Dtype.BF16,
    kv_dtype: str | Dtype = Dtype.BF16,
    tp: int = 1,
    pp: int = 1,
    gpu_memory_utilization: float = 0.90,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    activation_dtype: str | Dtype = Dtype.BF16,
    framework_overhead_gb: float | None = None,
    expert_parallel: bool = False,
    dp: int = 1,
    kv_groups: KvCacheGroups | None = None,
    max_model_len: int | None = None,
    block_size: int = 16,
    vllm_version: tuple[int, int, int] = EMULATED_VLLM_VERSION,
    gpus_per_node: int | None = None,
    nodes: int | None = None,
) -> MemoryPlan:
    """Plan one GPU of a tp x pp x dp replica (experts sliced over the tp x dp GPUs, or
    whole over them with `expert_parallel`; each dp rank's tp GPUs hold that rank's KV
    cache, so the plan's KV capacity is one rank's); raise InfeasibleError (with the breakdown) when
    weights, activations and overhead leave no room for a KV cache. The plan is the
    GPU whose stage holds the fewest KV tokens. With `kv_groups` (vLLM V1's hybrid KV
    cache manager) a block holds a page of one group's layers, as many as the most any
    group has on the stage (vLLM's tensors shared by one layer of each group). With
    `max_model_len`, the plan also holds the longest max_model_len up to it whose one
    sequence fits (`MemoryPlan.refusal` says when vLLM would refuse to start).
    `framework_overhead_gb` overrides the modelled non-torch memory
    (framework_overhead_bytes, over nodes of `gpus_per_node` GPUs; default: the GPU's
    node preset); `max_num_seqs` sizes the sampler's share of the profiled peak,
    `vllm_version` its bytes a logit (sampler_bytes_per_logit). Unset batch limits are
    `vllm serve`'s defaults for this GPU in `vllm_version` (vllm_defaults.batch_limits),
    as a scenario's are, so the plan is the one `run` makes.
    `arch` and `gpu` may be given as load_model and load_gpu take them (names, files).
    What does not fit raises DoesNotFit, which names the cheapest tp x pp that does with
    tp inside a node of `gpus_per_node` (8 where the GPU has no node preset) and pp across
    nodes (and whether the `nodes` given hold it)."""
    arch, gpu = model_of(arch, "plan_memory: arch"), gpu_of(gpu, "plan_memory: gpu")
    tp, pp, dp, block_size = (
        positive_int(value, f"plan_memory: {name}")
        for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("block_size", block_size))
    )
    max_num_seqs, max_num_batched_tokens, max_model_len = (
        None if value is None else positive_int(value, f"plan_memory: {name}")
        for name, value in (
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_model_len", max_model_len),
        )
    )
    if max_num_seqs is None or max_num_batched_tokens is None:
        max_num_seqs, max_num_batched_tokens = _batch_defaults(
            gpu,
            vllm_version,
            max_num_seqs,
            max_num_batched_tokens,
            max_model_len or arch.max_position_embeddings,
        )
    if not 0 < gpu_memory_utilization <= 1:
        raise InfersimError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
        )
    if framework_overhead_gb is not None and framework_overhead_gb < 0:
        raise InfersimError(f"framework_overhead_gb must be >= 0, got {framework_overhead_gb}")
    w_format, k_dtype = weight_format(weight_dtype), parse_dtype(kv_dtype)
    check_weight_support(gpu, w_format, "model.weight_dtype")

    def weights_and_activations(tp: int, pp: int = pp) -> tuple[list[StageWeights], float]:
        weights = stage_weights(
            arch,
            weight_dtype=w_format,
            activation_dtype=activation_dtype,
            tp=tp,
            pp=pp,
            expert_parallel=expert_parallel,
            dp=dp,
            gpu=gpu,
        )
        activations = activation_bytes(
            arch,
            max_num_batched_tokens,
            tp=tp,
            activation_dtype=activation_dtype,
            # vLLM's profile run samples one position per request: min(tokens, max_num_seqs)
            # (gpu_model_runner._dummy_sampler_run)
            sampled_tokens=min(max_num_batched_tokens, max_num_seqs),
            expert_parallel=expert_parallel,
            dp=dp,
            vllm_version=vllm_version,
        )
        return weights, activations

    stages, activations = weights_and_activations(tp)
    overhead = framework_overhead_bytes(gpu, tp, framework_overhead_gb, gpus_per_node)
    # vLLM's budget: a share of what torch.cuda.mem_get_info reports, not the datasheet.
    usable = gpu.cuda_memory_bytes * gpu_memory_utilization
    heaviest = max(stages)
    weights = heaviest.total
    layout = f"tp={tp}, pp={pp}" + (f", dp={dp}" if dp > 1 else "")
    layout += ", expert parallel" if expert_parallel else ""
    experts = f", {heaviest.experts / GB:.1f} GB of them routed experts" if arch.is_moe else ""
    if weights + activations + overhead >= usable:
        per_node = gpus_per_node or default_gpus_per_node(gpu) or 8

        def fits(tp: int, pp: int) -> bool:
            """Room for a KV cache on every GPU, for one max_model_len sequence if given."""
            stages, activations = weights_and_activations(tp, pp)
            free = (
                usable
                - activations
                - framework_overhead_bytes(gpu, tp, framework_overhead_gb, gpus_per_node)
            )
            layout = (block_size, max_num_batched_tokens, kv_groups)
            return all(
                stage.total < free
                and (
                    max_model_len is None
                    or one_sequence_kv_bytes(arch, layers, k_dtype, tp, max_model_len, *layout)
                    <= free - stage.total
                )
                for layers, stage in zip(stage_layers(arch, pp), stages, strict=True)
            )

        raise DoesNotFit(
            f"{arch.name} ({w_format}, {layout}) does not fit on {gpu.name}: "
            f"weights {weights / GB:.1f} GB + activations {activations / GB:.1f} GB + "
            f"overhead {overhead / GB:.1f} GB > usable {usable / GB:.1f} GB "
            f"({gpu.memory.visible_gib:g} GiB x {gpu_memory_utilization:.2f}) on the most "
            f"loaded GPU{experts}",
            tp,
            pp,
            cheapest_fit(arch, fits, per_node),
            per_node,
            nodes,
        )
    # Each stage's GPUs keep their own KV cache; the stage holding the fewest tokens
    # limits the replica.
    plans = []
    for layers, stage in zip(stage_layers(arch, pp), stages, strict=True):
        paged = layers if kv_groups is None else range(page_layers(arch, layers))
        per_token = kv_bytes_per_token_on_gpu(arch, paged, k_dtype, tp)
        room = usable - stage.total - activations - overhead
        plans.append((room // per_token, stage, per_token, room))
    tokens, stage, kv_per_token, kv_capacity = min(plans)
    longest = None
    if max_model_len is not None:
        layout = (block_size, max_num_batched_tokens, kv_groups)
        rooms = [room for *_, room in plans]
        longest = min(
            longest_fitting_len(arch, layers, k_dtype, tp, room, max_model_len, *layout)
            for layers, room in zip(stage_layers(arch, pp), rooms, strict=True)
        )
    return MemoryPlan(
        model=arch.name,
        gpu=gpu.name,
        weight_dtype=w_format,
        kv_dtype=k_dtype.value,
        tp=tp,
        pp=pp,
        dp=dp,
        capacity=gpu.cuda_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        weights=stage.total,
        expert_weights=stage.experts,
        expert_parallel=expert_parallel,
        activations=activations,
        framework_overhead=overhead,
        kv_bytes_per_token=kv_per_token,
        usable=usable,
        kv_capacity_bytes=kv_capacity,
        kv_capacity_tokens=int(tokens),
        kv_groups=kv_groups,
        max_model_len=max_model_len,
        longest_fitting_len=longest,
    )


def one_sequence_kv_bytes(
    arch: ModelArchitecture,
    layers: range,
    kv_dtype: str | Dtype,
    tp: int,
    max_model_len: int,
    block_size: int,
    max_num_batched_tokens: int,
    kv_groups: KvCacheGroups | None,
) -> float:
    """KV bytes one sequence of max_model_len tokens may hold on a GPU with `layers`, as
    vLLM sums each layer's KVCacheSpec.max_memory_usage_bytes: a full-attention layer
    every block of the sequence; with the hybrid KV cache manager (`kv_groups`) a
    sliding-window layer the window and a step's tokens plus a block (SlidingWindowSpec),
    a chunked local one the chunk and a step's tokens (ChunkedLocalAttentionSpec).
    Without it every layer is held at full length, as vLLM's unify_hybrid_kv_cache_specs
    makes them full-attention specs."""
    page = block_size * arch.kv_elements_per_token_layer_shard(tp) * bytes_per_element(kv_dtype)
    blocks = -(-max_model_len // block_size)
    if kv_groups is None:
        return page * len(layers) * blocks
    sliding = sum(arch.is_sliding_layer(i) for i in layers)
    if kv_groups.chunked:
        window = -(-min(kv_groups.window + max_num_batched_tokens, max_model_len) // block_size)
    else:
        span = min(kv_groups.window - 1 + max_num_batched_tokens, max_model_len)
        window = -(-span // block_size) + 1
    return page * ((len(layers) - sliding) * blocks + sliding * window)


def longest_fitting_len(
    arch: ModelArchitecture,
    layers: range,
    kv_dtype: str | Dtype,
    tp: int,
    room: float,
    max_model_len: int,
    *layout: Any,
) -> int:
    """The longest max_model_len, up to `max_model_len`, whose one sequence fits in `room`
    bytes (0: not one token), by bisection as vLLM's estimate_max_model_len; `layout`
    is one_sequence_kv_bytes's block_size, token budget and KV cache groups."""

    def fits(length: int) -> bool:
        return one_sequence_kv_bytes(arch, layers, kv_dtype, tp, length, *layout) <= room

    if fits(max_model_len):
        return max_model_len
    lo, hi = 0, max_model_len  # fits(lo) or lo == 0; not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def cheapest_fit(
    arch: ModelArchitecture, fits: Callable[[int, int], bool], gpus_per_node: int
) -> tuple[int, int] | None:
    """The (tp, pp) on the fewest GPUs that `fits`, laid out as vLLM's distributed-serving
    docs advise: tensor parallelism inside a node, pipeline stages across nodes, so one
    stage is one node's tensor-parallel group (pp > 1 with the widest tp a node holds that
    is not refused: `fits` raising InfersimError, as for fp8 blocks a shard would cut).
    None: not even one layer a stage fits."""
    allowed = []
    for tp in range(1, gpus_per_node + 1):
        try:
            arch.check_tp(tp)
            if fits(tp, 1):
                return tp, 1
        except InfersimError:
            continue
        allowed.append(tp)
    if not allowed:
        return None
    for pp in range(2, arch.num_layers + 1):  # more GPUs than any tp alone: 2 x the widest
        if fits(allowed[-1], pp):
            return allowed[-1], pp
    return None


class DoesNotFit(InfeasibleError):
    """Weights, activations and overhead leave no room for a KV cache at (tp, pp); `fit`
    is the cheapest (tp, pp) that leaves some (cheapest_fit), None when none does. The
    way out names each setting as the command spells it (`named`)."""

    def __init__(
        self,
        why: str,
        tp: int,
        pp: int,
        fit: tuple[int, int] | None,
        gpus_per_node: int,
        nodes: int | None,
        settings: SettingNames = RUN_SETTINGS,
    ) -> None:
        self.why, self.tp, self.pp, self.fit = why, tp, pp, fit
        self.gpus_per_node, self.nodes, self.settings = gpus_per_node, nodes, settings
        super().__init__(f"{why}; {self.way_out()}")

    def named(self, settings: SettingNames) -> DoesNotFit:
        """The same refusal with its settings spelled as another command sets them."""
        return DoesNotFit(
            self.why, self.tp, self.pp, self.fit, self.gpus_per_node, self.nodes, settings
        )

    def way_out(self) -> str:
        if self.fit is None:
            return "not even one layer a GPU fits: use a smaller weight dtype"
        tp, pp = self.fit
        names = self.settings
        if names.pp is None and pp > 1:
            layout = f"tp={tp} with pp={pp}, pipeline stages {names.tp} alone cannot set,"
        elif names.pp is None or pp == self.pp == 1:
            layout = f"{names.tp}={tp}" if names.pp else f"{names.tp} {tp}"
        else:
            layout = f"{names.tp}={tp} with {names.pp}={pp}"
        per_node = self.gpus_per_node
        where = f"{tp * pp} GPUs" + (f" in {pp} stages of tp={tp}" if pp > 1 else "")
        if self.nodes is not None and tp * pp > per_node * self.nodes:
            return (
                f"no tp x pp on the cluster's {self.nodes} x {per_node} GPUs fits; the "
                f"cheapest that does is {layout} ({where}; parallelism.nodes >= "
                f"{-(-tp * pp // per_node)}), or use a smaller weight dtype"
            )
        return f"the cheapest layout that fits is {layout} ({where}), or use a smaller weight dtype"
