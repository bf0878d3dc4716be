"""Where one `infersim run` spends its time: importing, setting up, the event loop, results.

Does in one process what `infersim run SCENARIO -o OUT --overwrite --quiet` does, timing
each phase with the wall clock and with the process's CPU clock (on a shared machine the
CPU seconds move less than the wall seconds), and reading the resident memory at its end
(VmRSS of /proc/self/status, Linux only):

- import: the `run` subcommand's modules (numpy, pydantic, SimPy and the simulator; no
  pandas, and pyarrow only when the files are written), loaded with the garbage collector
  off and then frozen (`gc.freeze`), as `infersim` loads them;
- setup: reading the scenario, presets and traces, drawing the requests, building the
  replicas (`Run`);
- loop: the SimPy run, GEMM pricing of each new token count included (a fresh process
  prices them cold, as the CLI does);
- results: the tables (`Results.from_run`), the summary and the files (`Results.write`,
  pyarrow's import included).

    python benchmarks/perf_phases.py [SCENARIO] [--set KEY=VALUE ...] [--out DIR]

Python's own start-up is not included: `python -c pass` gives it.
"""

from __future__ import annotations

import gc
import time

_clock = (time.perf_counter(), time.process_time())
gc.disable()  # as `infersim` imports (simulator/cli/main.py)

import argparse  # noqa: E402  (the clock starts before any import)
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import simulator.cli.run_cmd  # noqa: E402, F401  (what `infersim run` imports)
from simulator.metrics.context import SLO, RunContext  # noqa: E402
from simulator.results import Results  # noqa: E402
from simulator.run_loop import Run  # noqa: E402
from simulator.scenario import Scenario  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def resident_mb() -> float:
    """The process's resident memory now (NaN where /proc is not there)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return float("nan")
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def lap(phases: dict[str, tuple[float, float, float]], name: str) -> None:
    """Record the wall and CPU seconds since the previous lap, and the resident MB now,
    under `name`."""
    global _clock
    now = (time.perf_counter(), time.process_time())
    phases[name] = (now[0] - _clock[0], now[1] - _clock[1], resident_mb())
    _clock = now


def main() -> int:
    phases: dict[str, tuple[float, float, float]] = {}
    gc.freeze()  # as `infersim` does once its imports are done (simulator/cli/main.py)
    gc.enable()
    lap(phases, "import")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", default=REPO / "benchmarks" / "perf_10k.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "phases")
    args = parser.parse_args()
    scenario = Scenario.from_yaml(args.scenario, args.overrides)
    run = Run(scenario, progress=False)
    lap(phases, "setup")
    end = run.run()
    lap(phases, "loop")
    context = RunContext(
        scenario=scenario.name,
        seed=scenario.seed,
        duration_s=end,
        replicas=tuple(run.infos),
        slo=SLO(ttft_s=None, tpot_s=None, e2e_s=None),
        pue=scenario.cost.pue,
        usd_per_kwh=scenario.cost.usd_per_kwh,
        priority_names=tuple(run.class_names),
        wall_seconds=phases["loop"][0],
    )
    logs = [replica.log.close(end) for replica in run.replicas]
    totals = [replica.log.totals for replica in run.replicas]
    results = Results.from_run(scenario, "", context, run.requests, totals, logs)
    results.summary_table()
    results.write(args.out, overwrite=True, plots=False)
    lap(phases, "results")
    total = [sum(p[i] for p in phases.values()) for i in (0, 1)]
    print(f"{scenario.name}: {len(phases)} phases, {total[0]:.2f} s wall, {total[1]:.2f} s CPU")
    print("| phase | wall s | CPU s | share of CPU | resident MB after |")
    print("|---|---:|---:|---:|---:|")
    for name, (wall, cpu, mb) in phases.items():
        print(f"| {name} | {wall:.3f} | {cpu:.3f} | {cpu / total[1]:.0%} | {mb:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
