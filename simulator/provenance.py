"""What produced a result, recorded in its summary.json: the resolved scenario, the --set
overrides, the infersim version and build id, and the configuration in a few words for
the terminal header. No wall-clock time, so the same scenario and seed give the same bytes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from simulator.build_id import build_id

if TYPE_CHECKING:
    from simulator.scenario import Scenario


def provenance(scenario: Scenario, defaults: Sequence[str] = ()) -> dict[str, Any]:
    """The run's origin, JSON-ready: build_id is `<version>+<source digest>`; `defaults`
    says what vLLM's defaults chose for the settings the scenario left unset."""
    build = build_id()
    return {
        "infersim_version": build.split("+")[0],
        "build_id": build,
        "overrides": list(scenario.overrides),
        "defaults": list(defaults),
        "scenario": scenario.model_dump(mode="json"),
    }


def _pools(scenario: Mapping[str, Any]) -> list[dict[str, Any]]:
    if scenario.get("pools"):
        return [
            {"pool": p["name"], "gpu": p["hardware"]["gpu"], "tp": p["tp"], "pp": p["pp"],
             "replicas": p["replicas"]}
            for p in scenario["pools"]
        ]  # fmt: skip
    par = scenario["parallelism"]
    return [{"pool": "default", "gpu": scenario["hardware"]["gpu"], "tp": par["tp"],
             "pp": par["pp"], "dp": par.get("dp", 1), "ep": par.get("enable_expert_parallel"),
             "replicas": par["replicas"]}]  # fmt: skip


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
    return what


def configuration(scenario: Mapping[str, Any], defaults: Sequence[str] = ()) -> dict[str, Any]:
    """Model, GPUs and layout, dtypes, policy and load of a scenario dump, and the
    `defaults` vLLM's rules chose (provenance)."""
    model, serving = scenario["model"], scenario["serving"]
    return {
        "model": model["name"],
        "weight_dtype": model["weight_dtype"],
        "kv_dtype": model["kv_dtype"],
        "activation_dtype": model["activation_dtype"],
        "pools": _pools(scenario),
        "policy": serving["policy"],
        "max_num_seqs": serving["max_num_seqs"],
        "max_num_batched_tokens": serving["max_num_batched_tokens"],
        "load": _load(scenario["workload"]),
        "defaults": list(defaults),
    }


def header_lines(config: Mapping[str, Any]) -> list[str]:
    """Two lines naming what ran: model and hardware, then policy and load."""
    layout = ", ".join(
        f"{p['replicas']} x {p['gpu']} tp={p['tp']} pp={p['pp']}"
        + (f" dp={p['dp']}" if p.get("dp", 1) > 1 else "")
        + (" ep" if p.get("ep") else "")
        + ("" if p["pool"] == "default" else f" ({p['pool']})")
        for p in config["pools"]
    )
    seqs, tokens = config["max_num_seqs"], config["max_num_batched_tokens"]
    return [
        f"{config['model']} (weights {config['weight_dtype']}, KV {config['kv_dtype']}, "
        f"activations {config['activation_dtype']}) on {layout}",
        f"{config['policy']}: {'per pool' if seqs is None else seqs} seqs, "
        f"{'per pool' if tokens is None else format(tokens, ',')} tokens/step; {config['load']}",
        *(f"default {line}" for line in config.get("defaults", ())),
    ]
