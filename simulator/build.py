"""Resolve a scenario into built replicas: GPU, node, calibration, model, memory plan, cost
model and engine configuration per pool, checked against what vLLM would refuse."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration_lookup import (
    CalibrationChoice,
    choose_calibration,
    gemms_outside_fitted_sizes,
    profile_metadata,
)
from hardware_models.errors import InfeasibleError, InfersimError
from hardware_models.node import NodeSpec
from hardware_models.power import power_model
from hardware_models.presets import list_nodes, load_gpu, load_node
from hardware_models.warning_scope import pass_on, recording, warn
from simulator.architecture import ModelArchitecture
from simulator.caveats import (
    check_num_gpu_blocks,
    check_serving_starts,
    check_swap_space,
    ignored_settings,
    ignores,
    mla_block_size,
    overhead_override_warning,
)
from simulator.engine.kv_groups import KvCacheGroups, chunked_local_attention, kv_cache_groups
from simulator.engine.replica import ReplicaConfig
from simulator.engine.step_cost import EngineOverheads, StepCostModel
from simulator.memory_planner import (
    GIB,
    DoesNotFit,
    MaxModelLenRefused,
    MemoryPlan,
    SettingNames,
    framework_overhead_bytes,
    plan_memory,
)
from simulator.metrics.context import ReplicaInfo
from simulator.model_catalog import load_model
from simulator.provenance import named_from
from simulator.scenario import BATCH_LIMITS, ModelSection, Scenario, ServingSection, replica_gpus
from simulator.workload import RequestBatch, generate_requests


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
