"""Run module-level jobs on local processes, in this process, or on a Dask cluster:
`run_parallel`, the executor of sweeps' points, capacity plans' candidates and one big
run's shards (simulator/sharding.py). Light on imports (no pandas), since a worker
process imports it before its first job.

A local worker that dies (SIGKILL, out of memory) breaks its pool: the jobs it left are
rerun on a fresh one, and a job that kills its worker on every try ends 'failed' with that
reason. A job Dask gives up on ends 'lost'.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hardware_models.errors import InfersimError

if TYPE_CHECKING:
    from distributed import Client

OnReport = Callable[[int, Any], None]  # (job index, what the job reported)
# Work of the caller's own while the jobs run, given a function that reads their reports.
Meanwhile = Callable[[Callable[[], None]], None]
# fork is unsafe once threads run (a Dask client, a notebook kernel); forkserver is what
# Python 3.14 picks on Linux, spawn is the default elsewhere.
_START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

# A local job whose worker process dies (SIGKILL, the OOM killer) is retried on a fresh pool;
# after this many deaths it fails. Dask's default allowed-failures is the same 3.
WORKER_RETRIES = 3
# The exit status of a worker that, while importing the caller's main script, reached
# run_parallel: the script has no __main__ guard (`_leave_if_bootstrapping`).
UNGUARDED_MAIN_EXIT = 86
UNGUARDED_MAIN_TEXT = (
    "the worker processes could not start: each re-ran this script's code up to its sweep, "
    "plan or simulate(workers=...) call (multiprocessing's forkserver and spawn start a "
    "worker by importing the "
    "main script) and stopped there. Put the script's code under "
    '`if __name__ == "__main__":`, or pass workers=1 to run in this process'
)


@dataclass(frozen=True)
class JobError:
    """What run_parallel yields instead of a job's result when the job did not return:
    'failed' (it raised, or killed its worker on every try) or 'lost' (Dask gave up on it;
    worth rerunning)."""

    status: str
    error: str
    detail: str | None


def job_error(status: str, exc: BaseException) -> JobError:
    """A job's exception as its result: an InfersimError's message as the error (its first
    line) and the detail; any other exception named by type, with its traceback."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, InfersimError):
        return JobError(status, first, text)
    error = f"{type(exc).__name__}: {first}".rstrip(": ")
    return JobError(status, error, "".join(traceback.format_exception(exc)))


_started: Any = None  # in a local worker: the queue it reports each job's start on
_job: int | None = None  # in a local worker: the job it runs
# How often, in seconds, the parent reads what running jobs `report` (when it listens).
REPORT_EVERY_S = 0.2


def _init_worker(started: Any, caller: int) -> None:
    global _started
    _started = started
    _end_with_caller(caller)


def _end_with_caller(caller: int) -> None:
    """On Linux, end this worker (SIGTERM, as the pool ends its workers) when the `caller`
    process (the sweep, plan or sharded run) dies, so no worker runs on unowned after a
    caller killed with SIGKILL, which has no chance to end its pool; elsewhere nothing.
    prctl(PR_SET_PDEATHSIG) would follow the worker's parent, which under forkserver is
    the fork server, and that outlives the caller while any worker lives (each worker
    holds the pipe whose end tells it its client is gone): so a daemon thread waits on a
    pidfd of the caller instead, whatever the start method. A caller gone before the
    pidfd was opened ends the worker at once."""
    if not hasattr(os, "pidfd_open"):  # Linux 5.3+ only
        return
    try:
        pidfd = os.pidfd_open(caller)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except OSError:  # a kernel without pidfds: the worker lives as before
        return
    threading.Thread(
        target=_end_when_ready, args=(pidfd,), name="caller-watch", daemon=True
    ).start()


def _end_when_ready(pidfd: int) -> None:
    """A pidfd reads ready when its process exits."""
    select.select([pidfd], [], [])
    os.kill(os.getpid(), signal.SIGTERM)


def _call(fn: Callable[[Any], Any], index: int, payload: Any) -> Any:
    """Report the start first: when the pool breaks, the jobs that had started are the
    ones that may have killed it."""
    global _job
    _started.put(index)
    _job = index
    return fn(payload)


def report(value: Any) -> None:
    """From a job running on a local worker: `value` to the `on_report` the parent gave
    run_parallel (a progress count); elsewhere (in process, on Dask) nothing."""
    if _started is not None and _job is not None:
        _started.put((_job, value))


def _leave_if_bootstrapping() -> None:
    """In a worker still importing the caller's main script, a run_parallel call means
    the script has no `if __name__ == "__main__":` guard; starting a pool here would die on
    multiprocessing's bootstrapping RuntimeError, which the parent sees only as a broken
    pool. Exit with a status the parent recognises (UNGUARDED_MAIN_EXIT) instead."""
    # spawn._main sets this while it re-runs the main script (spawn._check_not_importing_main)
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        sys.stderr.flush()
        os._exit(UNGUARDED_MAIN_EXIT)


def _death_text(exit_codes: Iterable[int | None]) -> str:
    """How a broken pool's workers died, from their exit statuses (negative: a signal;
    SIGTERM is the pool ending the survivors)."""
    codes = sorted({c for c in exit_codes if c} - {-signal.SIGTERM})
    if not codes:
        return "killed by a signal, e.g. out of memory"
    return ", ".join(
        f"killed by {signal.Signals(-c).name}, e.g. out of memory"
        if -c in signal.valid_signals()
        else f"exit status {c}"
        for c in codes
    )


def _drain(started: Any, into: set[int], on_report: OnReport | None) -> None:
    """Jobs' starts into `into`, their reports to `on_report`."""
    while not started.empty():
        item = started.get()
        if not isinstance(item, tuple):
            into.add(item)
        elif on_report is not None:
            on_report(*item)


def _pool_round(
    fn: Callable[[Any], Any],
    payloads: Sequence[Any],
    batch: list[int],
    width: int,
    on_report: OnReport | None,
    meanwhile: Meanwhile | None = None,
) -> Generator[tuple[int, Any], None, tuple[list[int], list[int], str]]:
    """Run `batch` on a fresh pool of `width` processes, yielding results as they come,
    and `meanwhile` in this process once the jobs are submitted. Returns what a broken
    pool left: (not started, started but unfinished, how its workers died). Raises
    InfersimError when the workers could not start for want of a __main__ guard in the
    caller's script."""
    context = multiprocessing.get_context(_START_METHOD)
    started = context.SimpleQueue()
    pool = ProcessPoolExecutor(
        max_workers=min(width, len(batch)),
        mp_context=context,
        initializer=_init_worker,
        initargs=(started, os.getpid()),
    )
    futures: dict[Future, int] = {pool.submit(_call, fn, i, payloads[i]): i for i in batch}
    processes = pool._processes  # the pool's own dict: kept, with exit codes, when it breaks
    unfinished: list[int] = []
    began: set[int] = set()
    pending = set(futures)
    every = None if on_report is None else REPORT_EVERY_S  # else wake only for results
    try:
        if meanwhile is not None:
            meanwhile(lambda: _drain(started, began, on_report))
        while pending:
            done, pending = wait(pending, timeout=every, return_when=FIRST_COMPLETED)
            _drain(started, began, on_report)  # a full pipe would block workers' reports
            for future in sorted(done, key=futures.__getitem__):
                try:
                    result = future.result()
                except BrokenProcessPool:
                    unfinished.append(futures[future])
                    continue
                except Exception as exc:  # fn raised: the job's own failure, not the pool's
                    result = job_error("failed", exc)
                yield futures[future], result
    except BaseException:
        # ^C, or the caller stopped: end the jobs in flight instead of waiting for them
        # and for the ones already queued to each worker (Python 3.14 adds
        # ProcessPoolExecutor.terminate_workers for this).
        for process in list((pool._processes or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(cancel_futures=True)
    _drain(started, began, on_report)
    started.close()
    exit_codes = [process.exitcode for process in (processes or {}).values()]
    if unfinished and UNGUARDED_MAIN_EXIT in exit_codes:
        raise InfersimError(UNGUARDED_MAIN_TEXT)
    order = {i: n for n, i in enumerate(batch)}
    unfinished.sort(key=order.__getitem__)
    # No start reported (killed before it could say): blame the jobs workers took first.
    suspects = [i for i in unfinished if i in began] or unfinished[:width]
    return [i for i in unfinished if i not in suspects], suspects, _death_text(exit_codes)


def _local(
    fn: Callable[[Any], Any],
    payloads: Sequence[Any],
    workers: int,
    on_report: OnReport | None = None,
    meanwhile: Meanwhile | None = None,
) -> Iterator[tuple[int, Any]]:
    """Jobs on local processes, `meanwhile` in this process once the first pool has
    them. When a worker dies the pool is broken; the jobs that had not started go on a
    fresh pool, and those that had (the culprit and any job sharing the pool at the
    time) are retried one at a time, where a death names its job."""
    _leave_if_bootstrapping()
    deaths = [0] * len(payloads)
    together, alone = list(range(len(payloads))), []
    while together or alone:
        batch, width = (together, workers) if together else (alone, 1)
        rest, suspects, death = yield from _pool_round(
            fn, payloads, batch, width, on_report, meanwhile
        )
        meanwhile = None  # done, on the first pool
        if batch is together:
            together, alone = rest, alone + suspects
        else:
            alone = rest + suspects
        for i in suspects:
            deaths[i] += 1
            if deaths[i] > WORKER_RETRIES:
                alone.remove(i)
                reason = (
                    f"its worker process died on each of {deaths[i]} tries ({death}); not retried"
                )
                yield i, JobError("failed", reason, None)


def _in_process(fn: Callable[[Any], Any], payloads: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    """workers=1: the jobs one after another in this process, no pool to start (and so no
    main script for a worker to import)."""
    for index, payload in enumerate(payloads):
        try:
            result = fn(payload)
        except Exception as exc:  # the job's own failure, as a pool's worker reports it
            result = job_error("failed", exc)
        yield index, result


def _dask(
    fn: Callable[[Any], Any], payloads: Sequence[Any], client: Client
) -> Iterator[tuple[int, Any]]:
    """Jobs on a Dask cluster, which retries a job whose worker died (allowed-failures)
    and then gives it up: that job is 'lost'."""
    from distributed import as_completed as dask_completed

    if not payloads:
        return
    # pure=False: a repeat run on the same client must not share (and cancel) tasks.
    futures = client.map(fn, list(payloads), pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    try:
        for future in dask_completed(futures):
            try:
                result = future.result()
            except Exception as exc:
                result = job_error("lost", exc)
            yield index[future.key], result
    finally:
        client.cancel(futures)


def run_parallel(
    fn: Callable[[Any], Any],
    payloads: Sequence[Any],
    *,
    workers: int | None = None,
    client: Client | None = None,
    on_report: OnReport | None = None,
    meanwhile: Meanwhile | None = None,
) -> Iterator[tuple[int, Any]]:
    """`fn(payload)` for each payload, on `workers` local processes (default: one per CPU;
    1 runs them in this process) or on the Dask cluster of `client`; yields (index, result)
    in finishing order, with a JobError as the result of a job that did not return. `fn`
    must be a module-level function; sweeps, capacity plans and one run's shards run here.
    `on_report(index, value)` gets what a job on a local worker passes to `report` as it
    runs, read every REPORT_EVERY_S. `meanwhile(read)`: this process's own share of the
    work, run on a local pool's `workers` processes once they have the jobs (a sharded
    run's parent runs a shard); it may call `read` to have the jobs' reports read."""
    workers = workers or os.cpu_count() or 1
    if meanwhile is not None and (client is not None or workers == 1):
        raise ValueError("run_parallel: meanwhile runs beside a local pool's processes")
    if client is not None:
        return _dask(fn, payloads, client)
    if workers == 1:
        return _in_process(fn, payloads)
    return _local(fn, payloads, workers, on_report, meanwhile)
