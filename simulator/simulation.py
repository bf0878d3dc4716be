"""Wire a scenario into a SimPy run: workload process -> router -> replicas -> results."""

from __future__ import annotations

import contextlib
import functools
import heapq
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

import hardware_models
from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration_lookup import (
    CalibrationChoice,
    choose_calibration,
    gemms_outside_fitted_sizes,
    profile_metadata,
)
from hardware_models.errors import InfeasibleError, InfersimError, InfersimWarning
from hardware_models.node import LinkSpec, NodeSpec
from hardware_models.power import power_model
from hardware_models.presets import list_nodes, load_gpu, load_node
from hardware_models.warning_scope import raise_again, recording, warn, warn_at
from simulator.api_server import (
    ClientView,
    ingested,
    instances,
    unmodelled_load,
    unmodelled_warning,
)
from simulator.architecture import ModelArchitecture
from simulator.caveats import (
    check_num_gpu_blocks,
    check_serving_starts,
    check_swap_space,
    configuration_warnings,
    ignored_settings,
    ignores,
    mla_block_size,
    overhead_override_warning,
    static_fill_warning,
)
from simulator.engine.dp_group import DpGroup
from simulator.engine.kv_groups import KvCacheGroups, chunked_local_attention, kv_cache_groups
from simulator.engine.pipeline import PipelineGroup, SharedKv
from simulator.engine.prefix_hashes import BlockKeys
from simulator.engine.replica import Clock, Replica, ReplicaConfig, empty_kv_cache
from simulator.engine.requests import Outcome, RejectReason, RequestTable
from simulator.engine.step_cost import EngineOverheads, StepCostModel
from simulator.engine.step_log import ClosedLog
from simulator.inputs import shown
from simulator.kv_links import KvLinks
from simulator.memory_planner import (
    GIB,
    DoesNotFit,
    MaxModelLenRefused,
    MemoryPlan,
    SettingNames,
    framework_overhead_bytes,
    plan_memory,
    stage_layers,
)
from simulator.metrics.context import SLO, ReplicaInfo, RunContext
from simulator.metrics.step_totals import StepTotals
from simulator.model_catalog import load_model
from simulator.progress import Progress
from simulator.provenance import assumed_links, named_from, provenance
from simulator.results import Results
from simulator.router import SessionAffinity, foreseen_routes, make_router
from simulator.scenario import (
    BATCH_LIMITS,
    ModelSection,
    Scenario,
    ServingSection,
    replica_gpus,
)
from simulator.workload import (
    ClosedLoopSampler,
    PromptHashes,
    RequestBatch,
    Session,
    SessionSampler,
    generate_requests,
)

if TYPE_CHECKING:
    from simulator.sharding import Share, Workers


@dataclass(frozen=True)
class ReplicaBuild:
    """Everything derived from a scenario for one replica, before any request runs."""

    arch: ModelArchitecture
    gpu: AcceleratorSpec
    node: NodeSpec
    memory: MemoryPlan
    config: ReplicaConfig
    cost: StepCostModel
    info: ReplicaInfo  # of one dp rank (the whole replica when dp is 1)
    replicas: int
    dp: int = 1  # attention data-parallel ranks per replica
    defaults: tuple[str, ...] = ()  # the serving settings vLLM's defaults chose, and why
    pp_field: str = "parallelism.pp"  # where the scenario sets pp (a pool's own `pools.<i>.pp`)

    @property
    def pipelined_engines(self) -> int:
        """The engines (batches in flight) of a pipelined replica, each with its own
        scheduler and swap_blocks // engines of the swap space, as vLLM v0's virtual
        engines; 0 when the replica is not pipelined."""
        pp = self.cost.pp
        if pp > 1 and self.config.iterative and self.dp == 1:
            return min(pp, self.config.max_num_seqs)
        return 0


def resolve_calibration(scenario: Scenario) -> CalibrationChoice:
    """The scenario's GPU with the profile `hardware.calibration` chooses, and a note of
    which one that is (for the summary and the terminal)."""
    hw = scenario.hardware
    gpu = _named_field("hardware.gpu", load_gpu, _scenario_file(scenario, "hardware.gpu", hw.gpu))
    value = _scenario_file(scenario, "hardware.calibration", hw.calibration or "none")
    return _named_field("hardware.calibration", lambda v: choose_calibration(gpu, v), value)


def resolve_gpu(scenario: Scenario) -> AcceleratorSpec:
    return resolve_calibration(scenario).gpu


def _named_field(field: str, load, value: str):
    """Load a preset, naming the scenario field when the name or file is bad."""
    try:
        return load(value)
    except InfersimError as exc:
        raise InfersimError(f"{field}: {exc}") from None


def _maybe_path(scenario: Scenario, field: str, name: str) -> str:
    """Preset names stay names; a file (Scenario.reads_file) resolves from the scenario."""
    if scenario.reads_file(field, name):
        return str(scenario.resolve_path(name))
    return name


def _scenario_file(scenario: Scenario, field: str, name: str) -> str:
    """`_maybe_path`, refusing a relative path that is missing from the scenario's folder
    but exists from the working folder with a hint (the usual slip with --set)."""
    value = _maybe_path(scenario, field, name)
    if value != name and not Path(value).exists() and Path(name).is_file():
        raise InfersimError(
            f"{field}: {value}: no such file (a relative path resolves against the "
            f"scenario's folder; {name} is in the working folder: give its absolute path, "
            f"{Path(name).resolve()})"
        )
    return value


def resolve_node(scenario: Scenario, gpu: AcceleratorSpec) -> NodeSpec:
    if scenario.hardware.node:
        node = load_node(_scenario_file(scenario, "hardware.node", scenario.hardware.node))
        if node.gpu != gpu.name:
            raise InfeasibleError(
                f"hardware.node {node.name} is built from {node.gpu}, not hardware.gpu {gpu.name}"
            )
        return node
    return default_node(gpu)


def default_node(gpu: AcceleratorSpec) -> NodeSpec:
    """The node a scenario without hardware.node runs on: the first node preset built from
    `gpu`, else the GPU alone (one per node, no link to another)."""
    for name in list_nodes():
        node = load_node(name)
        if node.gpu == gpu.name:
            return node
    return NodeSpec(
        name=f"{gpu.name}-single",
        display_name=f"one {gpu.display_name}",
        gpu=gpu.name,
        gpus_per_node=1,
        intra_node_fabric="none",
        nics_per_node=0,
        nic_bandwidth_gbps=0,
        host_memory_gb=256,
    )


def check_tp_on_node(tp: int, node: NodeSpec, field: str = "parallelism.tp") -> None:
    """A tensor-parallel group of `tp` GPUs a deployment on `node` would refuse: wider than
    a node with no inter-node link, or spanning nodes unevenly; `field` names the tp."""
    per_node = node.gpus_per_node
    if tp > per_node and node.inter_node_link is None:
        raise InfeasibleError(
            f"{field}={tp} needs {tp} GPUs in one tensor-parallel group, but "
            f"a {node.name} node has {per_node} and no inter-node link"
        )
    if tp > per_node and tp % per_node:
        raise InfeasibleError(
            f"{field}={tp} spans nodes of {per_node} GPUs unevenly; "
            f"use a multiple of {per_node} or at most {per_node}"
        )


def check_placement(scenario: Scenario, arch: ModelArchitecture, node: NodeSpec) -> None:
    """Placements a real deployment would refuse, explained with the topology."""
    par = scenario.parallelism
    check_tp_on_node(par.tp, node)
    if par.pp > arch.num_layers:
        raise InfeasibleError(
            f"parallelism.pp={par.pp} exceeds {arch.name}'s {arch.num_layers} layers: a "
            "stage would hold none (uneven stages are split as vLLM does)"
        )
    size = replica_gpus(par.tp, par.pp, par.dp)
    per_node = node.gpus_per_node
    if par.tp < per_node and per_node % par.tp and par.replicas * size > per_node:
        raise InfeasibleError(
            f"parallelism.tp={par.tp} does not divide the {per_node} GPUs of a {node.name} "
            f"node: with the replicas' {par.replicas} x {size} GPUs packed in order, a "
            "tensor-parallel group would straddle two nodes and all-reduce over the "
            "inter-node link every layer (not modelled; vLLM's docs keep tp inside a node); "
            f"use a tp dividing {per_node}"
        )
    if par.nodes is not None:
        needed = par.replicas * size
        have = par.nodes * node.gpus_per_node
        if needed > have:
            dp = f" x dp={par.dp}" if par.dp > 1 else ""
            raise InfeasibleError(
                f"{par.replicas} replicas x tp={par.tp} x pp={par.pp}{dp} need {needed} GPUs; "
                f"the cluster has {par.nodes} x {node.name} = {have}"
            )


def _warn_straddling(cost: StepCostModel, replicas: int, dp: int, section: str) -> None:
    """Say which replicas, packed in order over the nodes (each from GPU replica x its
    size on, as Simulation places them), run their stage hand-offs, all-reduces or MoE
    dispatch over other links than the first replica's: a replica that straddles two
    nodes hands its activations (or dispatches its tokens) over the inter-node link, and
    is priced so (StepCostModel.placed). `section` names the replicas' field's section
    (`parallelism`, or a scenario's own `pools.<i> (<name>)`)."""
    size, per_node = cost.tp * cost.pp * dp, cost.node.gpus_per_node
    ranks = cost.placed_ranks(replicas, dp)
    moved = [r for r, models in enumerate(ranks) if any(m is not cost for m in models)]
    if not moved:
        return
    shown = ", ".join(map(str, moved[:8])) + (", ..." if len(moved) > 8 else "")
    elsewhere = dict.fromkeys(m for r in moved for m in ranks[r] if m is not cost)
    parts = ("pipeline hand-offs", "all-reduces", "MoE dispatches")  # placement()'s order
    what = [
        part for i, part in enumerate(parts) if any(m.where[i] != cost.where[i] for m in elsewhere)
    ]
    warn(
        f"{section}: replicas {shown} of {replicas} (from 0; {size} GPUs each, packed in "
        f"order over nodes of {per_node}) sit elsewhere in their nodes than replica 0, so "
        f"their {' and '.join(what)} run over other links (a replica straddling two nodes "
        "hands off or dispatches over the inter-node link) and their steps are priced where "
        f"they run; replicas whose GPUs divide {per_node} (or are whole nodes) sit alike",
        stacklevel=3,
    )


def _hybrid_off_reason(
    scenario: Scenario, arch: ModelArchitecture, kv_transfer: bool, hashed_prompts: bool
) -> str:
    """Why vLLM V1's hybrid KV cache manager does not run for this model and scenario
    (empty: it runs). vLLM turns it off itself with a KV connector and, by default, for
    chunked local attention; vLLM V1 has neither run-to-completion batches nor swapping.
    Prompts sharing blocks by hash (a trace's hash_ids) run, as vLLM runs them, but
    without the manager: sharing across its groups is not modelled."""
    serving = scenario.serving
    mixed = arch.num_sliding_layers < arch.num_layers
    if serving.disable_hybrid_kv_cache_manager and mixed:
        return "serving.disable_hybrid_kv_cache_manager is set"
    allowed = serving.allow_chunked_local_attn_with_hybrid_kv_cache
    if chunked_local_attention(arch) and not allowed:
        return (
            "vLLM turns its hybrid KV cache manager off for chunked local attention by "
            "default (a latency regression; serving.allow_chunked_local_attn_with_hybrid_"
            "kv_cache, vLLM's VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1, keeps it)"
        )
    if hashed_prompts and serving.prefix_caching:
        return (
            "the trace's prompts share cached blocks by hash_ids, and sharing blocks by "
            "hash is not modelled across the manager's groups (each group's blocks hit and "
            "are freed apart)"
        )
    if serving.policy not in ("continuous", "chunked_prefill"):
        return f"serving.policy {serving.policy} runs batches to completion (not vLLM V1)"
    if serving.preemption == "swap":
        return "serving.preemption swap is vLLM v0's, which has no hybrid KV cache manager"
    if kv_transfer:
        return (
            "vLLM turns the manager off with a KV connector (--kv-transfer-config), which "
            "moves caches between the prefill and decode pools"
        )
    return ""


def _kv_cache_groups(
    scenario: Scenario, arch: ModelArchitecture, kv_transfer: bool, hashed_prompts: bool
) -> KvCacheGroups | None:
    """The KV cache groups of vLLM V1's hybrid KV cache manager (None: every layer at
    full length in every block). A model with sliding-window layers held at full length
    has its keys priced over the window but fits fewer sequences than vLLM's manager
    would: the run says so, with the factor."""
    if not arch.num_sliding_layers:
        return None
    reason = _hybrid_off_reason(scenario, arch, kv_transfer, hashed_prompts)
    if not reason:
        return kv_cache_groups(arch, scenario.serving.block_size)
    full = arch.num_layers - arch.num_sliding_layers
    more = f"up to {arch.num_layers / full:.3g}x" if full else "many times"
    span = (
        f"{arch.sliding_window}-token chunks"
        if chunked_local_attention(arch)
        else f"a {arch.sliding_window}-token window (priced so)"
    )
    warn(
        f"{arch.name}: {arch.num_sliding_layers} of {arch.num_layers} layers attend to "
        f"{span}, but their KV cache is held at full length: {reason}. vLLM V1's hybrid "
        f"KV cache manager keeps only the window's blocks for those layers, fitting "
        f"{more} as many long-context tokens",
        stacklevel=2,
    )
    return None


def open_loop_requests(scenario: Scenario) -> RequestBatch | None:
    """The open-loop workload, drawn before the replicas are built (None for sessions and
    closed loops): prompts that share blocks by hash decide whether the KV cache runs in
    the hybrid manager's groups."""
    wl = scenario.workload
    if wl.sessions is not None or wl.arrivals.kind == "closed_loop":
        return None
    return generate_requests(wl, scenario.seed, scenario.base_dir)


def shares_blocks_by_hash(batch: RequestBatch | None) -> bool:
    return batch is not None and batch.prompt_hashes is not None


def build_pools(scenario: Scenario, hashed_prompts: bool = False) -> list[tuple[str, ReplicaBuild]]:
    """Each pool's name and replica build, as a run builds them: pools of a disaggregated
    scenario send or receive KV caches (which turns the hybrid KV cache manager off)."""
    pools = scenario.pool_list()
    kv_transfer = any(pool.role != "mixed" for pool in pools)
    return [
        (pool.name, _build_pool(scenario, index, kv_transfer, hashed_prompts))
        for index, pool in enumerate(pools)
    ]


@dataclass(frozen=True)
class BuiltScenario:
    """A scenario with its replicas built, and the warnings building them raised. A caller
    that builds a scenario to learn whether it starts (replay: the max_model_len its run
    must have set; compare: every run before any runs) hands it to simulate(), which runs
    these replicas instead of building them again and raises, and records, those
    warnings as its own build would."""

    scenario: Scenario
    pools: list[tuple[str, ReplicaBuild]]
    raised: tuple[warnings.WarningMessage, ...]  # the warnings building them raised


def build_scenario(scenario: Scenario) -> BuiltScenario:
    """The replicas simulate() builds for `scenario`, with the warnings kept for the run.
    The workload is drawn only where its prompts' hashes can change the build (prefix
    caching on); a build that fails passes on what it raised until then, as simulate
    does."""
    caught: list[warnings.WarningMessage] = []
    try:
        with recording() as caught:
            caching = scenario.serving.prefix_caching
            pools = build_pools(
                scenario, caching and shares_blocks_by_hash(open_loop_requests(scenario))
            )
    except Exception:
        pass_on(caught)
        raise
    return BuiltScenario(scenario, pools, tuple(caught))


def _build_pool(
    scenario: Scenario, index: int, kv_transfer: bool, hashed_prompts: bool
) -> ReplicaBuild:
    """One pool's replica build; a refusal or a pp warning in a scenario's own `pools:`
    names that pool's tp and pp, which it sets there instead of in `parallelism`."""
    pool = scenario.pool_list()[index]
    if not scenario.pools:
        return build_replica(scenario.for_pool(pool), kv_transfer, hashed_prompts)
    pp_field = f"pools.{index}.pp"
    names = SettingNames(tp=f"pools.{index}.tp", pp=pp_field)
    section = f"pools.{index} ({pool.name})"
    try:
        build = build_replica(scenario.for_pool(pool), kv_transfer, hashed_prompts, section)
    except (MaxModelLenRefused, DoesNotFit) as exc:
        raise exc.named(names) from None
    return replace(build, pp_field=pp_field)


def resolve_weight_dtype(asked: str | None, arch: ModelArchitecture) -> str:
    """model.weight_dtype, or the checkpoint's format when unset (vLLM serves a checkpoint
    as stored: gpt-oss's MXFP4 experts, not 234 GB of bf16); a format other than the
    checkpoint's is priced as asked, and said."""
    stored = arch.checkpoint_dtype
    if asked is None:
        return stored or "bf16"
    if stored is not None and asked != stored:
        warn(
            f"model.weight_dtype {asked}: {arch.name}'s checkpoint is stored in {stored}; "
            f"priced as {asked} (a re-quantised or upcast copy)",
            stacklevel=2,
        )
    return asked


def _warn_links_fitted_elsewhere(gpu: AcceleratorSpec, node: NodeSpec, profile: str | None) -> None:
    """A profile's collective fits belong to the link they were fitted over (an L40S's
    PCIe tree): over another node's link the datasheet link model prices collectives,
    and the run says so."""
    link = node.intra_node_link
    elsewhere = [] if link is None else gpu.efficiency.links_fitted_elsewhere(link)
    if elsewhere and profile is not None:
        groups = ", ".join(map(str, elsewhere))
        warn(
            f"calibration {profile}: its collective fits ({groups} GPUs) were made over "
            f"another link than node {node.name}'s; collectives over it are priced with the "
            "datasheet link model",
            stacklevel=2,
        )


def _warn_outside_fitted_sizes(
    calibration: CalibrationChoice, arch: ModelArchitecture, tp: int, max_tokens: int
) -> None:
    """A profile fitted on a narrow range of GEMM sizes extrapolates outside it (its
    metadata.size_ranges): the run says so when its GEMMs reach far beyond."""
    if calibration.profile is None:
        return
    shapes = [(n, k) for _name, _m, n, k, _layers in arch.gemms(1, tp)]
    why = gemms_outside_fitted_sizes(profile_metadata(calibration.profile), shapes, max_tokens)
    if why is not None:
        warn(f"calibration {calibration.profile}: {why}", stacklevel=2)


def _load_arch(scenario: Scenario) -> ModelArchitecture:
    """The catalog model, or the file or folder next to the scenario, model.name names
    (never one in the working folder: Scenario.reads_file)."""
    name = scenario.model.name
    load = load_model if scenario.reads_file("model.name", name) else scenario.catalog_model
    return _named_field("model.name", load, _scenario_file(scenario, "model.name", name))


def batch_limits_of(scenario: Scenario) -> dict[str, int | None]:
    """max_num_seqs and max_num_batched_tokens a replica of `scenario` runs with (set, or
    vLLM's defaults for its GPU), resolved as build_replica does without building it: for
    tables that set GPUs with different defaults side by side (plan), feasible or not;
    None for one the policy ignores (static and dynamic batches have no token budget)."""
    max_model_len = scenario.serving.max_model_len or _load_arch(scenario).max_position_embeddings
    serving, _ = scenario.serving.with_vllm_defaults(resolve_gpu(scenario), max_model_len)
    return {
        name: None if ignores(serving.policy, name) else getattr(serving, name)
        for name in BATCH_LIMITS
    }


def _at_vllm_block_size(
    scenario: Scenario, arch: ModelArchitecture, gpu: AcceleratorSpec
) -> tuple[Scenario, tuple[str, ...]]:
    """The scenario at the KV block size vLLM forces for an MLA model's attention backend
    on this GPU (caveats.mla_block_size), and the header's line for it where
    serving.block_size is the default 16 (vLLM's too; a variant's copy of the scenario
    sets every field, so the value, not whether it was written, tells); another block
    size the scenario chose is replaced as vLLM replaces it, and the run warns."""
    serving = scenario.serving
    forced = mla_block_size(arch, gpu, serving.block_size)
    if forced is None:
        return scenario, ()
    notes: tuple[str, ...] = ()
    if serving.block_size != ServingSection.model_fields["block_size"].default:
        warn(
            f"serving.block_size={serving.block_size}: {forced.reason} (CudaPlatformBase."
            f"check_and_update_config), so the run uses {forced.size}",
            stacklevel=3,
        )
    else:
        notes = (forced.default_line,)
    serving = serving.model_copy(update={"block_size": forced.size})
    return scenario.model_copy(update={"serving": serving}), notes


def build_replica(
    scenario: Scenario,
    kv_transfer: bool = False,
    hashed_prompts: bool = False,
    section: str = "parallelism",
) -> ReplicaBuild:
    """Model, hardware, memory plan and step costs: fails early, with the breakdown, when
    the configuration cannot run. `kv_transfer`: the replica's pool sends or receives
    KV caches (disaggregated prefill and decode); `hashed_prompts`: the workload's
    prompts name their blocks by hash (a trace's hash_ids); `section`: where the
    scenario sets the replicas' layout (a scenario's own pools: `pools.<i> (<name>)`)."""
    calibration = resolve_calibration(scenario)
    gpu = calibration.gpu
    node = resolve_node(scenario, gpu)
    _warn_links_fitted_elsewhere(gpu, node, calibration.profile)
    arch = _load_arch(scenario)
    scenario, forced = _at_vllm_block_size(scenario, arch, gpu)
    par, engine = scenario.parallelism, scenario.engine
    max_model_len = scenario.serving.max_model_len or arch.max_position_embeddings
    serving, defaults = scenario.serving.with_vllm_defaults(gpu, max_model_len)
    defaults = (*forced, *defaults)
    gpus = replica_gpus(par.tp, par.pp)  # of one dp rank; the replica has dp of them
    check_placement(scenario, arch, node)
    routing = scenario.model.moe_routing
    if not arch.is_moe and routing != ModelSection.model_fields["moe_routing"].default:
        # infersim's own setting, with no meaning for a dense model: refused, not ignored.
        raise InfersimError(
            f"model.moe_routing: {routing} routing, but {arch.name} has no experts (dense model)"
        )
    expert_parallel = par.enable_expert_parallel and arch.is_moe
    if par.enable_expert_parallel and not arch.is_moe:
        warn(
            f"parallelism.enable_expert_parallel: {arch.name} has no experts (dense model); "
            "vLLM ignores it (its expert-parallel layout, FusedMoEParallelConfig, applies to "
            "fused-MoE layers only), and so does this run",
            stacklevel=2,
        )
    check_serving_starts(
        arch, serving, max_model_len, budget_default=scenario.serving.max_num_batched_tokens is None
    )
    weight_dtype = resolve_weight_dtype(scenario.model.weight_dtype, arch)
    memory = plan_memory(
        arch,
        gpu,
        weight_dtype=weight_dtype,
        kv_dtype=scenario.model.kv_dtype,
        tp=par.tp,
        pp=par.pp,
        gpu_memory_utilization=serving.gpu_memory_utilization,
        max_num_batched_tokens=serving.max_num_batched_tokens,
        max_num_seqs=serving.max_num_seqs,
        activation_dtype=scenario.model.activation_dtype,
        framework_overhead_gb=engine.framework_overhead_gb,
        expert_parallel=expert_parallel,
        dp=par.dp,
        kv_groups=_kv_cache_groups(scenario, arch, kv_transfer, hashed_prompts),
        max_model_len=max_model_len,
        block_size=serving.block_size,
        gpus_per_node=node.gpus_per_node,
        nodes=par.nodes,
    )
    if engine.framework_overhead_gb is not None:
        modelled = framework_overhead_bytes(gpu, par.tp, gpus_per_node=node.gpus_per_node)
        warn(
            overhead_override_warning(engine.framework_overhead_gb, modelled),
            stacklevel=2,
        )
    block_bytes = serving.block_size * memory.kv_bytes_per_token
    derived = int(memory.kv_capacity_bytes // block_bytes)
    spare = memory.capacity - memory.usable  # what gpu_memory_utilization held back
    check_num_gpu_blocks(
        serving.num_gpu_blocks, int((memory.kv_capacity_bytes + spare) // block_bytes), derived
    )
    blocks = serving.num_gpu_blocks or derived
    if swap_warning := check_swap_space(serving.swap_space_gb, par.tp, node):
        warn(swap_warning, stacklevel=2)
    for ignored in ignored_settings(scenario.serving):
        warn(ignored, stacklevel=2)
    if blocks < 1:
        rows = "; ".join(f"{item} {gb:.2f} GB" for item, gb in memory.breakdown())
        raise InfeasibleError(
            f"the KV cache is smaller than one block of {serving.block_size} tokens (KV "
            f"capacity {memory.kv_capacity_tokens} tokens at {memory.kv_bytes_per_token:.0f} "
            f"B/token): {rows}"
        )
    memory.check_starts()
    pcie = gpu.pcie.unidirectional_gbps * 1e9
    config = ReplicaConfig(
        policy=serving.policy,
        max_num_seqs=serving.max_num_seqs,
        max_num_batched_tokens=serving.max_num_batched_tokens,
        block_size=serving.block_size,
        total_blocks=blocks,
        max_model_len=max_model_len,
        watermark=serving.kv_watermark,
        preemption=serving.preemption,
        swap_blocks=int(serving.swap_space_gb * GIB // block_bytes),
        swap_seconds_per_block=block_bytes / pcie,
        max_queue_delay_s=serving.max_queue_delay_ms / 1000,
        max_waiting=serving.max_waiting,
        sliding_window=arch.sliding_window if arch.num_sliding_layers else None,
        kv_groups=memory.kv_groups,
        scheduling=serving.scheduling_policy,
        reserve_full_sequence=serving.reserve_full_sequence,
        multi_step=engine.multi_step,
        prefix_caching=serving.prefix_caching,
        step_table=scenario.output.step_table,
    )
    cost = StepCostModel(
        arch,
        gpu,
        node,
        weight_dtype=weight_dtype,
        kv_dtype=scenario.model.kv_dtype,
        activation_dtype=scenario.model.activation_dtype,
        tp=par.tp,
        pp=par.pp,
        overheads=EngineOverheads(
            step_us=engine.host_overhead_step_us,
            per_seq_us=engine.host_overhead_per_seq_us,
            cuda_graphs=engine.cuda_graphs,
            async_scheduling=engine.async_scheduling,
            fused_kernels=engine.fused_kernels,
        ),
        expert_parallel=expert_parallel,
        moe_routing=scenario.model.moe_routing,
        dp=par.dp,
        all2all_backend=par.all2all_backend,
        custom_all_reduce=not par.disable_custom_all_reduce,
        symm_mem_all_reduce=par.allreduce_use_symm_mem,
        mxfp4_use_marlin=scenario.model.mxfp4_use_marlin,
    )
    _warn_outside_fitted_sizes(calibration, arch, par.tp, serving.max_num_batched_tokens)
    _warn_straddling(cost, par.replicas, par.dp, section)
    info = ReplicaInfo(
        gpu=gpu.name,
        gpus=gpus,
        peak_flops=cost.peak_flops,
        peak_bandwidth=cost.peak_bandwidth,
        kv_total_blocks=blocks,
        power=power_model(gpu),
        usd_per_gpu_hour=scenario.cost.price_of(gpu),
        token_budget=config.max_num_batched_tokens if config.iterative else math.inf,
        max_num_seqs=config.max_num_seqs,
        calibration=named_from(scenario.base_dir, calibration.note),  # as the scenario names it
        all_reduce=cost.all_reduce_note(),
        moe_kernel=cost.moe_kernel_note(),
    )
    return ReplicaBuild(arch, gpu, node, memory, config, cost, info, par.replicas, par.dp, defaults)


@dataclass
class _LiveSession:
    """A session that may still send turns."""

    session: Session
    turn: int = 0  # index of the next turn to send (0-based)
    in_flight: bool = False  # a turn is queued or running; otherwise the user thinks


@dataclass
class _SessionState:
    """The multi-turn traffic of a run: which sessions are live, which turns are due."""

    live: dict[int, _LiveSession] = field(default_factory=dict)
    due: dict[int, float] = field(default_factory=dict)  # session -> its next turn's time
    heap: list[tuple[float, int]] = field(default_factory=list)  # (time, session), lazily
    next_start: float = float("inf")
    starts_done: bool = False  # no session starts any more (all started, or count reached)


def _kv_link(build: ReplicaBuild) -> LinkSpec:
    """The link a disaggregated replica's GPUs send or receive KV caches over."""
    link = build.node.inter_node_link or build.node.intra_node_link
    if link is None:
        raise InfeasibleError(
            f"disaggregated serving moves KV caches between replicas, but node "
            f"{build.node.name} has no link to send them over"
        )
    return link


def _kv_tokens_per_s(build: ReplicaBuild) -> float:
    """How many tokens' KV cache a replica's link moves a second: each GPU moves its own
    shard over its own link, and a replica of dp ranks has dp times the GPUs."""
    return _kv_link(build).bytes_per_second / build.memory.kv_bytes_per_token * build.dp


def _split(total: int, parts: int) -> list[int]:
    """`total` in `parts` as even as integers go, the larger first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


class _Run:
    """The live state of one simulation: environment, replicas, request accounting."""

    def __init__(
        self,
        scenario: Scenario,
        progress: bool,
        built: BuiltScenario | None = None,
        share: Share | None = None,
    ) -> None:
        """`share`: the part of the run this process simulates, its replicas and their
        requests, the others' left to other processes (simulator/sharding.py); None: all."""
        self.scenario = scenario
        self.shard = None if share is None else frozenset(share.replicas)
        wl = scenario.workload
        base_dir = scenario.base_dir
        self.closed = wl.arrivals.kind == "closed_loop"
        batch = open_loop_requests(scenario) if share is None else share.batch
        self.builds = self._pools(built, batch)
        self.configuration_warnings = _configuration_warnings(self.builds)
        for text in self.configuration_warnings:  # before the run, which they may stop
            warn(text, stacklevel=3)
        self.env = simpy.Environment()
        self.horizon = wl.duration_s if wl.duration_s is not None else float("inf")
        self.clock = Clock(self.horizon)
        self.session_sampler: SessionSampler | None = None
        self.prompt_hashes: PromptHashes | None = None
        if wl.sessions is not None:
            context = min(build.config.max_model_len for _, build in self.builds)
            self.session_sampler = SessionSampler(wl, scenario.seed, base_dir, context)
            self.expected = wl.num_requests if len(self.session_sampler.starts) else 0
            self.class_names = list(self.session_sampler.class_names)
            self.requests = RequestTable(min(wl.num_requests or 4096, 1 << 20))
        elif self.closed:
            self.sampler = ClosedLoopSampler(wl, scenario.seed, base_dir)
            self.expected = wl.num_requests
            self.class_names = list(self.sampler.class_names)
            self.requests = RequestTable(min(wl.num_requests or 4096, 1 << 20))
        else:
            assert batch is not None
            self.prompt_hashes = batch.prompt_hashes
            self.expected = len(batch)
            self.class_names = list(batch.class_names)
            self.client_arrival = self.engine_arrival = batch.arrival_s
            self.submission_order = np.arange(len(batch))
            if scenario.frontend.modelled:  # the engine sees a request once taken in
                replicas = sum(pool.replicas for pool in scenario.pool_list())
                self.engine_arrival = ingested(
                    scenario.frontend, batch.arrival_s, batch.prompt_tokens, replicas
                )  # each process's own FIFO: a later request may overtake on another
                self.submission_order = np.argsort(self.engine_arrival, kind="stable")
            if share is not None:  # its own requests alone, ids in the run's order
                self.owned = share.owned
                self._timeline = (share.arrival, share.routes, self.submission_order)
                self.requests = RequestTable.of_inputs(share.inputs())  # the share's arrays
            else:
                self.requests = RequestTable(len(batch))
                self.requests.add(
                    self.engine_arrival,
                    batch.prompt_tokens,
                    batch.output_tokens,
                    batch.priority,
                    batch.priority_class,
                )
        self.terminal = 0
        self.done = self.env.event()
        self.progress = Progress(self.expected, enabled=progress, label=scenario.name)
        self.replicas: list[Replica] = []  # every engine, a dp rank each
        self.units: list[Replica | DpGroup] = []  # what routers and faults address
        self.infos: list[ReplicaInfo] = []
        roles = {pool.name: pool.role for pool in scenario.pool_list()}
        # A replica may run ahead of SimPy's clock only when it can foresee its inputs:
        # not in a disaggregated pool (handoffs come whenever prefills end, and a prefill
        # replica's blocks go free whenever their transfer ends), and not in a closed
        # loop or sessions over several replicas (another's completion sends a request
        # at any time).
        feedback = self.closed or self.session_sampler is not None
        blind = feedback and sum(b.replicas * b.dp for _, b in self.builds) > 1
        self.kv_links = KvLinks(self.env)
        self.kv_link_in: dict[Replica | DpGroup | PipelineGroup, int] = {}  # decode units'
        retried = scenario.faults is not None and scenario.faults.on_failure == "retry"
        for pool, build in self.builds:
            role = roles[pool]
            config = replace(
                build.config,
                role=role,
                multi_step=build.config.multi_step and not blind and role == "mixed",
                retried=retried,
            )
            keys = self._prefix_keys(config)
            size = replica_gpus(build.cost.tp, build.cost.pp, build.dp)
            for index in range(build.replicas):
                link = self.kv_links.add(_kv_tokens_per_s(build)) if role != "mixed" else -1
                unit_index = len(self.units)  # of the replica built next
                handoff = self._handoff_from(build, link, unit_index) if role == "prefill" else None
                info = replace(build.info, pool=pool)
                # Replicas packed in order over the pool's nodes (replica_placements).
                unit = self._replica(build, config, info, handoff, keys, index * size)
                self.units.append(unit)
                if role == "decode":
                    self.kv_link_in[unit] = link
        entry = [r for r in self.units if r.cfg.role in ("mixed", "prefill")]
        router = scenario.parallelism.router
        self.router = make_router(router, entry, scenario.seed, self.requests)
        decoders = [r for r in self.units if r.cfg.role == "decode"]
        self.decode_router = (
            make_router(router, decoders, scenario.seed + 1, self.requests) if decoders else None
        )

    def shares(self, shards: list[tuple[int, ...]]) -> list[Share]:
        """Each shard's part of the run, from this process's request table: the requests
        routed to its replicas, and the whole run's arrival timeline and routing, which
        every shard replays (the same arrays in each)."""
        from simulator.sharding import Share  # it imports this module

        req, n = self.requests, self.requests.size
        kind, seed = self.scenario.parallelism.router, self.scenario.seed
        routes = foreseen_routes(kind, len(self.router.replicas), seed, n)
        arrival = req.arrival[:n]  # in submission order: no API server reorders them here
        batch = RequestBatch(arrival, req.prompt[:n], req.output[:n], req.priority[:n],
                             req.priority_class[:n], tuple(self.class_names),
                             self.prompt_hashes)  # fmt: skip
        owned = [np.flatnonzero(np.isin(routes, shard)) for shard in shards]
        return [
            Share(shard, own, batch.take(own), arrival, routes)
            for shard, own in zip(shards, owned, strict=True)
        ]

    def _pools(
        self, built: BuiltScenario | None, batch: RequestBatch | None
    ) -> list[tuple[str, ReplicaBuild]]:
        """The replicas `built` holds, raising the warnings building them raised, or the
        replicas built now for the workload `batch`."""
        if built is None:
            return build_pools(self.scenario, shares_blocks_by_hash(batch))
        pass_on(list(built.raised))
        return built.pools

    def _replica(
        self,
        build: ReplicaBuild,
        config: ReplicaConfig,
        info: ReplicaInfo,
        handoff: Callable[[int], None] | None,
        keys: BlockKeys | None,
        first_gpu: int = 0,
    ) -> Replica | DpGroup | PipelineGroup:
        """One replica, from cluster GPU `first_gpu` on: an engine, dp ranks
        (engine_group.py, each rank's tp x pp GPUs after the last's), or pp pipelined
        engines (on the same GPUs)."""
        pp = build.cost.pp
        pipelined = build.pipelined_engines > 0
        if pp > 1 and not config.iterative:
            warn(
                f"{build.pp_field}={pp}: serving.policy {config.policy!r} runs whole "
                "batches, one at a time, so the stages run one after another (no pipelining; "
                "use continuous or chunked_prefill to pipeline)",
                stacklevel=2,
            )
        engines = build.dp if build.dp > 1 else build.pipelined_engines or 1
        driven = pipelined or (build.dp > 1 and build.arch.is_moe)
        configs = [config] * engines
        shared_kv = None
        if pipelined:  # one KV cache; max_num_seqs over all batches in flight
            configs = [replace(config, max_num_seqs=seqs, swap_blocks=config.swap_blocks // engines)
                       for seqs in _split(config.max_num_seqs, engines)]  # fmt: skip
            shared_kv = SharedKv(functools.partial(empty_kv_cache, config, keys))
            warn(  # per replica; simulate() passes each distinct one on once
                f"{build.pp_field}={pp}: serving.max_num_seqs={config.max_num_seqs} is split "
                f"as {_split(config.max_num_seqs, engines)} over the {engines} batches in "
                "flight, and a request stays in its batch; vLLM V1 caps only their total, "
                "so its batches may be less even than these",
                stacklevel=2,
            )
        index = len(self.replicas)
        members = []
        for rank, engine_config in enumerate(configs):
            rank_gpu = first_gpu + (0 if pipelined else rank * build.cost.tp * pp)
            members.append(
                Replica(self.env, index if pipelined else index + rank, engine_config,
                        build.cost.placed(rank_gpu, first_gpu), self.requests, self.clock,
                        self._on_finish, handoff, keys, driven=driven, kv_source=shared_kv)
            )  # fmt: skip
            if rank == 0 or not pipelined:  # a pipelined replica's engines share one log
                self.replicas.append(members[-1])
                self.infos.append(replace(info, dp_rank=rank) if build.dp > 1 else info)
        if pipelined:
            assert shared_kv is not None
            layers = [len(stage) for stage in stage_layers(build.arch, pp)]
            return PipelineGroup(self.env, members, layers, shared_kv)
        if build.dp > 1:
            return DpGroup(self.env, members, lockstep=driven)
        return members[0]

    def _prefix_keys(self, config: ReplicaConfig) -> BlockKeys | None:
        """Block identities of the trace's prompts, for a prefix cache shared by hash."""
        if self.prompt_hashes is None:
            return None
        if not config.prefix_caching:
            warn(
                "the trace's hash_ids are not used: serving.enable_prefix_caching is off, so "
                "no prompt reuses another's cached blocks",
                stacklevel=2,
            )
            return None
        assert config.kv_groups is None  # build_replica turned the hybrid manager off
        return BlockKeys(self.prompt_hashes, config.block_size)

    def _on_finish(self, rid: int) -> None:
        self.terminal += 1
        self.progress.update(self.terminal)
        if self.closed:
            self._schedule_user(float(self.sampler.think_time(1)[0]))
        if self.session_sampler is not None:
            finished = self._turn_done(rid)
        else:
            finished = self.expected is not None and self.terminal >= self.expected
        if finished and not self.done.triggered:
            self.done.succeed()

    # ---- arrivals ----------------------------------------------------------------------
    def _open_loop(self):
        """Requests in the order the engine sees them (`submission_order`: by arrival, or
        by when an API server process took each in)."""
        env, clock, order = self.env, self.clock, self.submission_order
        arrival = self.requests.arrival[order]
        n = self.requests.size
        for k in range(n):
            t = arrival.item(k)
            clock.next_arrival = t
            if t > env.now:
                yield env.timeout(t - env.now)
            clock.next_arrival = arrival.item(k + 1) if k + 1 < n else float("inf")
            clock.arrivals_done = k + 1 == n
            self._route(order.item(k))
        self._nudge_all()

    def _nudge_all(self) -> None:
        """No arrival is in sight: replicas holding partial batches may start them."""
        for unit in self.units:
            unit.nudge()

    def _routing_is_foreseeable(self) -> bool:
        """Round robin and random routing do not look at replica state, so every
        request's replica is known before the run: each replica then knows its own next
        arrival and runs ahead of SimPy's clock between them, not between the cluster's
        (the difference between a 64-replica run being event-per-step or not)."""
        return (
            self.scenario.parallelism.router in ("round_robin", "random")
            and self.session_sampler is None  # later turns arrive after completions
            and self.scenario.faults is None
            and len(self.router.replicas) > 1
        )

    def shardable(self) -> bool:
        """The replicas are independent simulations: every request's replica is known
        before the run (_routing_is_foreseeable) and no replica's output is another's
        input (no closed loop, decode pool, modelled API server or dp/pp group), so each
        may run in a process of its own (simulator/sharding.py)."""
        return (
            not self.closed
            and self.session_sampler is None
            and not self.scenario.frontend.modelled
            and self.decode_router is None
            and all(type(unit) is Replica for unit in self.units)
            and self._routing_is_foreseeable()
        )

    def _timeline_of_arrivals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The run's requests in submission order, each one's arrival and replica (an
        index into the router's replicas), and the table ids of this process's own
        requests (a shard's table holds those alone, in that order)."""
        if self.shard is not None:
            return self._timeline
        order, kind = self.submission_order, self.scenario.parallelism.router
        routes = foreseen_routes(kind, len(self.router.replicas), self.scenario.seed, len(order))
        return self.requests.arrival[order], routes, order

    def _open_loop_prerouted(self, arrival: np.ndarray, targets: np.ndarray, ids: np.ndarray):
        """Arrivals to replicas chosen before the run. A shard keeps the whole arrival
        timeline (the same timeouts, scheduled at the same times, so SimPy orders its
        replicas' events as the one-process run does) and submits only its own."""
        env, n = self.env, len(arrival)
        entry: list[Replica | None] = list(self.router.replicas)
        for i, replica in enumerate(self.router.replicas):
            replica.clock = Clock(self.horizon)
            if self.shard is not None and i not in self.shard:
                entry[i] = None  # another process's: no request comes to it here
                replica.clock.next_arrival, replica.clock.arrivals_done = math.inf, True
        own = [i for i, replica in enumerate(entry) if replica is not None]
        if len(own) < len(entry):
            mask = np.isin(targets, own)
            own_targets, own_arrival = targets[mask], arrival[mask]
        else:
            own_targets, own_arrival = targets, arrival
        next_own = np.full(len(ids), np.inf)  # the next arrival at the same replica
        for i in own:
            mine = np.flatnonzero(own_targets == i)
            next_own[mine[:-1]] = own_arrival[mine[1:]]
            clock = self.router.replicas[i].clock
            clock.next_arrival = own_arrival.item(mine[0]) if len(mine) else math.inf
            clock.arrivals_done = not len(mine)
        j = 0  # own requests submitted so far
        for k in range(n):
            t = arrival.item(k)  # .item(): Python numbers, with no numpy scalar made
            if t > env.now:
                yield env.timeout(t - env.now)
            replica = entry[targets.item(k)]
            if replica is None:
                continue
            after = next_own.item(j)
            replica.clock.next_arrival = after
            replica.clock.arrivals_done = after == math.inf
            replica.submit(ids.item(j))
            j += 1

    def _start_closed_loop(self) -> None:
        self.issued = 0
        self.pending: dict[int, float] = {}
        for _ in range(self.sampler.users):
            self._schedule_user(0.0)

    def _schedule_user(self, delay: float) -> None:
        wl = self.scenario.workload
        if wl.num_requests is not None and self.issued >= wl.num_requests:
            self.clock.arrivals_done = True
            return
        at = self.env.now + delay
        if at >= self.horizon:
            return
        self.issued += 1
        prompt, output = self.sampler.lengths(1)
        priority, cls = self.sampler.classes(1)
        rid = int(self.requests.add(np.array([at]), prompt, output, priority, cls)[0])
        self.pending[rid] = at
        self.clock.next_arrival = min(self.pending.values())
        self.env.process(self._arrive(rid, delay))

    def _arrive(self, rid: int, delay: float):
        if delay > 0:
            yield self.env.timeout(delay)
        del self.pending[rid]
        self.clock.next_arrival = min(self.pending.values(), default=float("inf"))
        self._route(rid)
        if not self.pending:
            self._nudge_all()

    # ---- multi-turn sessions ------------------------------------------------------------
    def _session_starts(self):
        """Start sessions at their drawn times; each sends its first turn at once."""
        sampler, state, env = self.session_sampler, self.sessions, self.env
        assert sampler is not None
        starts = sampler.starts.tolist()
        for index, t in enumerate(starts):
            state.next_start = t
            self._update_session_clock()
            if t > env.now:
                yield env.timeout(t - env.now)
            if state.starts_done:  # num_requests was reached by earlier turns
                break
            state.next_start = starts[index + 1] if index + 1 < len(starts) else float("inf")
            state.live[index] = _LiveSession(sampler.session(index))
            self._send_turn(index)
        state.starts_done = True
        state.next_start = float("inf")
        self._update_session_clock()
        if self._sessions_over() and not self.done.triggered:
            self.done.succeed()

    def _send_turn(self, session: int) -> None:
        """The session's next turn arrives now: register it and route it."""
        state, wl = self.sessions, self.scenario.workload
        live = state.live[session]
        s, k = live.session, live.turn
        rid = int(
            self.requests.add(
                np.array([self.env.now]), s.prompt[k : k + 1], s.output[k : k + 1],
                np.array([s.priority]), s.priority_class, session, k + 1,
            )[0]
        )  # fmt: skip
        self.issued += 1
        live.in_flight = True
        if wl.num_requests is not None and self.issued >= wl.num_requests:
            self._stop_sessions()
        self._update_session_clock()
        self._route(rid)
        if not state.due and state.next_start == float("inf"):
            self._nudge_all()  # no arrival in sight: partial batches may start

    def _stop_sessions(self) -> None:
        """num_requests turns were sent: no session starts or sends a turn any more."""
        state = self.sessions
        state.starts_done = True
        state.next_start = float("inf")
        for session in [s for s, live in state.live.items() if not live.in_flight]:
            self._end_session(session)
        state.due.clear()
        state.heap.clear()
        self.clock.arrivals_done = True

    def _turn_done(self, rid: int) -> bool:
        """A turn reached its outcome: schedule the session's next turn a think time
        after a completion, or end the session (last turn, the turn was rejected or
        failed, no more turns may be sent, or the next would come after the horizon).
        Returns whether the whole run is over."""
        state = self.sessions
        session = int(self.requests.session[rid])
        live = state.live[session]
        live.in_flight = False
        live.turn += 1
        s = live.session
        completed = self.requests.outcome[rid] == Outcome.COMPLETED
        if completed and live.turn < s.turns and not self.clock.arrivals_done:
            at = self.env.now + float(s.think_s[live.turn - 1])
            if at < self.horizon:
                state.due[session] = at
                heapq.heappush(state.heap, (at, session))
                self._update_session_clock()
                self.env.process(self._next_turn(session, at - self.env.now))
                return False
        self._end_session(session)
        return self._sessions_over()

    def _next_turn(self, session: int, delay: float):
        yield self.env.timeout(delay)
        if self.sessions.due.pop(session, None) is not None:  # else stopped meanwhile
            self._send_turn(session)

    def _end_session(self, session: int) -> None:
        del self.sessions.live[session]
        for router in (self.router, self.decode_router):
            if isinstance(router, SessionAffinity):
                router.end(session)

    def _update_session_clock(self) -> None:
        """The next arrival any replica may see: a session start or a due turn."""
        state = self.sessions
        heap = state.heap
        while heap and state.due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # sent or cancelled
        due = heap[0][0] if heap else float("inf")
        self.clock.next_arrival = min(state.next_start, due)

    def _sessions_over(self) -> bool:
        state = self.sessions
        return state.starts_done and not state.live and self.terminal >= self.issued

    # ---- disaggregated serving -------------------------------------------------------
    def _handoff_from(
        self, build: ReplicaBuild, link: int, unit_index: int
    ) -> Callable[[int, Callable[[], None]], None]:
        """The hand-off of prefill replica `self.units[unit_index]`, whose link is `link`
        (kv_links.py): the decode replica is chosen
        now, as vLLM's P/D proxy sends the request on when the prefill answers
        (benchmarks/disagg_benchmarks/disagg_prefill_proxy_server.py); the prompt's KV
        cache then crosses the sender's and the receiver's links, shared with their other
        transfers (kv_links.py), the sender's blocks going free once it has."""
        latency = _kv_link(build).latency_us * 1e-6

        def handoff(rid: int, release: Callable[[], None]) -> None:
            source = self.units[unit_index]
            target = self._healthy(rid, self.decode_router)
            if target is None:
                release()
                source.nudge()
                return
            tokens = int(self.requests.prompt[rid])
            target.incoming += 1
            sent = self.kv_links.send(tokens, link, self.kv_link_in[target], latency)
            sent.callbacks.append(lambda _: self._deliver(rid, tokens, source, target, release))

        return handoff

    def _deliver(
        self,
        rid: int,
        tokens: int,
        source: Replica | DpGroup | PipelineGroup,
        target: Replica | DpGroup | PipelineGroup,
        release: Callable[[], None],
    ) -> None:
        """The KV cache has crossed: the prefill replica frees its blocks (and may admit
        what waited for them), the decode replica takes the request."""
        release()
        source.nudge()
        target.incoming -= 1
        if target.down:  # failed meanwhile: another decode replica takes it
            self._route(rid, self.decode_router, kv_tokens=tokens)
        else:
            target.submit(rid, tokens)

    def _healthy(self, rid: int, router) -> Replica | DpGroup | PipelineGroup | None:
        """A healthy replica chosen by the router, or None (the request has then failed)."""
        replica = router.route(rid)
        if replica.down:
            healthy = [r for r in router.replicas if not r.down]
            if not healthy:
                self.requests.fail(rid, RejectReason.NO_HEALTHY_REPLICA, self.env.now)
                self._on_finish(rid)
                return None
            # State-blind routers (round robin, random) may land on a dead replica.
            replica = min(healthy, key=lambda r: r.outstanding)
        return replica

    def _route(self, rid: int, router=None, kv_tokens: int = 0) -> None:
        """Send a request to a healthy replica chosen by the router (or fail it)."""
        replica = self._healthy(rid, router or self.router)
        if replica is not None:
            replica.submit(rid, kv_tokens)

    # ---- faults --------------------------------------------------------------------------
    def _start_faults(self) -> None:
        faults = self.scenario.faults
        if faults is None:
            return
        events = sorted(
            [(e.at_s, "fail", e.replica) for e in faults.events]
            + [(e.recover_at_s, "recover", e.replica) for e in faults.events if e.recover_at_s]
        )
        self.clock.next_fault = min(t for t, kind, _ in events if kind == "fail")
        self.env.process(self._fault_process(events))

    def _fault_process(self, events):
        faults = self.scenario.faults
        failures = sorted(t for t, kind, _ in events if kind == "fail")
        for at, kind, index in events:
            if at > self.env.now:
                yield self.env.timeout(at - self.env.now)
            replica = self.units[index]
            if kind == "recover":
                replica.recover()
                continue
            failures.remove(at)
            self.clock.next_fault = failures[0] if failures else float("inf")
            if replica.down:
                continue
            for rid in replica.fail():
                if faults.on_failure == "retry" and self.requests.retries[rid] < faults.max_retries:
                    self.requests.restart(rid)
                    self._route(rid)
                    continue
                reason = (
                    RejectReason.REPLICA_FAILED
                    if faults.on_failure == "fail"
                    else RejectReason.TOO_MANY_RETRIES
                )
                self.requests.fail(rid, reason, self.env.now)
                self._on_finish(rid)

    def _warn_unfired_faults(self) -> None:
        """A failure timed after the run's last event never happens: say so, rather than
        report a fault-free run as the fault's outcome."""
        faults = self.scenario.faults
        for i, event in enumerate(faults.events if faults else ()):
            if event.at_s > self.env.now:
                warn(
                    f"faults.events[{i}]: at_s={event.at_s:g} s is after the run's end "
                    f"({self.env.now:.1f} s), so replica {event.replica} never failed; "
                    "fail it earlier or run longer (workload.duration_s / num_requests)",
                    stacklevel=2,
                )

    # ---- run ---------------------------------------------------------------------------
    def run(self) -> float:
        """Simulate to the stop condition; the time the run stopped at."""
        end = self.advance()
        self.wrap_up()
        return end

    def advance(self) -> float:
        """The event loop, to the stop condition (all requests ended, or the horizon), and
        the in-flight tokens counted at the end: all a shard's process does."""
        self._start_faults()
        if self.session_sampler is not None:
            self.issued = 0
            self.sessions = _SessionState()
            self.env.process(self._session_starts())
        elif self.closed:
            self._start_closed_loop()
        elif self._routing_is_foreseeable():
            self.env.process(self._open_loop_prerouted(*self._timeline_of_arrivals()))
        else:
            self.env.process(self._open_loop())
        until = self.done
        if np.isfinite(self.horizon):
            until = self.done | self.env.timeout(self.horizon)
        if self.expected == 0:
            return 0.0
        self.env.run(until=until)
        for unit in self.units:
            unit.settle(self.env.now)
        return float(self.env.now)

    def wrap_up(self) -> None:
        """After the loop, over the whole cluster's requests (merged, when shards ran)."""
        self.progress.close()
        self._warn_unfired_faults()
        self._warn_unmodelled_front_end()

    def _warn_unmodelled_front_end(self) -> None:
        """A run that leaves the API server out but streams more than one replica's API
        server processes could (at frontend's costs) says its client figures are optimistic."""
        section = self.scenario.frontend
        if section.modelled:
            return
        instance = instances([info.dp_rank for info in self.infos])
        load, window = unmodelled_load(section, self.requests, instance)
        if load > 1:
            dp = self.scenario.parallelism.dp
            offline = self.scenario.workload.arrivals.kind == "offline"
            text = unmodelled_warning(section, load, window, dp, offline)
            warn(text, stacklevel=3)


def _configuration_warnings(builds: list[tuple[str, ReplicaBuild]]) -> tuple[str, ...]:
    """Each pool's configuration warnings, named by pool when there are several."""
    named = len(builds) > 1
    return tuple(
        f"pool {pool}: {text}" if named else text
        for pool, build in builds
        for text in configuration_warnings(build)
    )


def _as_run(scenario: Scenario, builds: list[tuple[str, ReplicaBuild]]) -> Scenario:
    """The scenario as it ran, so summary.json names it: an unset model.weight_dtype is the
    checkpoint's format the replicas were built with (resolve_weight_dtype); unset batch
    limits are vLLM's defaults for the GPU (one the policy ignores stays unset), an unset
    enable_prefix_caching the policy's engine's default, a block size vLLM forced is
    the forced one, where every pool got the same, and expert parallelism asked of a
    dense model (vLLM ignores it, build_replica) is off."""
    if not builds:
        return scenario
    update = {}
    par = scenario.parallelism
    if par.enable_expert_parallel and not builds[0][1].arch.is_moe:
        update["parallelism"] = par.model_copy(update={"enable_expert_parallel": False})
    if scenario.model.weight_dtype is None:
        used = builds[0][1].memory.weight_dtype
        update["model"] = scenario.model.model_copy(update={"weight_dtype": used})
    chosen = {
        name: {getattr(build.config, name) for _, build in builds}
        for name in BATCH_LIMITS
        if getattr(scenario.serving, name) is None and not ignores(scenario.serving.policy, name)
    }
    if scenario.serving.enable_prefix_caching is None:
        chosen["enable_prefix_caching"] = {build.config.prefix_caching for _, build in builds}
    sizes = {build.config.block_size for _, build in builds}
    if sizes != {scenario.serving.block_size}:  # vLLM forced one (_at_vllm_block_size)
        chosen["block_size"] = sizes
    agreed = {name: values.pop() for name, values in chosen.items() if len(values) == 1}
    if agreed:
        update["serving"] = scenario.serving.model_copy(update=agreed)
    return scenario.model_copy(update=update)


def _serving_defaults(builds: list[tuple[str, ReplicaBuild]]) -> list[str]:
    """What vLLM's defaults chose for each pool's unset serving settings, and why."""
    named = len(builds) > 1
    return [
        f"[{pool}] {line}" if named else line for pool, build in builds for line in build.defaults
    ]


# infersim's own code: simulate passes a warning on at the first line outside it.
_PACKAGE_DIRS = tuple(
    os.path.dirname(path) + os.sep for path in (hardware_models.__file__, __file__)
)


def simulate(
    scenario: Scenario | BuiltScenario | Mapping[str, Any] | str | os.PathLike[str],
    *,
    progress: bool | None = None,
    summary_warnings: bool = True,
    workers: Workers = 1,
) -> Results:
    """Run one scenario (a Scenario, a dict of its fields, the scenario file at a path,
    or a scenario build_scenario built already) to its stop condition and return its
    results, as `run_simulation` does (`workers` as there). Each InfersimWarning is raised once, as
    `scenario NAME: ...` and at the caller's line: a notebook that runs many scenarios
    one by one gets each warning with the run it belongs to (simulate cannot tell one run
    from the fiftieth of a loop, so it always names it)."""
    for argument, value, allowed in (
        ("progress", progress, (bool, type(None))),
        ("summary_warnings", summary_warnings, (bool,)),
    ):
        if not isinstance(value, allowed):
            also = ", False or None" if type(None) in allowed else " or False"
            raise InfersimError(f"simulate: {argument}: expected True{also}, got {shown(value)}")
    name: str | None = None
    caught: list[warnings.WarningMessage] = []
    try:
        with recording() as caught:  # each once, by _pass_on_named
            loaded = _scenario_of(scenario)
            name = (loaded.scenario if isinstance(loaded, BuiltScenario) else loaded).name
            return run_simulation(
                loaded, progress=progress, summary_warnings=summary_warnings, workers=workers
            )
    finally:  # also when the run stops with an error: what it raised until then holds
        _pass_on_named(caught, name)


def _scenario_of(given: Any) -> Scenario | BuiltScenario:
    """What simulate was given, as a Scenario (or the BuiltScenario itself)."""
    if isinstance(given, Scenario | BuiltScenario):
        return given
    if isinstance(given, Mapping):
        return Scenario.from_dict(dict(given))
    if isinstance(given, str | os.PathLike):
        return Scenario.from_yaml(os.fspath(given))
    raise InfersimError(
        "simulate: scenario: expected a Scenario, a dict of its fields or a scenario file's "
        f"path, got {shown(given)}"
    )


def _pass_on_named(caught: list[warnings.WarningMessage], name: str | None) -> None:
    """Each distinct recorded InfersimWarning to the caller's filters once, named by its
    scenario and raised at the first line outside infersim (the caller's cell or script,
    whatever depth of infersim raised it)."""
    frame = sys._getframe(0)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIRS):
        frame = frame.f_back
    for text in (str(recorded.message) for recorded in _distinct(caught).values()):
        warn_at(text if name is None else f"scenario {name}: {text}", frame)


def run_simulation(
    scenario: Scenario | BuiltScenario,
    *,
    progress: bool | None = None,
    summary_warnings: bool = True,
    workers: Workers = 1,
) -> Results:
    """Run one scenario (or a scenario build_scenario built already) to its stop
    condition and return its results. Every warning goes to the caller's filters once,
    unnamed: for callers that name their runs themselves (sweep, plan, the command line);
    analysts call `simulate`. With `summary_warnings` off, those only the finished run's
    figures show (KV cache short, batch capped, rejections) stay in its summary alone:
    for callers that run loads past capacity by design and judge them from the summary
    (the planner's probes). `workers`: processes for a cluster whose replicas are
    independent (round robin or random routing of an open loop; simulator/sharding.py),
    "auto" for one per core when the run is big enough to pay for their start-up; the
    results are the same either way. Default 1: a library call starts no processes
    unasked (a script calling it with more needs an `if __name__ == "__main__":` guard)."""
    from simulator.sharding import run_in_shards, shards_for  # it imports this module

    built = scenario if isinstance(scenario, BuiltScenario) else None
    if built is not None:
        scenario = built.scenario
    show = scenario.output.progress if progress is None else progress
    with warnings_passed_on_once() as caught:
        run = _Run(scenario, show, built)
        shards = shards_for(run, workers)
        started = time.perf_counter()
        if len(shards) > 1:
            end, logs, totals = run_in_shards(run, shards, caught)
        else:
            end = run.advance()
            logs = [replica.log.close(end) for replica in run.replicas]
            totals = [replica.log.totals for replica in run.replicas]
        run.wrap_up()
        wall = time.perf_counter() - started
        if scenario.serving.policy == "static" and (fill := _static_fill(run, end)):
            warn(fill, stacklevel=2)
        raised = [msg for kind, msg in _distinct(caught) if issubclass(kind, InfersimWarning)]
        results = _results(scenario, run, end, wall, raised, (logs, totals, max(len(shards), 1)))
        for text in results.summary()["warnings"] if summary_warnings else ():
            if text not in results.context.warnings:  # the ones the run's figures show
                warn(text, stacklevel=2)
    return results


def _static_fill(run: _Run, end: float) -> str | None:
    """The static batches' wait for a full batch, where it inflated TTFT (caveats)."""
    req = run.requests
    return static_fill_warning(
        run.builds[0][1].config.max_num_seqs,
        sum(replica.batch_fill_idle_s for replica in run.replicas),
        sum(replica.batch_fill_wait_s for replica in run.replicas),
        len(run.replicas),
        end,
        req.first_token[: req.size] - req.arrival[: req.size],
    )


@contextlib.contextmanager
def warnings_passed_on_once() -> Iterator[list[warnings.WarningMessage]]:
    """Record every InfersimWarning raised within (the list it gives), then pass each
    distinct one on to the caller's filters, also when the block stops with an error:
    what it raised until then still holds. Per thread (hardware_models.warning_scope)."""
    caught: list[warnings.WarningMessage] = []
    try:
        with recording() as caught:
            yield caught
    finally:
        pass_on(caught)


def _distinct(
    caught: list[warnings.WarningMessage],
) -> dict[tuple[type[Warning], str], warnings.WarningMessage]:
    """Each distinct warning once: one raised per replica is one fact."""
    distinct: dict[tuple[type[Warning], str], warnings.WarningMessage] = {}
    for caught_warning in caught:
        distinct.setdefault((caught_warning.category, str(caught_warning.message)), caught_warning)
    return distinct


def pass_on(
    caught: list[warnings.WarningMessage],
    keep: Callable[[warnings.WarningMessage], bool] = lambda _: True,
) -> None:
    """Recorded warnings (the distinct ones `keep` accepts, each once) to the caller's
    filters and display (or the recording the caller opened), where they were raised."""
    for caught_warning in _distinct(caught).values():
        if keep(caught_warning):
            raise_again(caught_warning)


def _results(
    scenario: Scenario,
    run: _Run,
    end: float,
    wall: float,
    raised: list[str],
    closed: tuple[list[ClosedLog], list[StepTotals], int],
) -> Results:
    """The finished run's results, from each replica's `closed` log and step totals and
    the count of processes that ran it; its summary holds the warnings raised so far in
    the order they were raised, as stderr shows them: the scenario's loading ones, its
    build's and configuration's, the run's. With the API server modelled, the request table and
    gaps are the client's and the run lasts until the client has seen every token."""
    logs, totals, processes = closed
    frontend = None
    duration = end
    if scenario.frontend.modelled:
        view = ClientView(
            scenario.frontend, run.requests, run.client_arrival, run.engine_arrival,
            [gaps for _, gaps, _ in logs],
        )  # fmt: skip
        view.apply()
        duration = max(end, view.last_seen())
        frontend = view.summary(duration)
    slo = scenario.slo
    folder = scenario.base_dir  # warnings name its files from it, as the scenario does
    ctx = RunContext(
        scenario=scenario.name,
        seed=scenario.seed,
        duration_s=duration,
        replicas=tuple(run.infos),
        slo=SLO(
            ttft_s=None if slo.ttft_ms is None else slo.ttft_ms / 1000,
            tpot_s=None if slo.tpot_ms is None else slo.tpot_ms / 1000,
            e2e_s=None if slo.e2e_ms is None else slo.e2e_ms / 1000,
        ),
        pue=scenario.cost.pue,
        host_w_per_gpu=scenario.cost.host_w_per_gpu,
        usd_per_kwh=scenario.cost.usd_per_kwh,
        priority_names=tuple(run.class_names),
        wall_seconds=wall,
        provenance=provenance(
            _as_run(scenario, run.builds),
            _serving_defaults(run.builds),
            processes,
            assumed_links(run.builds),
        ),
        warnings=tuple(
            dict.fromkeys(named_from(folder, w) for w in (*scenario.load_warnings, *raised))
        ),
        frontend=frontend,
    )
    memory = "\n".join(f"[{pool}] {build.memory.table()}" for pool, build in run.builds)
    return Results.from_run(scenario, memory, ctx, run.requests, totals, logs)
