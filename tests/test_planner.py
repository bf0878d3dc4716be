"""The capacity planner finds fleets that meet the SLOs and ranks them by cost."""

from __future__ import annotations

import pytest

from hardware_models.errors import InfersimError
from simulator.planner import plan_capacity
from simulator.simulation import simulate


def _plan_scenario(make_scenario, **plan):
    return make_scenario(
        slo={"ttft_ms": 1500, "tpot_ms": 60},
        workload={"arrivals": {"kind": "poisson", "rate_per_s": 6.0}},
        plan={"gpus": ["a100-80gb-sxm", "l4"], "tp": [1], "requests_per_probe": 60,
              "headroom": 0.1, **plan},
    )  # fmt: skip


def test_plan_ranks_feasible_fleets_and_explains_the_rest(make_scenario):
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm", "l4", "h100-sxm"], tp=[1])
    table = plan_capacity(scenario, workers=1)
    ok = table[table["status"] == "ok"]
    assert list(ok["rank"]) == sorted(ok["rank"])
    assert list(ok["usd_per_hour"]) == sorted(ok["usd_per_hour"])
    assert set(table["gpu"]) == {"a100-80gb-sxm", "l4", "h100-sxm"}
    assert (ok["replicas"] >= 1).all() and (ok["ttft_p99_ms"] <= 1500).all()
    best = ok.iloc[0]
    # Re-simulate the winner at the planned load: it meets the SLO there.
    check = scenario.with_overrides(
        [f"hardware.gpu={best['gpu']}", f"parallelism.replicas={int(best['replicas'])}",
         "parallelism.router=least_outstanding", "workload.arrivals.rate_per_s=6.6",
         "workload.num_requests=120"]
    )  # fmt: skip
    summary = simulate(check).summary()
    assert summary["latency"]["ttft"]["p99"] <= 1.5


def test_a_model_that_does_not_fit_is_infeasible_with_reason(make_scenario):
    scenario = _plan_scenario(make_scenario, gpus=["l4"], tp=[1])
    scenario = scenario.with_overrides(["model.name=llama-2-13b"])
    table = plan_capacity(scenario, workers=1)
    assert table.loc[0, "status"] == "infeasible"
    assert "does not fit" in table.loc[0, "reason"]


def test_plan_needs_a_plan_section_slo_and_a_rate(make_scenario):
    with pytest.raises(InfersimError, match="no `plan:`"):
        plan_capacity(make_scenario())
    with pytest.raises(InfersimError, match="SLO"):
        plan_capacity(make_scenario(plan={"gpus": ["l4"]}))
