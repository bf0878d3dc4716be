"""GPU-count estimates as practitioners make them: a quick rule of thumb, then a detailed
breakdown that shows which term (weights, KV, attention scores, optimizer states,
activations) dominates and how parallelism and ZeRO change it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype, bytes_per_element
from hardware_models.errors import InfersimError
from simulator.architecture import ModelArchitecture
from simulator.memory_planner import (
    GB,
    activation_bytes,
    framework_overhead_bytes,
    stage_weight_bytes,
    weight_bytes_per_param,
)

TRAINING_MULTIPLIER = 6
"""Training memory ~ 6x the weights: optimizer states 2x + gradients 1x + activations 1x
+ temporary buffers 2x (the practitioner's rule for mixed-precision Adam)."""

# Mixed-precision Adam: bf16/fp16 weights and gradients (2 B each); the fp32 master copy
# and Adam's m and v are 3 x 4 = 12 B per parameter.
_HALF_BYTES = 2
_OPTIMIZER_BYTES = 12


def quick_inference_gpus(
    arch: ModelArchitecture, gpu: AcceleratorSpec, dtype: str | Dtype = Dtype.FP16
) -> int:
    """ceil(params x bytes per param / GPU memory): weights only, nothing else (a
    block-scaled format's bytes include its scales: weight_bytes_per_param)."""
    weights = arch.param_count() * weight_bytes_per_param(dtype)
    return math.ceil(weights / gpu.marketed_memory_bytes)


def quick_training_gpus(
    arch: ModelArchitecture, gpu: AcceleratorSpec, dtype: str | Dtype = Dtype.FP16
) -> int:
    """ceil(params x bytes per param x 6 / GPU memory); see TRAINING_MULTIPLIER."""
    weights = arch.param_count() * weight_bytes_per_param(dtype)
    return math.ceil(weights * TRAINING_MULTIPLIER / gpu.marketed_memory_bytes)


@dataclass(frozen=True)
class InferenceEstimate:
    """Bytes of the whole model instance (not per GPU), and the GPUs it needs."""

    weights: float
    kv_cache: float
    attention_scores: float
    activations: float
    framework_overhead: float
    usable_per_gpu: float
    gpus: int  # by memory
    # The smallest tensor-parallel size of at least `gpus` the heads split over; past the
    # largest one, that largest (then tp < gpus: tensor parallelism alone cannot hold it).
    tp: int

    @property
    def tp_holds(self) -> bool:
        """Whether one tensor-parallel group of `tp` GPUs holds it all (no pp needed)."""
        return self.gpus <= self.tp

    @property
    def total(self) -> float:
        """Everything, with the per-GPU overhead counted once."""
        return (
            self.weights
            + self.kv_cache
            + self.attention_scores
            + self.activations
            + self.framework_overhead
        )

    def breakdown(self) -> list[tuple[str, float]]:
        return [
            ("weights", self.weights / GB),
            ("KV cache", self.kv_cache / GB),
            ("attention scores", self.attention_scores / GB),
            ("activations", self.activations / GB),
            ("framework overhead (per GPU)", self.framework_overhead / GB),
            ("total", self.total / GB),
        ]

    def __repr__(self) -> str:
        rows = [*self.breakdown(), ("usable per GPU", self.usable_per_gpu / GB)]
        return _shown_in_gb(self, rows, f"gpus={self.gpus}, tp={self.tp}")


def detailed_inference(
    arch: ModelArchitecture,
    gpu: AcceleratorSpec,
    *,
    weight_dtype: str | Dtype = Dtype.BF16,
    kv_dtype: str | Dtype = Dtype.BF16,
    batch: int = 1,
    seq_len: int = 2048,
    flash_attention: bool = True,
    activation_dtype: str | Dtype = Dtype.BF16,
    gpu_memory_utilization: float = 0.90,
    framework_overhead_gb: float | None = None,
) -> InferenceEstimate:
    """Memory to prefill `batch` sequences of `seq_len` tokens in one pass and hold their KV.

    KV grows linearly with batch x seq_len. Without FlashAttention one layer's score
    matrix (batch x heads x seq_len^2) is materialised at a time, so that term is
    quadratic in seq_len; FlashAttention tiles it away. Activations are the memory
    planner's per-step peak for batch x seq_len tokens with batch sampled positions;
    weights are the planner's (quantised matrices, 16-bit embeddings and norms). The
    budget and the overhead are the serving plan's (plan_memory): `gpu_memory_utilization`
    of the memory CUDA reports, less vLLM's non-torch memory at the tp chosen
    (framework_overhead_bytes, which grows with the tp group over NVLink) unless
    `framework_overhead_gb` is given. GPUs = ceil(shardable bytes / (usable - overhead)):
    each GPU pays the overhead once and everything else is assumed to shard evenly.
    """
    if batch < 1 or seq_len < 1:
        raise InfersimError(f"batch and seq_len must be >= 1, got {batch} and {seq_len}")
    tokens = batch * seq_len
    # The planner's weights on this GPU (MXFP4 experts padded for the kernel run there),
    # so this section and the serving plan agree.
    weights = stage_weight_bytes(
        arch, weight_dtype=weight_dtype, activation_dtype=activation_dtype, gpu=gpu
    )
    kv = tokens * arch.kv_bytes_per_token(kv_dtype)
    scores = 0.0
    if not flash_attention:
        scores = batch * arch.num_attention_heads * seq_len**2 * bytes_per_element(activation_dtype)
    activations = activation_bytes(
        arch, tokens, activation_dtype=activation_dtype, sampled_tokens=batch
    )
    usable = gpu.cuda_memory_bytes * gpu_memory_utilization
    shardable = weights + kv + scores + activations

    # The overhead grows with tp, so more GPUs may be needed at the tp the count rounds to;
    # past the largest valid tp, the count is at that tp's overhead (pp adds the GPUs).
    largest = valid_tps(arch)[-1]
    gpus, tp = 1, 1
    while True:
        overhead = framework_overhead_bytes(gpu, tp, framework_overhead_gb)
        if usable <= overhead:
            raise InfersimError(
                f"framework overhead {overhead / GB:.2f} GB (tp={tp}) leaves nothing of "
                f"{gpu.name}'s usable {usable / GB:.1f} GB"
            )
        gpus = max(gpus, math.ceil(shardable / (usable - overhead)))
        if gpus <= tp or tp == largest:
            break
        tp = valid_tp_at_least(arch, gpus) or largest
    return InferenceEstimate(
        weights=weights,
        kv_cache=kv,
        attention_scores=scores,
        activations=activations,
        framework_overhead=overhead,
        usable_per_gpu=usable,
        gpus=gpus,
        tp=tp,
    )


def valid_tps(arch: ModelArchitecture) -> list[int]:
    """The tensor-parallel sizes vLLM would run the model at (arch.check_tp: attention
    heads and KV heads split evenly), ascending; 1 always is one."""
    tps = []
    for tp in range(1, arch.num_attention_heads + 1):
        try:
            arch.check_tp(tp)
        except InfersimError:
            continue
        tps.append(tp)
    return tps


def valid_tp_at_least(arch: ModelArchitecture, gpus: int) -> int | None:
    """The smallest valid tp >= `gpus` (valid_tps): DeepSeek-V3's 128 heads need 8 GPUs
    where memory asks 5. None past the largest: no tensor-parallel size holds that many
    GPUs' worth, pipeline stages must."""
    return next((tp for tp in valid_tps(arch) if tp >= gpus), None)


def training_activation_bytes(
    arch: ModelArchitecture,
    micro_batch: int,
    seq_len: int,
    *,
    activation_checkpointing: bool = False,
    flash_attention: bool = True,
) -> float:
    """Stored activations of one micro-batch (Korthikanti et al. 2022, 16-bit, no TP/SP).

    Per layer s*b*h*(34 + 5*a*s/h) bytes; FlashAttention drops the 5*a*s/h term (scores,
    softmax and dropout mask are recomputed, not stored). Full checkpointing keeps only
    each layer's 2*s*b*h input plus one layer's full set while it is recomputed. The
    loss adds the logits, s*b*vocab in fp32. The 34 assumes a GPT-style layer; gated and
    GQA layers differ by a few sbh, which the estimate ignores.
    """
    if micro_batch < 1 or seq_len < 1:
        raise InfersimError(f"micro_batch and seq_len must be >= 1, got {micro_batch}, {seq_len}")
    sbh = seq_len * micro_batch * arch.hidden_size
    per_token_layer = 34.0
    if not flash_attention:
        per_token_layer += 5 * arch.num_attention_heads * seq_len / arch.hidden_size
    full_layer = sbh * per_token_layer
    layers = (
        arch.num_layers * 2 * sbh + full_layer
        if activation_checkpointing
        else arch.num_layers * full_layer
    )
    logits = seq_len * micro_batch * arch.vocab_size * 4
    return layers + logits


@dataclass(frozen=True)
class TrainingEstimate:
    """Bytes per GPU for data-parallel mixed-precision Adam training with ZeRO."""

    dp: int
    zero_stage: int
    weights: float
    gradients: float
    optimizer_states: float
    activations: float
    framework_overhead: float
    capacity_per_gpu: float
    effective_batch: int
    min_dp_zero3: int | None

    @property
    def per_gpu(self) -> float:
        return (
            self.weights
            + self.gradients
            + self.optimizer_states
            + self.activations
            + self.framework_overhead
        )

    @property
    def fits(self) -> bool:
        return self.per_gpu <= self.capacity_per_gpu

    def breakdown(self) -> list[tuple[str, float]]:
        return [
            ("weights", self.weights / GB),
            ("gradients", self.gradients / GB),
            ("optimizer states", self.optimizer_states / GB),
            ("activations", self.activations / GB),
            ("framework overhead", self.framework_overhead / GB),
            ("per GPU", self.per_gpu / GB),
        ]

    def __repr__(self) -> str:
        rows = [*self.breakdown(), ("capacity per GPU", self.capacity_per_gpu / GB)]
        counts = (
            f"dp={self.dp}, zero_stage={self.zero_stage}, fits={self.fits}, "
            f"effective_batch={self.effective_batch}, min_dp_zero3={self.min_dp_zero3}"
        )
        return _shown_in_gb(self, rows, counts)


def _shown_in_gb(estimate: object, rows: list[tuple[str, float]], counts: str) -> str:
    """An estimate's repr with its units: the byte fields in GB (1e9 bytes, as the
    breakdowns give them), then its counts; the fields keep bytes."""
    sizes = ", ".join(f"{name} {gb:.2f} GB" for name, gb in rows)
    return f"{type(estimate).__name__}({sizes}; {counts})"


def detailed_training(
    arch: ModelArchitecture,
    gpu: AcceleratorSpec,
    *,
    dp: int = 1,
    zero_stage: int = 0,
    micro_batch: int = 1,
    seq_len: int = 2048,
    grad_accum_steps: int = 1,
    activation_checkpointing: bool = False,
    flash_attention: bool = True,
    framework_overhead_gb: float | None = None,
) -> TrainingEstimate:
    """Per-GPU memory on `dp` data-parallel GPUs (no tensor or pipeline parallelism).

    ZeRO-1 shards the optimizer states over dp, ZeRO-2 also the gradients, ZeRO-3 also
    the weights. Gradient accumulation leaves per-GPU memory unchanged (activations are
    per micro-batch) and only raises the effective batch to micro_batch x accum x dp.
    `min_dp_zero3` is the smallest dp at which ZeRO-3 fits (None when activations and
    overhead alone exceed the GPU). The capacity is the memory CUDA reports, all of it
    usable; the overhead is the serving plan's non-torch memory of a GPU outside a tensor-
    parallel group (framework_overhead_bytes at tp=1: cuBLAS and driver allocations)
    unless `framework_overhead_gb` is given. The dp all-reduce's NCCL buffers are not in
    it: the modelled figures are vLLM's tp groups', measured up to 8 GPUs of a node.
    """
    if dp < 1 or grad_accum_steps < 1:
        raise InfersimError(f"dp and grad_accum_steps must be >= 1, got {dp}, {grad_accum_steps}")
    if zero_stage not in (0, 1, 2, 3):
        raise InfersimError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    params = arch.param_count()
    activations = training_activation_bytes(
        arch,
        micro_batch,
        seq_len,
        activation_checkpointing=activation_checkpointing,
        flash_attention=flash_attention,
    )
    overhead = framework_overhead_bytes(gpu, tp=1, asked_gb=framework_overhead_gb)
    capacity = gpu.cuda_memory_bytes
    model_states = params * (2 * _HALF_BYTES + _OPTIMIZER_BYTES)
    room = capacity - activations - overhead
    return TrainingEstimate(
        dp=dp,
        zero_stage=zero_stage,
        weights=params * _HALF_BYTES / (dp if zero_stage >= 3 else 1),
        gradients=params * _HALF_BYTES / (dp if zero_stage >= 2 else 1),
        optimizer_states=params * _OPTIMIZER_BYTES / (dp if zero_stage >= 1 else 1),
        activations=activations,
        framework_overhead=overhead,
        capacity_per_gpu=capacity,
        effective_batch=micro_batch * grad_accum_steps * dp,
        min_dp_zero3=math.ceil(model_states / room) if room > 0 else None,
    )
