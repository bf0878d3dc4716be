"""Settings that quietly bend a run's answer, said before it runs: a run that is allowed
but not what the user may think it is gets a one-line warning (in the terminal and in
summary.json's `warnings`), and what vLLM refuses at start-up is refused here too.

What the run's figures reveal afterwards (a token budget that caps the batch while the KV
cache is free, heavy preemption) is judged in simulator.metrics.summary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from hardware_models.block_scaling import NVFP4
from hardware_models.dtypes import Dtype, bytes_per_element
from hardware_models.errors import InfeasibleError
from hardware_models.node import CrossNodeLink
from simulator.engine.kv_groups import chunked_local_attention
from simulator.engine.moe_layer import mxfp4_backend
from simulator.memory_planner import RUN_SETTINGS, SettingNames
from simulator.vllm_defaults import Default

if TYPE_CHECKING:
    from hardware_models.accelerator import AcceleratorSpec
    from hardware_models.node import NodeSpec
    from simulator.architecture import ModelArchitecture
    from simulator.build import ReplicaBuild
    from simulator.scenario import ServingSection


def check_token_budget(
    policy: str,
    budget: int,
    max_model_len: int,
    max_num_seqs: int,
    budget_default: bool = False,
    names: SettingNames = RUN_SETTINGS,
) -> None:
    """vLLM's SchedulerConfig.verify_max_model_len refuses to start a prefill-first engine
    (no chunked prefill) whose token budget is below max_model_len (a longer prompt could
    never be scheduled), and any engine whose budget is below max_num_seqs (each
    sequence of a step takes at least one token), chunked prefill or not.
    `budget_default`: the budget was left unset (vLLM's default for the GPU, which only
    a max_num_seqs given above it can exceed), so the message says to set it; `names`:
    the settings as the command spells them (a scenario's fields, estimate's flags)."""
    if policy not in ("continuous", "chunked_prefill"):
        return  # run-to-completion batches: not vLLM's scheduler, no token budget
    tokens, seqs = names.max_num_batched_tokens, names.max_num_seqs
    if policy == "continuous" and budget < max_model_len:
        raise InfeasibleError(
            f"{tokens}={budget} is below max_model_len={max_model_len}: the continuous "
            "policy prefills a prompt in one step, so vLLM refuses this at start-up; raise "
            f"{tokens}, lower {names.max_model_len}, or use chunked_prefill"
        )
    if budget < max_num_seqs:
        way_out = f"raise {tokens} or lower {seqs}"
        if budget_default:
            way_out = (
                f"{tokens} was left unset and took vLLM's default for this GPU, {budget}: "
                f"set it to at least {max_num_seqs} or lower {seqs}"
            )
        raise InfeasibleError(
            f"{tokens}={budget} is below {seqs}={max_num_seqs}: vLLM refuses this at "
            "start-up (max_num_batched_tokens must be greater than or equal to "
            f"max_num_seqs); {way_out}"
        )


def check_context(
    max_model_len: int, arch: ModelArchitecture, names: SettingNames = RUN_SETTINGS
) -> None:
    """vLLM's ModelConfig (_get_and_verify_max_len) refuses a max_model_len above the
    model's context (max_position_embeddings, rope scaling included), unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, which infersim does not model."""
    if max_model_len > arch.max_position_embeddings:
        raise InfeasibleError(
            f"{names.max_model_len}={max_model_len} is above {arch.name}'s context of "
            f"{arch.max_position_embeddings} tokens (max_position_embeddings): vLLM refuses "
            f"this at start-up; set {names.max_model_len} to at most "
            f"{arch.max_position_embeddings}"
        )


def check_serving_starts(
    arch: ModelArchitecture,
    serving: ServingSection,
    max_model_len: int,
    *,
    budget_default: bool,
    names: SettingNames = RUN_SETTINGS,
) -> None:
    """What vLLM checks of the serving settings before it sizes memory (check_context,
    check_token_budget), as `run` and `estimate` both refuse them, each naming the
    settings as its user sets them (`names`); `budget_default`: the token budget was
    left to vLLM's default."""
    check_context(max_model_len, arch, names)
    check_token_budget(
        serving.policy,
        serving.max_num_batched_tokens,
        max_model_len,
        serving.max_num_seqs,
        budget_default=budget_default,
        names=names,
    )


SWAP_REFUSED_SHARE = 0.7  # vLLM CacheConfig.verify_with_parallel_config raises above it
SWAP_WARNED_SHARE = 0.4  # and warns above it


def swap_space_share(swap_space_gb: float, tp: int, node: NodeSpec) -> float:
    """Share of the node's host memory the swap space takes, as vLLM's
    CacheConfig.verify_with_parallel_config counts it: swap_space for each of the tp
    GPUs, on one node (vLLM's comment there says it assumes the tp group shares one)."""
    return swap_space_gb * tp / node.host_memory_gb


def _swap_space_message(swap_space_gb: float, tp: int, node: NodeSpec) -> str:
    return (
        f"serving.swap_space_gb={swap_space_gb:g} for each of tp={tp} GPUs takes "
        f"{swap_space_gb * tp:g} GiB of the {node.host_memory_gb:g} GiB of host memory of a "
        f"{node.name} node ({swap_space_share(swap_space_gb, tp, node):.0%})"
    )


def check_swap_space(swap_space_gb: float, tp: int, node: NodeSpec) -> str | None:
    """As vLLM's CacheConfig.verify_with_parallel_config, whatever the preemption: refuse
    a swap space above 70% of the node's CPU memory ('Too large swap space'); above 40%,
    the warning to give ('Possibly too large swap space'), else None."""
    share = swap_space_share(swap_space_gb, tp, node)
    if share > SWAP_REFUSED_SHARE:
        raise InfeasibleError(
            f"{_swap_space_message(swap_space_gb, tp, node)}: vLLM refuses more than "
            f"{SWAP_REFUSED_SHARE:.0%} at start-up ('Too large swap space'); lower "
            "serving.swap_space_gb"
        )
    if share > SWAP_WARNED_SHARE:
        return (
            f"{_swap_space_message(swap_space_gb, tp, node)}: vLLM warns above "
            f"{SWAP_WARNED_SHARE:.0%} ('Possibly too large swap space')"
        )
    return None


def check_num_gpu_blocks(num_gpu_blocks: int | None, fitting: int, derived: int) -> None:
    """serving.num_gpu_blocks above what the GPU's memory holds beside the weights,
    activations and overhead (`fitting`, at gpu_memory_utilization 1): vLLM takes the
    override as given (may_override_num_blocks) and runs out of GPU memory allocating
    the KV cache at start-up. `derived`: the blocks the memory planner gives."""
    if num_gpu_blocks is not None and num_gpu_blocks > fitting:
        fitting = max(fitting, 0)
        way_out = (
            f"set at most {fitting:,}, or leave it unset"
            if fitting
            else "the rest fills it alone: raise parallelism.tp or narrow model.weight_dtype"
        )
        raise InfeasibleError(
            f"serving.num_gpu_blocks={num_gpu_blocks:,} is more KV blocks than the GPU "
            f"holds beside the weights, activations and overhead ({fitting:,} at "
            f"gpu_memory_utilization 1; the memory plan gives {max(derived, 0):,}): vLLM "
            "takes the override (may_override_num_blocks) and runs out of GPU memory "
            f"allocating the KV cache at start-up; {way_out}"
        )


_BATCHERS = ("static", "dynamic")  # infersim's run-to-completion batchers, not vLLM's
IGNORED_SETTINGS: dict[str, tuple[tuple[str, ...], str]] = {
    # setting: (the policies that ignore it, why)
    "max_num_batched_tokens": (_BATCHERS, "its batches have no token budget (max_num_seqs "
                               "and the KV cache bound them); it only sizes the memory plan's "
                               "profiling pass, as vLLM's profile run takes it"),
    "watermark": (_BATCHERS, "a batch starts while its padded KV cache fits, no watermark"),
    "preemption": (_BATCHERS, "a batch runs to completion, nothing is preempted"),
    "swap_space_gb": (_BATCHERS, "a batch runs to completion, nothing is swapped"),
    "reserve_full_sequence": (_BATCHERS, "a batch reserves its whole padded KV cache"),
    "enable_prefix_caching": (_BATCHERS, "a batch prefills every prompt whole"),
    "max_queue_delay_ms": (("static", "continuous", "chunked_prefill"),
                           "only the dynamic policy waits for a batch to form"),
}  # fmt: skip


def ignores(policy: str, setting: str) -> bool:
    """Whether serving.policy `policy` never reads serving.`setting` (IGNORED_SETTINGS)."""
    return policy in IGNORED_SETTINGS.get(setting, ((), ""))[0]


def ignored_settings(serving: ServingSection) -> list[str]:
    """A line for each serving setting given a value other than its default that the
    policy never reads: a sweep over it would give a flat line, silently."""
    lines = []
    for name, (policies, why) in IGNORED_SETTINGS.items():
        value = getattr(serving, name)
        if serving.policy in policies and value != type(serving).model_fields[name].default:
            lines.append(
                f"serving.{name}={value} is ignored by serving.policy {serving.policy}: {why}"
            )
    return lines


STATIC_FILL_SHARE = 0.1  # of the mean TTFT: waits for a full static batch worth a warning


def static_fill_warning(
    max_num_seqs: int, idle_s: float, wait_s: float, replicas: int, end: float, ttft: np.ndarray
) -> str | None:
    """What a static batcher's wait for max_num_seqs requests cost, told when it added
    STATIC_FILL_SHARE or more to the mean TTFT (a run's figure, said after it): the
    GPUs idled `idle_s` (summed over `replicas`, of a run `end` s long) while requests
    waited `wait_s` in all for their batch to fill; `ttft` of the requests that got a
    token. None: the batches filled fast enough."""
    started = ttft[~np.isnan(ttft)]
    if not len(started) or not idle_s:
        return None
    added, mean = wait_s / len(started), float(started.mean())
    if added < STATIC_FILL_SHARE * mean:
        return None
    return (
        f"serving.policy static waits for a full batch of max_num_seqs={max_num_seqs}: the "
        f"GPUs sat idle {idle_s / (replicas * end):.0%} of the run with requests waiting, "
        f"which adds {added * 1e3:,.0f} ms to the mean TTFT of {mean * 1e3:,.0f} ms; the "
        "dynamic policy bounds the wait (max_queue_delay_ms, as Triton's dynamic batcher), "
        "continuous batching has none"
    )


class ForcedBlockSize(NamedTuple):
    size: int
    backend: str  # the MLA attention backend that needs it
    reason: str  # for the header line or the warning

    @property
    def default_line(self) -> str:
        """The serving plan's and the run header's line where the block size was left at
        the default, so `estimate` and `run` say it alike."""
        return Default(self.size, self.reason).line("serving.block_size")


def mla_block_size(
    arch: ModelArchitecture, gpu: AcceleratorSpec, block_size: int
) -> ForcedBlockSize | None:
    """The KV block size vLLM forces for an MLA model on CUDA, and the backend that needs
    it (None: block_size suits it). CudaPlatformBase.check_and_update_config
    (vllm/platforms/cuda.py, commit 002db49) picks the MLA backend by GPU and resizes the
    block, whether the user set it or not: FlashMLA on Hopper (is_flashmla_dense_supported:
    capability family 90) reads pages of 64 tokens; on datacenter Blackwell (family 100),
    FlashInfer MLA for 128-wide qk_nope heads takes 32 or a multiple of 64, else CUTLASS
    MLA a multiple of 128. Elsewhere (Ampere, Ada, RTX Blackwell, ROCm) the block is kept."""
    if not arch.is_mla or gpu.vendor != "nvidia":
        return None
    major = gpu.capability_major
    if gpu.architecture.strip().lower() == "hopper" or major == 9:
        fits, size, backend = block_size % 64 == 0, 64, "FlashMLA"
    elif major != 10:
        return None
    elif arch.qk_nope_head_dim == 128:
        fits, size, backend = block_size == 32 or block_size % 64 == 0, 64, "FlashInfer MLA"
    else:
        fits, size, backend = block_size % 128 == 0, 128, "CUTLASS MLA"
    reason = f"vLLM forces it for {backend}, {arch.name}'s MLA attention on {gpu.name}"
    return None if fits else ForcedBlockSize(size, backend, reason)


def overhead_override_warning(asked_gb: float, modelled_bytes: float) -> str:
    """engine.framework_overhead_gb narrowed with the memory plan as vLLM's profiler
    (merge d0e21c8): it was a catch-all allowance (CUDA context, allocator, graphs) and is
    now vLLM's non-torch memory alone, the profile run's sampler peak and the memory CUDA
    does not show being counted apart; an old file's figure still loads, so the run says
    it now stands for less."""
    return (
        f"engine.framework_overhead_gb={asked_gb:g}: this is now vLLM's non-torch memory "
        f"only (cuBLAS, driver, NCCL and custom all-reduce buffers; {modelled_bytes / 2**30:.2f} "
        "GiB modelled here); the profile run's activation and sampler peak and the memory "
        "CUDA does not show are counted apart, so a figure written for the older catch-all "
        "allowance (CUDA context, allocator, graphs) counts them twice: unset it for the "
        "modelled figure"
    )


def _dtype_without_tensor_rate(build: ReplicaBuild, dtype: Dtype) -> bool:
    return bytes_per_element(dtype) < 2 and dtype not in build.gpu.tensor_flops_per_core_per_clock


def _crossing_nodes(build: ReplicaBuild) -> str | None:
    """What of a replica talks across nodes (its tp group, its MoE dispatch group, its
    pipeline hand-offs), over which link: priced as NCCL runs it there, a model no
    measurement here checks; None where everything stays in a node. Every replica as
    placed (StepCostModel.placed_ranks), not replica 0's alone: a later one packed
    across a node boundary dispatches or hands off over the inter-node link where
    replica 0 does not, and may cross more boundaries than it."""
    cost, node = build.cost, build.node
    link, per_node = node.inter_node_link, node.gpus_per_node
    if link is None:
        return None
    placed = list(dict.fromkeys(m for ranks in cost.placed_ranks(build.replicas, build.dp)
                                for m in ranks))  # fmt: skip
    what = []
    if cost.tp > per_node:
        what.append(f"tp={cost.tp}'s all-reduces ({cost.tp // per_node} nodes)")
    crossed = [m.ep_link is link or isinstance(m.ep_link, CrossNodeLink) for m in placed]
    if build.arch.is_moe and cost.dp > 1 and any(crossed):
        some = "" if all(crossed) else " (in some replicas)"
        what.append(f"the MoE dispatch over tp x dp = {cost.tp * cost.dp} GPUs{some}")
    handoffs = sorted({sum(n for hop, n, _, _ in m.handoffs if hop is link) for m in placed})
    if handoffs[-1]:
        counts = f"{handoffs[0]}" if len(handoffs) == 1 else f"{handoffs[0]} to {handoffs[-1]}"
        by_replica = "" if len(handoffs) == 1 else ", by replica"
        what.append(f"pipeline hand-offs ({counts} of {cost.pp - 1}{by_replica})")
    if not what:
        return None
    return (
        f"crossing {node.name} nodes of {per_node} GPUs: {' and '.join(what)}, over the "
        f"{link.kind} link ({link.bandwidth_gbps:g} GB/s per GPU, {link.latency_us:g} us), "
        "priced as NCCL runs them there (each GPU sends over its own NIC rail; rings and "
        "trees also pass through the node's own link) from the node preset's figures, "
        "not from a measurement (summary.json provenance.links); against the only measured "
        "2-node rows (A100 all-reduces of 1 MiB and up) they are 13% off on average at 8 GPUs "
        "but 65% at 16, too fast (2.5x at 64 MiB; benchmarks/README.md, 'All-reduce across "
        "nodes')"
    )


def configuration_warnings(build: ReplicaBuild) -> list[str]:
    """One replica layout's silent limits: groups and hand-offs crossing nodes,
    narrow dtypes the GPU cannot multiply in (dequantized to the activation dtype),
    chunked local attention priced as a sliding window (whatever the KV cache mode), a
    swap space too small for one sequence (the run may stop at a swap-out), Marlin asked
    for MXFP4 experts the model does not have, MXFP4 experts on a kernel whose price is
    checked against little published (mxfp4_moe's caveats), NVFP4 experts priced as
    Marlin where vLLM multiplies them in fp4."""
    cost, gpu, arch = build.cost, build.gpu, build.arch
    warnings = []
    if chunked_local_attention(arch):
        warnings.append(
            f"{arch.name}: {arch.num_sliding_layers} of {arch.num_layers} layers attend "
            f"within {arch.sliding_window}-token chunks, priced as a sliding window of "
            f"{arch.sliding_window} tokens: an upper bound on their attention time (a query "
            "early in a chunk reads fewer keys)"
        )
    if crossing := _crossing_nodes(build):
        warnings.append(crossing)
    act = cost.act_dtype.value
    backend = mxfp4_backend(cost.weight_format, gpu, cost.mxfp4_use_marlin)
    mxfp4_experts = arch.is_moe and backend is not None
    # MXFP4 experts: the run's moe_kernel line says how they are multiplied (widened to
    # bf16 on every backend, B200's included), so the GPU's lack of an fp4 rate is no
    # second message; the rest of such a model is 16-bit (mxfp4_layout).
    if _dtype_without_tensor_rate(build, cost.weight_dtype) and not mxfp4_experts:
        warnings.append(
            f"{gpu.name} has no {cost.weight_dtype.value} tensor rate: "
            f"{cost.weight_dtype.value} weights are dequantized and multiplied at the {act} "
            "rate (weight-only quantization: less memory and traffic, no faster math)"
        )
    if _dtype_without_tensor_rate(build, cost.kv_dtype):
        warnings.append(
            f"{gpu.name} has no {cost.kv_dtype.value} tensor rate: the "
            f"{cost.kv_dtype.value} KV cache is dequantized and attention runs at the {act} "
            "rate"
        )
    if mxfp4_experts and backend.caveat:
        warnings.append(f"{arch.name}'s MXFP4 experts on {backend.name}: {backend.caveat}")
    if arch.is_moe and cost.weight_format == NVFP4.name and gpu.supports(Dtype.FP4):
        warnings.append(
            f"{arch.name}: its nvfp4 experts are priced as the Marlin W4A16 kernel (weights "
            f"dequantised, bf16 math); on {gpu.name}, which multiplies fp4 natively, vLLM "
            "runs NVFP4 MoE kernels with fp4 activations, so the MoE layers are priced slower"
        )
    if cost.mxfp4_use_marlin and cost.moe_kernel_note() is None:
        warnings.append(
            f"model.mxfp4_use_marlin: {arch.name} in {cost.weight_format} has no MXFP4 "
            "MoE experts, so VLLM_MXFP4_USE_MARLIN changes nothing"
        )
    config = build.config
    longest = -(-config.max_model_len // config.block_size)
    engines = build.pipelined_engines
    swap_blocks = config.swap_blocks // max(engines, 1)  # what a swap-out can use
    if config.iterative and config.preemption == "swap" and swap_blocks < longest:
        share = f" per pipelined batch ({engines} share it)" if engines > 1 else ""
        warnings.append(
            f"serving.swap_space_gb holds {swap_blocks:,} KV blocks of host swap space{share}, "
            f"fewer than one {config.max_model_len:,}-token sequence needs ({longest:,}): "
            "with serving.preemption=swap, a swap-out that finds too little free stops the "
            "run, as vLLM v0 aborts the engine (Scheduler._swap_out)"
        )
    return warnings
