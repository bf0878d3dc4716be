"""vLLM's API server between the client and the engine core, as FIFO CPU servers.

`vllm serve` runs --api-server-count processes in front of the engine core (vLLM V1).
Each takes requests in (HTTP, validation, tokenising) and streams every token out
(output processing, detokenising, one SSE chunk of JSON): CPU work that, past a rate,
caps what a client sees however fast the GPUs are (benchmarks/README.md, "vLLM's API
server"). A process is modelled as a FIFO server: work that arrives while it is busy
waits. Two passes keep the engine loop as it is:

- ingest, before the run (`ingested`): the requests, in arrival order, go round robin
  over the fleet's processes, each its own FIFO; the engine sees a request when its
  process has taken it in, so in the order they were taken in (the run's submission
  order), and the router routes it then.
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
  backlog then (`token_delay_s` in the summary bounds it);
- every token costs the same: vLLM merges a lagging request's streamed deltas into one
  SSE chunk (RequestOutputCollector), which a saturated process would pay once.

Saturation is judged on the busiest replica, over the busiest of WINDOWS windows of its
serving span (`peak_load`), with the front end modelled and without (`unmodelled_load`,
per vLLM instance: a replica's dp ranks share its processes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.engine.requests import Outcome, RequestTable
from simulator.metrics.bins import count_in_bins, integrals
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
    process i mod (replicas x processes per replica), the partition round robin over
    replicas then over each replica's processes makes, and waits for that process to take
    in the requests before it. Each process is its own FIFO: a request another process
    takes in sooner overtakes one stuck behind a long prompt, so the engine sees requests
    in the order of these times (the run's submission order), not in arrival order."""
    done = np.empty(len(arrival))
    servers = replicas * section.processes()
    work = ingest_work(section, prompt)
    for server in range(min(servers, len(arrival))):
        mine = slice(server, None, servers)
        done[mine] = fifo_done(arrival[mine], work[mine])
    return done


@dataclass(frozen=True)
class _Replica:
    """One replica's processes' queue: event times (sorted, distinct), when the client
    sees what arrived at each, and the work that arrived at each."""

    times: np.ndarray
    seen: np.ndarray
    work_at: np.ndarray

    @property
    def work(self) -> float:
        return math.fsum(self.work_at)

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
        self._applied = False

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
            return _Replica(np.zeros(1), np.zeros(1), np.zeros(1))
        distinct, at = np.unique(times, return_inverse=True)
        ingest = np.bincount(
            at[: len(arrive)], ingest_work(section, req.prompt[:n][mine]), len(distinct)
        )
        token_weights = np.concatenate((np.ones(int(first.sum()), np.int64), gaps["weight"]))
        tokens = np.bincount(at[len(arrive) :], token_weights, len(distinct))
        work = ingest + tokens * (section.output_token_us * US)
        share = work / section.processes()
        return _Replica(distinct, fifo_done(distinct, share), work)

    def apply(self) -> None:
        """Client times in the request table (arrival, first and last token, a completed
        request's finish) and the gaps (seconds between the client's tokens, at the
        client's time)."""
        if self._applied:  # a second pass would delay the client's times again
            raise RuntimeError("ClientView.apply() rewrites the run in place: apply it once")
        self._applied = True
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
        """How busy the processes were over `duration` (the client's run), the fleet's and
        the busiest replica's, the busiest replica's offered load (`load`), how long the
        engine's tokens waited in them before the client saw them, and how long requests
        took to reach the engine."""
        section = self.section
        count = section.processes()
        work = np.array([q.work for q in self._replicas])
        waits = [w for w, _ in self._waits] or [np.zeros(0)]
        weights = [k for _, k in self._waits] or [np.zeros(0)]
        busy = duration > 0
        load, window = max(peak_load(q.times, q.work_at, count) for q in self._replicas)
        return {
            "kind": section.kind,
            "api_server_count": count,
            "processes": len(self._replicas) * count,
            "utilisation": work.sum() / (len(work) * count * duration) if busy else None,
            "utilisation_max": work.max() / (count * duration) if busy else None,
            "load": load,
            "load_window_s": window,
            "token_delay_s": latency_stats(np.concatenate(waits), np.concatenate(weights)),
            "ingest_s": latency_stats(self.engine_arrival - self.client_arrival),
        }


WINDOWS = 20  # a replica's serving span in this many windows, to find its busiest


def peak_load(
    times: np.ndarray,
    work: np.ndarray,
    processes: int,
    spread: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[float, float]:
    """The busiest of WINDOWS equal windows of the span from the first to the last time:
    the share of `processes`' CPU the work handed over in it asks for (above 1 they fell
    behind; a whole run's mean hides a saturation in its middle), and its seconds.
    `work` arrives at `times`; `spread` (start, end, seconds a second) is work handed over
    evenly between two times."""
    first, last = float(times.min()), float(times.max())
    if not last > first:
        return 0.0, 0.0
    edges = np.linspace(first, last, WINDOWS + 1)
    per_window = count_in_bins(times, edges, work)
    if spread is not None:
        start, end, rate = spread
        per_window += integrals(start, end, rate[np.newaxis], edges)[0]
    width = (last - first) / WINDOWS
    return float(per_window.max()) / (processes * width), width


def instances(dp_ranks: Sequence[int | None]) -> np.ndarray:
    """Each engine's vLLM instance (replica): the engines are listed instance by
    instance, a dp group's ranks 0..dp-1 together (None: an instance without dp)."""
    return np.cumsum([rank is None or rank == 0 for rank in dp_ranks]) - 1


def unmodelled_load(
    section: FrontendSection, requests: RequestTable, instance: np.ndarray
) -> tuple[float, float]:
    """The busiest vLLM instance's `peak_load` on its API server processes, had the front
    end been modelled with `section`'s costs: each request's intake at its arrival, its
    first token's output at `first_token` and the rest evenly up to `last_token` (a
    decode's tokens come at a steady pace). `instance` maps each engine
    (requests.replica, a dp rank each) to its instance, whose processes are
    `section.processes(its dp ranks)`."""
    n = requests.size
    routed = np.flatnonzero(requests.replica[:n] >= 0)
    owner = instance[requests.replica[routed]]
    rows = routed[np.argsort(owner, kind="stable")]  # instance by instance
    owner = instance[requests.replica[rows]]
    ranks = np.bincount(instance)
    token = section.output_token_us * US
    busiest = (0.0, 0.0)
    for i in np.flatnonzero(np.bincount(owner)):  # not np.unique: it loads numpy.ma
        mine = rows[np.searchsorted(owner, i) : np.searchsorted(owner, i, side="right")]
        arrival, first, last = (requests.arrival[mine], requests.first_token[mine],
                                requests.last_token[mine])  # fmt: skip
        out = np.isfinite(first)
        first, last = first[out], last[out]
        rest = (requests.generated[mine][out] - 1) * token
        decoding = last > first
        times = np.concatenate((arrival, first, last))
        work = np.concatenate((
            ingest_work(section, requests.prompt[mine]),
            np.full(len(first), token),
            np.where(decoding, 0.0, rest),  # no time between: all at the last token
        ))  # fmt: skip
        rate = np.where(decoding, rest / np.where(decoding, last - first, 1.0), 0.0)
        load = peak_load(times, work, section.processes(int(ranks[i])), (first, last, rate))
        busiest = max(busiest, load)
    return busiest


def unmodelled_warning(
    section: FrontendSection, load: float, window: float, dp: int, offline: bool
) -> str:
    """The warning for a run that does not model the front end and whose streamed output
    one vLLM instance's API server processes could not have kept up with. Offline
    arrivals are served through the API server too (every request sent at once, as
    benchmark_serving.py's request rate inf); the warning says so, since vLLM's offline
    LLM.generate has no API server."""
    processes = section.processes(dp)
    offline_note = (
        " (offline arrivals are taken as sent at once to `vllm serve`; for LLM.generate, "
        "which has no API server, ignore this)"
        if offline
        else ""
    )
    return (
        f"the front end is not modelled (frontend.kind none), but streaming this run's "
        f"output and taking in its requests would keep the busiest replica's {processes} "
        f"vLLM API server process{'es' if processes > 1 else ''} {load:.0%} busy over its "
        f"busiest {window:.3g} s ({section.output_token_us:g} us a streamed token, "
        f"{section.request_us:g} us a request, {section.prompt_token_us:g} us a prompt "
        "token): client-visible throughput would be lower and latency higher than "
        "reported; set frontend.kind: vllm_api_server (and frontend.api_server_count) to "
        f"model it{offline_note}"
    )
