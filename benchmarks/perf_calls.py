"""What one `infersim run`'s event loop spends per call of the engine's main methods.

Wraps each of the replica's per-step and per-run methods (and the step pricing) in a
timer, runs the scenario's loop, and prints for each the calls, the microseconds a call
and the seconds in all, then how many entries the step-cost model's memo tables hold
(a memo that keeps filling means steps still priced cold) and what the garbage
collector took. The timers add about 0.3 us a call, so compare figures from this script
with each other, not with `perf_phases.py`'s loop time. They read the wall clock: where
the loop's wall time is well above its CPU time (printed first), the machine made the
run wait for a core and the figures count the waits too.

    python benchmarks/perf_calls.py [SCENARIO] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

from simulator.engine.replica import Replica
from simulator.engine.step_cost import StepCostModel
from simulator.run_loop import Run
from simulator.scenario import Scenario

REPO = Path(__file__).resolve().parents[1]
TIMED = {
    Replica: (
        "_price_run_stepwise", "_price_run_vectorised", "_price_step", "next_plan",
        "_apply_step", "_finish", "_decode_next", "submit",
    ),
    StepCostModel: ("step",),
}  # fmt: skip


class GcClock:
    """Collections and CPU seconds the garbage collector takes (a `gc.callbacks` entry)."""

    def __init__(self) -> None:
        self.collections, self.seconds, self._start = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.process_time()
            return
        self.collections += 1
        self.seconds += time.process_time() - self._start


def timed(method: Callable, totals: list[float]) -> Callable:
    """`method`, adding its calls and seconds to `totals` (perf_counter: about 0.3 us a
    call, where reading a CPU clock is a system call, five times that)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            totals[0] += 1
            totals[1] += time.perf_counter() - start

    return wrapper


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", default=REPO / "benchmarks" / "perf_10k.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    totals: dict[str, list[float]] = {}
    for cls, names in TIMED.items():
        for name in names:
            totals[name] = [0, 0.0]
            setattr(cls, name, timed(getattr(cls, name), totals[name]))
    run = Run(Scenario.from_yaml(args.scenario, args.overrides), progress=False)
    collector = GcClock()
    gc.callbacks.append(collector)
    gc.freeze()  # as `infersim` does before its loop
    start = time.perf_counter(), time.process_time()
    run.run()
    wall, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
    print(f"loop: {wall:.2f} s wall, {cpu:.2f} s CPU (timers included)")
    print("| method | calls | us a call | s |\n|---|---:|---:|---:|")
    for name, (calls, seconds) in sorted(totals.items(), key=lambda item: -item[1][1]):
        if calls:
            print(f"| {name} | {calls:,} | {seconds / calls * 1e6:.1f} | {seconds:.2f} |")
    costs = {id(replica.cost): replica.cost for replica in run.replicas}
    for cost in costs.values():
        memos = {name: len(v) for name, v in vars(cost).items() if isinstance(v, dict)}
        print("cost model memo entries:", ", ".join(f"{k} {v:,}" for k, v in memos.items() if v))
    print(f"garbage collector: {collector.collections} collections, {collector.seconds:.2f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
