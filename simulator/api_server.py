"""vLLM's API server between the client and the engine core, as FIFO CPU servers.

`vllm serve` runs --api-server-count processes in front of the engine core (vLLM V1).
Each takes requests in (HTTP, validation, tokenising) and streams every token out
(output processing, detokenising, one SSE chunk of JSON): CPU work that, past a rate,
caps what a client sees however fast the GPUs are (benchmarks/README.md, "vLLM's API
server"). A process is modelled as a FIFO server: work that arrives while it is busy
waits. Two passes keep the engine loop as it is:

- ingest, before the run (`ingested`): the requests, in arrival order, go round robin
  over the fleet's processes; the engine sees a request when its process has taken it in.
- output, after the run (`ClientView`): every token the engine emitted (first tokens from
  the request table, the rest from the inter-token gaps' end times) is work arriving at
  its replica's processes when its step ends; the client sees it when the processes have
  worked through it. TTFT, TPOT, ITL, E2E and throughput become the client's.

A FIFO queue's finishing times are a running maximum over its arrivals
(`fifo_done`), so both passes are vectorised numpy, not SimPy events per token.

Approximations (each bounded by a figure the summary reports):
- a replica's tokens are shared equally by its processes (round robin spreads its running
  requests evenly; exact for one process, and off by a few tokens a step when a batch is
  small, which is when the processes are idle anyway);
- ingest and output share a process's CPU: the output pass counts the ingest work too
  (so utilisation, and the cap on throughput, are exact), but the ingest pass does not
  wait behind output work, so a request reaches the engine early by at most the output
  backlog then (`token_delay_s` in the summary bounds it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.engine.requests import Outcome, RequestTable
from simulator.metrics.summary import latency_stats
from simulator.scenario import FrontendSection

US = 1e-6


def fifo_done(arrive: np.ndarray, work: np.ndarray) -> np.ndarray:
    """When a FIFO server, idle at first, finishes each job (arrivals in time order):
    done_k = max(done_k-1, arrive_k) + work_k, in closed form as a running maximum,
    done_k = S_k + max over j <= k of (arrive_j - S_j-1), S the cumulative work."""
    total = np.cumsum(work)
    return total + np.maximum.accumulate(arrive - (total - work))


def ingest_work(section: FrontendSection, prompt: np.ndarray) -> np.ndarray:
    """Seconds of CPU each request takes to take in."""
    return (section.request_us + section.prompt_token_us * prompt) * US


def ingested(
    section: FrontendSection, arrival: np.ndarray, prompt: np.ndarray, replicas: int
) -> np.ndarray:
    """When the engine sees each request (arrivals in time order): request i goes to
    process i mod (replicas x api_server_count), the partition round robin routing over
    replicas then over each replica's processes makes, and waits for that process to take
    in the requests before it. A request is handed on no earlier than the one before it
    (the engine's open loop takes arrivals in order): exact with one process per replica."""
    done = np.empty(len(arrival))
    servers = replicas * section.api_server_count
    work = ingest_work(section, prompt)
    for server in range(min(servers, len(arrival))):
        mine = slice(server, None, servers)
        done[mine] = fifo_done(arrival[mine], work[mine])
    return np.maximum.accumulate(done) if len(done) else done


@dataclass(frozen=True)
class _Replica:
    """One replica's processes' queue: event times (sorted, distinct), when the client
    sees what arrived at each, and the work."""

    times: np.ndarray
    seen: np.ndarray
    work: float

    def client(self, t: np.ndarray) -> np.ndarray:
        """When the client sees tokens the engine emitted at times `t` (event times of
        this replica, or within rounding of one: a gap's start is its end minus it)."""
        i = np.clip(np.searchsorted(self.times, t), 1, len(self.times) - 1)
        nearer = np.where(np.abs(self.times[i - 1] - t) <= np.abs(self.times[i] - t), i - 1, i)
        return self.seen[nearer] if len(self.times) > 1 else np.full(np.shape(t), self.seen[0])


class ClientView:
    """The run as the client sees it through the API servers: apply() rewrites the request
    table's times and the inter-token gaps in place; summary() says how busy the
    processes were and how long tokens waited in them."""

    def __init__(
        self,
        section: FrontendSection,
        requests: RequestTable,
        client_arrival: np.ndarray,
        engine_arrival: np.ndarray,
        gaps: Sequence[np.ndarray],
    ) -> None:
        self.section, self.requests = section, requests
        self.client_arrival, self.engine_arrival = client_arrival, engine_arrival
        self.gaps = gaps
        n = requests.size
        self._replicas = [self._queue(r, gaps[r], n) for r in range(len(gaps))]
        self._waits: list[tuple[np.ndarray, np.ndarray]] = []

    def _queue(self, replica: int, gaps: np.ndarray, n: int) -> _Replica:
        """The replica's processes' queue. Tokens are counted per event time as integers
        before they are priced, so however the engine grouped its gap rows (a multi-step
        run or step by step) the work at each time is the same float."""
        req, section = self.requests, self.section
        mine = req.replica[:n] == replica
        first = mine & np.isfinite(req.first_token[:n])
        arrive = self.client_arrival[mine]
        times = np.concatenate((arrive, req.first_token[:n][first], gaps["end"]))
        if not len(times):
            return _Replica(np.zeros(1), np.zeros(1), 0.0)
        distinct, at = np.unique(times, return_inverse=True)
        ingest = np.bincount(
            at[: len(arrive)], ingest_work(section, req.prompt[:n][mine]), len(distinct)
        )
        token_weights = np.concatenate((np.ones(int(first.sum()), np.int64), gaps["weight"]))
        tokens = np.bincount(at[len(arrive) :], token_weights, len(distinct))
        work = ingest + tokens * (section.output_token_us * US)
        share = work / section.api_server_count
        return _Replica(distinct, fifo_done(distinct, share), math.fsum(work))

    def apply(self) -> None:
        """Client times in the request table (arrival, first and last token, a completed
        request's finish) and the gaps (seconds between the client's tokens, at the
        client's time)."""
        req, n = self.requests, self.requests.size
        req.arrival[:n] = self.client_arrival
        for r, queue in enumerate(self._replicas):
            mine = req.replica[:n] == r
            first = mine & np.isfinite(req.first_token[:n])
            seen = queue.client(req.first_token[:n][first])
            self._waits.append((seen - req.first_token[:n][first], np.ones(len(seen))))
            req.first_token[:n][first] = seen
            last = mine & np.isfinite(req.last_token[:n])
            req.last_token[:n][last] = queue.client(req.last_token[:n][last])
            done = mine & (req.outcome[:n] == Outcome.COMPLETED)
            req.finish[:n][done] = queue.client(req.finish[:n][done])
            gaps = self.gaps[r]
            if len(gaps):
                end = queue.client(gaps["end"])
                self._waits.append((end - gaps["end"], gaps["weight"]))
                gaps["seconds"] = end - queue.client(gaps["end"] - gaps["seconds"])
                gaps["end"] = end

    def last_seen(self) -> float:
        """When the client saw the last token of the run."""
        return max((float(q.seen[-1]) for q in self._replicas), default=0.0)

    def summary(self, duration: float) -> dict[str, Any]:
        """How busy the processes were over `duration` (the client's run), how long the
        engine's tokens waited in them before the client saw them, and how long requests
        took to reach the engine."""
        section = self.section
        processes = len(self._replicas) * section.api_server_count
        work = sum(q.work for q in self._replicas)
        waits = [w for w, _ in self._waits] or [np.zeros(0)]
        weights = [k for _, k in self._waits] or [np.zeros(0)]
        return {
            "kind": section.kind,
            "api_server_count": section.api_server_count,
            "processes": processes,
            "utilisation": work / (processes * duration) if duration > 0 else None,
            "token_delay_s": latency_stats(np.concatenate(waits), np.concatenate(weights)),
            "ingest_s": latency_stats(self.engine_arrival - self.client_arrival),
        }


def unmodelled_load(
    section: FrontendSection, requests: RequestTable, replicas: int, duration: float
) -> float:
    """The busiest replica's API server processes' utilisation had the front end been
    modelled with `section`'s costs: its requests' ingest and its streamed tokens over the
    run. Above 1 they could not have kept up."""
    n = requests.size
    if duration <= 0 or not n:
        return 0.0
    work = ingest_work(section, requests.prompt[:n]) + requests.generated[:n] * (
        section.output_token_us * US
    )
    routed = requests.replica[:n] >= 0
    per_replica = np.bincount(requests.replica[:n][routed], work[routed], minlength=replicas)
    return float(per_replica.max()) / (section.api_server_count * duration)


def unmodelled_warning(section: FrontendSection, load: float) -> str:
    """The warning for a run that does not model the front end and whose streamed output
    one replica's API server processes could not have kept up with."""
    processes = section.api_server_count
    return (
        f"the front end is not modelled (frontend.kind none), but streaming this run's "
        f"output and taking in its requests would keep {processes} vLLM API server "
        f"process{'es' if processes > 1 else ''} per replica {load:.0%} busy "
        f"({section.output_token_us:g} us a streamed token, {section.request_us:g} us a "
        f"request, {section.prompt_token_us:g} us a prompt token): client-visible "
        "throughput would be lower and latency higher than reported; set "
        "frontend.kind=vllm_api_server (and frontend.api_server_count) to model it"
    )
