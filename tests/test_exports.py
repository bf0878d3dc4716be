"""Outputs other tools read: a Chrome/Perfetto trace and a vLLM `bench serve` result JSON;
and simulate() taking a scenario file's path."""

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

import simulator as sim
from hardware_models.errors import InfersimError
from simulator.cli.main import main
from simulator.formats import vllm_bench
from simulator.formats.chrome_trace import chrome_trace
from simulator.formats.vllm_bench import bench_result, request_itls
from simulator.metrics.writer import summary_json
from simulator.replay.bench_json import read_bench_json
from simulator.scenario import Scenario
from tests.conftest import scenario_dict


@pytest.fixture(scope="module")
def results():
    return sim.simulate(Scenario.from_dict(scenario_dict()), progress=False)


def test_simulate_takes_a_path_or_a_string(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(scenario_dict(workload={"num_requests": 30})))
    by_str = sim.simulate(str(path), progress=False)
    by_path = sim.simulate(path, progress=False)
    assert summary_json(by_str.summary(), include_wall_time=False) == summary_json(
        by_path.summary(), include_wall_time=False
    )
    assert by_path.scenario.base_dir == str(tmp_path.resolve())  # paths inside resolve there
    with pytest.raises(InfersimError, match=r"no-such\.yaml"):
        sim.simulate("no-such.yaml")


# ---- Chrome / Perfetto trace -------------------------------------------------------------


def test_trace_events_have_the_format_fields(results):
    trace = chrome_trace(results)
    events = trace.document["traceEvents"]
    assert trace.dropped == 0 and trace.document["otherData"]["truncated_at_s"] is None
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= e.keys() and e["ph"] in "XCM"
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    steps = [e for e in events if e["ph"] == "X" and e["tid"] == 0]
    assert len(steps) == len(results.steps)
    # microseconds of simulated time
    first = results.steps.iloc[0]
    assert steps[0]["ts"] == pytest.approx(first["start"] * 1e6)
    assert steps[0]["dur"] == pytest.approx(first["duration"] * 1e6)
    assert {"batch_size", "prefill_tokens", "decode_tokens", "kv_blocks_used"} <= steps[0][
        "args"
    ].keys()
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"batch", "kv_blocks_used"}
    # every completed request has its three phases, and a lane never overlaps itself
    lifetimes = [e for e in events if e["ph"] == "X" and e["tid"] > 0]
    completed = int((results.requests["outcome"] == "completed").sum())
    assert sum(e["name"] == "decode" for e in lifetimes) == completed
    by_lane: dict = {}
    for e in sorted(lifetimes, key=lambda e: e["ts"]):
        by_lane.setdefault((e["pid"], e["tid"]), []).append(e)
    for lane in by_lane.values():
        for a, b in itertools.pairwise(lane):
            if a["args"]["request"] != b["args"]["request"]:
                assert a["ts"] + a["dur"] <= b["ts"] + 1e-6
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert "engine steps" in names


def _process_names(trace) -> dict[int, str]:
    events = trace.document["traceEvents"]
    return {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}


def test_trace_names_a_dp_rank_as_a_rank_of_its_replica(results):
    """A data-parallel rank's engine is `replica j rank k` (`rank k` in a single replica),
    as the summary's rows and the terminal name it, not a replica of its own."""
    assert _process_names(chrome_trace(results)) == {0: "replica 0 (default, 1 x a100-80gb-sxm)"}
    data = scenario_dict(parallelism={"dp": 2, "replicas": 2}, workload={"num_requests": 40})
    dp = sim.simulate(Scenario.from_dict(data), progress=False)
    names = _process_names(chrome_trace(dp))
    assert [n.split(" (")[0] for _, n in sorted(names.items())] == [
        "replica 0 rank 0", "replica 0 rank 1", "replica 1 rank 0", "replica 1 rank 1"
    ]  # fmt: skip
    one = sim.simulate(Scenario.from_dict({**data, "parallelism": {"dp": 2}}), progress=False)
    assert sorted(_process_names(chrome_trace(one)).values())[1].startswith("rank 1 (")


def test_trace_is_cut_at_the_cap_and_says_where(results):
    trace = chrome_trace(results, max_events=500)
    assert len(trace.document["traceEvents"]) == trace.events <= 500  # names included
    events = [e for e in trace.document["traceEvents"] if e["ph"] != "M"]
    assert trace.dropped > 0 and len(events) > 400
    cut = trace.document["otherData"]["truncated_at_s"]
    assert cut == trace.cut_s and max(e["ts"] for e in events) < cut * 1e6
    assert trace.document["otherData"]["events_dropped"] == trace.dropped


def test_trace_needs_the_step_table():
    kept_none = sim.simulate(
        Scenario.from_dict(scenario_dict(output={"step_table": False})), progress=False
    )
    with pytest.raises(InfersimError, match=r"output\.step_table: true"):
        chrome_trace(kept_none)


# ---- vLLM bench serve result -------------------------------------------------------------


def test_bench_result_has_vllms_keys_and_figures(results):
    result = bench_result(results)
    for key in (
        *vllm_bench.SETUP_KEYS,
        *vllm_bench.RESULT_KEYS,
        *vllm_bench.DETAILED_KEYS,
        *vllm_bench.METRIC_KEYS,
    ):
        assert key in result, key
    for key in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "std_e2el_ms"):
        assert key in vllm_bench.METRIC_KEYS
    summary = results.summary()
    requests = results.requests
    done = requests["outcome"] == "completed"
    assert result["completed"] == summary["counts"]["completed"] == int(done.sum())
    assert result["completed"] + result["failed"] == result["num_prompts"] == len(requests)
    assert result["total_input_tokens"] == int(requests["prompt"][done].sum())
    assert result["total_output_tokens"] == int(requests["generated"][done].sum())
    assert result["request_throughput"] == pytest.approx(done.sum() / results.context.duration_s)
    assert result["mean_ttft_ms"] == pytest.approx(1000 * requests["ttft"][done].mean())
    assert result["median_ttft_ms"] == pytest.approx(1000 * requests["ttft"][done].median())
    assert result["std_ttft_ms"] == pytest.approx(1000 * requests["ttft"][done].std(ddof=0))
    assert result["p99_itl_ms"] == pytest.approx(1000 * summary["latency"]["itl"]["p99"])
    assert result["request_rate"] == 4.0 and result["burstiness"] == 1.0
    assert result["request_goodput"] is None  # no SLO, as vLLM without --goodput
    n = len(requests)
    assert all(len(result[key]) == n for key in vllm_bench.DETAILED_KEYS)


def test_per_request_itls_are_read_off_the_steps(results):
    itls, estimated = request_itls(results.requests, results.steps)
    requests = results.requests
    assert estimated == 0
    all_gaps = np.concatenate(itls)
    itl = results.itl
    # the same gaps as the engine logged, request by request
    assert len(all_gaps) == int(itl["weight"].sum())
    assert all_gaps.mean() == pytest.approx(np.average(itl["seconds"], weights=itl["weight"]))
    for i in np.flatnonzero((requests["outcome"] == "completed").to_numpy())[:50]:
        row = requests.iloc[i]
        assert len(itls[i]) == row["generated"] - 1
        assert row["first_token"] + itls[i].sum() == pytest.approx(row["last_token"])


def test_itls_without_a_step_table_are_estimated_and_counted():
    kept_none = sim.simulate(
        Scenario.from_dict(scenario_dict(output={"step_table": False})), progress=False
    )
    result = bench_result(kept_none)
    multi = int((kept_none.requests["generated"] > 1).sum())
    assert result[vllm_bench.ESTIMATED_ITLS_KEY] == multi > 0
    row = kept_none.requests.iloc[0]
    gaps = result["itls"][0]
    assert math.isclose(sum(gaps), row["last_token"] - row["first_token"], rel_tol=1e-9)


def test_goodput_uses_the_slo():
    with_slo = sim.simulate(
        Scenario.from_dict(scenario_dict(slo={"ttft_ms": 1e9, "tpot_ms": 1e9})), progress=False
    )
    result = bench_result(with_slo)
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])


def test_run_writes_both_files(tmp_path, capsys):
    scenario = tmp_path / "s.yaml"
    data = scenario_dict(workload={"num_requests": 40})
    scenario.write_text(json.dumps(data))
    trace, bench = tmp_path / "t.json", tmp_path / "b.json"
    args = ["run", str(scenario), "-o", str(tmp_path / "out"), "--quiet", "--no-plots"]
    assert main([*args, "--trace-out", str(trace), "--bench-json", str(bench),
                 "--trace-max-events", "100"]) == 0  # fmt: skip
    assert "trace cut at" in capsys.readouterr().err
    assert json.loads(trace.read_text())["otherData"]["events_dropped"] > 0
    assert json.loads(bench.read_text())["completed"] == 40
    assert main([*args, "--overwrite", "--bench-json", str(bench)]) == 0
    assert main([*args, "--overwrite", "--bench-json", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    no_steps = [*args, "--overwrite", "--set", "output.step_table=false"]
    assert main([*no_steps, "--trace-out", str(trace)]) == 2
    assert "--trace-out needs the run's per-step table" in capsys.readouterr().err


def test_peak_concurrency_is_exact_over_half_open_intervals():
    """As vLLM's calculate_metrics: requests in flight at once, each over [send, end), not
    every request that touched the same second (the two here never overlap)."""
    requests = pd.DataFrame({"arrival": [0.1, 0.9, 1.5], "finish": [0.5, 1.5, 2.0],
                             "first_token": [0.2, 1.0, 1.6]})  # fmt: skip
    completed = np.ones(3, dtype=bool)
    peaks = vllm_bench._peaks(requests, completed, [np.empty(0)] * 3)
    assert peaks["max_concurrent_requests"] == 1  # 1.5 ends one and starts the next
    requests.loc[2, "arrival"] = 1.4
    assert vllm_bench._peaks(requests, completed, [np.empty(0)] * 3)["max_concurrent_requests"] == 2


def test_a_constant_rate_writes_valid_json_that_replays(tmp_path, capsys):
    """burstiness of a constant rate is infinite: written "inf" as vLLM writes an infinite
    request_rate (a float infinity is not JSON), and read back as evenly spaced sends."""
    arrivals = {"kind": "constant", "rate_per_s": 5.0}
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(scenario_dict(workload={"num_requests": 10,
                                                           "arrivals": arrivals})))  # fmt: skip
    bench = tmp_path / "b.json"
    args = ["run", str(scenario), "-o", str(tmp_path / "out"), "--quiet", "--no-plots"]
    assert main([*args, "--bench-json", str(bench)]) == 0

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    data = json.loads(bench.read_text(), parse_constant=refuse)
    assert data["burstiness"] == "inf" and data["request_rate"] == 5.0
    del data["start_times"]
    bench.write_text(json.dumps(data))
    runs = read_bench_json(bench)
    assert runs.requests["arrival"].to_numpy() == pytest.approx(np.arange(10) / 5.0)
    assert "evenly spaced (burstiness inf)" in runs.notes[0]
