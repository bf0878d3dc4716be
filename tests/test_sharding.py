"""One run over several processes (simulator/sharding.py): a cluster whose replicas are
independent gives, in any number of shards, exactly the results of one process (every
file, every table, every figure), and a run whose replicas are not stays in one."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from benchmarks.same_results import differences
from hardware_models.errors import InfersimError, InfersimWarning
from simulator.cli.main import build_parser, main
from simulator.engine.requests import INPUT_COLUMNS, RequestTable
from simulator.results import Results
from simulator.router import foreseen_routes, make_router
from simulator.run_loop import Run
from simulator.scenario import Scenario
from simulator.sharding import AUTO_MIN_REQUESTS
from simulator.simulation import simulate
from tests.conftest import scenario_dict

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE_SAMPLE = ROOT / "scenarios" / "traces" / "mooncake_sample.jsonl"

# Six replicas, round robin, the step table kept, plots drawn, and a horizon that stops
# the run with requests queued and running (settle, clipped steps, unserved arrivals); an
# fp8 KV cache on the A100 raises a build warning in every process, passed on once.
ROUND_ROBIN = scenario_dict(
    model={"name": "llama-2-7b", "kv_dtype": "fp8"},
    parallelism={"replicas": 6, "router": "round_robin"},
    workload={"arrivals": {"kind": "poisson", "rate_per_s": 30.0}, "num_requests": 600,
              "duration_s": 15.0},
    output={"plots": True, "progress": False, "step_table": True},
)  # fmt: skip
# Two GPU types in two pools, random routing, no step table, prompts some replicas
# refuse (max_model_len): rejections, and the run goes to its last request.
RANDOM_POOLS = {
    **scenario_dict(
        workload={"arrivals": {"kind": "poisson", "rate_per_s": 20.0}, "num_requests": 500,
                  "prompt_tokens": {"kind": "uniform", "low": 32, "high": 5000}},
        serving={"max_model_len": 4096},
        output={"plots": False, "progress": False, "step_table": False},
    ),
    "parallelism": {"router": "random"},
    "pools": [
        {"name": "a100", "hardware": {"gpu": "a100-80gb-sxm"}, "replicas": 3},
        {"name": "h100", "hardware": {"gpu": "h100-sxm"}, "replicas": 2},
    ],
}  # fmt: skip
del RANDOM_POOLS["hardware"]


def _run(data: dict[str, Any], workers: int, outdir: Path) -> tuple[Results, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = simulate(Scenario.from_dict(data), workers=workers)
    results.write(outdir)
    return results, [str(w.message) for w in caught if issubclass(w.category, InfersimWarning)]


def assert_same_files(one: Path, many: Path) -> None:
    """summary.json equal but for the build and the process count, tables exactly, every
    other file byte for byte: benchmarks/same_results.py's check, which the README's
    exactness figures cite."""
    assert json.loads((one / "summary.json").read_text())["provenance"]["processes"] == 1
    assert differences(one, many) == []


@pytest.mark.parametrize("data", [ROUND_ROBIN, RANDOM_POOLS], ids=["round_robin", "random"])
def test_shards_give_the_one_process_results(tmp_path, data):
    one, warned = _run(data, 1, tmp_path / "one")
    assert one.summary()["provenance"]["processes"] == 1
    for workers in (2, 3):
        many, warned_many = _run(data, workers, tmp_path / f"w{workers}")
        assert many.summary()["provenance"]["processes"] == workers
        assert_same_files(tmp_path / "one", tmp_path / f"w{workers}")
        assert warned_many == warned  # each once, in the same order
        if one.kept_steps is not None:
            pd.testing.assert_frame_equal(one.steps, many.steps, check_exact=True)
    counts = one.summary()["counts"]
    if data is ROUND_ROBIN:  # the horizon cut the run short
        assert counts["completed"] < 600 and one.requests["finish"].isna().any()
        assert len(warned) == 1 and "no fp8 tensor rate" in warned[0]
    else:
        assert counts["rejected"] > 0 and counts["completed"] + counts["rejected"] == 500


def test_a_static_batch_wait_is_said_from_every_shard(tmp_path):
    """The static policy's idle wait for full batches (a warning from each replica's
    counters) comes back from the shards: the sharded run says it as one process does."""
    data = scenario_dict(
        parallelism={"replicas": 4, "router": "round_robin"},
        serving={"policy": "static", "max_num_seqs": 8},
        workload={"arrivals": {"kind": "poisson", "rate_per_s": 2.0}, "num_requests": 80},
    )
    _, one = _run(data, 1, tmp_path / "one")
    _, two = _run(data, 2, tmp_path / "two")
    assert any("full batch" in text for text in one), one
    assert two == one
    assert_same_files(tmp_path / "one", tmp_path / "two")


@pytest.mark.parametrize(
    "change",
    [
        {"parallelism": {"replicas": 4, "router": "least_outstanding"}},
        {"parallelism": {"replicas": 4, "router": "round_robin"},
         "workload": {"arrivals": {"kind": "closed_loop", "users": 8}, "num_requests": 60}},
        {"parallelism": {"replicas": 4, "router": "round_robin"},
         "faults": {"events": [{"at_s": 2.0, "replica": 1}]}},
        {"parallelism": {"replicas": 4, "router": "round_robin"},
         "workload": {"sessions": {"turns": 3, "think_time_s": 0.5}}},
        {"parallelism": {"replicas": 4, "router": "round_robin"},
         "frontend": {"kind": "vllm_api_server"}},
        {"parallelism": {"replicas": 2, "router": "round_robin", "dp": 2},
         "model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "h100-sxm"}},
        {"parallelism": {"router": "round_robin"}, "hardware": None,
         "model": {"name": "llama-3.1-8b"},
         "pools": [
             {"name": "prefill", "hardware": {"gpu": "h100-sxm"}, "replicas": 2, "role": "prefill"},
             {"name": "decode", "hardware": {"gpu": "h100-sxm"}, "replicas": 2, "role": "decode"},
         ]},
        {"parallelism": {"replicas": 1, "router": "round_robin"}},
    ],
    ids=["load_aware", "closed_loop", "faults", "sessions", "front_end", "dp", "disaggregated",
         "one_replica"],
)  # fmt: skip
def test_runs_whose_replicas_depend_on_each_other_stay_in_one_process(change):
    data = scenario_dict(**change)
    if data.get("hardware") is None:
        del data["hardware"]
    data["workload"] = {**data["workload"], "num_requests": 60}
    results = simulate(Scenario.from_dict(data), workers=3)
    assert results.summary()["provenance"]["processes"] == 1


def test_auto_shards_only_a_run_big_enough_to_pay_for_it():
    data = scenario_dict(parallelism={"replicas": 4, "router": "round_robin"})
    assert data["workload"]["num_requests"] < AUTO_MIN_REQUESTS
    results = simulate(Scenario.from_dict(data), workers="auto")
    assert results.summary()["provenance"]["processes"] == 1


@pytest.mark.parametrize("workers", [0, -2, "many", 1.5])
def test_a_bad_worker_count_is_refused(workers):
    data = scenario_dict(parallelism={"replicas": 4, "router": "round_robin"})
    with pytest.raises(InfersimError, match="workers: expected a count of at least 1"):
        simulate(Scenario.from_dict(data), workers=workers)


def test_one_progress_bar_counts_every_shard(monkeypatch):
    shown: list[int] = []

    class Recorder:
        def __init__(self, total: int | None, *, enabled: bool, label: str) -> None:
            self.total = total

        def update(self, done: int) -> None:
            shown.append(done)

        def close(self) -> None:
            shown.append(-1)

    monkeypatch.setattr("simulator.run_loop.Progress", Recorder)
    data = scenario_dict(parallelism={"replicas": 4, "router": "round_robin"})
    simulate(Scenario.from_dict(data), workers=2)
    assert shown[-1] == -1 and shown[-2] == 300  # the shards' requests together, then closed
    assert shown[:-1] == sorted(shown[:-1])


def test_infersim_run_takes_workers(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    data = scenario_dict(parallelism={"replicas": 4, "router": "round_robin"})
    path.write_text(json.dumps(data))
    for workers in ("1", "2"):
        assert main(["run", str(path), "-o", str(tmp_path / workers), "--workers", workers]) == 0
    assert_same_files(tmp_path / "1", tmp_path / "2")
    with pytest.raises(SystemExit):
        main(["run", str(path), "-o", str(tmp_path / "x"), "--workers", "0"])
    assert "--workers: expected a count of at least 1 or 'auto' (got '0')" in (
        capsys.readouterr().err
    )


def test_infersim_compare_takes_workers_as_run_does(tmp_path):
    """Each compared run is split over --workers processes as `infersim run` splits it,
    with the same results; the default is run's ('auto')."""
    path = tmp_path / "cluster.yaml"
    data = scenario_dict(parallelism={"replicas": 4, "router": "round_robin"})
    data["variants"] = {"a": {}, "b": {"workload.arrivals.rate_per_s": 3.0}}
    path.write_text(json.dumps(data))
    for workers in ("1", "2"):
        argv = ["compare", str(path), "-o", str(tmp_path / workers), "--quiet", "--no-plots"]
        assert main([*argv, "--workers", workers]) == 0
    for variant in ("a", "b"):
        one, two = tmp_path / "1" / variant, tmp_path / "2" / variant
        assert json.loads((two / "summary.json").read_text())["provenance"]["processes"] == 2
        assert_same_files(one, two)
    assert (tmp_path / "1" / "comparison.csv").read_bytes() == (
        tmp_path / "2" / "comparison.csv"
    ).read_bytes()
    compare = build_parser().parse_args(["compare", str(path), str(path)])
    assert compare.workers == "auto"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 3])
def test_the_64_replica_benchmark_in_shards(tmp_path, workers):
    """The issue's benchmark (64 replicas, round robin) at 20,000 requests."""
    path = ROOT / "benchmarks" / "perf_1m_cluster.yaml"
    scenario = Scenario.from_yaml(path, ["workload.num_requests=20000"])
    simulate(scenario, workers=1).write(tmp_path / "one")
    simulate(scenario, workers=workers).write(tmp_path / "many")
    assert_same_files(tmp_path / "one", tmp_path / "many")


@pytest.mark.parametrize("replicas", [1, 2, 3, 7, 64])
def test_foreseen_routes_are_the_routers_own_picks(replicas):
    """The whole run's routing at once (round robin's arithmetic, random's one draw of
    numpy's Generator) is what route() picks request by request, also after some."""
    for kind in ("round_robin", "random"):
        one_by_one = make_router(kind, list(range(replicas)), seed=5)
        picks = [one_by_one.route(rid) for rid in range(1000)]
        assert foreseen_routes(kind, replicas, 5, 1000).tolist() == picks
        at_once = make_router(kind, list(range(replicas)), seed=5)
        assert [at_once.route(rid) for rid in range(3)] == picks[:3]
        assert at_once.routes(997).tolist() == picks[3:]
    with pytest.raises(InfersimError, match=r"least_outstanding.*not foreseeable"):
        foreseen_routes("least_outstanding", 4, 0, 10)


def test_a_shard_holds_only_its_own_requests():
    """Each shard's table has its replicas' requests alone, in the run's order, with the
    run's inputs; together the shards hold every request once."""
    scenario = Scenario.from_dict(RANDOM_POOLS)
    whole = Run(scenario, progress=False)
    arrival, routes, _ = whole._timeline_of_arrivals()
    held = []
    for share in whole.shares([(0, 2, 4), (1, 3)]):
        run = Run(scenario, progress=False, share=share)
        own = np.flatnonzero(np.isin(routes, share.replicas))
        np.testing.assert_array_equal(run.owned, own)
        assert run.requests.size == run.expected == len(own)
        for name in INPUT_COLUMNS:
            np.testing.assert_array_equal(
                run.requests.columns()[name], whole.requests.columns()[name][own]
            )
        timeline, shard_routes, ids = run._timeline_of_arrivals()
        np.testing.assert_array_equal(timeline, arrival)
        np.testing.assert_array_equal(shard_routes, routes)
        np.testing.assert_array_equal(ids, np.arange(len(own)))  # its table's ids, in order
        held.append(own)
    np.testing.assert_array_equal(np.sort(np.concatenate(held)), np.arange(whole.requests.size))


def test_shared_prompt_blocks_in_shards_hit_as_in_one_process(tmp_path):
    """A trace's block hashes go with each shard's requests (RequestBatch.take): the
    prefix cache shared by hash hits in each shard as it does in one process."""
    data = scenario_dict(
        model={"name": "llama-3.1-8b"},
        parallelism={"replicas": 3, "router": "round_robin"},
        serving={"enable_prefix_caching": True},
        workload={"arrivals": {"kind": "trace", "path": str(MOONCAKE_SAMPLE)},
                  "num_requests": 48},
        output={"plots": False, "progress": False, "step_table": True},
    )  # fmt: skip
    for length in ("prompt_tokens", "output_tokens"):
        del data["workload"][length]
    one, _ = _run(data, 1, tmp_path / "one")
    assert one.summary()["prefix_cache"]["cached_prompt_tokens"] > 0
    for workers in (2, 3):
        _run(data, workers, tmp_path / f"w{workers}")
        assert_same_files(tmp_path / "one", tmp_path / f"w{workers}")


def test_dropped_columns_are_filled_from_parts_holding_each_request_once():
    """The parent drops every column but the arrivals while its shards run and fills them
    from the shares' inputs and the shards' outcomes; a column no part holds (session,
    turn) comes back blank, as `add` leaves it."""
    table = RequestTable(4)
    table.add(np.arange(4.0), np.full(4, 10), np.full(4, 5), np.zeros(4))
    parts = [
        (np.array([0, 2]), {name: column[[0, 2]] for name, column in table.outcomes().items()})
    ]
    table.drop([name for name in table.columns() if name != "arrival"])
    assert len(table.finish) == len(table.prompt) == len(table.session) == 0
    assert table.columns()["arrival"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="each request once"):
        table.fill(parts)
    served = {name: column.copy() for name, column in parts[0][1].items()}
    served["finish"][:] = [7.0, 9.0]
    served["prompt"] = np.array([11, 13])
    table.fill([(np.array([1, 3]), {**parts[0][1], "prompt": np.array([12, 14])}),
                (np.array([0, 2]), served)])  # fmt: skip
    np.testing.assert_array_equal(table.columns()["finish"], [7.0, np.nan, 9.0, np.nan])
    np.testing.assert_array_equal(table.columns()["replica"], [-1, -1, -1, -1])
    np.testing.assert_array_equal(table.columns()["prompt"], [11, 12, 13, 14])
    np.testing.assert_array_equal(table.columns()["session"], [-1, -1, -1, -1])
    np.testing.assert_array_equal(table.columns()["turn"], [0, 0, 0, 0])
    assert table.prompt.dtype == np.int64 and table.session.dtype == np.int64


def test_a_shards_table_keeps_its_shares_arrays():
    """A shard's table is its share's inputs, not a copy of them (one copy of its
    requests in its process), those of another dtype copied, and the rest blank."""
    scenario = Scenario.from_dict(RANDOM_POOLS)
    share = Run(scenario, progress=False).shares([(0, 2, 4), (1, 3)])[1]
    table = Run(scenario, progress=False, share=share).requests
    inputs = share.inputs()
    for name in ("arrival", "prompt", "output", "priority_class"):
        assert getattr(table, name) is inputs[name] and not inputs[name].flags.writeable
    assert (
        table.priority.dtype == np.int16 and table.priority.tolist() == inputs["priority"].tolist()
    )
    assert table.size == len(share.owned) == len(table.finish)
    assert np.isnan(table.finish).all() and (table.session == -1).all()


def test_the_parent_runs_the_first_shard_itself(monkeypatch, tmp_path):
    """The parent simulates one shard while the workers run the others: a sharded run
    starts one worker fewer than its process count, with the same results."""
    from simulator import executors

    pools: list[int] = []
    pool_round = executors._pool_round

    def counted(fn, payloads, batch, width, on_report, meanwhile=None):
        pools.append(min(width, len(batch)))
        return (yield from pool_round(fn, payloads, batch, width, on_report, meanwhile))

    monkeypatch.setattr(executors, "_pool_round", counted)
    _run(RANDOM_POOLS, 1, tmp_path / "one")
    _run(RANDOM_POOLS, 3, tmp_path / "three")
    assert pools == [2]  # two workers beside the parent
    assert_same_files(tmp_path / "one", tmp_path / "three")


def test_meanwhile_is_refused_where_no_local_pool_runs():
    from simulator.executors import run_parallel

    with pytest.raises(ValueError, match="meanwhile runs beside a local pool"):
        run_parallel(abs, [1], workers=1, meanwhile=lambda read: None)
