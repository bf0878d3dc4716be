"""What prefill attention costs the event loop: one scenario's prefill calls, timed.

Runs the scenario once, recording every `PrefillAttention` call (its arguments and its
result), and then reports, in CPU seconds of this process:

- replay: the recorded calls priced again one after another on the first replica's
  model, best of `--rounds`, in ns a call (the cost of the arithmetic alone);
- loop, priced: a fresh run's loop (cold caches, as the CLI runs it);
- loop, looked up: a fresh run's loop with every prefill call answered from the
  recorded results (a dict lookup), so that priced less looked up is what pricing
  prefill costs the loop, and two codes' looked-up loops compare everything else.

Compare two codes by running this file from each tree (`PYTHONPATH=TREE python
benchmarks/prefill_calls.py`, the tree an export such as `git archive REV simulator
hardware_models`), alternating, since the loop times move with the machine's load.

    python benchmarks/prefill_calls.py [SCENARIO] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import hardware_models.attention as attention
from simulator.run_loop import Run
from simulator.scenario import Scenario

REPO = Path(__file__).resolve().parents[1]
PRICE = attention.PrefillAttention.__call__


def record(scenario: Scenario) -> tuple[list[tuple], dict[tuple, tuple]]:
    """The prefill calls of one run of `scenario`, in order, and each one's result."""
    calls: list[tuple] = []
    results: dict[tuple, tuple] = {}

    def recording(model, *args):
        calls.append(args)
        results[args] = result = PRICE(model, *args)
        return result

    attention.PrefillAttention.__call__ = recording
    try:
        Run(scenario, progress=False).run()
    finally:
        attention.PrefillAttention.__call__ = PRICE
    return calls, results


def loop_seconds(scenario: Scenario, table: dict[tuple, tuple] | None) -> float:
    """CPU seconds of a fresh run's loop; prefill looked up in `table` when given."""
    run = Run(scenario, progress=False)
    if table is not None:
        attention.PrefillAttention.__call__ = lambda model, *args: table[args]
    gc.collect()
    start = time.process_time()
    try:
        run.run()
    finally:
        attention.PrefillAttention.__call__ = PRICE
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", default=REPO / "benchmarks" / "perf_10k.yaml")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    scenario = Scenario.from_yaml(args.scenario)
    calls, table = record(scenario)
    model = Run(scenario, progress=False).replicas[0].cost._prefill_attention
    best = float("inf")
    for _ in range(args.rounds):
        start = time.process_time()
        for call in calls:
            model(*call)
        best = min(best, time.process_time() - start)
    print(f"{scenario.name}: {len(calls)} prefill calls, {len(table)} distinct")
    print(f"replay: {best / len(calls) * 1e9:.0f} ns a call (best of {args.rounds})")
    print(f"loop, priced: {loop_seconds(scenario, None):.3f} s CPU")
    print(f"loop, looked up: {loop_seconds(scenario, table):.3f} s CPU")


if __name__ == "__main__":
    main()
