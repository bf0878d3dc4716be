"""Sweep scaling: does a sweep of 32 points spread over the available cores?

Runs `infersim sweep benchmarks/sweep_32.yaml` (32 points of a few seconds each) as a
subprocess with 1 worker process and with one per core, and prints for each: the whole
command's wall time, the speed-up over 1 worker, and per-point CPU use (the worker's CPU
seconds over the point's wall seconds: about 1 when each worker has a core to itself, less
when workers or other jobs outnumber the cores). The load average before and after each
run is printed next to it, since on a shared machine it decides the figures; "cores busy"
(the points' CPU seconds over the command's wall time) is what a busy machine distorts
least. Speed-up is against the first worker count of the same round. The tables of all
runs must agree on every simulated number (only timings may differ).

With `--dask`, each worker count of 2 or more also runs on a Dask LocalCluster of that
many single-threaded worker processes (`--dask-scheduler`; the cluster is started before
the clock starts, and its start-up is printed apart). "Overhead s" is what the command
spent beyond its points' own work shared over the workers: wall - (sum of point wall
seconds) / workers, i.e. start-up, scheduling, shipping scenarios and summaries, writing
the table, and the last point's tail.

    python benchmarks/sweep_scaling.py [--workers 1 2] [--repeats N] [--dask]
                                       [--scenario PATH] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "benchmarks" / "sweep_32.yaml"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "sweep_scaling"
INFERSIM = Path(sys.executable).with_name("infersim")
TIMINGS = ["wall_s", "cpu_s"]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(scenario: Path, workers: int, out: Path, scheduler: str | None = None) -> dict[str, object]:
    """One `infersim sweep` with `workers` processes (local, or the Dask cluster at
    `scheduler`): its wall time and per-point CPU."""
    before = _load()
    where = ["--dask-scheduler", scheduler] if scheduler else ["--workers", str(workers)]
    argv = [str(INFERSIM), "sweep", str(scenario), "-o", str(out), *where,
            "--quiet", "--no-plots", "--overwrite"]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    wall = time.perf_counter() - started
    table = pd.read_parquet(out / "sweep.parquet")
    if not (table["status"] == "ok").all():
        raise SystemExit(f"{out}: not every point ran: {table['status'].value_counts()}")
    use = table["cpu_s"] / table["wall_s"]
    return {
        "executor": "dask" if scheduler else "local",
        "workers": workers,
        "points": len(table),
        "wall_s": wall,
        "point_wall_s_sum": table["wall_s"].sum(),
        "point_cpu_s_sum": table["cpu_s"].sum(),
        "cpu_use_median": use.median(),
        "cpu_use_min": use.min(),
        "load_before": before,
        "load_after": _load(),
        "table": table.drop(columns=TIMINGS),
    }


def run_on_dask(scenario: Path, workers: int, out: Path) -> dict[str, object]:
    """run() on a fresh Dask LocalCluster of `workers` single-threaded processes."""
    from distributed import LocalCluster

    started = time.perf_counter()
    with LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        startup = time.perf_counter() - started
        result = run(scenario, workers, out, cluster.scheduler_address)
    return {**result, "startup_s": startup}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the counts")
    parser.add_argument("--dask", action="store_true", help="also on Dask LocalClusters")
    args = parser.parse_args()
    runs = []
    for i in range(args.repeats):
        for w in args.workers:  # interleaved, so that a change of load hits every count
            runs.append({**run(args.scenario, w, args.out / f"workers-{w}"), "repeat": i})
            if args.dask and w > 1:
                out = args.out / f"dask-{w}"
                runs.append({**run_on_dask(args.scenario, w, out), "repeat": i})
    for other in runs[1:]:
        pd.testing.assert_frame_equal(runs[0]["table"], other["table"])
    first = args.workers[0]
    base = [r["wall_s"] for r in runs if r["workers"] == first and r["executor"] == "local"]
    print(f"{runs[0]['points']} points, {os.cpu_count()} cores; load average 1/5/15 min")
    print("| executor | workers | wall s | speed-up | overhead s | cores busy | per-point CPU "
          "use (median, min) | sum of point CPU s | load before | load after |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in runs:
        overhead = r["wall_s"] - r["point_wall_s_sum"] / r["workers"]
        startup = f" (+{r['startup_s']:.1f} s cluster start)" if "startup_s" in r else ""
        print(f"| {r['executor']} | {r['workers']} | {r['wall_s']:.1f} | "
              f"{base[r['repeat']] / r['wall_s']:.2f}x | {overhead:.1f}{startup} | "
              f"{r['point_cpu_s_sum'] / r['wall_s']:.2f} | "
              f"{r['cpu_use_median']:.2f}, {r['cpu_use_min']:.2f} | "
              f"{r['point_cpu_s_sum']:.1f} | {r['load_before']} | {r['load_after']} |")  # fmt: skip
    print("simulated numbers identical across worker counts and executors: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
