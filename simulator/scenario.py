"""A scenario: one question put to the simulator, as a validated YAML file.

Every section is a strict pydantic model: an unknown key is an error with a did-you-mean,
a bad value names its field and what is allowed. `--set key.path=value` overrides any
field before validation. Paths inside a scenario resolve relative to its file.
"""

from __future__ import annotations

import math
import os
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.errors import InfersimError
from hardware_models.warning_scope import warn
from hardware_models.yaml_io import did_you_mean, load_yaml_mapping, parse_yaml
from simulator.inputs import shown
from simulator.router import RouterName
from simulator.vllm_defaults import (
    EMULATED_VLLM_VERSION,
    PREFIX_CACHING_V0,
    PREFIX_CACHING_V1,
    Default,
    batch_limits,
    version_text,
)
from simulator.ways_out import option
from simulator.workload.config import WorkloadConfig

# What with_overrides and from_yaml take: `key.path=value`, a list of those, or a mapping
# {key.path: value} (override_items).
Overrides = str | Sequence[str] | Mapping[str, Any]
# No NaN or infinity anywhere in a scenario: every number must be a real quantity.
_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
# The KV cache types vLLM has (CacheConfig.cache_dtype: auto, i.e. the model's bf16 or
# fp16, bfloat16, float16 and the fp8 variants, fp8_e4m3 and fp8_e5m2 as one byte each).
KvDType = Literal["bf16", "fp16", "fp8"]
# vLLM's --kv-cache-dtype names (CacheDType, vllm/config/cache.py) of the caches infersim
# models: fp8_e4m3 is what vLLM's fp8 means on CUDA; fp8_e5m2 stores the same byte an
# element and is priced as it (its coarser 2-bit mantissa's accuracy is not modelled);
# float16 is in newer vLLM's CacheDType, not in older ones (commit c1d8642's), whose
# fp16 cache is auto on an fp16 model.
VLLM_KV_DTYPES: dict[str, KvDType] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}
# vLLM's CacheConfig BlockSize (vllm/config/cache.py): the block sizes it starts with.
BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]
# Weights also come block-scaled: fp8_block is DeepSeek-V3's and Qwen3-FP8's checkpoint
# format, nvfp4 and mxfp4 Blackwell's 4-bit ones (simulator.engine.weight_format).
WeightDType = Literal[
    "fp32", "fp16", "bf16", "fp8", "fp8_block", "int8", "int4", "fp4", "nvfp4", "mxfp4"
]


VLLM_V0_WATERMARK = 0.01  # share of KV blocks vLLM v0's block manager kept free


class HardwareSection(BaseModel):
    model_config = _STRICT
    gpu: str = Field(description="GPU preset name (`infersim hardware list`) or YAML path")
    node: str | None = Field(
        default=None,
        description="node preset or YAML path; default: the first node preset built from "
        "this GPU, or a single-GPU machine",
    )
    calibration: str | None = Field(
        default="auto",
        description="calibration profile replacing the GPU's efficiencies: `auto` (the GPU's "
        "own shipped profile, else that of the nearest measured chip of the same "
        "architecture and memory family, else none), `none` or null (the datasheet "
        "efficiencies), a "
        "shipped profile's name (`infersim hardware list`) or a YAML path written by "
        "`infersim calibrate fit`",
    )


class ModelSection(BaseModel):
    model_config = _STRICT
    name: str = Field(
        description="catalog name (`infersim models`), else a checkpoint folder next to the "
        "scenario holding a config.json (`NAME`; `./NAME` where a catalog model has that "
        "name), or a path from the scenario's folder to a config.json or catalog YAML"
    )
    weight_dtype: WeightDType | None = Field(
        default=None,
        description="storage type of the weights; fp8_block: fp8 with one fp32 scale per "
        "128 x 128 block (DeepSeek-V3, Qwen3-FP8 checkpoints), run by block-scaled kernels; "
        "nvfp4: 4-bit with an fp8 scale per 16 weights and an fp32 one per tensor; mxfp4 "
        "(and fp4): 4-bit with an e8m0 scale per 32. Blackwell multiplies the 4-bit "
        "formats natively (activations quantised to them before each GEMM); NVIDIA sm_80+ "
        "dequantises them (W4A16), and mxfp4 also runs on CDNA3; elsewhere they are refused. "
        "Default: the checkpoint's own format (`infersim models show`; a config.json's "
        "quantization_config), else bf16, as vLLM serves a checkpoint as stored",
    )
    kv_dtype: KvDType = Field(
        default="bf16",
        description="storage type of the KV cache, as vLLM's --kv-cache-dtype: bf16 or "
        "fp16 (its auto: the model's dtype) or fp8; vLLM's spellings bfloat16, float16, "
        "fp8_e4m3 and fp8_e5m2 are read as bf16, fp16 and fp8 (fp8_e5m2 priced as fp8: "
        "the same byte an element, its accuracy not modelled); int8, int4, fp4 and "
        "vLLM's other cache types are refused",
    )
    activation_dtype: Literal["fp16", "bf16"] = Field(default="bf16")
    mxfp4_use_marlin: bool = Field(
        default=False,
        description="vLLM's VLLM_MXFP4_USE_MARLIN=1: an MXFP4 MoE checkpoint's experts "
        "(gpt-oss) run Marlin W4A16 on any NVIDIA GPU instead of the kernel vLLM picks for "
        "it (OpenAI's matmul_ogs on Hopper, FlashInfer's TRT-LLM MoE on B200; Marlin on "
        "Ampere and Ada already); the run's moe_kernel line says which. No effect on other "
        "models (the run says so)",
    )
    moe_routing: str = Field(
        default="balanced",
        description="how an MoE model's tokens spread over its experts: balanced (each "
        "token picks its top-k uniformly), round_robin (loads even to one token), or "
        "power_law_<alpha> (skewed loads, alpha > 1, as the measured tables use)",
    )

    @field_validator("kv_dtype", mode="before")
    @classmethod
    def _vllm_kv_dtype(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        value = VLLM_KV_DTYPES.get(value, value)
        if value not in typing.get_args(KvDType):
            raise ValueError(
                "vLLM has no such KV cache type, or infersim does not model it; allowed: "
                f"{', '.join(typing.get_args(KvDType))}, or vLLM's spellings "
                f"{', '.join(VLLM_KV_DTYPES)}"
            )
        return value

    @field_validator("moe_routing")
    @classmethod
    def _known_routing(cls, value: str) -> str:
        from hardware_models.moe import Routing  # scipy: loaded when a scenario names one

        try:
            Routing.parse(value)
        except InfersimError as exc:
            raise ValueError(str(exc)) from None
        return value


def _is_number(value: Any) -> bool:
    """A finite int or float, as YAML writes a number (not a bool, not quoted text)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def replica_gpus(tp: int, pp: int, dp: int = 1) -> int:
    """The GPUs of one replica: its dp attention data-parallel ranks, each a tp x pp engine
    (vLLM's world size is tp x pp per DP rank). Placement, the run header and the
    planner's fleets all count GPUs by this rule."""
    return tp * pp * dp


class ParallelismSection(BaseModel):
    model_config = _STRICT
    tp: int = Field(default=1, ge=1, le=512, description="tensor-parallel degree per replica")
    pp: int = Field(default=1, ge=1, le=128, description="pipeline-parallel degree per replica")
    replicas: int = Field(default=1, ge=1, le=10_000, description="model copies serving traffic")
    router: RouterName = Field(
        default="round_robin",
        description="how arrivals are spread over replicas; session_affinity keeps every "
        "turn of a multi-turn session on the replica holding its cached conversation",
    )
    nodes: int | None = Field(
        default=None,
        ge=1,
        description="nodes the cluster has; a placement needing more GPUs is an error",
    )
    enable_expert_parallel: bool = Field(
        default=False,
        description="vLLM's --enable-expert-parallel: an MoE model's routed experts are "
        "spread whole over the replica's tp x dp GPUs (EP size = tp x dp) instead of each "
        "expert being split tp x dp ways; list the catalog's MoE models with `infersim models`",
    )
    dp: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="vLLM's --data-parallel-size: attention data-parallel ranks per replica, "
        "each tp GPUs with its own scheduler and KV cache, requests balanced over them "
        "by load; with an MoE model the ranks step together (the MoE layers run over every "
        "rank's tokens; an idle rank runs a dummy pass), with a dense model they are "
        "independent. The replica has tp x dp GPUs (pp must be 1)",
    )
    all2all_backend: Literal["allgather_reducescatter", "all_to_all"] = Field(
        default="allgather_reducescatter",
        description="vLLM's --all2all-backend when dp > 1 (MoE): allgather_reducescatter "
        "gathers every dp rank's tokens before each MoE layer and reduce-scatters after it "
        "(vLLM's default); all_to_all sends each token only to its top-k experts' GPUs and "
        "back (DeepEP, pplx)",
    )
    disable_custom_all_reduce: bool = Field(
        default=False,
        description="vLLM's --disable-custom-all-reduce: every tensor-parallel all-reduce "
        "that would run vLLM's own peer-memory kernel (below 8 MiB, on 2, 4, 6 or 8 "
        "NVLink GPUs or 2 PCIe GPUs whose node allows peer access: "
        "intra_node_link.fabric.p2p) goes to symmetric memory or NCCL "
        "instead; the run's `all_reduce` line says which backend each size takes",
    )
    allreduce_use_symm_mem: bool = Field(
        default=True,
        description="vLLM's VLLM_ALLREDUCE_USE_SYMM_MEM, whose default has moved: off in "
        "0.10.2, on in 0.11.0, off from 0.11.1, on again by 0.18 and on vLLM's main branch "
        "(this field's default; `infersim replay` picks it by the run's version): bf16 "
        "all-reduces up to a per-GPU-count limit run torch symmetric memory on NVSwitch "
        "Hopper and Blackwell nodes; false sends them to NCCL (and lets the custom kernel "
        "take tensors up to 8 MiB again)",
    )


class PoolSection(BaseModel):
    """A group of identical replicas; several pools make a heterogeneous cluster."""

    model_config = _STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="label in results")
    hardware: HardwareSection
    tp: int = Field(default=1, ge=1, le=512, description="tensor-parallel degree per replica")
    pp: int = Field(default=1, ge=1, le=128, description="pipeline-parallel degree per replica")
    replicas: int = Field(default=1, ge=1, le=10_000, description="replicas in this pool")
    role: Literal["mixed", "prefill", "decode"] = Field(
        default="mixed",
        description="mixed serves whole requests; prefill and decode pools split them "
        "(Splitwise / DistServe, vLLM's P/D proxy): a prefill replica computes the prompt, "
        "its KV cache crosses the network (links shared by concurrent transfers), then a "
        "decode replica samples the first token and decodes (docs/METRICS.md)",
    )


class FaultEvent(BaseModel):
    model_config = _STRICT
    replica: int = Field(ge=0, description="index of the replica that fails (0-based)")
    at_s: float = Field(ge=0, description="simulated time of the failure, s")
    recover_at_s: float | None = Field(
        default=None, gt=0, description="when it serves again (empty); default: never"
    )


class FaultsSection(BaseModel):
    model_config = _STRICT
    events: list[FaultEvent] = Field(min_length=1)
    on_failure: Literal["retry", "fail"] = Field(
        default="retry",
        description="what happens to a failed replica's requests: retry them from scratch "
        "on another replica, or count them as failed",
    )
    max_retries: int = Field(default=3, ge=0, description="retries per request before it fails")


Policy = Literal["static", "dynamic", "continuous", "chunked_prefill"]


BATCH_LIMITS = ("max_num_seqs", "max_num_batched_tokens")  # vLLM's defaults differ by GPU
NON_VLLM_BATCH_LIMITS = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
"""The static and dynamic policies' unset batch limits: infersim's own batchers, not vLLM's
scheduler, so vLLM's GPU-dependent defaults do not apply; these are infersim's defaults
from before it took vLLM's (vLLM's for a GPU under 70 GiB)."""


class ServingSection(BaseModel):
    """The batching policy and its knobs (vLLM names where they exist)."""

    model_config = _STRICT
    policy: Policy = Field(
        default="chunked_prefill",
        description="static: a batch starts at max_num_seqs waiting requests (or the last "
        "arrival) and runs to completion; dynamic: a batch starts at max_num_seqs or once "
        "the oldest has waited max_queue_delay_ms (Triton's dynamic batcher), runs to "
        "completion; continuous: iteration-level, prefill first (vLLM v0); "
        "chunked_prefill: iteration-level, decodes first, prefill chunks fill the budget",
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="sequences per step (batch size for static); default: what `vllm "
        "serve` of the emulated release (simulator.vllm_defaults.EMULATED_VLLM_VERSION, "
        "0.19) chooses for the GPU: 1024 on GPUs CUDA sees at least 70 GiB of, other than "
        "the A100, else 256, and at most max_num_batched_tokens; 256 for the static and "
        "dynamic policies (the run's summary says which)",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1 << 22,
        description="token budget per engine step; the continuous policy needs at least "
        "max_model_len (vLLM refuses less at start-up); default: as `vllm serve` chooses "
        "for the GPU, 8192 on GPUs CUDA sees at least 70 GiB of, other than the A100, else "
        "2048, at least max_model_len for the continuous policy (chunked prefill off), and "
        "at most max_num_seqs * max_model_len; the static and dynamic policies batch whole "
        "prompts and read it only to size the memory plan's profiling pass (2048 unset)",
    )
    max_queue_delay_ms: float = Field(
        default=10.0, ge=0, description="dynamic batching: longest a request waits for a batch"
    )
    block_size: BlockSize = Field(
        default=16,
        description="tokens per KV-cache block; one of the block sizes vLLM's --block-size "
        "accepts. An MLA model (DeepSeek) on CUDA runs at the size vLLM forces for its "
        "attention backend, set or not: 64 for FlashMLA on Hopper, 64 (or 32) for FlashInfer "
        "MLA and a multiple of 128 for CUTLASS MLA on datacenter Blackwell (said in the "
        "header, warned when another size was set)",
    )
    gpu_memory_utilization: float = Field(
        default=0.90, gt=0, le=1, description="share of GPU memory the engine may use"
    )
    num_gpu_blocks: int | None = Field(
        default=None,
        ge=1,
        description="override the KV-cache size the memory planner derives, in blocks of "
        "block_size tokens; with vLLM's hybrid KV cache manager (a model with "
        "sliding-window layers) a block holds one group's layers, not all of them, as "
        "vLLM's --num-gpu-blocks-override counts them (gpt-oss: half the memory of a block of "
        "every layer). At most what the GPU's memory holds beside the weights: vLLM runs "
        "out of memory allocating more at start-up",
    )
    watermark: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="share of KV blocks admission keeps free for running requests to grow "
        "into; default: as the engine each policy models does, none for chunked_prefill "
        "(vLLM v1) and 0.01 for continuous (vLLM v0's block manager)",
    )
    preemption: Literal["recompute", "swap"] = Field(
        default="recompute",
        description="what happens to a preempted request's KV cache: recomputed, or "
        "swapped to host memory and back (vLLM v0's, so the continuous policy only: vLLM "
        "v1, chunked_prefill, preempts by recompute alone)",
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="fcfs",
        description="vLLM's --scheduling-policy. fcfs: arrival order, and a workload "
        "class of non-zero priority is refused, as vLLM refuses such a request; priority: "
        "by workload class priority then arrival, and the cache's preemption victim is "
        "the least important, latest arrival (vLLM v1). Only under the continuous policy "
        "(vLLM v0) may a waiting request preempt running ones to get in",
    )
    swap_space_gb: float = Field(
        default=4.0,
        ge=0,
        le=1e5,
        description="host memory per GPU for swapped KV blocks, GiB (vLLM's --swap-space, "
        "CacheConfig.swap_space); as vLLM, refused where it times tp exceeds 70% of the "
        "node's host memory, warned about above 40%",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=2,
        description="longest prompt + output; default: the model's context. As vLLM, a run "
        "is refused above the context, or where the KV cache cannot hold one sequence this "
        "long (the message names the largest that fits)",
    )
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="keep released full KV blocks cached while free (LRU): a "
        "recompute-preempted request's recompute skips what was not evicted, likewise a "
        "session's next turn, and prompts whose trace hash_ids share blocks. Default: as "
        "the engine the policy models, on for chunked_prefill (vLLM v1, for the "
        "decoder-only models infersim describes: vLLM turns it off by default only for "
        "hybrid Mamba, attention-free, encoder-decoder and some pooling models, "
        "ModelConfig.is_prefix_caching_supported), off for continuous (vLLM v0's "
        "default); static and dynamic keep no cache (the run's header says which)",
    )
    reserve_full_sequence: bool = Field(
        default=True,
        description="admit a waiting request only while the KV blocks for its whole "
        "sequence are free, not just its first chunk's, unless nothing else runs (vLLM "
        "0.19's scheduler_reserve_full_isl): a long prompt does not start what it cannot "
        "finish",
    )
    max_waiting: int | None = Field(
        default=None, ge=0, description="reject arrivals beyond this many waiting per replica"
    )
    disable_hybrid_kv_cache_manager: bool = Field(
        default=False,
        description="vLLM's --disable-hybrid-kv-cache-manager: a model mixing sliding-window "
        "and full-attention layers keeps every layer's keys at full length, instead of "
        "KV cache groups whose sliding ones free the blocks that leave the window",
    )
    allow_chunked_local_attn_with_hybrid_kv_cache: bool = Field(
        default=False,
        description="vLLM's VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1: Llama 4's "
        "chunked local attention layers keep only their current chunk's blocks; vLLM "
        "turns its hybrid KV cache manager off for them by default",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_priority_preemption(cls, data: Any) -> Any:
        if isinstance(data, dict) and "priority_preemption" in data:
            raise ValueError(
                "priority_preemption was removed: no vLLM has such a switch. Set "
                "scheduling_policy: priority (vLLM's --scheduling-policy); a waiting "
                "request then preempts running ones under the continuous policy (vLLM v0's "
                "priority preemption) and never under chunked_prefill (vLLM v1)"
            )
        return data

    @model_validator(mode="after")
    def _swap_needs_v0(self) -> ServingSection:
        if self.preemption == "swap" and self.policy == "chunked_prefill":
            raise ValueError(
                "preemption: swap is vLLM v0's; chunked_prefill models vLLM v1, which "
                "preempts by recompute only (Scheduler._preempt_request frees the blocks): "
                "use preemption: recompute, or policy: continuous (vLLM v0) to swap"
            )
        return self

    @property
    def prefix_caching(self) -> bool:
        """enable_prefix_caching as given, else the default of the engine the policy
        models (prefix_caching_default)."""
        if self.enable_prefix_caching is not None:
            return self.enable_prefix_caching
        return bool(self.prefix_caching_default().value)

    def prefix_caching_default(self) -> Default:
        """What the engine the policy models does when enable_prefix_caching is unset,
        and why: vLLM v1 caches prefixes by default, v0 did not; the run-to-completion
        batchers (not vLLM's scheduler) have no prefix cache."""
        if self.policy == "chunked_prefill":
            why = f"vLLM {version_text(EMULATED_VLLM_VERSION)} default: {PREFIX_CACHING_V1}"
            return Default(True, why)
        if self.policy == "continuous":
            return Default(False, f"{PREFIX_CACHING_V0}, the engine the continuous policy models")
        return Default(False, f"the {self.policy} policy keeps no prefix cache (not vLLM's)")

    @property
    def kv_watermark(self) -> float:
        """The watermark given, else the one of the engine the policy models."""
        if self.watermark is not None:
            return self.watermark
        return VLLM_V0_WATERMARK if self.policy == "continuous" else 0.0

    def with_vllm_defaults(
        self, gpu: AcceleratorSpec, max_model_len: int
    ) -> tuple[ServingSection, tuple[str, ...]]:
        """This section with max_num_seqs and max_num_batched_tokens, where unset, as `vllm
        serve` of EMULATED_VLLM_VERSION chooses them on `gpu`, read by its device name and
        the memory CUDA reports, as vLLM's rule reads it, not the datasheet figure
        (vllm_defaults.batch_limits: a limit given bounds the other's default), and
        enable_prefix_caching as the engine the policy models defaults it, with a line
        for each saying what it became and why; set values are kept as given. The static
        and dynamic policies are not vLLM's scheduler: theirs default to
        NON_VLLM_BATCH_LIMITS, and they keep no prefix cache. Their batches have no token
        budget (caveats.IGNORED_SETTINGS): an unset max_num_batched_tokens takes
        NON_VLLM_BATCH_LIMITS' for the memory plan's profile run with no line, and the
        run's resolved scenario leaves it unset (simulation._as_run)."""
        silent: dict[str, Any] = {}
        if self.policy in ("static", "dynamic"):
            chosen = {
                "max_num_seqs": Default(
                    NON_VLLM_BATCH_LIMITS["max_num_seqs"],
                    f"the {self.policy} policy's default (not vLLM's scheduler)",
                )
            } if self.max_num_seqs is None else {}  # fmt: skip
            if self.max_num_batched_tokens is None:
                silent["max_num_batched_tokens"] = NON_VLLM_BATCH_LIMITS["max_num_batched_tokens"]
        else:
            chosen = batch_limits(
                EMULATED_VLLM_VERSION,
                gpu.display_name,
                gpu.cuda_memory_bytes / 2**30,
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                chunked_prefill=self.policy != "continuous",
                max_model_len=max_model_len,
            )
        if self.enable_prefix_caching is None and self.policy in ("continuous", "chunked_prefill"):
            chosen["enable_prefix_caching"] = self.prefix_caching_default()
        notes = tuple(d.line(f"serving.{name}") for name, d in chosen.items())
        update = {"enable_prefix_caching": self.prefix_caching, **silent}
        update.update((name, d.value) for name, d in chosen.items())
        return self.model_copy(update=update), notes


class EngineSection(BaseModel):
    """Host-side behaviour of the serving engine."""

    model_config = _STRICT
    cuda_graphs: bool = Field(default=True, description="replay kernels from CUDA graphs")
    fused_kernels: bool = Field(default=True, description="fused norm/activation/residual")
    async_scheduling: bool = Field(
        default=True, description="overlap host scheduling with the GPU step (vLLM v1)"
    )
    host_overhead_step_us: float = Field(
        default=150.0, ge=0, le=1e7, description="host time per step: scheduling, input preparation"
    )
    host_overhead_per_seq_us: float = Field(
        default=4.0, ge=0, le=1e6, description="extra host time per scheduled sequence"
    )
    framework_overhead_gb: float | None = Field(
        default=None,
        ge=0,
        le=1e4,
        description="vLLM's non-torch memory per GPU (cuBLAS, NCCL and custom all-reduce "
        "buffers), GiB as vLLM logs it; null: modelled from tp and the GPU's links "
        "(memory_planner.framework_overhead_bytes). Before the memory plan followed vLLM's "
        "profiler (2026-12-01) it was a catch-all (CUDA context, allocator, graphs, default "
        "1.5); the profile run's sampler peak and the memory CUDA does not show are now "
        "counted apart, so an old file's figure counts them twice (a run that sets it says "
        "so)",
    )
    multi_step: bool = Field(
        default=True,
        description="price runs of decode steps in one event (same results, faster); false "
        "steps one by one",
    )


# The API server's CPU costs, derived from three published `vllm serve` runs at request
# rate inf (benchmarks/README.md, "vLLM's API server"); each vllm_api_server process pays them.
API_SERVER_REQUEST_US = 500.0
API_SERVER_PROMPT_TOKEN_US = 1.0
API_SERVER_OUTPUT_TOKEN_US = 140.0
_DERIVED = (
    "derived from three published `vllm serve` + benchmark_serving.py runs at request rate "
    "inf, 1000 ShareGPT prompts (vLLM PRs #18566: Llama-3.1-8B on an H100, 32.4 req/s; "
    "#23369: gpt-oss-20b TP2 on Hopper, 29.5 req/s; #23696: gpt-oss-120b TP8 on B200, "
    '37.6 req/s; benchmarks/README.md, "vLLM\'s API server", gives the derivation and '
    "the error on each)"
)


class FrontendSection(BaseModel):
    """vLLM's API server: the processes between the client and the engine core that take
    requests in (HTTP, tokenise) and stream every token out (detokenise, SSE)."""

    model_config = _STRICT
    kind: Literal["none", "vllm_api_server"] = Field(
        default="none",
        description="none: the client sees what the engine does, when it does it (a run "
        "whose output rate one API server process could not stream warns); "
        "vllm_api_server: each replica's requests go through api_server_count `vllm serve` "
        "API server processes, each a FIFO CPU server: ingest delays when the engine sees "
        "a request, streaming delays when the client sees each token, and latencies and "
        "throughput are the client's (open-loop arrivals, one pool role, dp 1, no faults)",
    )
    api_server_count: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="vLLM's --api-server-count: API server processes per replica (vLLM "
        "instance), requests spread over them round robin; unset, vLLM's default: the "
        "instance's data-parallel size (parallelism.dp), 1 without dp",
    )
    request_us: float = Field(
        default=API_SERVER_REQUEST_US,
        ge=0,
        le=1e7,
        description="CPU time an API server process spends taking in one request (HTTP, "
        "validation, sampling parameters, handing it to the engine core), us; an "
        "assumption, not fitted: the published runs output_token_us is derived from share "
        "one workload, so they fix only the total CPU time of a request; this share is "
        "set, and output_token_us takes the rest",
    )
    prompt_token_us: float = Field(
        default=API_SERVER_PROMPT_TOKEN_US,
        ge=0,
        le=1e5,
        description="CPU time to tokenise one prompt token, us; an assumption (a fast "
        "tokenizer's order of magnitude), not fitted, for the reason request_us gives",
    )
    output_token_us: float = Field(
        default=API_SERVER_OUTPUT_TOKEN_US,
        ge=0,
        le=1e6,
        description="CPU time per streamed output token (output processing, detokenising, "
        f"one SSE chunk of JSON), us; {_DERIVED}",
    )

    @property
    def modelled(self) -> bool:
        return self.kind != "none"

    def processes(self, dp: int = 1) -> int:
        """API server processes of one vLLM instance of `dp` data-parallel ranks: as
        `vllm serve` (internal load balancing) defaults --api-server-count to dp."""
        return self.api_server_count or dp


class SLOSection(BaseModel):
    model_config = _STRICT
    ttft_ms: float | None = Field(default=None, gt=0, description="time to first token bound")
    tpot_ms: float | None = Field(default=None, gt=0, description="time per output token bound")
    e2e_ms: float | None = Field(default=None, gt=0, description="end-to-end latency bound")


class CostSection(BaseModel):
    model_config = _STRICT
    usd_per_gpu_hour: float | dict[str, float] | None = Field(
        default=None,
        description="price per GPU-hour in USD, replacing the GPU presets' "
        "(`infersim hardware show`): one price for every GPU type, or a mapping "
        "{GPU preset: price}, each above 0 (e.g. {h100-sxm: 2.0, h200-sxm: 2.6}; a GPU it "
        "does not name keeps its preset's price, a GPU from a YAML file its file's "
        "price.usd_per_hour)",
    )
    pue: float = Field(
        default=1.2,
        ge=1,
        le=3,
        description="datacentre power usage efficiency: facility energy / IT energy (cooling "
        "and power conversion; host CPUs and NICs are IT load: host_w_per_gpu)",
    )
    host_w_per_gpu: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description="power of the servers around the GPUs (CPUs, host memory, NICs, fans) "
        "per GPU, W, drawn the whole run: IT load, added to the facility energy (x PUE) and "
        "not to the GPU figures. Default 0: GPUs only. A DGX H100 is rated 10.2 kW at most "
        "with 8 x 700 W GPUs: up to 575 W a GPU",
    )
    usd_per_kwh: float = Field(default=0.10, ge=0, description="electricity price")

    @field_validator("usd_per_gpu_hour", mode="before")
    @classmethod
    def _a_price_or_prices(cls, value: Any) -> Any:
        """One line naming what is wrong and what is allowed, not pydantic's attempt at
        each member of the union (`.float: ...; .dict[str,float].h100-sxm: ...`)."""
        allowed = "expected a number, or a mapping GPU name -> number > 0 (e.g. {h100-sxm: 2.0})"
        if value is None or _is_number(value):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"not a price: {allowed}")
        for name, price in value.items():
            if not isinstance(name, str) or not _is_number(price):
                raise ValueError(f"{name}: not a price ({price!r}): {allowed}")
        return value

    @field_validator("usd_per_gpu_hour")
    @classmethod
    def _positive_prices_of_known_gpus(
        cls, value: float | dict[str, float] | None
    ) -> float | dict[str, float] | None:
        from hardware_models.presets import list_gpus
        from hardware_models.yaml_io import unknown_name_error

        if value is None:
            return None
        if not isinstance(value, dict):
            if value <= 0:  # the error line adds (got value)
                raise ValueError("expected a price above 0 USD per GPU-hour")
            return value
        for name, price in value.items():
            if price <= 0:
                raise ValueError(
                    f"{name}: expected a price above 0 USD per GPU-hour (got {price:g})"
                )
        known = list_gpus()
        for name in value:
            if name.lower() not in known:
                raise ValueError(
                    f"{unknown_name_error('gpu', name, known)} (a GPU from a YAML file "
                    "takes its price from that file's price.usd_per_hour)"
                )
        return {name.lower(): price for name, price in value.items()}

    def price_of(self, gpu: AcceleratorSpec) -> float:
        """USD per hour of one `gpu`: the scenario's price for it, else the GPU's own."""
        price = self.usd_per_gpu_hour
        if isinstance(price, dict):
            return price.get(gpu.name, gpu.price.usd_per_hour)
        return price or gpu.price.usd_per_hour

    def one_price_for(self, gpus: set[str]) -> str | None:
        """The warning when a single price replaces the presets' of several GPU types
        (a plan, sweep or comparison over GPUs would rank them on equal prices)."""
        if isinstance(self.usd_per_gpu_hour, dict) or self.usd_per_gpu_hour is None:
            return None
        if len(gpus) < 2:
            return None
        return (
            f"cost.usd_per_gpu_hour={self.usd_per_gpu_hour:g} prices every GPU type alike "
            f"({', '.join(sorted(gpus))}), replacing their presets' different prices; give a "
            "price per GPU type ({gpu: usd_per_hour, ...}) or leave it unset"
        )


class OutputSection(BaseModel):
    model_config = _STRICT
    plots: bool = Field(default=True, description="write PNG plots next to the tables")
    csv: bool = Field(default=False, description="also write CSV copies of the tables")
    progress: bool = Field(
        default=True, description="show a progress bar on a terminal or in a Jupyter notebook"
    )
    step_table: bool = Field(
        default=True,
        description="keep one row per engine step (steps.parquet, Results.steps); the "
        "summary and time series are aggregated as the run goes either way, so turn it "
        "off for runs of millions of requests to keep memory bounded",
    )


class SweepSection(BaseModel):
    model_config = _STRICT
    grid: dict[str, list[Any]] = Field(
        min_length=1,
        description="dotted field path -> values; the sweep runs every combination "
        "(e.g. {workload.arrivals.rate_per_s: [2, 4, 8], serving.max_num_seqs: [64, 256]})",
    )


class PlanSection(BaseModel):
    """What `infersim plan` searches: the cheapest cluster meeting the SLOs."""

    model_config = _STRICT
    target_rate_per_s: float | None = Field(
        default=None, gt=0, description="traffic to serve; default: the workload's rate"
    )
    gpus: list[str] = Field(min_length=1, description="candidate GPU presets or YAML paths")
    tp: list[int] = Field(default=[1, 2, 4, 8], min_length=1, description="tp degrees to try")
    pp: list[int] = Field(default=[1], min_length=1, description="pp degrees to try")
    policies: list[Policy] = Field(default=["chunked_prefill"], min_length=1)
    headroom: float = Field(
        default=0.2, ge=0, le=5, description="plan for this much more traffic than target"
    )
    percentile: Literal["p50", "p90", "p95", "p99"] = Field(
        default="p99", description="the SLO bounds apply at this percentile"
    )
    max_replicas: int = Field(default=512, ge=1, description="give up on a candidate beyond")
    requests_per_probe: int = Field(
        default=400,
        ge=100,
        le=100_000,
        description="requests per capacity probe; at least 100, the fewest with which a "
        "run's overload tests can tell a queue that keeps growing",
    )
    disaggregation: bool = Field(
        default=False,
        description="also try each candidate split into a prefill pool and a decode pool "
        "(same GPU, tp and pp; continuous and chunked_prefill policies), each pool sized "
        "by bisection on the simulated fleet",
    )


class Scenario(BaseModel):
    """Everything one simulation needs; defaults are vLLM's where it has one."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str = Field(default="scenario", description="label used in outputs and comparisons")
    description: str = Field(default="", description="the question this scenario answers")
    seed: int = Field(default=0, ge=0, description="random seed: same seed, same results")
    hardware: HardwareSection | None = Field(
        default=None, description="the GPU of every replica (or give `pools`)"
    )
    model: ModelSection
    parallelism: ParallelismSection = Field(default_factory=ParallelismSection)
    pools: list[PoolSection] = Field(
        default_factory=list,
        description="heterogeneous cluster: groups of replicas with their own GPU and "
        "tp/pp, all behind parallelism.router; replaces hardware and parallelism.tp/pp/"
        "replicas",
    )
    serving: ServingSection = Field(default_factory=ServingSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    frontend: FrontendSection = Field(
        default_factory=FrontendSection,
        description="vLLM's API server between the client and the engine (off by default)",
    )
    workload: WorkloadConfig
    slo: SLOSection = Field(default_factory=SLOSection)
    cost: CostSection = Field(default_factory=CostSection)
    output: OutputSection = Field(default_factory=OutputSection)
    variants: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="named variants to compare: each maps dotted field paths to values "
        "applied to this scenario (e.g. {fp8: {model.kv_dtype: fp8}})",
    )
    faults: FaultsSection | None = Field(
        default=None, description="replica failures to inject (and recoveries)"
    )
    plan: PlanSection | None = Field(
        default=None, description="a capacity-planning search for `infersim plan`"
    )
    sweep: SweepSection | None = Field(
        default=None, description="a grid of values to run with `infersim sweep`"
    )
    base_dir: str = Field(
        default=".", exclude=True, description="folder relative paths resolve against"
    )
    _overrides: tuple[str, ...] = PrivateAttr(default=())
    _load_warnings: tuple[str, ...] = PrivateAttr(default=())

    @property
    def overrides(self) -> tuple[str, ...]:
        """The `key.path=value` overrides (the CLI's --set) this scenario was built with."""
        return self._overrides

    @property
    def load_warnings(self) -> tuple[str, ...]:
        """What loading it said (one price over several GPU types, an override over a
        variant's field): raised once when it is loaded, before any run, and listed first
        in the summary of each run of it (simulation._results), as a BuiltScenario's
        build warnings are."""
        return self._load_warnings

    @model_validator(mode="after")
    def _hardware_or_pools(self) -> Scenario:
        if self.hardware is None and not self.pools:
            raise ValueError("give hardware (one GPU type) or pools (a heterogeneous cluster)")
        if self.hardware is not None and self.pools:
            raise ValueError("give either hardware or pools, not both")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools: names must be unique, got {names}")
        roles = {p.role for p in self.pools}
        if roles & {"prefill", "decode"} and roles != {"prefill", "decode"}:
            raise ValueError(
                f"pools: a disaggregated cluster needs prefill and decode pools and no mixed "
                f"ones, got roles {sorted(roles)}"
            )
        if roles & {"prefill", "decode"} and self.serving.policy in ("static", "dynamic"):
            raise ValueError(
                f"pools: disaggregated serving hands requests over step by step; "
                f"serving.policy {self.serving.policy!r} runs whole batches (use continuous "
                "or chunked_prefill)"
            )
        if self.parallelism.dp > 1 and self.pools:
            raise ValueError(
                "parallelism.dp: data-parallel ranks inside a replica are not supported with "
                "pools yet; give hardware and parallelism.replicas instead"
            )
        if self.parallelism.dp > 1 and self.parallelism.pp > 1:
            raise ValueError(
                "parallelism.dp: data-parallel ranks with pipeline stages (pp > 1) are not "
                "modelled yet; use dp with pp = 1, or pp with dp = 1"
            )
        if self.parallelism.dp > 1 and self.serving.policy in ("static", "dynamic"):
            raise ValueError(
                f"parallelism.dp: data-parallel ranks step iteration by iteration; "
                f"serving.policy {self.serving.policy!r} runs whole batches (use continuous "
                "or chunked_prefill)"
            )
        if self.serving.scheduling_policy == "fcfs":
            for c in self.workload.priorities:
                if c.priority != 0:
                    raise ValueError(
                        f"workload.priorities: class {c.name!r} has priority {c.priority}, "
                        "but serving.scheduling_policy is fcfs (vLLM's default), and vLLM "
                        f"refuses such a request ('Got priority {c.priority} but Priority "
                        "scheduling is not enabled.', add_request): set "
                        "serving.scheduling_policy: priority, or priority 0"
                    )
        if self.frontend.modelled and (reason := self._frontend_unsupported()):
            raise ValueError(reason)
        if self.faults is not None:
            replicas = sum(p.replicas for p in self.pool_list())
            for i, event in enumerate(self.faults.events):
                if event.replica >= replicas:
                    raise ValueError(
                        f"faults.events.{i}.replica: {event.replica} is not a replica "
                        f"(the cluster has {replicas}: 0..{replicas - 1})"
                    )
                if event.recover_at_s is not None and event.recover_at_s <= event.at_s:
                    raise ValueError(f"faults.events.{i}: recover_at_s must be after at_s")
        return self

    def _frontend_unsupported(self) -> str:
        """Why the API server model cannot run this scenario, led by the field to change
        (empty: it can). It is a pass over the finished engine run, so the engine must not
        depend on when the client sees a token, and it reads each token's time from the
        kept inter-token gaps."""
        wl = self.workload
        off = " or frontend.kind: none"
        if wl.arrivals.kind == "closed_loop" or wl.sessions is not None:
            field = "workload.sessions" if wl.sessions is not None else "workload.arrivals.kind"
            return (
                f"{field}: closed-loop users and sessions send their next request when the "
                "client sees the previous one end, which the API server delays after the "
                "engine has run; not modelled with frontend.kind: vllm_api_server: use "
                f"open-loop arrivals (poisson, gamma, constant, trace, offline){off}"
            )
        for i, pool in enumerate(self.pools):
            if pool.role != "mixed":
                return (
                    f"pools.{i}.role: disaggregated pools (prefill/decode roles) are not "
                    f"modelled with frontend.kind: vllm_api_server; set role: mixed{off}"
                )
        if self.parallelism.dp > 1:
            return (
                f"parallelism.dp: {self.parallelism.dp} engine cores behind one instance's "
                "API servers are not modelled with frontend.kind: vllm_api_server; set "
                f"parallelism.dp: 1{off}"
            )
        if self.faults is not None:
            return (
                "faults: retried requests restart on another replica, not modelled with "
                f"frontend.kind: vllm_api_server; remove faults{off}"
            )
        if not self.output.step_table:
            return (
                "output.step_table: false folds every token's time into a histogram, and "
                "frontend.kind: vllm_api_server needs them; set output.step_table: true"
                f"{off}"
            )
        return ""

    def pool_list(self) -> list[PoolSection]:
        """The cluster as pools; a plain scenario is one pool named after its GPU."""
        if self.pools:
            return list(self.pools)
        assert self.hardware is not None
        par = self.parallelism
        return [
            PoolSection(
                name="default", hardware=self.hardware, tp=par.tp, pp=par.pp,
                replicas=par.replicas,
            )
        ]  # fmt: skip

    def for_pool(self, pool: PoolSection) -> Scenario:
        """This scenario narrowed to one pool: what one of its replicas is built from."""
        par = self.parallelism.model_copy(
            update={"tp": pool.tp, "pp": pool.pp, "replicas": pool.replicas}
        )
        return self.model_copy(update={"hardware": pool.hardware, "parallelism": par, "pools": []})

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Overrides | None = None) -> Scenario:
        """Load, apply overrides (see `override_items`), validate; errors name file and
        field."""
        items = override_items(overrides)
        path = Path(path)
        data = load_yaml_mapping(path)
        apply_overrides(data, items)
        data.setdefault("base_dir", str(path.parent.resolve()))
        return cls.from_dict(data, source=str(path), overrides=items)

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], source: str = "scenario", overrides: Sequence[str] = ()
    ) -> Scenario:
        """Validate `data`; `overrides` are the --set items already applied to it, kept
        for the run's provenance."""
        try:
            scenario = cls.model_validate(data)
        except ValidationError as exc:
            raise InfersimError(f"{source}: {describe_errors(exc, cls)}") from None
        scenario._overrides = tuple(overrides)
        if one_price := scenario.cost.one_price_for(scenario.gpu_types()):
            scenario._load_warnings = (f"{source}: {one_price}",)
        runs = scenario.expand(source)  # a bad variant is reported now, not after others
        for run in runs:
            run._check_preset_names(source)
        for text in dict.fromkeys(text for run in runs for text in run.load_warnings):
            warn(text, stacklevel=2)
        return scenario

    def _check_preset_names(self, source: str) -> None:
        """A GPU, node or model given by name (not a file) must be one infersim has: said
        when the scenario is built, with the name it may have meant, not when a run (or
        each point of a sweep) starts. The presets are read as the run reads them."""
        from hardware_models.presets import load_gpu, load_node

        named: list[tuple[str, Any, str | None]] = [
            ("model.name", self.catalog_model, self.model.name)
        ]
        for where, pool in self.hardware_sections():
            named += [(f"{where}.gpu", load_gpu, pool.gpu), (f"{where}.node", load_node, pool.node)]
        for field, load, value in named:
            if value is None or not self.reads_file(field, value):
                check_preset_name(f"{source}: {field}", load, value)

    def catalog_model(self, name: str) -> Any:
        """The catalog model `name` names; an unknown one's error says where a model
        folder of that name would have been read from."""
        from simulator.model_catalog import load_catalog_model

        try:
            return load_catalog_model(name)
        except InfersimError as exc:
            where = f"a model folder is read from the scenario's folder, {self.base_dir}"
            raise InfersimError(f"{exc}; {where}, which has no {name!r}") from None

    def reads_file(self, field: str, value: str) -> bool:
        """Whether `field`'s `value` names a file read from the scenario's folder, not a
        preset: a YAML or JSON name or a path (names_a_file), or a model.name that is no
        catalog model but a folder next to the scenario (a checkpoint's config.json). The
        catalog comes first; a folder named as a catalog model is given as ./NAME."""
        if names_a_file(value):
            return True
        if field != "model.name" or not self.resolve_path(value).is_dir():
            return False
        from simulator.model_catalog import catalog_name

        return catalog_name(value) is None

    def hardware_sections(self) -> list[tuple[str, HardwareSection]]:
        """Each hardware section with the path that names it in an error."""
        if self.hardware is not None:
            return [("hardware", self.hardware)]
        return [(f"pools.{i}.hardware", pool.hardware) for i, pool in enumerate(self.pools)]

    def gpu_types(self) -> set[str]:
        """The GPU types (preset names or paths, as given) this scenario's runs use: a
        plan's candidates, or the cluster's pools with what the variants and a sweep grid
        put in their place."""
        if self.plan is not None:
            return {gpu.lower() for gpu in self.plan.gpus}
        own = {pool.hardware.gpu for pool in self.pool_list()}
        gpus = set() if self.variants else set(own)
        for changes in self.variants.values():
            given = changes.get("hardware.gpu") if isinstance(changes, dict) else None
            gpus.update(own if given is None else {str(given)})
        if self.sweep is not None:
            gpus.update(str(gpu) for gpu in self.sweep.grid.get("hardware.gpu", ()))
        return {gpu.lower() for gpu in gpus}

    def expand(self, source: str | None = None) -> list[Scenario]:
        """The scenarios to run: this one, or one per variant (named after the variant).

        The command line wins over the file, variants included: the --set overrides are
        applied again after each variant's changes (a warning names each field both set,
        said on loading and kept in the variant's load_warnings), so a variant runs, and
        its summary records, what the overrides say."""
        if not self.variants:
            return [self]
        cli = [o for o in self._overrides if override_key(o).split(".")[0] not in _VARIANT_OWNED]
        expanded = []
        for name, changes in self.variants.items():
            data = self.model_dump(mode="json", exclude={"variants"})
            data["base_dir"] = self.base_dir
            if not isinstance(changes, dict):
                raise InfersimError(
                    f"{source or self.name}: variants.{name}: expected a mapping of field: value"
                )
            for key, value in changes.items():
                set_path(data, key, value, f"{source or self.name}: variants.{name}.{key}")
            apply_overrides(data, cli)
            data["name"] = name
            try:
                expanded.append(Scenario.model_validate(data))
                expanded[-1]._overrides = self._overrides
                overridden = _overridden(name, changes, cli)
                expanded[-1]._load_warnings = (*self._load_warnings, *overridden)
            except ValidationError as exc:
                where = f"{source or self.name}: variants.{name}"
                raise InfersimError(f"{where}: {describe_errors(exc, Scenario)}") from None
        return expanded

    def resolve_path(self, path: str) -> Path:
        candidate = Path(path)
        return candidate if candidate.is_absolute() else Path(self.base_dir) / candidate

    def with_overrides(self, overrides: Overrides) -> Scenario:
        """A copy with overrides applied (the CLI's --set; see `override_items`)."""
        items = override_items(overrides)
        data = self.model_dump(mode="json")
        data["base_dir"] = self.base_dir
        apply_overrides(data, items)
        return Scenario.from_dict(data, self.name, (*self._overrides, *items))


def names_a_file(value: str) -> bool:
    """Whether a GPU, node, model or calibration field names a file (read from the
    scenario's folder) rather than a preset: a YAML or JSON name, or a path."""
    return value.endswith((".yaml", ".yml", ".json")) or "/" in value


# ---- overrides ----------------------------------------------------------------------------
# Mappings whose keys are themselves dotted field paths (`sweep.grid.serving.max_num_seqs`
# is the grid key `serving.max_num_seqs`); "*" matches any name.
_PATH_KEYED = (("sweep", "grid"), ("variants", "*"))


def _path_keyed(prefix: list[str]) -> bool:
    return any(
        len(prefix) == len(keyed) and all(k in ("*", p) for p, k in zip(prefix, keyed, strict=True))
        for keyed in _PATH_KEYED
    )


def set_path(data: dict[str, Any], dotted: str, value: Any, label: str) -> None:
    """Set `a.b.c` in nested dicts, creating sections that are absent."""
    node = data
    parts = dotted.strip().split(".")
    for depth, part in enumerate(parts[:-1]):
        if _path_keyed(parts[:depth]):
            node[".".join(parts[depth:])] = value
            return
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise InfersimError(f"{label}: {part} is not a section")
        node = child
    node[parts[-1]] = value


# --set keys a variant's copy of the scenario does not take again: the variants themselves
# (already applied to the mapping) and the name (each variant is named after itself).
_VARIANT_OWNED = ("variants", "name")


def override_key(item: str) -> str:
    """The field path a `key.path=value` override sets."""
    return item.partition("=")[0].strip()


def fields_overlap(a: str, b: str) -> bool:
    """Whether setting dotted path `a` and setting `b` touch the same field."""
    return a == b or a.startswith(f"{b}.") or b.startswith(f"{a}.")


def _overridden(variant: str, changes: dict[str, Any], overrides: list[str]) -> list[str]:
    """The warning for each field of a variant an override sets again."""
    winner = option("overrides win", "the command line wins")
    return [
        f"{_given(item)} overrides variants.{variant}.{field}={changes[field]!r} "
        f"({winner} over the scenario file, variants included)"
        for item in overrides
        for field in changes
        if fields_overlap(field, override_key(item))
    ]


def _given(item: str) -> str:
    """An override as its caller gave it: `--set ITEM` on the command line, else
    `override ITEM` (an item of `overrides=`)."""
    return f"{option('override', '--set')} {item}"


def check_preset_name(where: str, load: Callable[[str], object], value: str | None) -> None:
    """A preset given by name (not a file, which is read from base_dir when the run
    starts) must load: otherwise one line `where: unknown ...; did you mean ...`."""
    if value is None or names_a_file(value):
        return
    try:
        load(value)
    except InfersimError as exc:
        raise InfersimError(f"{where}: {exc}") from None


def override_items(overrides: Overrides | None) -> tuple[str, ...]:
    """Overrides as `key.path=value` strings, from one such string, a list of them, or a
    mapping {key.path: value} (each value written as YAML, so that it reads back as
    given: `{"name": "16"}` names the scenario "16")."""
    if overrides is None:
        return ()
    if isinstance(overrides, str):
        return (overrides,)
    if isinstance(overrides, Mapping) and all(isinstance(k, str) for k in overrides):
        return tuple(f"{key}={_yaml_text(key, value)}" for key, value in overrides.items())
    if isinstance(overrides, Sequence) and all(isinstance(i, str) for i in overrides):
        return tuple(overrides)
    raise InfersimError(
        "overrides: expected 'key.path=value', a list of such strings or a dict "
        f"{{'key.path': value}}, got {shown(overrides)}"
    )


def _yaml_text(key: str, value: Any) -> str:
    """A mapping override's value as the one-line YAML an override string holds."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf)
    except yaml.YAMLError:
        raise InfersimError(
            f"overrides[{key!r}]: a value written as YAML is expected (a number, string, "
            f"boolean, list or dict), got {type(value).__name__}"
        ) from None
    return text.removesuffix("\n...\n").rstrip("\n")


def _is_text_field(dotted: str) -> bool:
    """Whether `dotted` names a scenario field that holds text alone (a name, a path)."""
    *section, field = dotted.split(".")
    info = getattr(_model_at(Scenario, tuple(section)), "model_fields", {}).get(field)
    if info is None:
        return False
    return set(typing.get_args(info.annotation) or {info.annotation}) - {type(None)} == {str}


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> None:
    """`serving.max_num_seqs=64`: values are parsed as YAML (numbers, booleans, lists),
    except that a string field takes the text as written (`name=16` names it "16")."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InfersimError(f"{_given(repr(item))}: expected key.path=value")
        value = parse_yaml(raw, _given(key.strip()))
        if isinstance(value, int | float) and _is_text_field(key.strip()):
            value = raw.strip()
        set_path(data, key, value, _given(repr(item)))


# ---- readable validation errors -------------------------------------------------------------
def _field_models(annotation: Any) -> list[type[BaseModel]]:
    """Pydantic models an annotation may hold (through Optional, unions, lists)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(_field_models(arg))
    return found


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """Follow an error location down through nested models (tags pick union members)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None:
            return None
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part))
        if field is not None:
            candidates = _field_models(field.annotation)
            current = candidates[0] if len(candidates) == 1 else _Union(candidates)
            continue
        if isinstance(current, _Union):
            current = current.pick(str(part))
            continue
        return None
    return current.pick(None) if isinstance(current, _Union) else current


class _Union(list):
    """Several possible models at one place; the next location part may name the tag."""

    @property
    def model_fields(self) -> dict:
        return {}

    def pick(self, tag: str | None) -> type[BaseModel] | None:
        for model in self:
            kind = model.model_fields.get("kind")
            if tag is not None and kind is not None and kind.default == tag:
                return model
        return self[0] if len(self) == 1 else None


_LEADING_FIELD = re.compile(r"[a-z_]+(\.[a-z_0-9]+)*: ")


def describe_errors(exc: ValidationError, model: type[BaseModel]) -> str:
    lines = []
    for item in exc.errors():
        loc = tuple(item["loc"])
        where = ".".join(repr(p) if "\n" in str(p) else str(p) for p in loc) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if not loc and _LEADING_FIELD.match(message):  # a whole-scenario check names it
            lines.append(message)
            continue
        if item["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            known = sorted(parent.model_fields) if parent is not None else []
            known = [k for k in known if k != "base_dir"]
            hint = did_you_mean(str(loc[-1]), known, cutoff=0.5)
            allowed = f" (allowed: {', '.join(known)})" if known else ""
            lines.append(f"{where}: unknown key{hint}{allowed}")
            continue
        got = item.get("input")
        got_text = (
            ""
            if isinstance(got, (dict, list)) or item["type"] == "missing"
            else (f" (got {got!r})")
        )
        lines.append(f"{where}: {message}{got_text}")
    return "; ".join(lines)
