"""One cluster run split over processes, its results exactly those of one process.

Under a state-blind router (round robin, random) every request's replica is known before
the run, and in an open loop with mixed replicas no replica's output is another's input:
the replicas are independent simulations. A shard is a group of them run in a process of
its own (the process pool sweeps and plans use, `run_parallel`; the parent runs the
first shard itself meanwhile); the parent merges the shards' request rows, step logs and
step totals replica by replica, in the order one process would have produced them, and
makes the results from those.

Why it is exact (docs/ARCHITECTURE.md, "One run over several processes"): the parent
routes every request once and hands each shard its own requests and the whole arrival
timeline (a `Share`); each shard builds the whole cluster (the same cost models) and
replays the whole timeline, the same timeouts scheduled at the same moments, submitting
only its own replicas' requests, which its table alone holds. SimPy orders events by
(time, priority, insertion order), and a replica's events are caused only by its own
and the arrival process's, so their relative order, a tie between a step's end and an
arrival included, is the one the one-process run has; the other replicas' events only
took insertion numbers in between. Every float sum over replicas is formed in the
parent, in replica order.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from hardware_models.errors import InfersimError
from hardware_models.warning_scope import recording
from simulator.run_loop import Run

if TYPE_CHECKING:
    from simulator.engine.step_log import ClosedLog
    from simulator.metrics.step_totals import StepTotals
    from simulator.scenario import Scenario
    from simulator.workload.generate import RequestBatch

Workers = int | Literal["auto"]

# "auto" shards a run of at least this many requests. Each worker imports infersim and
# builds the cluster again (about 0.6 s) and replays the arrival timeline: in
# two shards of the 64-replica benchmark the longest path (parent + slower shard) took
# 2.6 s of CPU against 3.2 s in one process at 20,000 requests, 4.4 against 6.7 s at
# 50,000 and 8.3 against about 15 s at 100,000 (benchmarks/README.md, "Thirteenth session").
AUTO_MIN_REQUESTS = 50_000


def available_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def shards_for(run: Run, workers: Workers) -> list[tuple[int, ...]]:
    """The groups of replicas (indices into `run.units`) to run in processes of their
    own; none when the run is one process's (not shardable, one worker, or "auto" on a
    run too small to pay for the start-up). Replicas are dealt out in turn, so a shard of
    a heterogeneous cluster holds a share of each pool."""
    if workers != "auto" and (not isinstance(workers, int) or workers < 1):
        raise InfersimError(f"workers: expected a count of at least 1 or 'auto' (got {workers!r})")
    if not run.shardable():
        return []
    units = len(run.units)
    if workers == "auto":
        count = available_cores() if run.expected >= AUTO_MIN_REQUESTS else 1
    else:
        count = workers
    count = min(count, units)
    if count < 2:
        return []
    return [tuple(range(first, units, count)) for first in range(count)]


@dataclass
class Share:
    """A shard's part of the run, made once by the parent (`Run.shares`): its replicas,
    its requests (their ids in the run and their inputs), and the whole run's arrival
    timeline and routing, which it replays."""

    replicas: tuple[int, ...]  # indices into the run's units
    owned: np.ndarray  # the run's ids of its requests, ascending
    batch: RequestBatch  # their inputs, in that order
    arrival: np.ndarray  # every request's arrival, in submission order
    routes: np.ndarray  # every request's replica, in submission order

    def inputs(self) -> dict[str, np.ndarray]:
        """Its requests' input columns (engine.requests.INPUT_COLUMNS but the session's),
        by the request table's names: its shard's table keeps these arrays."""
        batch = self.batch
        return {"arrival": batch.arrival_s, "prompt": batch.prompt_tokens,
                "output": batch.output_tokens, "priority": batch.priority,
                "priority_class": batch.priority_class}  # fmt: skip


@dataclass
class ShardResult:
    """What a shard's process sends back: its replicas' closed logs and step totals, and
    its own requests' rows of the columns the engine writes (the parent has the others)."""

    end: float
    owned: np.ndarray  # the shard's request ids
    columns: dict[str, np.ndarray]  # each outcome column (requests.OUTCOME_COLUMNS) at `owned`
    logs: list[ClosedLog]
    totals: list[StepTotals]
    warnings: list[tuple[type[Warning], str, str, int]]
    batch_fill: list[tuple[float, float]]  # each replica's static-batch wait (idle s, waits)


# Allocations above this many bytes get pages of their own from the OS, returned to it
# when freed (`_big_arrays_off_the_heap`).
OWN_PAGES_ABOVE = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _big_arrays_off_the_heap() -> None:
    """glibc serves an allocation from its heap unless it is bigger than a threshold that
    it raises (to 32 MiB) each time a block that big is freed; a heap shrinks only from
    its top, so the tables, shares and pickled results a shard frees stay in its RSS,
    heaped under what is still alive. Fixing the threshold (which stops the raising)
    gives every array over OWN_PAGES_ABOVE pages that go back when it is freed. For the
    rest of the process; nothing where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, OWN_PAGES_ABOVE)


class _Reported:
    """A shard's progress (its finished requests) passed to `report` about 200 times
    over the whole run, as Progress redraws: from a worker, `executors.report` to the
    parent's one bar; in the parent, to that bar directly."""

    def __init__(self, total: int, report: Callable[[int], None]) -> None:
        self._report, self._every, self._shown = report, max(1, total // 200), 0

    def update(self, done: int) -> None:
        if done - self._shown >= self._every:
            self._report(done)
            self._shown = done

    def close(self) -> None:
        pass


def simulate_shard(job: tuple[Scenario, Share, int]) -> ShardResult:
    """Run a shard (a worker process's job), its progress reported to the parent."""
    from simulator.executors import report  # in a worker only

    _big_arrays_off_the_heap()
    scenario, share, total = job
    return _simulate(scenario, share, _Reported(total, report))


def _simulate(scenario: Scenario, share: Share, progress: _Reported) -> ShardResult:
    """Run a shard: the whole cluster built, only its replicas served. Its warnings go
    back to the parent, which passes each distinct one on once."""
    replicas = share.replicas
    with recording() as caught:  # its own, also in the parent (inside the run's recording)
        run = Run(scenario, progress=False, share=share)
        run.progress = progress
        end = run.advance()
        logs = [run.replicas[i].log.close(end) for i in replicas]
    result = ShardResult(
        end=end,
        owned=run.owned,
        columns=run.requests.outcomes(),  # its table holds its own requests alone
        logs=logs,
        totals=[run.replicas[i].log.totals for i in replicas],
        warnings=[(w.category, str(w.message), w.filename, w.lineno) for w in caught],
        batch_fill=[
            (run.replicas[i].batch_fill_idle_s, run.replicas[i].batch_fill_wait_s) for i in replicas
        ],
    )
    # The cluster's objects refer to each other (SimPy's processes and their replicas):
    # only a collection frees the request inputs and the timeline before the result is
    # pickled (or merged, in the parent), which would otherwise add its copy to them all.
    del run
    gc.collect()
    return result


def run_in_shards(
    run: Run, shards: list[tuple[int, ...]], caught: list[warnings.WarningMessage]
) -> tuple[float, list[ClosedLog], list[StepTotals]]:
    """Simulate `run`'s replicas in `shards`, the first in this process and each other
    in a worker process, and merge: the shards' request rows into `run.requests` (whose
    outcome columns are freed meanwhile: the shards fill every row), their warnings into
    `caught` (the parent's record, for the summary and the caller), and the end time,
    closed logs and step totals of every replica, in order. The end is the latest
    shard's: a shard whose requests all ended earlier has nothing in flight, so its logs
    closed at its own end are the same."""
    from simulator.executors import JobError, run_parallel  # 20 ms of imports, when shards run

    n = len(run.units)
    logs: list[ClosedLog | None] = [None] * n
    totals: list[StepTotals | None] = [None] * n
    results: list[ShardResult | None] = [None] * len(shards)
    finished = [0] * len(shards)

    def progressed(index: int, done: int) -> None:
        finished[index] = done
        run.progress.update(sum(finished))

    def shifted(job: int, done: int) -> None:  # job i is shard i + 1
        progressed(job + 1, done)

    def own_shard(read: Callable[[], None]) -> None:
        """The parent's share while the workers run theirs: a worker less to start and
        fill with imports, and its progress and the workers' reports shown as it goes."""

        def shown(done: int) -> None:
            progressed(0, done)
            read()

        results[0] = _simulate(run.scenario, shares[0], _Reported(run.expected, shown))
        progressed(0, len(results[0].owned))

    _big_arrays_off_the_heap()
    shares = run.shares(shards)
    jobs = [(run.scenario, share, run.expected) for share in shares[1:]]
    # The shares hold the requests' inputs and the shards fill the outcomes: the
    # parent's table keeps only the arrivals (the timeline in the shares) meanwhile.
    run.requests.drop([name for name in run.requests.columns() if name != "arrival"])
    for index, result in run_parallel(
        simulate_shard, jobs, workers=len(jobs) + 1, on_report=shifted, meanwhile=own_shard
    ):
        if isinstance(result, JobError):
            raise InfersimError(
                f"shard {index + 2} of {len(shards)}: {result.detail or result.error}"
            )
        results[index + 1] = result
        progressed(index + 1, len(result.owned))
    done = [result for result in results if result is not None]
    assert len(done) == len(shards)  # a shard that failed raised above
    end = max(result.end for result in done)
    run.requests.fill(  # session and turn come back blank: a shard runs an open loop
        [
            (result.owned, {**share.inputs(), **result.columns})
            for share, result in zip(shares, done, strict=True)
        ]
    )
    for shard, result in zip(shards, done, strict=True):
        for i, log, total, fill in zip(
            shard, result.logs, result.totals, result.batch_fill, strict=True
        ):
            logs[i], totals[i] = log, total
            run.replicas[i].batch_fill_idle_s, run.replicas[i].batch_fill_wait_s = fill
        caught += [warnings.WarningMessage(message, category, filename, lineno)
                   for category, message, filename, lineno in result.warnings]  # fmt: skip
    return end, logs, totals  # type: ignore[return-value]  # every replica is in a shard
