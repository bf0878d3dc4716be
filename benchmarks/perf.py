"""Simulator speed: the whole `infersim run` process on the perf scenario, timed.

Runs `infersim run benchmarks/perf_10k.yaml` (Llama-2-7B on one A100, chunked prefill,
Poisson 4 req/s, Azure conversation lengths) as a subprocess, for 10,000 and 100,000
requests, N times each, and prints a markdown table of the medians: whole-process wall
seconds (Python start, imports, simulation, summary, parquet files), simulated requests
and engine steps per wall second, simulated time over wall time, peak resident memory,
and the 100k/10k ratio.

    python benchmarks/perf.py [--repeats N] [--requests 10000 100000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "benchmarks" / "perf_10k.yaml"
TRACE = REPO.parent / "shared" / "data" / "traces" / "azure_conv_2023.csv"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "perf"
INFERSIM = Path(sys.executable).with_name("infersim")


@dataclass(frozen=True)
class Run:
    wall_s: float
    peak_rss_mb: float
    requests: int
    steps: int
    simulated_s: float


def run_once(requests: int, out: Path) -> Run:
    """One `infersim run` process: its wall time, peak RSS and what it simulated."""
    command = [str(INFERSIM), "run", str(SCENARIO), "-o", str(out), "--overwrite", "--quiet"]
    command += ["--set", f"workload.num_requests={requests}"]
    out.mkdir(parents=True, exist_ok=True)
    log = out.with_name(out.name + ".log")
    started = time.perf_counter()
    with log.open("w") as stderr:
        child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
        # wait4 gives this child's own resource usage (getrusage mixes all children).
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited with {child.returncode}:\n{log.read_text()}")
    summary = json.loads((out / "summary.json").read_text())
    return Run(
        wall_s=wall,
        peak_rss_mb=usage.ru_maxrss / 1024,  # kilobytes on Linux
        requests=summary["counts"]["arrived"],
        steps=pq.ParquetFile(out / "steps.parquet").metadata.num_rows,
        simulated_s=summary["run"]["duration_s"],
    )


def median_run(runs: list[Run]) -> Run:
    """The run of median wall time (its own memory and counts)."""
    return sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]


def table(results: dict[int, tuple[Run, list[Run]]]) -> str:
    lines = [
        "| requests | wall s (median) | wall s (all) | requests / wall s | steps | "
        "steps / wall s | simulated s / wall s | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run, runs in results.values():
        walls = ", ".join(f"{r.wall_s:.2f}" for r in runs)
        lines.append(
            f"| {run.requests:,} | {run.wall_s:.2f} | {walls} | {run.requests / run.wall_s:,.0f}"
            f" | {run.steps:,} | {run.steps / run.wall_s:,.0f}"
            f" | {run.simulated_s / run.wall_s:,.0f} | {run.peak_rss_mb:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per size (median)")
    parser.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    args = parser.parse_args(argv)
    if not TRACE.is_file():
        print(
            f"skipped: the perf scenario reads its lengths from {TRACE} (../shared/data), "
            "which is missing",
            file=sys.stderr,
        )
        return 0
    results: dict[int, tuple[Run, list[Run]]] = {}
    for requests in args.requests:
        runs = [run_once(requests, args.out / f"run_{requests}") for _ in range(args.repeats)]
        results[requests] = (median_run(runs), runs)
        print(f"{requests:,} requests: " + ", ".join(f"{r.wall_s:.2f} s" for r in runs))
    text = table(results)
    sizes = sorted(results)
    if len(sizes) >= 2:
        small, large = results[sizes[0]][0], results[sizes[-1]][0]
        text += (
            f"\n\n{sizes[-1]:,} / {sizes[0]:,} requests: wall time x"
            f"{large.wall_s / small.wall_s:.2f}"
        )
    print()
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "perf.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
