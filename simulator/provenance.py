"""What produced a result, recorded in its summary.json: the resolved scenario, the --set
overrides, the infersim version and build id, and the configuration in a few words for
the terminal header. No wall-clock time, so the same scenario and seed give the same bytes."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hardware_models.file_memo import per_file_version
from hardware_models.node import CrossNodeLink, LinkSpec
from simulator.build_id import build_id
from simulator.scenario import replica_gpus

if TYPE_CHECKING:
    from simulator.build import ReplicaBuild
    from simulator.engine.step_cost import StepCostModel
    from simulator.scenario import Scenario


def provenance(
    scenario: Scenario,
    defaults: Sequence[str] = (),
    processes: int = 1,
    links: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The run's origin, JSON-ready: build_id is `<version>+<source digest>`; `defaults`
    says what vLLM's defaults chose for the settings the scenario left unset; `processes`
    how many simulated it (simulator/sharding.py), which changes no figure; `links` the
    GPU-to-GPU links its collectives were priced over (assumed_links; absent where the
    replicas talk over none); `inputs` the files it read (input_files), where it read any."""
    return {
        **origin(scenario),
        "processes": processes,
        "defaults": list(defaults),
        **({"links": list(links)} if links else {}),
        "scenario": scenario.model_dump(mode="json"),
    }


def origin(scenario: Scenario) -> dict[str, Any]:
    """What every result of `scenario` records, one run's or many's (a plan's plan.json):
    the infersim version and build_id, the --set overrides, and the files it read."""
    build = build_id()
    inputs = input_files(scenario)
    return {
        "infersim_version": build.split("+")[0],
        "build_id": build,
        "overrides": list(scenario.overrides),
        **({"inputs": inputs} if inputs else {}),
    }


def _link_record(link: LinkSpec, preset: LinkSpec | None, node: str, calibration: str) -> dict:
    """One link as priced: its figures, and whether they are the node preset's or a
    calibration profile's fit (which replaces the latency and efficiency)."""
    source = f"node preset {node}" if link == preset else f"calibration: {calibration}"
    return {
        "kind": link.kind,
        "bandwidth_gbps": link.bandwidth_gbps,
        "latency_us": link.latency_us,
        "efficiency": link.efficiency,
        "source": source,
    }


def _group_record(
    build: ReplicaBuild, group: str, gpus: int, link: LinkSpec | CrossNodeLink
) -> dict[str, Any]:
    node, note = build.node, build.info.calibration
    record: dict[str, Any] = {"group": group, "gpus": gpus}
    if isinstance(link, CrossNodeLink):
        record["gpus_per_node"] = link.gpus_per_node
        record["intra"] = _link_record(link.intra, node.intra_node_link, node.name, note)
        record["inter"] = _link_record(link.inter, node.inter_node_link, node.name, note)
    elif link is node.inter_node_link:
        record["inter"] = _link_record(link, node.inter_node_link, node.name, note)
    else:
        record["intra"] = _link_record(link, node.intra_node_link, node.name, note)
    return record


def _placed_groups(build: ReplicaBuild, cost: StepCostModel) -> list[dict[str, Any]]:
    """The groups of one placed model of `build` and the links they were priced over."""
    groups: list[tuple[str, int, LinkSpec | CrossNodeLink | None]] = [("tp", cost.tp, cost.tp_link)]
    dispatch = cost.dp if cost.all2all_backend != "all_to_all" else cost.tp * cost.dp
    if build.arch.is_moe and dispatch > 1:
        groups.append(("moe_dispatch", cost.tp * cost.dp, cost.ep_link))
    groups += [("pp_handoff", 2 * cost.tp, link) for link, _, _, _ in cost.handoffs]
    return [_group_record(build, group, gpus, link) for group, gpus, link in groups if link]


def assumed_links(builds: Sequence[tuple[str, ReplicaBuild]]) -> list[dict[str, Any]]:
    """The links each pool's collectives were priced over: its tp group's, its MoE
    dispatch group's and its pipeline hand-offs' (`intra` inside a node, `inter` between
    nodes, both for a group spanning nodes), each with its kind, figures and source; over
    every replica as placed (StepCostModel.placed_ranks: one straddling two nodes hands
    off over the inter-node link), a record holding for some of a pool's replicas only
    naming them (`replicas`, from 0)."""
    records = []
    for pool, build in builds:
        seen: dict[str, tuple[dict[str, Any], set[int]]] = {}  # by the record's JSON
        placed = build.cost.placed_ranks(build.replicas, build.dp)
        for replica, models in enumerate(placed):
            for cost in dict.fromkeys(models):  # a replica's distinct placed models
                for group in _placed_groups(build, cost):
                    record = {"pool": pool, **group}
                    key = json.dumps(record, sort_keys=True)
                    seen.setdefault(key, (record, set()))[1].add(replica)
        for record, replicas in seen.values():
            if len(replicas) < build.replicas:
                record["replicas"] = sorted(replicas)
            records.append(record)
    return records


def _file_fields(scenario: Scenario) -> list[tuple[str, str]]:
    """(field, value as given) of each file the scenario reads: a GPU, node, model or
    calibration file (presets are named, and build_id covers them), and the traces."""
    named = [("model.name", scenario.model.name)]
    for where, hardware in scenario.hardware_sections():
        named += [
            (f"{where}.{field}", getattr(hardware, field))
            for field in ("gpu", "node", "calibration")
        ]
    files = [
        (field, value) for field, value in named if value and scenario.reads_file(field, value)
    ]
    for role in ("arrivals", "prompt_tokens", "output_tokens"):
        spec = getattr(scenario.workload, role)
        if getattr(spec, "kind", None) == "trace":
            files.append((f"workload.{role}.path", spec.path))
    return files


@per_file_version
def _sha256(path: Path) -> str:
    """The file's sha256, computed once per version of it (hardware_models/file_memo.py):
    a 20 MB trace takes ~70 ms, a sweep's hundreds of points read it once."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def input_files(scenario: Scenario) -> list[dict[str, str | None]]:
    """Each file the scenario read, by field, named as the scenario names it (relative to
    its folder) and with the sha256 of its contents as the run ends, so an edited trace or
    profile shows in the provenance as an edited source shows in build_id; sha256 None
    where the file cannot be read any more. A model given as a folder is its config.json."""
    records = []
    for field, value in _file_fields(scenario):
        path = scenario.resolve_path(value)
        if field == "model.name" and path.is_dir():
            path = path / "config.json"
        records.append(pinned(field, path, value))
    return records


def pinned(field: str, path: Path, named: str) -> dict[str, str | None]:
    """{field, path: `named`, sha256 of the file at `path`} (sha256 None where it cannot
    be read): one file a result was computed from."""
    try:
        digest: str | None = _sha256(path)
    except OSError:
        digest = None
    return {"field": field, "path": named, "sha256": digest}


def named_from(folder: str, text: str) -> str:
    """`text` (a warning, a calibration note) with the files in the scenario's `folder`
    named from it, as the scenario names them, so that results do not hold the folder a
    run happened in: the same scenario in two checkouts gives the same summary.json. The
    messages printed while the run goes keep the full paths."""
    prefix = os.path.join(folder, "")
    if not os.path.isabs(folder) or Path(folder).parent == Path(folder):
        return text  # relative paths are named from the folder already; '/' is every path
    # a path begins the text, or follows a space, a quote or a bracket
    return re.sub(r"(?<![^\s'\"(\[])" + re.escape(prefix), "", text)


def _pools(scenario: Mapping[str, Any], chips: Mapping[str, str]) -> list[dict[str, Any]]:
    if scenario.get("pools"):
        pools = [
            {"pool": p["name"], "gpu": p["hardware"]["gpu"], "tp": p["tp"], "pp": p["pp"],
             "replicas": p["replicas"]}
            for p in scenario["pools"]
        ]  # fmt: skip
    else:
        par = scenario["parallelism"]
        pools = [{"pool": "default", "gpu": scenario["hardware"]["gpu"], "tp": par["tp"],
                  "pp": par["pp"], "dp": par.get("dp", 1),
                  "ep": par.get("enable_expert_parallel"),
                  "replicas": par["replicas"]}]  # fmt: skip
    for pool in pools:
        chip = chips.get(pool["pool"], pool["gpu"])
        if chip != pool["gpu"]:  # a custom GPU's file: its chip names it, the file is kept
            pool["gpu_file"], pool["gpu"] = pool["gpu"], chip
    return pools


def _load(workload: Mapping[str, Any]) -> str:
    arrivals = workload["arrivals"]
    kind = arrivals["kind"]
    if arrivals.get("rate_per_s") is not None:
        what = f"{kind} {arrivals['rate_per_s']:g} req/s"
    elif arrivals.get("users") is not None:
        what = f"{kind} {arrivals['users']} users"
    else:
        what = kind
    if workload.get("duration_s") is not None:
        return f"{what} for {workload['duration_s']:g} s"
    if workload.get("num_requests") is not None:
        return f"{what}, {workload['num_requests']:,} requests"
    return f"{what} (to its end)" if kind == "trace" else what


def configuration(
    scenario: Mapping[str, Any],
    defaults: Sequence[str] = (),
    chips: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Model, GPUs and layout, dtypes, policy and load of a scenario dump, and the
    `defaults` vLLM's rules chose (provenance). `chips`: each pool's GPU name as loaded,
    for pools whose hardware.gpu is a file."""
    model, serving = scenario["model"], scenario["serving"]
    return {
        "model": model["name"],
        "weight_dtype": model["weight_dtype"],
        "kv_dtype": model["kv_dtype"],
        "activation_dtype": model["activation_dtype"],
        "pools": _pools(scenario, chips or {}),
        "policy": serving["policy"],
        "max_num_seqs": serving["max_num_seqs"],
        "max_num_batched_tokens": serving["max_num_batched_tokens"],
        "max_queue_delay_ms": serving["max_queue_delay_ms"],
        "load": _load(scenario["workload"]),
        "defaults": list(defaults),
        # Only where it is not vLLM's default, so that FCFS runs' summaries stay as they were.
        **(
            {"scheduling_policy": "priority"}
            if serving.get("scheduling_policy") == "priority"
            else {}
        ),
        # Only where set: a fixed block count no memory setting changes (the KV advice).
        **(
            {"num_gpu_blocks": serving["num_gpu_blocks"]}
            if serving.get("num_gpu_blocks") is not None
            else {}
        ),
    }


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _layout(pool: Mapping[str, Any]) -> str:
    """'4 replicas x 2 h100-sxm (tp=2 pp=1)': the replicas, then the GPUs each holds (a
    leading count of replicas alone read as a count of GPUs)."""
    shape = f"tp={pool['tp']} pp={pool['pp']}"
    shape += f" dp={pool['dp']}" if pool.get("dp", 1) > 1 else ""
    shape += " ep" if pool.get("ep") else ""
    shape += "" if pool["pool"] == "default" else f", pool {pool['pool']}"
    gpus = replica_gpus(pool["tp"], pool["pp"], pool.get("dp", 1))
    return f"{_plural(pool['replicas'], 'replica')} x {gpus} {pool['gpu']} ({shape})"


def _batching(config: Mapping[str, Any]) -> str:
    """What bounds a step: the token budget for the iteration-level policies; static and
    dynamic batches run whole prompts at once (no token budget), up to max_num_seqs
    requests whose KV fits, dynamic ones also leaving after max_queue_delay_ms."""
    seqs, tokens = config["max_num_seqs"], config["max_num_batched_tokens"]
    # None: pools that took different vLLM defaults (each pool's header line says)
    seqs = "per-pool seqs" if seqs is None else f"{seqs:,} seqs"
    tokens = "per-pool tokens" if tokens is None else f"{tokens:,} tokens"
    if config["policy"] == "static":
        return f"batches of up to {seqs} whose KV fits, whole prompts (no token budget)"
    if config["policy"] == "dynamic":
        delay = config.get("max_queue_delay_ms")
        wait = "" if delay is None else f" or after {delay:g} ms"
        return f"batches of up to {seqs}{wait}, whole prompts (no token budget)"
    return f"{seqs}, {tokens}/step"


def header_lines(config: Mapping[str, Any]) -> list[str]:
    """Two lines naming what ran: model and hardware, then policy and load."""
    layout = ", ".join(_layout(p) for p in config["pools"])
    return [
        f"{config['model']} (weights {config['weight_dtype']}, KV {config['kv_dtype']}, "
        f"activations {config['activation_dtype']}) on {layout}",
        f"{config['policy']}: {_batching(config)}; {config['load']}",
        *(f"default {line}" for line in config.get("defaults", ())),
    ]
