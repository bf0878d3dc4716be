"""A run as a Chrome / Perfetto trace-event JSON (chrome://tracing, ui.perfetto.dev): what
Vidur users open to see a simulated engine step by step.

One process per replica, or per dp rank of one, named as the summary's rows are
(`replica 2`, `replica 1 rank 3`: formatting.engine_labels). Its thread 0 holds the
engine steps as complete events ("X", named prefill, decode or mixed, with batch size,
token and KV counts as arguments) and counters ("C") for the batch (prefill and decode
tokens, batch size) and KV blocks in use. The requests it served are on the following
threads, each a lane of requests that do not overlap in time: per request a `queued`,
`prefill` and `decode` slice. Times are microseconds of simulated time, as the format
wants. A request shows on the replica that
finished it (in a disaggregated cluster, its decode replica; after a failure, the one
that retried it).

A long run has millions of steps, more than a trace viewer opens, so a trace holds at
most `max_events` events, the replicas' and lanes' names included: above that it keeps
the events that start before the time at which the cap is reached (the run's beginning,
complete), and says where it stopped.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hardware_models.errors import InfersimError
from simulator.formatting import engine_labels
from simulator.metrics.table import Table

if TYPE_CHECKING:
    from simulator.results import Results

MAX_EVENTS = 1_000_000
"""Default cap: about 150 MB of JSON, which chrome://tracing and Perfetto still open."""
_US = 1e6
STEP_THREAD = 0


@dataclass(frozen=True)
class ChromeTrace:
    """The trace-event document, and where it was cut when it had too many events."""

    document: dict[str, Any]
    events: int
    """Events in the document, the replicas' and lanes' names included."""
    dropped: int
    cut_s: float | None
    """Simulated time from which events were left out; None when nothing was."""


def chrome_trace(results: Results, *, max_events: int = MAX_EVENTS) -> ChromeTrace:
    """Steps, counters and request lifetimes of a run that kept its step table."""
    if max_events < 1:
        raise InfersimError(f"trace: max_events must be >= 1, got {max_events}")
    if results.step_table is None:
        raise InfersimError(
            "--trace-out needs the run's per-step table; set output.step_table: true"
        )
    events = _step_events(results.step_table) + _request_events(results.request_table)
    events.sort(key=lambda e: (e["ts"], e["pid"], e["tid"]))
    dropped, cut = 0, None
    over = _first_over_cap(events, max_events)
    if over is not None:
        cut_us = events[over]["ts"]
        keep = next(i for i, e in enumerate(events) if e["ts"] >= cut_us)
        dropped, cut = len(events) - keep, cut_us / _US
        events = events[:keep]
    meta = _metadata(results, events)
    document = {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "scenario": results.scenario.name,
            "seed": results.scenario.seed,
            "clock": "simulated time, microseconds",
            "truncated_at_s": cut,
            "events_dropped": dropped,
        },
    }
    return ChromeTrace(document, len(events) + len(meta), dropped, cut)


def _first_over_cap(events: list[dict[str, Any]], max_events: int) -> int | None:
    """Index of the first event that, with the names its replica and thread add (two
    per replica, one per thread: see _metadata), takes the trace over `max_events`;
    None when all of them fit."""
    pids: set[int] = set()
    threads: set[tuple[int, int]] = set()
    for i, event in enumerate(events):
        pids.add(event["pid"])
        threads.add((event["pid"], event["tid"]))
        if i + 1 + 2 * len(pids) + len(threads) > max_events:
            return i
    return None


def _step_events(steps: Table) -> list[dict[str, Any]]:
    start = (steps["start"] * _US).tolist()
    duration = (steps["duration"] * _US).tolist()
    prefill = steps["prefill_tokens"].tolist()
    decode = steps["decode_tokens"].tolist()
    batch = steps["batch_size"].tolist()
    kv = steps["kv_blocks_used"].tolist()
    waiting = steps["waiting"].tolist()
    replica = steps["replica"].tolist()
    events: list[dict[str, Any]] = []
    for ts, dur, p, d, b, k, w, r in zip(
        start, duration, prefill, decode, batch, kv, waiting, replica, strict=True
    ):
        name = "mixed" if p and d else ("prefill" if p else "decode")
        args = {"batch_size": b, "prefill_tokens": p, "decode_tokens": d}
        events.append(
            {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": r, "tid": STEP_THREAD,
             "args": {**args, "kv_blocks_used": k, "waiting": w}}
        )  # fmt: skip
        events.append({"name": "batch", "ph": "C", "ts": ts, "pid": r, "tid": STEP_THREAD,
                       "args": args})  # fmt: skip
        events.append({"name": "kv_blocks_used", "ph": "C", "ts": ts, "pid": r,
                       "tid": STEP_THREAD, "args": {"blocks": k}})  # fmt: skip
    return events


def _request_events(requests: Table) -> list[dict[str, Any]]:
    """queued (arrival to first scheduled), prefill (to the first token), decode (to the
    finish) of each request that reached a replica, on non-overlapping lanes."""
    ids = np.flatnonzero(requests["replica"] >= 0)
    served = requests.rows(ids)
    phases = {
        "queued": ("arrival", "first_scheduled"),
        "prefill": ("first_scheduled", "first_token"),
        "decode": ("first_token", "finish"),
    }
    begin = served["arrival"]
    times = np.stack([served[c] for c in ("first_scheduled", "first_token", "finish")])
    end = np.fmax.reduce(times)  # the latest time the request has (NaN: none)
    lanes = _lanes(served["replica"], begin, np.where(np.isnan(end), np.inf, end))
    events: list[dict[str, Any]] = []
    for name, (a, b) in phases.items():
        t0, t1 = served[a], served[b]
        ok = np.isfinite(t0) & np.isfinite(t1)
        for rid, r, lane, s, e in zip(
            ids[ok], served["replica"][ok], lanes[ok], t0[ok], t1[ok], strict=True
        ):
            events.append(
                {"name": name, "ph": "X", "ts": s * _US, "dur": (e - s) * _US, "pid": int(r),
                 "tid": int(lane), "args": {"request": int(rid)}}
            )  # fmt: skip
    return events


def _lanes(replica: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Thread (1, 2, ...) for each request: the lowest free lane of its replica when it
    arrives, so a lane never holds two requests at once."""
    lane = np.zeros(len(begin), dtype=np.int64)
    free: dict[int, list[int]] = {}
    busy: dict[int, list[tuple[float, int]]] = {}
    count: dict[int, int] = {}
    for i in np.argsort(begin, kind="stable"):
        r = int(replica[i])
        heap, idle = busy.setdefault(r, []), free.setdefault(r, [])
        while heap and heap[0][0] <= begin[i]:
            heapq.heappush(idle, heapq.heappop(heap)[1])
        if idle:
            lane[i] = heapq.heappop(idle)
        else:
            count[r] = lane[i] = count.get(r, 0) + 1
        heapq.heappush(heap, (float(end[i]), int(lane[i])))
    return lane


def _metadata(results: Results, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Process and thread names of the replicas and lanes in `events`, so the viewer
    shows them by name."""
    infos = results.context.replicas
    names = engine_labels([info.dp_rank for info in infos])  # as the summary's rows
    meta: list[dict[str, Any]] = []
    for r in sorted({e["pid"] for e in events}):
        info = infos[r] if r < len(infos) else None
        label = f"{names[r]} ({info.pool}, {info.gpus} x {info.gpu})" if info else f"replica {r}"
        meta.append({"name": "process_name", "ph": "M", "pid": int(r), "tid": 0,
                     "args": {"name": label}})  # fmt: skip
        meta.append({"name": "process_sort_index", "ph": "M", "pid": int(r), "tid": 0,
                     "args": {"sort_index": int(r)}})  # fmt: skip
    threads = sorted({(e["pid"], e["tid"]) for e in events})
    for pid, tid in threads:
        name = "engine steps" if tid == STEP_THREAD else f"requests {tid}"
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"name": name}})  # fmt: skip
    return meta
