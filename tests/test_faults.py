"""Replica failures: requests are retried elsewhere or counted as failed, never lost."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.simulation import simulate

LOAD = {"arrivals": {"kind": "poisson", "rate_per_s": 12.0}, "num_requests": 500}


def _faulty(make_scenario, events, on_failure="retry", policy="chunked_prefill", **extra):
    return make_scenario(
        parallelism={"replicas": 2, "router": "round_robin"},
        serving={
            "policy": policy,
            "max_num_seqs": 32,
            "max_num_batched_tokens": 2048,
            "max_model_len": 2048,
        },
        workload=LOAD,
        faults={"events": events, "on_failure": on_failure},
        **extra,
    )


def _accounted(results) -> None:
    req = results.requests
    counts = req["outcome"].value_counts()
    assert counts.sum() == len(req) == 500
    assert counts.get("in_flight", 0) == 0


@pytest.mark.parametrize("policy", ["chunked_prefill", "continuous", "static", "dynamic"])
def test_a_dead_replica_costs_retries_not_requests(make_scenario, policy):
    results = simulate(_faulty(make_scenario, [{"replica": 0, "at_s": 15.0}], policy=policy))
    _accounted(results)
    req, steps = results.requests, results.steps
    assert (req["outcome"] == "completed").all()
    assert req["retries"].sum() > 0
    dead = steps[steps["replica"] == 0]
    assert (dead["start"] + dead["duration"] <= 15.0 + 1e-9).all()
    late = req[req["arrival"] > 15.0]
    assert (late["replica"] == 1).all()
    retried = req[req["retries"] > 0]
    assert (retried["replica"] == 1).all() and (retried["generated"] == retried["output"]).all()


def test_fail_policy_counts_the_lost_requests(make_scenario):
    results = simulate(_faulty(make_scenario, [{"replica": 0, "at_s": 15.0}], "fail"))
    _accounted(results)
    failed = results.requests[results.requests["outcome"] == "failed"]
    assert len(failed) > 0
    assert failed["reason"].str.contains("replica failed").all()
    assert np.allclose(failed["finish"], 15.0)
    assert results.summary()["counts"]["failed"] == len(failed)


def test_a_replica_recovers_empty_and_serves_again(make_scenario):
    results = simulate(_faulty(make_scenario, [{"replica": 0, "at_s": 10.0, "recover_at_s": 25.0}]))
    _accounted(results)
    zero = results.steps[results.steps["replica"] == 0]
    ends = zero["start"] + zero["duration"]
    assert not ((zero["start"] >= 10.0) & (zero["start"] < 25.0)).any()
    assert (ends[zero["start"] < 10.0] <= 10.0 + 1e-9).all()
    assert (zero["start"] >= 25.0).any()


def test_with_every_replica_down_arrivals_fail_with_a_reason(make_scenario):
    events = [{"replica": 0, "at_s": 5.0}, {"replica": 1, "at_s": 5.0}]
    results = simulate(_faulty(make_scenario, events, "fail"))
    _accounted(results)
    req = results.requests
    late = req[req["arrival"] > 5.0]
    assert (late["outcome"] == "failed").all()
    assert late["reason"].str.contains("no healthy replica").all()


def test_faults_give_the_same_results_step_by_step(make_scenario):
    events = [{"replica": 0, "at_s": 12.3, "recover_at_s": 20.0}, {"replica": 1, "at_s": 30.0}]
    fast = simulate(_faulty(make_scenario, events))
    slow = simulate(_faulty(make_scenario, events, engine={"multi_step": False}))
    cols = ["first_token", "finish", "generated", "retries", "replica", "outcome"]
    pd.testing.assert_frame_equal(fast.requests[cols], slow.requests[cols])
    np.testing.assert_array_equal(fast.steps["duration"], slow.steps["duration"])


def test_a_fault_on_a_missing_replica_is_a_clear_error(make_scenario):
    from hardware_models.errors import InfersimError

    with pytest.raises(InfersimError, match=r"faults.events.0.replica: 5 is not a replica"):
        _faulty(make_scenario, [{"replica": 5, "at_s": 1.0}])


def test_failed_and_retried_requests_show_in_the_summary_and_compare_table(make_scenario):
    """The goodput line counts against the arrived requests, so a failed one is a miss,
    and the summary and compare table say how many failed and how many were retried."""
    from simulator.compare import compare_table

    runs = {
        policy: simulate(_faulty(make_scenario, [{"replica": 0, "at_s": 15.0}], policy))
        for policy in ("retry", "fail")
    }
    retry, fail = (runs[k].summary() for k in ("retry", "fail"))
    assert 0 < retry["counts"]["retried"] <= retry["counts"]["retries"]
    assert fail["counts"]["retried"] == 0 and fail["counts"]["failed"] > 0
    text = " ".join(runs["fail"].summary_table().split())  # as one line, unwrapped
    good = fail["goodput"]
    assert f"{good['requests_meeting_slo']:,} of 500 arrived" in text
    assert f"failed {fail['counts']['failed']:,} retried 0" in text
    assert f"completed; {fail['counts']['failed']:,} failed" in text
    assert f"retried {retry['counts']['retried']:,}" in runs["retry"].summary_table()
    table = compare_table(runs)
    assert table.loc["retry", "retried"] == retry["counts"]["retried"]
    assert table.loc["fail", "goodput_fraction_of_arrived"] == good["fraction_of_arrived"]
    assert table.loc["fail", "goodput_fraction_of_arrived"] < table.loc["fail", "goodput_fraction"]
    html = runs["fail"]._repr_html_()  # a notebook shows both too
    assert f"failed {fail['counts']['failed']:,}  retried 0" in html
    assert f"completed; {fail['counts']['failed']:,} failed" in html


def test_a_fault_after_the_run_ends_is_a_warning(make_scenario):
    with pytest.warns(UserWarning, match=r"faults.events\[0\]: at_s=500 s is after the run's end"):
        results = simulate(_faulty(make_scenario, [{"replica": 0, "at_s": 500.0}]))
    assert any("never failed" in w for w in results.summary()["warnings"])


def test_the_cli_prints_a_warning_the_summary_holds_once_on_each_stream(tmp_path, capsys):
    """The summary's `warning:` line (stdout), and one `infersim: warning:` line on stderr,
    where every command says its warnings."""
    import yaml

    from simulator.cli.main import main
    from tests.conftest import scenario_dict

    data = scenario_dict(workload={**LOAD, "num_requests": 40},
                         faults={"events": [{"replica": 0, "at_s": 500.0}]})  # fmt: skip
    path = tmp_path / "late-fault.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "--quiet", "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("never failed") == captured.err.count("never failed") == 1
    assert "warning: faults.events[0]" in captured.out
    assert "infersim: warning: faults.events[0]" in captured.err
