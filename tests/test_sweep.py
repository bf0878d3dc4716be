"""Sweeps and comparisons: grid expansion, parallel runs that match in-process runs, failed
points kept as rows, resume, overwrite refusal, a real Dask cluster, `infersim compare`."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from hardware_models.errors import InfersimError
from simulator.cli.main import main
from simulator.cli.sweep_cmd import _format_table
from simulator.scenario import Scenario
from simulator.sweep import PLOT_FILES, JobError, expand_grid, run_parallel, run_point, sweep
from tests.conftest import scenario_dict

ROOT = Path(__file__).resolve().parents[1]

GRID = {"workload.arrivals.rate_per_s": [2.0, 8.0], "serving.max_num_seqs": [4, 32]}


def tiny(grid: dict[str, list] | None = None, **sections: Any) -> dict[str, Any]:
    """The shared test scenario cut to 30 requests, with a sweep grid."""
    data = scenario_dict(**sections)
    data["workload"]["num_requests"] = 30
    data["sweep"] = {"grid": grid or GRID}
    return data


def write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def point_files(outdir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (outdir / "points").glob("*.json")}


def in_process(data: dict[str, Any]) -> dict[str, Any]:
    outcome = run_point(data)
    assert outcome["status"] == "ok", outcome["error"]
    return outcome["summary"]


# ---- the grid -------------------------------------------------------------------------------
def test_grid_is_the_cartesian_product_with_stable_ids_and_names():
    points = expand_grid(Scenario.from_dict(tiny()))
    assert [p.name for p in points] == [
        "rate_per_s=2.0 max_num_seqs=4",
        "rate_per_s=2.0 max_num_seqs=32",
        "rate_per_s=8.0 max_num_seqs=4",
        "rate_per_s=8.0 max_num_seqs=32",
    ]
    last = points[-1].data
    assert last["workload"]["arrivals"]["rate_per_s"] == 8.0
    assert last["serving"]["max_num_seqs"] == 32 and last["output"]["progress"] is False
    assert "sweep" not in last and last["seed"] == 3
    ids = [p.id for p in points]
    assert len(set(ids)) == 4 and all(len(i) == 12 for i in ids)
    # The id names the overrides: the same on a rerun and when the base scenario changes.
    assert [p.id for p in expand_grid(Scenario.from_dict(tiny(seed=5)))] == ids


def test_shipped_sweep_scenario_expands():
    path = Path(__file__).resolve().parents[1] / "scenarios" / "sweep-rate-batch.yaml"
    points = expand_grid(Scenario.from_yaml(path))
    assert len(points) == 8 and points[0].data["model"]["name"] == "llama-3.1-8b"


def test_variants_times_grid_and_ambiguous_axis_names():
    grid = {"workload.prompt_tokens.high": [512, 1024], "workload.output_tokens.high": [64]}
    data = tiny(grid, variants={"a": {}, "b": {"serving.max_num_seqs": 8}})
    points = expand_grid(Scenario.from_dict(data))
    assert [p.name for p in points] == [
        "a: workload.prompt_tokens.high=512 workload.output_tokens.high=64",
        "a: workload.prompt_tokens.high=1024 workload.output_tokens.high=64",
        "b: workload.prompt_tokens.high=512 workload.output_tokens.high=64",
        "b: workload.prompt_tokens.high=1024 workload.output_tokens.high=64",
    ]
    assert points[2].data["serving"]["max_num_seqs"] == 8
    assert points[0].id != points[2].id  # same values, other variant


@pytest.mark.parametrize(
    ("grid", "needle"),
    [
        ({"serving.max_num_seq": [8]}, "sweep.grid.serving.max_num_seq: unknown key; did you mean"),
        ({"serving.max_num_seqs": [8, 0]}, "sweep.grid.serving.max_num_seqs: "),
        ({"workload.arrivals.rate_per_s": [-1]}, "sweep.grid.workload.arrivals.rate_per_s: "),
        ({"serving.policy.x": [1]}, "sweep.grid.serving.policy.x: policy is not a section"),
        ({"serving.max_num_seqs": []}, "sweep.grid.serving.max_num_seqs: needs at least one"),
        ({"serving.max_num_seqs": [4, 4]}, "4 appears twice"),
        ({"variants.a": [1]}, "sweep.grid.variants.a: variants cannot be swept"),
        ({"hardware.gpu": ["h100"]}, "hardware.gpu: unknown gpu 'h100'; did you mean 'h100-sxm'"),
        ({"model.name": ["llama-3.1-8", "llama-2-7b"]}, "'name=llama-3.1-8': model.name: unknown"),
    ],
)
def test_bad_grid_names_the_key_before_anything_runs(tmp_path, grid, needle):
    with pytest.raises(InfersimError) as info:
        sweep(Scenario.from_dict(tiny(grid)), workers=1, outdir=tmp_path / "out")
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_a_scenario_without_a_grid_is_refused():
    data = tiny()
    del data["sweep"]
    with pytest.raises(InfersimError, match=r"no sweep\.grid"):
        sweep(Scenario.from_dict(data))


# ---- running --------------------------------------------------------------------------------
def test_process_pool_gives_the_in_process_summaries(tmp_path):
    scenario = Scenario.from_dict(tiny())
    table = sweep(scenario, workers=2, outdir=tmp_path / "out")
    points = expand_grid(scenario)
    assert table["point"].tolist() == [p.id for p in points]  # grid order, not finish order
    assert (table["status"] == "ok").all() and table["error"].isna().all()
    files = point_files(tmp_path / "out")
    for point in points:
        assert files[point.id]["summary"] == in_process(point.data)
    row = table.iloc[-1]
    assert row["workload.arrivals.rate_per_s"] == 8.0 and row["serving.max_num_seqs"] == 32
    assert row["completed"] == 30 and row["ttft_p99_ms"] > 0 and row["usd_per_hour"] > 0
    # steady state, as $/1M output tokens: the whole run's mean would count the drain
    steady = files[points[-1].id]["summary"]["throughput"]["steady_output_tokens_per_s"]
    assert row["steady_output_tokens_per_s"] == steady != row["output_tokens_per_s"]
    assert row["output_tokens_per_s_per_usd_hour"] == pytest.approx(steady / row["usd_per_hour"])
    assert row["output_tokens_per_s_per_usd_hour"] == pytest.approx(
        1e6 / 3600 / row["usd_per_million_output_tokens"]
    )
    assert row["cost_basis"] == "steady_state"
    assert pd.read_parquet(tmp_path / "out" / "sweep.parquet").equals(table)


def test_an_infeasible_point_is_a_failed_row_and_the_others_run(tmp_path):
    data = tiny({"model.name": ["llama-2-7b", "llama-2-70b"]}, hardware={"gpu": "a100-40gb-sxm"})
    table = sweep(Scenario.from_dict(data), workers=2, outdir=tmp_path / "out")
    ok, failed = table.iloc[0], table.iloc[1]
    assert ok["status"] == "ok" and ok["completed"] == 30
    assert failed["status"] == "failed" and pd.isna(failed["completed"])
    assert "llama-2-70b" in failed["error"] and "does not fit" in failed["error"]
    assert "\n" not in failed["error"]
    assert point_files(tmp_path / "out")[failed["point"]]["status"] == "failed"


def test_each_point_says_the_batch_limits_it_ran_with(tmp_path):
    """Unset, they are vLLM's defaults for the point's GPU: 1024/8192 on an H100 beside
    256/2048 on an A100 in the same table."""
    data = tiny({"hardware.gpu": ["h100-sxm", "a100-80gb-sxm"]})
    data["serving"] = {"policy": "chunked_prefill"}
    table = sweep(Scenario.from_dict(data), workers=1, outdir=tmp_path / "out")
    limits = table.set_index("hardware.gpu")[["max_num_seqs", "max_num_batched_tokens"]]
    assert limits.loc["h100-sxm"].tolist() == [1024, 8192]
    assert limits.loc["a100-80gb-sxm"].tolist() == [256, 2048]
    assert str(table["max_num_seqs"].dtype) == "Int64"


def test_resume_runs_only_the_missing_points(tmp_path):
    scenario = Scenario.from_dict(tiny())
    out = tmp_path / "out"
    first = sweep(scenario, workers=2, outdir=out)
    files = sorted((out / "points").glob("*.json"))
    mtimes = {p: p.stat().st_mtime_ns for p in files}
    files[0].unlink()  # as if the sweep had been interrupted before this point finished
    time.sleep(0.01)
    resumed = sweep(scenario, workers=2, outdir=out, resume=True)
    assert files[0].is_file()
    assert all(p.stat().st_mtime_ns == mtimes[p] for p in files[1:])
    columns = ["wall_s", "cpu_s"]  # the rerun point took its own time
    pd.testing.assert_frame_equal(first.drop(columns=columns), resumed.drop(columns=columns))
    changed = Scenario.from_dict(tiny(seed=4))
    with pytest.raises(InfersimError, match=r"different scenario \(seed differs\)"):
        sweep(changed, workers=1, outdir=out, resume=True)
    # A point file from another build of infersim is refused, not mixed in.
    record = json.loads(files[1].read_text())
    files[1].write_text(json.dumps(record | {"build": "0.0.9+000000000000"}))
    with pytest.raises(InfersimError, match=r"written by infersim 0\.0\.9\+0+, this is"):
        sweep(scenario, workers=1, outdir=out, resume=True)


def test_run_parallel_returns_every_job_once_and_a_raising_one_as_failed():
    """5,000 jobs: more start reports than a pipe holds undrained (~4,000), so a pool
    that did not read them as it went would hang here."""
    jobs = [float(i) for i in range(5000)] + [-1.0]
    results = dict(run_parallel(math.sqrt, jobs, workers=2))
    assert sorted(results) == list(range(len(jobs)))
    assert results[4] == 2.0
    raised = results[5000]
    assert isinstance(raised, JobError) and raised.status == "failed"
    assert raised.error == "ValueError: math domain error" and "Traceback" in raised.detail


def test_one_worker_runs_the_jobs_in_this_process():
    """workers=1 starts no process (as plan_capacity's): a job sees this process's id."""
    import os

    assert dict(run_parallel(_own_pid, [0, 1], workers=1)) == {0: os.getpid(), 1: os.getpid()}
    raised = dict(run_parallel(math.sqrt, [-1.0], workers=1))[0]
    assert isinstance(raised, JobError) and raised.error == "ValueError: math domain error"


def _own_pid(_: Any) -> int:
    import os

    return os.getpid()


UNGUARDED_SCRIPT = """
import sys
from simulator.scenario import Scenario
from simulator.sweep import sweep
print("top level ran")
table = sweep(Scenario.from_yaml(sys.argv[1]), workers=int(sys.argv[2]), progress=False)
print(table["status"].tolist())
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path, workers):
    """spawn and forkserver workers import the main script: without the guard they reach
    sweep() again and cannot start. The sweep says so (not 'killed by a signal' for every
    point); with one worker nothing is started and the script just runs."""
    import subprocess
    import sys

    (tmp_path / "run.py").write_text(UNGUARDED_SCRIPT)
    scenario = write(tmp_path, tiny({"serving.max_num_seqs": [4, 32]}))
    done = subprocess.run(
        [sys.executable, "run.py", str(scenario), str(workers)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if workers == 1:
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["top level ran", "['ok', 'ok']"]
        return
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hardware_models.errors.InfersimError: the worker processes could")
    assert 'if __name__ == "__main__":' in last and "killed by" not in done.stderr
    assert "RuntimeError" not in done.stderr  # the children's bootstrapping traceback


def test_a_lost_point_is_reported_and_resume_reruns_it(tmp_path, monkeypatch):
    """'lost' (what Dask reports past its allowed failures) leaves no point file."""
    from simulator import sweep as module

    real = module.run_parallel

    def lose_the_first(fn, payloads, **_):
        yield 0, module.job_error("lost", RuntimeError("KilledWorker: worker died"))
        yield from ((i, fn(p)) for i, p in enumerate(payloads) if i)

    scenario = Scenario.from_dict(tiny())
    out = tmp_path / "out"
    monkeypatch.setattr(module, "run_parallel", lose_the_first)
    table = sweep(scenario, workers=1, outdir=out)
    assert table["status"].tolist() == ["lost", "ok", "ok", "ok"]
    assert table["error"][0] == "RuntimeError: KilledWorker: worker died"
    assert table["point"][0] not in point_files(out)  # no file: resume runs it again
    monkeypatch.setattr(module, "run_parallel", real)
    assert (sweep(scenario, workers=1, outdir=out, resume=True)["status"] == "ok").all()


def test_results_are_never_silently_overwritten(tmp_path):
    scenario = Scenario.from_dict(tiny({"serving.max_num_seqs": [4]}))
    out = tmp_path / "out"
    (out / "points").mkdir(parents=True)
    stale = out / "points" / "stale.json"
    stale.write_text("{}")
    with pytest.raises(InfersimError, match="already has results; pass overwrite=True, resume="):
        sweep(scenario, workers=1, outdir=out)
    assert [p.name for p in (out / "points").iterdir()] == ["stale.json"]
    with pytest.raises(InfersimError, match="exclude each other"):
        sweep(scenario, workers=1, outdir=out, resume=True, overwrite=True)
    sweep(scenario, workers=1, outdir=out, overwrite=True)
    assert not stale.exists() and len(point_files(out)) == 1


def test_dask_local_cluster_gives_the_in_process_summaries(tmp_path, capsys):
    distributed = pytest.importorskip("distributed", reason="needs the distributed package")
    data = tiny({"serving.max_num_seqs": [4, 32]})
    scenario, path = Scenario.from_dict(data), write(tmp_path, data)
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        with distributed.Client(cluster) as client:
            table = sweep(scenario, client=client, outdir=tmp_path / "api")
        address = cluster.scheduler_address
        argv = ["sweep", str(path), "-o", str(tmp_path / "cli"), "--dask-scheduler", address]
        assert main([*argv, "--quiet"]) == 0
    assert (table["status"] == "ok").all()
    api, cli = point_files(tmp_path / "api"), point_files(tmp_path / "cli")
    for point in expand_grid(scenario):
        assert api[point.id]["summary"] == cli[point.id]["summary"] == in_process(point.data)
    assert "2 of 2 points ok" in capsys.readouterr().err


# ---- command line ---------------------------------------------------------------------------
def test_cli_sweep_writes_table_plots_and_reports_failures(tmp_path, capsys):
    data = tiny(
        {"model.name": ["llama-2-7b", "llama-2-70b"], "workload.arrivals.rate_per_s": [2, 8]},
        hardware={"gpu": "a100-40gb-sxm"},
        output={"plots": True, "progress": False},
    )
    path, out = write(tmp_path, data), tmp_path / "out"
    assert main(["sweep", str(path), "-o", str(out), "--workers", "2", "--csv", "--quiet"]) == 0
    stdout = capsys.readouterr().out
    assert "name=llama-2-7b rate_per_s=8" in stdout and "TTFT p99 ms" in stdout
    assert "failed: name=llama-2-70b rate_per_s=2: llama-2-70b (bf16" in stdout
    for name in ("sweep.parquet", "sweep.csv", *PLOT_FILES):
        assert (out / name).stat().st_size > 0, name
    assert main(["sweep", str(path), "-o", str(out), "--quiet"]) == 2
    assert (
        "already has results; pass --overwrite, --resume or another -o" in capsys.readouterr().err
    )
    assert main(["sweep", str(path), "-o", str(out), "--quiet", "--resume"]) == 0


def test_cli_sweep_where_no_point_ran_exits_1(tmp_path, capsys):
    data = tiny({"model.name": ["llama-2-70b"]}, hardware={"gpu": "a100-40gb-sxm"})
    out = tmp_path / "out"
    assert main(["sweep", str(write(tmp_path, data)), "-o", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "0 of 1 points ok" in err and "infersim: no sweep point ran" in err
    assert (out / "sweep.parquet").is_file()  # the failed rows are still written


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--set", "sweep.grid={serving.max_num_seq: [1]}"], "sweep.grid.serving.max_num_seq"),
        (["--workers", "2", "--dask-scheduler", "tcp://x:1"], "exclude each other"),
    ],
)
def test_cli_sweep_bad_input_is_one_line(tmp_path, capsys, argv, needle):
    path = write(tmp_path, tiny())
    assert main(["sweep", str(path), "-o", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("infersim: error:") and needle in err and err.count("\n") == 1


def test_cli_compare_files_and_variants(tmp_path, capsys):
    a = write(tmp_path, scenario_dict(workload={"num_requests": 30}), "a.yaml")
    variants = {"x": {"serving.max_num_seqs": 4}, "y": {}}
    b = write(tmp_path, scenario_dict(workload={"num_requests": 30}, variants=variants), "b.yaml")
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "-o", str(out), "--quiet"]) == 0
    table = pd.read_csv(out / "comparison.csv", index_col="run")
    assert table.index.tolist() == ["a", "b:x", "b:y"]
    assert (table["completed"] == 30).all()
    assert "b:x" in capsys.readouterr().out
    for name in ("comparison_latency_cdfs.png", "comparison_throughput_cost.png"):
        assert (out / name).stat().st_size > 1000
    assert (out / "a" / "summary.json").is_file() and (out / "b" / "x" / "summary.json").is_file()
    assert main(["compare", str(a), str(b), "-o", str(out), "--quiet"]) == 2
    assert "already has results" in capsys.readouterr().err
    assert main(["compare", str(a), "-o", str(tmp_path / "one")]) == 2
    assert "two or more runs" in capsys.readouterr().err


def test_each_point_records_the_sweeps_set_overrides_and_its_overload_verdict(tmp_path, capsys):
    """... and the table holds each point's SLO share of arrived requests (as run and
    compare show it) beside that of completed ones, and its failed and rejected counts."""
    path, out = write(tmp_path, tiny({"serving.max_num_seqs": [4, 32]})), tmp_path / "out"
    argv = ["sweep", str(path), "-o", str(out), "--workers", "1", "--quiet", "--no-plots"]
    assert main([*argv, "--set", "seed=7"]) == 0
    verdicts, arrived = {}, {}
    for record in point_files(out).values():
        provenance = record["summary"]["provenance"]
        assert provenance["overrides"] == ["seed=7", "output.plots=false"]
        assert provenance["scenario"]["seed"] == 7
        verdicts[record["name"]] = record["summary"]["overload_verdict"]
        counts, goodput = record["summary"]["counts"], record["summary"]["goodput"]
        arrived[record["name"]] = (
            goodput["fraction_of_arrived"],
            counts["failed"],
            counts["rejected"],
        )
    table = pd.read_parquet(out / "sweep.parquet")
    assert "overload_verdict" in table  # None here: 30 arrivals are too few for a trend
    assert dict(zip(table["name"], table["overload_verdict"], strict=True)) == verdicts
    columns = ["goodput_fraction_of_arrived", "failed", "rejected"]
    assert {n: tuple(r) for n, *r in table[["name", *columns]].itertuples(index=False)} == (arrived)
    shown = capsys.readouterr().out
    # the headers (and percentages) compare tables print too
    assert all(label in shown for label in ("SLO met % arrived", "SLO met %", "rejected"))


def test_a_set_of_a_swept_field_is_refused_not_overridden_by_the_grid(tmp_path):
    scenario = Scenario.from_dict(tiny({"serving.max_num_seqs": [4, 32]}))
    with pytest.raises(InfersimError, match=r"--set serving=\{max_num_seqs: 8\} fixes a field "
                       r"sweep.grid.serving.max_num_seqs sweeps"):  # fmt: skip
        expand_grid(scenario.with_overrides(["serving={max_num_seqs: 8}"]))
    points = expand_grid(scenario.with_overrides(["sweep.grid.serving.max_num_seqs=[8]"]))
    assert [p.data["serving"]["max_num_seqs"] for p in points] == [8]


def test_the_sweep_table_prints_a_point_too_short_to_judge_as_such(tmp_path, capsys):
    """sweep-rate-batch's 32 req/s, max_num_seqs 256 point at 400 requests ends within the
    ramp of its requests in the system: the table says too_short_to_judge, where it printed
    `overloaded False` (and the verdict was `stable`) while only the waiting queue was
    tested."""
    grid = "sweep.grid={workload.arrivals.rate_per_s: [32], serving.max_num_seqs: [256]}"
    argv = ["sweep", str(ROOT / "scenarios" / "sweep-rate-batch.yaml"), "-o", str(tmp_path),
            "--workers", "1", "--quiet", "--no-plots", "--set", grid,
            "--set", "workload.num_requests=400"]  # fmt: skip
    assert main(argv) == 0
    assert "too_short_to_judge" in capsys.readouterr().out
    table = pd.read_parquet(tmp_path / "sweep.parquet")
    assert table["overload_verdict"].tolist() == ["too_short_to_judge"]
    assert table["overloaded"].tolist() == [False]


def test_the_printed_table_puts_throughput_and_its_cost_on_one_basis(tmp_path):
    """The terminal's throughput is the steady state's, as its tok/s per $/h and $/1M out
    tok are: never the whole run's mean (which counts the drain) beside a steady cost."""
    table = sweep(Scenario.from_dict(tiny()), workers=1, outdir=tmp_path / "out")
    header = _format_table(table).splitlines()[0]
    assert "steady out tok/s" in header and " out tok/s" not in header.replace("steady out", "")
    row = table.iloc[-1]
    assert row["output_tokens_per_s_per_usd_hour"] == pytest.approx(
        row["steady_output_tokens_per_s"] / row["usd_per_hour"]
    )
