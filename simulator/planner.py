"""Capacity planning: the cheapest cluster that meets the SLOs for a traffic level.

For every candidate (GPU type, tp, pp, batching policy) the planner
1. drops it if the model does not fit (the memory planner says why);
2. finds one replica's capacity: the highest arrival rate at which it still meets the
   SLO bounds at the chosen percentile (bisection over simulated runs);
3. sizes the fleet: replicas = ceil(target x (1 + headroom) / capacity);
4. verifies the fleet by simulating it at target x (1 + headroom) behind a
   least-outstanding router, adding replicas until the SLOs hold;
and ranks the survivors by $/hour. Candidates run in parallel on local processes.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from hardware_models.errors import InfersimError
from simulator.scenario import PlanSection, Scenario

BISECTION_STEPS = 7
VERIFY_ATTEMPTS = 4


@dataclass(frozen=True)
class Candidate:
    gpu: str
    tp: int
    pp: int
    policy: str


def _base_rate(scenario: Scenario) -> float:
    arrivals = scenario.workload.arrivals
    rate = getattr(arrivals, "rate_per_s", None)
    if rate is None:
        raise InfersimError(
            f"plan: workload.arrivals.kind {arrivals.kind!r} has no rate to scale; use "
            "poisson, gamma or constant arrivals (lengths may still come from a trace)"
        )
    return float(rate)


def _at(scenario: Scenario, candidate: Candidate, rate: float, replicas: int, n: int):
    """`scenario` as one probe: this candidate, this rate, n requests."""
    data = scenario.model_dump(mode="json", exclude={"plan", "sweep", "variants", "pools"})
    data["base_dir"] = scenario.base_dir
    data["hardware"] = {**(data.get("hardware") or {}), "gpu": candidate.gpu, "node": None}
    data["parallelism"] = {
        **data["parallelism"], "tp": candidate.tp, "pp": candidate.pp, "replicas": replicas,
        "router": "least_outstanding",
    }  # fmt: skip
    data["serving"] = {**data["serving"], "policy": candidate.policy}
    data["workload"] = {**data["workload"], "num_requests": n, "duration_s": None}
    data["workload"]["arrivals"] = {**data["workload"]["arrivals"], "rate_per_s": rate}
    data["output"] = {"plots": False, "csv": False, "progress": False}
    return Scenario.from_dict(data, source="plan")


def _margins(summary: dict[str, Any], scenario: Scenario, pct: str) -> dict[str, float]:
    """Bound / achieved at the percentile, per SLO: >= 1 means it holds."""
    slo, out = scenario.slo, {}
    for metric, bound_ms in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2e", slo.e2e_ms)):
        if bound_ms is None:
            continue
        achieved = (summary["latency"][metric] or {}).get(pct)
        out[metric] = 0.0 if not achieved else bound_ms / 1000 / achieved
    return out


def _meets(summary: dict[str, Any], scenario: Scenario, pct: str) -> bool:
    counts = summary["counts"]
    if counts["completed"] < counts["arrived"] or summary.get("overloaded"):
        return False
    return all(m >= 1.0 for m in _margins(summary, scenario, pct).values())


def _run(scenario: Scenario) -> dict[str, Any]:
    from simulator.simulation import simulate

    return simulate(scenario, progress=False).summary()


def _replica_capacity(scenario: Scenario, c: Candidate, plan: PlanSection, hi: float) -> float:
    """Highest rate one replica serves within the SLOs (0 if none)."""
    n = plan.requests_per_probe
    lo = 0.0
    if _meets(_run(_at(scenario, c, hi, 1, n)), scenario, plan.percentile):
        return hi
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2 if lo else hi / 2 ** (BISECTION_STEPS // 2)
        if _meets(_run(_at(scenario, c, mid, 1, n)), scenario, plan.percentile):
            lo = mid
        else:
            hi = mid
        if lo and hi / lo < 1.08:
            break
    return lo


def evaluate(scenario: Scenario, candidate: Candidate) -> dict[str, Any]:
    """One candidate's row of the plan table (status 'infeasible' with the reason)."""
    plan = scenario.plan
    assert plan is not None
    row: dict[str, Any] = asdict(candidate)
    target = (plan.target_rate_per_s or _base_rate(scenario)) * (1 + plan.headroom)
    try:
        capacity = _replica_capacity(scenario, candidate, plan, target)
        if capacity <= 0:
            return {**row, "status": "infeasible", "reason": "one replica misses the SLO "
                    "even at the lowest probed rate"}  # fmt: skip
        replicas = math.ceil(target / capacity)
        for _ in range(VERIFY_ATTEMPTS):
            if replicas > plan.max_replicas:
                return {**row, "status": "infeasible",
                        "reason": f"needs more than {plan.max_replicas} replicas"}  # fmt: skip
            n = plan.requests_per_probe * min(replicas, 8)
            verify = _at(scenario, candidate, target, replicas, n)
            summary = _run(verify)
            if _meets(summary, scenario, plan.percentile):
                break
            replicas += max(1, replicas // 10)
        else:
            return {**row, "status": "infeasible", "reason": "fleet never met the SLO"}
    except InfersimError as exc:
        return {**row, "status": "infeasible", "reason": str(exc).splitlines()[0]}
    margins = _margins(summary, scenario, plan.percentile)
    gpus = replicas * candidate.tp * candidate.pp
    return {
        **row,
        "status": "ok",
        "replica_capacity_rps": capacity,
        "replicas": replicas,
        "gpus": gpus,
        "usd_per_hour": summary["cost"]["usd_per_hour"],
        "usd_per_million_output_tokens": summary["cost"]["usd_per_million_output_tokens"],
        f"ttft_{plan.percentile}_ms": 1000 * summary["latency"]["ttft"][plan.percentile],
        f"tpot_{plan.percentile}_ms": 1000 * summary["latency"]["tpot"][plan.percentile],
        **{f"{k}_margin": v for k, v in margins.items()},
        "reason": "",
    }


def candidates(plan: PlanSection) -> list[Candidate]:
    return [
        Candidate(gpu, tp, pp, policy)
        for gpu in plan.gpus
        for tp in plan.tp
        for pp in plan.pp
        for policy in plan.policies
    ]


def _evaluate_packed(args: tuple[dict[str, Any], Candidate]) -> dict[str, Any]:
    data, candidate = args
    return evaluate(Scenario.model_validate(data), candidate)


def plan_capacity(scenario: Scenario, *, workers: int | None = None) -> pd.DataFrame:
    """The ranked plan table: feasible candidates cheapest first, then the rest."""
    if scenario.plan is None:
        raise InfersimError(f"{scenario.name}: no `plan:` section to search")
    if not any((scenario.slo.ttft_ms, scenario.slo.tpot_ms, scenario.slo.e2e_ms)):
        raise InfersimError("plan: give at least one SLO bound (slo.ttft_ms, tpot_ms, e2e_ms)")
    _base_rate(scenario)
    todo = candidates(scenario.plan)
    data = scenario.model_dump(mode="json")
    data["base_dir"] = scenario.base_dir
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        rows = [evaluate(scenario, c) for c in todo]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = list(pool.map(_evaluate_packed, [(data, c) for c in todo]))
    table = pd.DataFrame(rows)
    if "usd_per_hour" not in table:  # nothing feasible
        table["usd_per_hour"] = float("nan")
    table["rank"] = table["usd_per_hour"].where(table["status"] == "ok").rank(method="first")
    return table.sort_values(["rank", "gpu", "tp"], na_position="last", ignore_index=True)


def pareto_figure(table: pd.DataFrame, percentile: str = "p99"):
    """$/hour against the latency percentile per feasible candidate; the Pareto front
    (nothing both cheaper and faster) is joined by a line."""
    from matplotlib.figure import Figure

    ok = table[table["status"] == "ok"]
    fig = Figure(figsize=(9, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
        column = f"{metric}_{percentile}_ms"
        if ok.empty or column not in ok:
            ax.text(0.5, 0.5, "no feasible candidate", ha="center", transform=ax.transAxes)
            continue
        for gpu, group in ok.groupby("gpu"):
            ax.scatter(group[column], group["usd_per_hour"], label=gpu, s=30)
        ordered = ok.sort_values(column)
        front = ordered[ordered["usd_per_hour"] <= ordered["usd_per_hour"].cummin()]
        ax.plot(front[column], front["usd_per_hour"], color="black", lw=1, ls="--")
        ax.set_xlabel(f"{metric.upper()} {percentile} (ms)")
        ax.set_ylabel("$ / hour")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle("Capacity plan: cost against latency (dashed: Pareto front)")
    return fig
