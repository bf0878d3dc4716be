"""The capacity planner finds fleets that meet the SLOs and ranks them by cost."""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.presets import load_gpu
from simulator.cli.main import main
from simulator.planner import Candidate, _at, _check_overrides, plan_capacity
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict

ROOT = Path(__file__).resolve().parents[1]


def _plan_scenario(make_scenario, **plan):
    return make_scenario(
        slo={"ttft_ms": 1500, "tpot_ms": 60},
        workload={"arrivals": {"kind": "poisson", "rate_per_s": 6.0}},
        plan={"gpus": ["a100-80gb-sxm", "l4"], "tp": [1], "requests_per_probe": 100,
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


def test_each_candidate_says_the_batch_limits_it_ran_with(make_scenario):
    """vLLM's defaults differ by GPU, and a budget given bounds the default sequences
    (vLLM 0.19 starts an H100 with `--max-num-batched-tokens 512` at 512 sequences, so
    the H100 is not refused as a budget below its 1024)."""
    scenario = _plan_scenario(make_scenario, gpus=["h100-sxm", "a100-80gb-sxm"])
    unset = {"max_num_seqs": None, "max_num_batched_tokens": None}
    scenario = scenario.model_copy(update={"serving": scenario.serving.model_copy(update=unset)})
    table = plan_capacity(scenario, workers=1).set_index("gpu")
    assert (table["status"] == "ok").all(), table["reason"].tolist()
    limits = table[["max_num_seqs", "max_num_batched_tokens"]].astype(int)
    assert limits.loc["h100-sxm"].tolist() == [1024, 8192]
    assert limits.loc["a100-80gb-sxm"].tolist() == [256, 2048]
    budget = scenario.with_overrides(["serving.max_num_batched_tokens=512"])
    table = plan_capacity(budget, workers=1).set_index("gpu")
    assert (table["status"] == "ok").all(), table["reason"].tolist()
    assert table.loc["h100-sxm", "max_num_seqs"] == 512
    assert table.loc["a100-80gb-sxm", "max_num_seqs"] == 256


def test_a_model_that_does_not_fit_is_infeasible_with_reason(make_scenario):
    scenario = _plan_scenario(make_scenario, gpus=["l4"], tp=[1])
    scenario = scenario.with_overrides(["model.name=llama-2-13b"])
    table = plan_capacity(scenario, workers=1)
    assert table.loc[0, "status"] == "infeasible"
    assert "does not fit" in table.loc[0, "reason"]
    assert table.loc[0, "max_num_seqs"] == 64  # said for a refused candidate too


def test_plan_needs_a_plan_section_slo_and_a_rate(make_scenario):
    with pytest.raises(InfersimError, match="no `plan:`"):
        plan_capacity(make_scenario())
    with pytest.raises(InfersimError, match="SLO"):
        plan_capacity(make_scenario(plan={"gpus": ["l4"]}))


def test_a_misspelt_plan_gpu_is_refused_before_any_probe_runs(make_scenario, monkeypatch):
    """Not ranked `infeasible` below the GPUs that were meant."""
    monkeypatch.setattr("simulator.planner.run_parallel", pytest.fail)
    scenario = _plan_scenario(make_scenario, gpus=["l4", "h100"])
    with pytest.raises(InfersimError) as info:
        plan_capacity(scenario, workers=1)
    assert str(info.value).startswith("plan.gpus.1: unknown gpu 'h100'; did you mean 'h100-sxm'")


@pytest.mark.parametrize(
    ("item", "needle"),
    [
        ("parallelism.tp=2", "sets parallelism.tp from the search; give degrees as plan.tp"),
        ("serving.policy=static", "give policies as plan.policies"),
        ("hardware.gpu=h100-sxm", "give GPUs as plan.gpus"),
        ("parallelism.replicas=3", "the search sizes the fleet"),
    ],
)
def test_plan_refuses_a_set_its_search_would_replace(make_scenario, item, needle):
    scenario = make_scenario(plan={"gpus": ["l4"]}, slo={"ttft_ms": 500}).with_overrides([item])
    with pytest.raises(InfersimError, match=f"plan: --set {re.escape(item)}: every probe"):
        plan_capacity(scenario, workers=1)
    with pytest.raises(InfersimError, match=re.escape(needle)):
        plan_capacity(scenario, workers=1)


def test_plan_keeps_a_set_of_the_hardware_fields_its_probes_keep(make_scenario):
    """Probes replace hardware.gpu and hardware.node only: a --set of the calibration is
    carried to every probe, not refused; a whole hardware section still is."""
    scenario = _plan_scenario(make_scenario, gpus=["l4"], tp=[1])
    scenario = scenario.with_overrides(["hardware.calibration=none"])
    _check_overrides(scenario)
    probe = _at(scenario, Candidate("l4", 1, 1, "chunked_prefill"), 1.0, 1, 10)
    assert probe.hardware.calibration == "none" and probe.hardware.gpu == "l4"
    for item in ("hardware.node=dgx-h100", "hardware={gpu: h100-sxm}"):
        with pytest.raises(InfersimError, match="every probe sets hardware"):
            _check_overrides(scenario.with_overrides([item]))


def _check_fleet(scenario, row, rate: float) -> dict:
    """Re-simulate a planned fleet as a user would write it: pools when disaggregated."""
    data = scenario.model_dump(mode="json", exclude={"plan"})
    data["parallelism"] = {"router": "least_outstanding", "tp": int(row["tp"])}
    hardware = {"gpu": row["gpu"]}
    if row["layout"] == "disaggregated":
        del data["hardware"]
        data["pools"] = [
            {"name": role, "hardware": hardware, "tp": int(row["tp"]), "role": role,
             "replicas": int(row[f"{role}_replicas"])}
            for role in ("prefill", "decode")
        ]  # fmt: skip
    else:
        data["hardware"] = hardware
        data["parallelism"]["replicas"] = int(row["replicas"])
    data["workload"] |= {"num_requests": 120, "arrivals": {"kind": "poisson", "rate_per_s": rate}}
    return simulate(Scenario.from_dict(data)).summary()


def test_disaggregated_fleets_are_sized_per_pool_ranked_and_verified(make_scenario):
    scenario = _plan_scenario(
        make_scenario, gpus=["a100-80gb-sxm"], policies=["chunked_prefill", "static"],
        disaggregation=True,
    )  # fmt: skip
    table = plan_capacity(scenario, workers=1)
    # static batches run whole, so they cannot be handed over: no disaggregated row
    assert sorted(zip(table["policy"], table["layout"], strict=True)) == [
        ("chunked_prefill", "colocated"), ("chunked_prefill", "disaggregated"),
        ("static", "colocated"),
    ]  # fmt: skip
    split = table[table["layout"] == "disaggregated"].iloc[0]
    assert split["status"] == "ok", split["reason"]
    assert split["prefill_replicas"] >= 1 and split["decode_replicas"] >= 1
    assert split["replicas"] == split["prefill_replicas"] + split["decode_replicas"]
    assert split["gpus"] == split["replicas"] and split["tpot_margin"] >= 1
    assert table.loc[table["layout"] == "colocated", "prefill_replicas"].isna().all()
    ok = table[table["status"] == "ok"]
    assert list(ok["usd_per_hour"]) == sorted(ok["usd_per_hour"])
    summary = _check_fleet(scenario, split, 6.6)
    assert summary["latency"]["ttft"]["p99"] <= 1.5 and summary["latency"]["tpot"]["p99"] <= 0.06
    # the smallest: one replica fewer in either pool misses the SLO (or leaves it empty)
    assert (
        split["prefill_replicas"] == 1
        or split["decode_replicas"] == 1
        or not all(_meets_at(scenario, split, pool) for pool in ("prefill", "decode"))
    )


def _meets_at(scenario, row, pool: str) -> bool:
    from simulator.planner import Candidate, _probe

    fleet = [int(row["prefill_replicas"]), int(row["decode_replicas"])]
    fleet[pool == "decode"] -= 1
    c = Candidate(row["gpu"], int(row["tp"]), int(row["pp"]), row["policy"])
    return _probe(scenario, c, 6.6, tuple(fleet)).ok


def test_parallel_plan_uses_the_sweep_executor_and_matches_in_process(make_scenario):
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm", "l4"], disaggregation=True)
    local = plan_capacity(scenario, workers=1)
    parallel = plan_capacity(scenario, workers=2)
    pd.testing.assert_frame_equal(local, parallel)
    # l4 nodes have no network to send a KV cache over: said, not dropped
    l4 = parallel[(parallel["gpu"] == "l4") & (parallel["layout"] == "disaggregated")]
    assert l4["status"].tolist() == ["infeasible"] and l4["reason"].iloc[0]


def test_plan_cli_shows_both_layouts_and_bad_settings_are_one_line(tmp_path, capsys):
    path = tmp_path / "plan.yaml"
    data = scenario_dict(
        slo={"ttft_ms": 1500, "tpot_ms": 60},
        plan={"gpus": ["a100-80gb-sxm"], "tp": [1], "requests_per_probe": 100,
              "disaggregation": True},
    )  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    argv = ["plan", str(path), "-o", str(tmp_path / "out"), "--workers", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "planning 1 candidate (GPU x tp x pp x policy)" in captured.err
    assert "disaggregated" in out and "colocated" in out and "prefill_replicas" in out
    # the headers compare and sweep print (metrics.headline.labelled), energy and goodput too
    for header in ("seqs", "tok/step", "$/h", "$/1M out tok", "TTFT p99 ms", "TPOT p99 ms",
                   "steady goodput req/s", "GPU J/out tok"):  # fmt: skip
        assert header in out, header
    assert not re.search(r"usd_per|_p99_ms|max_num_seqs|joules", out)
    table = pd.read_csv(tmp_path / "out" / "plan.csv")
    feasible = table[table["status"] != "infeasible"]
    assert len(feasible) and (feasible["joules_per_output_token"] > 0).all()
    assert (feasible["steady_goodput_requests_per_s"] > 0).all()
    assert (tmp_path / "out" / "pareto.png").stat().st_size > 1000
    assert main([*argv, "--overwrite", "--set", "plan.disaggregation=maybe"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan.disaggregation" in err


def test_plan_on_a_dask_cluster_matches_in_process(make_scenario):
    distributed = pytest.importorskip("distributed", reason="needs the distributed package")
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm"], disaggregation=True)
    with (
        distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        on_dask = plan_capacity(scenario, client=client)
    pd.testing.assert_frame_equal(on_dask, plan_capacity(scenario, workers=1))
    with pytest.raises(InfersimError, match="not both"):
        plan_capacity(scenario, client=client, workers=2)


def test_the_70b_plan_sizes_tp4_fleets_at_two_replicas():
    """One H100 or H200 tp=4 replica carries ~10 req/s of this traffic: 12 req/s (10 +20%
    headroom) needs 2, which verification must not inflate to 3 by mistaking a short
    probe's warm-up for overload."""
    scenario = Scenario.from_yaml(
        ROOT / "scenarios" / "capacity-plan-llama70b.yaml",
        ["plan.gpus=[h100-sxm, h200-sxm]", "plan.tp=[4]"],
    )
    table = plan_capacity(scenario, workers=1)
    assert (table["status"] == "ok").all(), table["reason"].tolist()
    assert table.set_index("gpu")["replicas"].to_dict() == {"h100-sxm": 2, "h200-sxm": 2}
    assert (table["replica_capacity_rps"] > 6).all()


def test_plan_cli_exits_non_zero_when_no_candidate_is_feasible(tmp_path, capsys):
    """plan.json records what plan.csv came from, as a run's summary.json does: the
    build, the overrides and each file read, pinned by its sha256."""
    import hashlib
    import json
    import shutil

    from simulator.build_id import build_id
    from simulator.model_catalog import CATALOG_DIR

    path = tmp_path / "plan.yaml"
    shutil.copy(CATALOG_DIR / "llama-3.1-405b.yaml", tmp_path / "m.yaml")
    data = scenario_dict(slo={"ttft_ms": 1500}, model={"name": "m.yaml"},
                         plan={"gpus": ["l4"], "tp": [1], "requests_per_probe": 100})  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    argv = ["plan", str(path), "-o", str(tmp_path / "out"), "--workers", "1"]
    assert main([*argv, "--set", "seed=3"]) == 1
    captured = capsys.readouterr()
    assert "infeasible" in captured.out
    assert "no candidate meets the SLOs" in captured.err
    assert (tmp_path / "out" / "plan.csv").is_file()
    made = json.loads((tmp_path / "out" / "plan.json").read_text())["provenance"]
    digest = hashlib.sha256((tmp_path / "m.yaml").read_bytes()).hexdigest()
    assert made["inputs"] == [{"field": "model.name", "path": "m.yaml", "sha256": digest}]
    assert made["build_id"] == build_id() and made["overrides"] == ["seed=3"]
    assert made["scenario"]["seed"] == 3 and made["scenario"]["plan"]["gpus"] == ["l4"]


@pytest.mark.parametrize("quiet", [False, True])
def test_plan_cli_shows_its_progress_on_a_terminal_unless_quiet(tmp_path, capsys, monkeypatch,
                                                                quiet):  # fmt: skip
    path = tmp_path / "plan.yaml"
    plan = {"gpus": ["l4"], "tp": [1, 2], "requests_per_probe": 100}
    data = scenario_dict(slo={"ttft_ms": 1500}, model={"name": "llama-3.1-405b"}, plan=plan)
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    argv = ["plan", str(path), "-o", str(tmp_path / "out"), "--workers", "1"]
    assert main([*argv, "--quiet"] if quiet else argv) == 1
    err = capsys.readouterr().err
    assert ("plan test:" in err and "/2 [" in err) is not quiet  # the bar, on candidates
    assert ("planning 2 candidates" in err) is not quiet


@pytest.mark.parametrize("workers", ["1", "2"])
def test_plan_cli_names_each_candidates_warnings_once_from_any_worker(tmp_path, capfd, workers):
    """A warning a candidate's probes raise (here pp's split of max_num_seqs, on every
    probe) shows once, naming the candidates that raised it, whether they ran in this
    process or in a worker."""
    path = tmp_path / "plan.yaml"
    plan = {"gpus": ["a100-80gb-sxm", "h100-sxm"], "tp": [1], "pp": [2], "requests_per_probe": 100}
    data = scenario_dict(slo={"ttft_ms": 1500, "tpot_ms": 60}, serving={"max_num_seqs": 7},
                         plan=plan)  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    argv = ["plan", str(path), "-o", str(tmp_path / "out"), "--workers", workers, "--quiet"]
    assert main(argv) == 0
    err = capfd.readouterr().err
    assert "InfersimWarning" not in err  # nothing printed raw by a worker
    split = "parallelism.pp=2: serving.max_num_seqs=7 is split as [4, 3]"
    assert err.count(f"infersim: warning: every candidate: {split}") == 1, err
    assert err.count(split) == 1


def test_a_replica_of_dp_ranks_counts_and_prices_all_its_gpus(make_scenario):
    """parallelism.dp = 2: every probe runs two data-parallel ranks per replica, so a
    replica is tp x dp GPUs and is priced as such."""
    scenario = _plan_scenario(make_scenario, gpus=["h100-sxm"], tp=[1])
    scenario = scenario.with_overrides(["parallelism.dp=2"])
    row = plan_capacity(scenario, workers=1).iloc[0]
    assert row["status"] == "ok"
    assert row["gpus"] == 2 * row["replicas"]
    price = load_gpu("h100-sxm").price.usd_per_hour
    assert row["usd_per_hour"] == pytest.approx(row["gpus"] * price)
    assert row["dp"] == 2


def _summary(
    verdict: str, unserved: float | None, detectable: float, p50_s: float,
    in_system: dict | None = None,
) -> dict:  # fmt: skip
    """A waiting queue that rose by `unserved` over 100 s at 10 req/s (p = 1e-4)."""
    load = {"window_s": 100.0, "offered_requests_per_s": 10.0, "trend_p_value": 1e-4,
            "queue_growth_per_s": 10.0 * (unserved or 0.0), "unserved_share": unserved,
            "detectable_unserved_share": detectable}  # fmt: skip
    load["in_system"] = in_system or {"verdict": "stable", "ramp_over": True, "arrivals": 0}
    return {"overload_verdict": verdict, "load": load, "latency": {"e2e": {"p50": p50_s}}}


def test_a_probe_too_short_to_judge_is_run_long_enough_to_see_its_rise():
    from simulator.planner import _requests_needed

    # Little's law alone: 5 turnovers of rate x time in system
    assert _requests_needed(_summary("stable", 0.001, 0.2, 2.0), 10.0, 1_000) == 100
    # a 5% rise where 1,000 arrivals can only see 10%: 4x the arrivals halve the limit
    assert _requests_needed(_summary("too_short_to_judge", 0.05, 0.1, 2.0), 10.0, 1_000) == 4_000


def test_a_probe_ended_within_its_ramp_is_run_past_it():
    """Requests in the system still rising over a ramp of 30 s: a verdict needs arrivals
    over the ramp and then RAMPS_TO_JUDGE (3) ramps and 1,000 arrivals at least."""
    from simulator.planner import _requests_needed

    ramp = {"verdict": "too_short_to_judge", "ramp_over": False, "ramp_end_s": 30.0,
            "arrivals": 1_200}  # fmt: skip
    summary = _summary("too_short_to_judge", 0.0, 0.1, 2.0, in_system=ramp)
    # the ramp ends tau after the first 10% of arrivals (30 s at 10 req/s: tau = 27 s) and
    # lengthens with the run: T >= 4 tau / (1 - 4 x 10%) = 180 s, 1,800 requests, +10%
    assert _requests_needed(summary, 10.0, 300) == 1_980
    # at 50 req/s 300 requests take 6 s (tau = 29.4 s): 196 s, 9,800 requests, +10%
    assert _requests_needed(summary, 50.0, 300) == pytest.approx(10_780, abs=1)
    # a run judged stable within its ramp saw no steady state either: run past it
    stable = _summary("stable", 0.0, 0.1, 2.0, in_system={**ramp, "verdict": "stable"})
    assert _requests_needed(stable, 10.0, 300) == 1_980


def test_a_probe_held_at_the_request_cap_says_so_in_the_plan(make_scenario, monkeypatch):
    from simulator import planner

    monkeypatch.setattr(planner, "MAX_PROBE_REQUESTS", 120)
    monkeypatch.setattr(planner, "STEADY_TURNOVERS", 500)  # asks for far more than the cap
    table = plan_capacity(_plan_scenario(make_scenario, gpus=["a100-80gb-sxm"]), workers=1)
    ok = table[table["status"].isin(["ok", "unverified"])]
    assert not ok.empty
    assert ok["note"].str.contains("verified with 120 requests where a steady-state").all()
    assert set(ok["overload_verdict"]) <= {"stable", "too_short_to_judge"}
    # a fleet whose probe could not be judged is not `ok`: it is unverified
    short = ok["overload_verdict"] == "too_short_to_judge"
    assert (ok.loc[short, "status"] == "unverified").all()
    assert (ok.loc[ok["status"] == "ok", "overload_verdict"] == "stable").all()


def test_unverified_fleets_rank_after_verified_ones_and_ties_by_cost_per_token():
    """A fleet too short to judge ranks after every verified one, however cheap; equal
    $/hour ranks by $ per 1M output tokens, not by the order the GPUs were given."""
    from simulator.planner import _ranked

    rows = [
        ("h100-sxm", "ok", 16.0, 2.6), ("h200-sxm", "ok", 16.0, 2.1),
        ("l4", "unverified", 4.0, 1.0), ("a100-80gb-sxm", "infeasible", None, None),
        ("b200", "ok", 20.0, 1.5),
    ]  # fmt: skip
    table = pd.DataFrame(
        [{"gpu": g, "tp": 8, "layout": "colocated", "status": st, "usd_per_hour": usd,
          "usd_per_million_output_tokens": per_m, "replicas": 1 if usd else None,
          "ttft_p99_ms": 100.0, "tpot_p99_ms": 20.0} for g, st, usd, per_m in rows]
    )  # fmt: skip
    ranked = _ranked(table, "p99")
    assert ranked["gpu"].tolist() == ["h200-sxm", "h100-sxm", "b200", "l4", "a100-80gb-sxm"]
    assert ranked["rank"].tolist()[:4] == [1, 2, 3, 4] and pd.isna(ranked["rank"].iloc[4])
    assert str(ranked["replicas"].dtype) == "Int64"  # counts print as 1, not 1.0


def test_prices_equal_to_the_cent_rank_by_cost_per_token():
    """Summed per GPU, one fleet's $/hour came out 42.959999999999994 and the other's
    42.96 (`infersim plan scenarios/capacity-plan-llama70b.yaml`): the same price."""
    from simulator.planner import _ranked

    table = pd.DataFrame(
        [{"gpu": "a100-80gb-sxm", "tp": tp, "layout": "colocated", "status": "ok",
          "usd_per_hour": usd, "usd_per_million_output_tokens": per_m, "replicas": n,
          "ttft_p99_ms": 100.0, "tpot_p99_ms": 20.0}
         for tp, n, usd, per_m in ((4, 6, 42.959999999999994, 4.12), (8, 3, 42.96, 3.97))]
    )  # fmt: skip
    assert table["usd_per_hour"].iloc[0] < table["usd_per_hour"].iloc[1]
    assert _ranked(table, "p99")["tp"].tolist() == [8, 4]


def test_an_infeasible_candidate_names_the_slo_it_missed_and_what_it_reached(make_scenario):
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm"]).with_overrides(
        ["slo.tpot_ms=1"]
    )
    row = plan_capacity(scenario, workers=1).iloc[0]
    assert row["status"] == "infeasible"
    reason = re.fullmatch(
        r"one replica misses the SLO even at the lowest probed rate \(([\d.]+) req/s\): "
        r"TPOT p99 ([\d.]+) ms > 1 ms",
        row["reason"],
    )
    assert reason, row["reason"]
    assert float(reason[1]) < 6.6 and float(reason[2]) > 1


def test_plan_table_marks_a_capped_capacity_and_the_ep_size(make_scenario):
    """A replica meeting the SLOs at the planned rate itself was probed no higher: its
    capacity is a lower bound, `capacity_capped`. With expert parallelism the table has
    the EP size (tp x dp)."""
    scenario = make_scenario(
        model={"name": "qwen3-30b-a3b"},
        parallelism={"enable_expert_parallel": True},
        slo={"ttft_ms": 5000, "tpot_ms": 200},
        workload={"arrivals": {"kind": "poisson", "rate_per_s": 1.0}},
        plan={"gpus": ["h100-sxm"], "tp": [2], "requests_per_probe": 100},
    )
    row = plan_capacity(scenario, workers=1).iloc[0]
    assert row["status"] in ("ok", "unverified"), row["reason"]
    assert row["ep"] == 2 and row["dp"] == 1
    assert row["capacity_capped"] and row["replica_capacity_rps"] == pytest.approx(
        1.2
    )  # 1 req/s +20%


def test_a_price_per_gpu_type_prices_each_pool_by_its_gpu(make_scenario):
    """cost.usd_per_gpu_hour as {gpu: price}: each replica at its GPU's price; a GPU the
    mapping leaves out keeps its preset's."""
    pools = [
        {"name": "a", "hardware": {"gpu": "h100-sxm"}, "tp": 1, "replicas": 1},
        {"name": "b", "hardware": {"gpu": "a100-80gb-sxm"}, "tp": 2, "replicas": 1},
    ]
    scenario = make_scenario(
        pools=pools, hardware=None, cost={"usd_per_gpu_hour": {"H100-SXM": 2.0}},
        workload={"num_requests": 20},
    )  # fmt: skip
    summary = simulate(scenario).summary()
    a100 = load_gpu("a100-80gb-sxm").price.usd_per_hour
    assert summary["cost"]["usd_per_hour"] == pytest.approx(2.0 + 2 * a100)


ALLOWED_PRICES = "expected a number, or a mapping GPU name -> number > 0 (e.g. {h100-sxm: 2.0})"


@pytest.mark.parametrize(
    ("price", "error"),
    [
        ({"h100": 2.0}, "cost.usd_per_gpu_hour: unknown gpu 'h100'; did you mean 'h100-sxm'?"),
        ({"h100-sxm": 0}, "cost.usd_per_gpu_hour: h100-sxm: expected a price above 0"),
        (-1.0, "cost.usd_per_gpu_hour: expected a price above 0 USD per GPU-hour (got -1.0)"),
        ("x", f"cost.usd_per_gpu_hour: not a price: {ALLOWED_PRICES} (got 'x')"),
        ([1, 2], f"cost.usd_per_gpu_hour: not a price: {ALLOWED_PRICES}"),
        (
            {"h100-sxm": "abc"},
            f"cost.usd_per_gpu_hour: h100-sxm: not a price ('abc'): {ALLOWED_PRICES}",
        ),
        ({"h100-sxm": True}, "cost.usd_per_gpu_hour: h100-sxm: not a price (True)"),
    ],
)
def test_a_bad_price_is_refused_naming_the_field(price, error):
    """One line, one field: not pydantic's try at each member of the union
    (`cost.usd_per_gpu_hour.float: ...; cost.usd_per_gpu_hour.dict[str,float]...`)."""
    with pytest.raises(InfersimError, match=re.escape(error)) as info:
        Scenario.from_dict(scenario_dict(cost={"usd_per_gpu_hour": price}))
    assert ".float" not in str(info.value) and "dict[" not in str(info.value)


def test_one_price_for_several_gpu_types_warns(make_scenario):
    """A scalar price makes a plan (or a sweep or comparison) over GPUs rank them on equal
    prices: it says so; a price per GPU type does not warn."""
    plan = {"gpus": ["h100-sxm", "h200-sxm"], "tp": [8]}
    with pytest.warns(InfersimWarning, match=r"usd_per_gpu_hour=2 prices every GPU type alike "
                      r"\(h100-sxm, h200-sxm\)"):  # fmt: skip
        make_scenario(slo={"tpot_ms": 50}, plan=plan, cost={"usd_per_gpu_hour": 2.0})
    with pytest.warns(InfersimWarning, match=r"alike \(a100-80gb-sxm, h100-sxm\)"):
        make_scenario(variants={"h100": {"hardware.gpu": "h100-sxm"}, "same": {}},
                      cost={"usd_per_gpu_hour": 2.0})  # fmt: skip
    with pytest.warns(InfersimWarning, match=r"alike \(a100-80gb-sxm, l4\)"):
        make_scenario(sweep={"grid": {"hardware.gpu": ["l4", "a100-80gb-sxm"]}},
                      cost={"usd_per_gpu_hour": 2.0})  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_scenario(plan=plan, cost={"usd_per_gpu_hour": {"h100-sxm": 2.0, "h200-sxm": 2.6}})
        make_scenario(cost={"usd_per_gpu_hour": 2.0})  # one GPU type


def test_a_trace_is_planned_at_its_own_rate_or_replayed_at_the_target(make_scenario, tmp_path):
    """Trace arrivals: each probe replays the trace with time_scale set so that its mean
    rate is the probe's; the plan's rate is the trace's own (at its time_scale) unless
    plan.target_rate_per_s is given; no probe asks for more requests than it has."""
    from simulator.planner import _max_requests, planned_rate

    path = tmp_path / "trace.csv"
    times = np.cumsum(np.random.default_rng(1).exponential(0.5, 400))  # ~2 req/s
    path.write_text("arrived_at\n" + "\n".join(f"{t:.6f}" for t in times) + "\n")
    arrivals = {"kind": "trace", "path": str(path), "time_scale": 2.0}
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm"]).with_overrides(
        [f"workload.arrivals={json.dumps(arrivals)}"]
    )
    native = 399 / (times[-1] - times[0])
    assert planned_rate(scenario) == pytest.approx(native / 2)  # slowed down twice
    assert _max_requests(scenario) == 400
    probe = _at(scenario, Candidate("h100-sxm", 1, 1, "continuous"), 6.0, 1, 300)
    first_300 = 299 / (times[299] - times[0])  # the rows the probe replays
    assert probe.workload.arrivals.time_scale == pytest.approx(first_300 / 6.0)
    table = plan_capacity(scenario.with_overrides(["plan.target_rate_per_s=3"]), workers=1)
    row = table.iloc[0]
    assert row["status"] in ("ok", "unverified"), row["reason"]
    assert row["replicas"] >= 1


def test_an_edited_trace_is_planned_at_its_new_rate(make_scenario, tmp_path):
    """The planner reads a trace once per version of the file, not once a process: a
    trace edited between two plans in one notebook is planned at its new rate."""
    from simulator.planner import planned_rate

    path = tmp_path / "trace.csv"
    arrivals = {"kind": "trace", "path": str(path)}
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm"]).with_overrides(
        [f"workload.arrivals={json.dumps(arrivals)}"]
    )
    rates = []
    for gap_s, rows in ((0.5, 400), (0.25, 300)):
        path.write_text("arrived_at\n" + "".join(f"{i * gap_s:.6f}\n" for i in range(rows)))
        rates.append(planned_rate(scenario))
    assert rates == [pytest.approx(2.0), pytest.approx(4.0)]


def _bursty_trace(path: Path, quiet: int = 300, burst: int = 900) -> Path:
    """`quiet` requests at 1 req/s, then `burst` at 25 req/s."""
    times = np.concatenate([np.arange(quiet) * 1.0, quiet + np.arange(burst) / 25.0])
    path.write_text("arrived_at\n" + "\n".join(f"{t:.6f}" for t in times) + "\n")
    return path


def test_a_probe_of_a_trace_offers_the_rate_it_names(make_scenario, tmp_path):
    """A probe replays the trace's first n rows: it is scaled by their rate, not by the
    whole trace's (a quiet start would be offered at a fraction of the rate named), and
    the simulated arrivals run at the rate named."""
    path = _bursty_trace(tmp_path / "bursty.csv")
    arrivals = {"kind": "trace", "path": str(path)}
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm"]).with_overrides(
        [f"workload.arrivals={json.dumps(arrivals)}"]
    )
    probe = _at(scenario, Candidate("a100-80gb-sxm", 1, 1, "chunked_prefill"), 5.0, 1, 200)
    assert probe.workload.arrivals.time_scale == pytest.approx(1 / 5.0)
    offered = simulate(probe).summary()["load"]["offered_requests_per_s"]
    assert offered == pytest.approx(5.0, rel=0.1)


def test_a_plan_warns_where_the_trace_windows_probed_misstate_the_trace(make_scenario, tmp_path):
    """A window replayed at a rate 1.5x or more from the whole trace's (a quiet start
    before a burst) makes every probe replay the whole trace, said once before the search;
    a trace shorter than a probe is said too."""
    from simulator.planner import _check_trace_window, _least_probe

    path = _bursty_trace(tmp_path / "bursty.csv")
    arrivals = {"kind": "trace", "path": str(path)}
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm"]).with_overrides(
        [f"workload.arrivals={json.dumps(arrivals)}", "plan.requests_per_probe=200"]
    )
    with pytest.warns(
        InfersimWarning,
        match=r"its first 200 requests arrive at 1.00 req/s.*1,200 at 3.57.*"
        r"every probe replays the whole trace \(1,200 requests\)",
    ) as w:
        _check_trace_window(scenario)
    assert len(w) == 1
    assert _least_probe(scenario) == 1200
    steady = tmp_path / "steady.csv"
    steady.write_text("arrived_at\n" + "\n".join(f"{t / 4:.6f}" for t in range(300)) + "\n")
    even = scenario.with_overrides([f"workload.arrivals.path={steady}"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_trace_window(even)
    assert _least_probe(even) == 0
    short = even.with_overrides(["plan.requests_per_probe=500"])
    with pytest.warns(InfersimWarning, match=r"300 requests, fewer than plan.requests_per_probe"):
        _check_trace_window(short)


def test_a_probe_of_the_whole_trace_is_judged_by_the_trace_not_a_steady_state():
    """A bursty trace replayed whole is the workload: meeting the SLOs over all of it,
    not overloaded, verifies it, though its queue never settles into a steady state."""
    from simulator.planner import Probe

    unsettled = {
        "overload_verdict": "too_short_to_judge",
        "load": {"in_system": {"ramp_over": False}},
    }
    assert Probe(True, unsettled, whole_trace=True).verified
    assert not Probe(True, unsettled).verified
    overloaded = {**unsettled, "overload_verdict": "overloaded"}
    assert not Probe(True, overloaded, whole_trace=True).verified
    assert not Probe(False, unsettled, whole_trace=True).verified


def _fake_probe(verified_to: float, unjudged_to: float):
    """A replica that meets the SLOs, judged stable, up to `verified_to` req/s, meets them
    in probes too short to judge up to `unjudged_to`, and misses them above."""
    from simulator.planner import Probe

    def probe(scenario, c, rate, fleet, n=None):
        judged = "stable" if rate <= verified_to else "too_short_to_judge"
        summary = {"overload_verdict": judged, "load": {"in_system": {"ramp_over": True}}}
        return Probe(rate <= unjudged_to, summary)

    return probe


def test_the_capacity_bisection_counts_no_probe_too_short_to_judge_as_a_pass(
    make_scenario, monkeypatch
):
    """A probe that met the SLOs before its queue could show a rise is no pass: the
    capacity is the highest rate judged stable, said to be a lower bound, or unknown."""
    from simulator import planner

    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm"])
    c = Candidate("a100-80gb-sxm", 1, 1, "chunked_prefill")
    monkeypatch.setattr(planner, "_probe", _fake_probe(verified_to=4.0, unjudged_to=8.0))
    capacity = planner._replica_capacity(scenario, c, scenario.plan, 16.0)
    assert 4.0 / 1.08 <= capacity.rps <= 4.0 and 4.0 < capacity.unjudged <= 8.0
    assert not capacity.capped and capacity.sizing_rps == capacity.rps
    assert capacity.note().startswith(f"replica capacity at least {capacity.rps:.3g} req/s")
    monkeypatch.setattr(planner, "_probe", _fake_probe(verified_to=0.0, unjudged_to=8.0))
    unknown = planner._replica_capacity(scenario, c, scenario.plan, 16.0)
    assert unknown.rps == 0 and unknown.missed is None and unknown.sizing_rps > 0
    assert unknown.note().startswith("replica capacity unknown")
    # met and judged at the planned rate itself: capped there, nothing to say
    monkeypatch.setattr(planner, "_probe", _fake_probe(verified_to=20.0, unjudged_to=20.0))
    capped = planner._replica_capacity(scenario, c, scenario.plan, 16.0)
    assert (capped.rps, capped.capped, capped.note()) == (16.0, True, "")


def test_a_saturated_front_end_fails_a_probe(make_scenario):
    """API server processes busy 90% of the time or more capped the throughput (their
    token queue grows while the GPUs keep up): a probe there misses, and says why."""
    from simulator.planner import Probe, _meets, _misses

    scenario = _plan_scenario(make_scenario)
    summary = {"counts": {"arrived": 100, "completed": 100}, "overloaded": False,
               "latency": {"ttft": {"p99": 0.5}, "tpot": {"p99": 0.02}, "e2e": {}},
               "frontend": {"utilisation": 0.5}}  # fmt: skip
    assert _meets(summary, scenario, "p99")
    busy = {**summary, "frontend": {"utilisation": 0.97}}
    assert not _meets(busy, scenario, "p99")
    assert _misses(Probe(False, busy), scenario, "p99") == (
        "API server processes 97% busy (frontend.api_server_count)"
    )


def test_plan_cli_asks_for_a_longer_trace_where_the_trace_held_the_probes(tmp_path, capsys):
    """Probes are capped at a trace's length: raising plan.requests_per_probe cannot
    lengthen them, so the advice is a longer trace."""
    path = _bursty_trace(tmp_path / "short.csv", quiet=0, burst=120)
    data = scenario_dict(
        slo={"ttft_ms": 1500, "tpot_ms": 60},
        workload={"arrivals": {"kind": "trace", "path": str(path)}},
        plan={"gpus": ["a100-80gb-sxm"], "tp": [1], "requests_per_probe": 100,
              "target_rate_per_s": 20},
    )  # fmt: skip
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(data))
    argv = ["plan", str(tmp_path / "plan.yaml"), "-o", str(tmp_path / "out"), "--workers", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "(the whole trace)" in " ".join(captured.out.split())
    assert "no candidate was verified" in captured.err
    assert "replay a longer trace" in captured.err


def test_a_fleet_is_priced_per_token_at_the_planned_rate_not_the_verified_one(make_scenario):
    """Latencies are the verifying probe's, at target x (1 + headroom); the price per
    token is what the planned traffic pays: a run of the fleet at the planned rate."""
    scenario = _plan_scenario(make_scenario, gpus=["a100-80gb-sxm"], headroom=0.5)
    row = plan_capacity(scenario, workers=1).iloc[0]
    assert row["status"] in ("ok", "unverified"), row["reason"]
    check = scenario.with_overrides(
        [f"hardware.gpu={row['gpu']}", f"parallelism.replicas={int(row['replicas'])}",
         "parallelism.router=least_outstanding", f"serving.policy={row['policy']}",
         "workload.num_requests=600"]
    )  # fmt: skip
    at_planned = simulate(check, progress=False).summary()["cost"]
    assert row["usd_per_hour"] == pytest.approx(at_planned["usd_per_hour"])
    # the probe at 9 req/s would give 1 / 1.5 of it
    assert row["usd_per_million_output_tokens"] == pytest.approx(
        at_planned["usd_per_million_output_tokens"], rel=0.1
    )


def test_plan_cli_prints_reasons_and_notes_as_footnotes_and_each_warning_once(tmp_path, capsys):
    """Long reasons and notes are footnotes keyed from the `see` column, not columns that
    push the rows apart; an infeasible row shows '-' for what it lacks; the `unverified`
    legend shows only where a row is; a warning the plan raised before its candidates
    (reading its trace) is not repeated per candidate; --help says once what 1 worker
    does."""
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "arrived_at\n" + "\n".join(f"{1_700_000_000 + t / 6:.3f}" for t in range(400)) + "\n"
    )
    data = scenario_dict(
        slo={"ttft_ms": 1500, "tpot_ms": 60},
        workload={"arrivals": {"kind": "trace", "path": str(trace)}},
        model={"name": "llama-3.1-70b"},
        plan={"gpus": ["a100-80gb-sxm"], "tp": [1, 4], "requests_per_probe": 100},
    )  # fmt: skip
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(data))
    argv = ["plan", str(tmp_path / "plan.yaml"), "-o", str(tmp_path / "out"), "--workers", "1"]
    assert main([*argv, "--quiet"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert max(map(len, lines)) <= 100
    assert "<NA>" not in captured.out
    infeasible = next(line for line in lines if "infeasible" in line and "[" in line)
    mark = re.search(r"\[\d\]", infeasible).group()
    assert any(
        line.startswith(f"{mark} a100-80gb-sxm tp1 colocated (infeasible): ") for line in lines
    )
    table = pd.read_csv(tmp_path / "out" / "plan.csv")
    assert ("unverified" in table["status"].tolist()) == any(
        line.startswith("unverified: ") for line in lines
    )
    assert captured.err.count("replayed from its earliest request") == 1
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert " ".join(capsys.readouterr().out.split()).count("runs in this process") == 1


def test_plan_takes_the_stop_condition_from_the_file_or_a_set_alike(tmp_path, capsys):
    """The scenario needs a stop condition (`infersim run` of it runs that); the probes run
    their own lengths. A --set of it is accepted as the file's is, and said to leave the
    probes alone; without either, the error says both ways to give it."""
    data = scenario_dict(
        slo={"ttft_ms": 1500, "tpot_ms": 60},
        plan={"gpus": ["a100-80gb-sxm"], "tp": [1], "requests_per_probe": 100},
    )  # fmt: skip
    del data["workload"]["num_requests"]
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(data))
    argv = ["plan", str(tmp_path / "plan.yaml"), "-o", str(tmp_path / "out"), "--workers", "1"]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "give a stop condition" in err and "--set workload.num_requests=N" in err
    assert main([*argv, "--quiet", "--set", "workload.num_requests=50"]) == 0
    err = capsys.readouterr().err
    assert "plan: --set workload.num_requests=50: each probe runs plan.requests_per_probe" in err
