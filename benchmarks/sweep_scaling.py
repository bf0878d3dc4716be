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

    python benchmarks/sweep_scaling.py [--workers 1 2] [--repeats N] [--scenario PATH]
                                       [--out DIR]
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


def run(scenario: Path, workers: int, out: Path) -> dict[str, object]:
    """One `infersim sweep` with `workers` processes: its wall time and per-point CPU."""
    before = _load()
    argv = [str(INFERSIM), "sweep", str(scenario), "-o", str(out), "--workers", str(workers),
            "--quiet", "--no-plots", "--overwrite"]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    wall = time.perf_counter() - started
    table = pd.read_parquet(out / "sweep.parquet")
    if not (table["status"] == "ok").all():
        raise SystemExit(f"{out}: not every point ran: {table['status'].value_counts()}")
    use = table["cpu_s"] / table["wall_s"]
    return {
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the counts")
    args = parser.parse_args()
    runs = [
        {**run(args.scenario, w, args.out / f"workers-{w}"), "repeat": i}
        for i in range(args.repeats)
        for w in args.workers  # interleaved, so that a change of load hits every count
    ]
    for other in runs[1:]:
        pd.testing.assert_frame_equal(runs[0]["table"], other["table"])
    base = [r["wall_s"] for r in runs if r["workers"] == args.workers[0]]
    print(f"{runs[0]['points']} points, {os.cpu_count()} cores; load average 1/5/15 min")
    print("| workers | wall s | speed-up | cores busy | per-point CPU use (median, min) | "
          "sum of point CPU s | load before | load after |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---|---|")
    for r in runs:
        print(f"| {r['workers']} | {r['wall_s']:.1f} | {base[r['repeat']] / r['wall_s']:.2f}x | "
              f"{r['point_cpu_s_sum'] / r['wall_s']:.2f} | "
              f"{r['cpu_use_median']:.2f}, {r['cpu_use_min']:.2f} | "
              f"{r['point_cpu_s_sum']:.1f} | {r['load_before']} | {r['load_after']} |")  # fmt: skip
    print("simulated numbers identical across worker counts: yes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
