"""The event loop of one run (`Run`): SimPy environment, workload process -> router ->
replicas, multi-turn sessions, disaggregated KV transfers, faults and request accounting."""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import simpy

from hardware_models.errors import InfeasibleError
from hardware_models.node import LinkSpec
from hardware_models.warning_scope import pass_on, warn
from simulator.api_server import ingested, instances, unmodelled_load, unmodelled_warning
from simulator.build import (
    BuiltScenario,
    ReplicaBuild,
    build_pools,
    open_loop_requests,
    shares_blocks_by_hash,
)
from simulator.caveats import configuration_warnings
from simulator.engine.dp_group import DpGroup
from simulator.engine.pipeline import PipelineGroup, SharedKv
from simulator.engine.prefix_hashes import BlockKeys
from simulator.engine.replica import Clock, Replica, ReplicaConfig, empty_kv_cache
from simulator.engine.requests import Outcome, RejectReason, RequestTable
from simulator.kv_links import KvLinks
from simulator.memory_planner import stage_layers
from simulator.metrics.context import ReplicaInfo
from simulator.progress import Progress
from simulator.router import SessionAffinity, foreseen_routes, make_router
from simulator.scenario import Scenario, replica_gpus
from simulator.workload import (
    ClosedLoopSampler,
    PromptHashes,
    RequestBatch,
    Session,
    SessionSampler,
)

if TYPE_CHECKING:
    from simulator.sharding import Share


@dataclass
class _LiveSession:
    """A session that may still send turns."""

    session: Session
    turn: int = 0  # index of the next turn to send (0-based)
    in_flight: bool = False  # a turn is queued or running; otherwise the user thinks


@dataclass
class _SessionState:
    """The multi-turn traffic of a run: which sessions are live, which turns are due."""

    live: dict[int, _LiveSession] = field(default_factory=dict)
    due: dict[int, float] = field(default_factory=dict)  # session -> its next turn's time
    heap: list[tuple[float, int]] = field(default_factory=list)  # (time, session), lazily
    next_start: float = float("inf")
    starts_done: bool = False  # no session starts any more (all started, or count reached)


def _kv_link(build: ReplicaBuild) -> LinkSpec:
    """The link a disaggregated replica's GPUs send or receive KV caches over."""
    link = build.node.inter_node_link or build.node.intra_node_link
    if link is None:
        raise InfeasibleError(
            f"disaggregated serving moves KV caches between replicas, but node "
            f"{build.node.name} has no link to send them over"
        )
    return link


def _kv_tokens_per_s(build: ReplicaBuild) -> float:
    """How many tokens' KV cache a replica's link moves a second: each GPU moves its own
    shard over its own link, and a replica of dp ranks has dp times the GPUs."""
    return _kv_link(build).bytes_per_second / build.memory.kv_bytes_per_token * build.dp


def _split(total: int, parts: int) -> list[int]:
    """`total` in `parts` as even as integers go, the larger first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


class Run:
    """The live state of one simulation: environment, replicas, request accounting.

    Built from a Scenario (its replicas built here, or taken from a `BuiltScenario`) and
    an optional `Share`, the replicas and requests this process simulates (sharding.py).
    `run()` simulates to the stop condition and wraps up (the cluster-wide warnings);
    `advance()` runs the event loop only, all a shard's process does. What sharding reads:
    `shardable()`, `units`, `expected`, `shares()` in the parent; `replicas`, `requests`,
    `owned` and `progress` in a shard; `scenario` in both."""

    def __init__(
        self,
        scenario: Scenario,
        progress: bool,
        built: BuiltScenario | None = None,
        share: Share | None = None,
    ) -> None:
        """`share`: the part of the run this process simulates, its replicas and their
        requests, the others' left to other processes (simulator/sharding.py); None: all."""
        self.scenario = scenario
        self.shard = None if share is None else frozenset(share.replicas)
        wl = scenario.workload
        base_dir = scenario.base_dir
        self.closed = wl.arrivals.kind == "closed_loop"
        batch = open_loop_requests(scenario) if share is None else share.batch
        self.builds = self._pools(built, batch)
        self.configuration_warnings = _configuration_warnings(self.builds)
        for text in self.configuration_warnings:  # before the run, which they may stop
            warn(text, stacklevel=3)
        self.env = simpy.Environment()
        self.horizon = wl.duration_s if wl.duration_s is not None else float("inf")
        self.clock = Clock(self.horizon)
        self.session_sampler: SessionSampler | None = None
        self.prompt_hashes: PromptHashes | None = None
        if wl.sessions is not None:
            context = min(build.config.max_model_len for _, build in self.builds)
            self.session_sampler = SessionSampler(wl, scenario.seed, base_dir, context)
            self.expected = wl.num_requests if len(self.session_sampler.starts) else 0
            self.class_names = list(self.session_sampler.class_names)
            self.requests = RequestTable(min(wl.num_requests or 4096, 1 << 20))
        elif self.closed:
            self.sampler = ClosedLoopSampler(wl, scenario.seed, base_dir)
            self.expected = wl.num_requests
            self.class_names = list(self.sampler.class_names)
            self.requests = RequestTable(min(wl.num_requests or 4096, 1 << 20))
        else:
            assert batch is not None
            self.prompt_hashes = batch.prompt_hashes
            self.expected = len(batch)
            self.class_names = list(batch.class_names)
            self.client_arrival = self.engine_arrival = batch.arrival_s
            self.submission_order = np.arange(len(batch))
            if scenario.frontend.modelled:  # the engine sees a request once taken in
                replicas = sum(pool.replicas for pool in scenario.pool_list())
                self.engine_arrival = ingested(
                    scenario.frontend, batch.arrival_s, batch.prompt_tokens, replicas
                )  # each process's own FIFO: a later request may overtake on another
                self.submission_order = np.argsort(self.engine_arrival, kind="stable")
            if share is not None:  # its own requests alone, ids in the run's order
                self.owned = share.owned
                self._timeline = (share.arrival, share.routes, self.submission_order)
                self.requests = RequestTable.of_inputs(share.inputs())  # the share's arrays
            else:
                self.requests = RequestTable(len(batch))
                self.requests.add(
                    self.engine_arrival,
                    batch.prompt_tokens,
                    batch.output_tokens,
                    batch.priority,
                    batch.priority_class,
                )
        self.terminal = 0
        self.done = self.env.event()
        self.progress = Progress(self.expected, enabled=progress, label=scenario.name)
        self.replicas: list[Replica] = []  # every engine, a dp rank each
        self.units: list[Replica | DpGroup] = []  # what routers and faults address
        self.infos: list[ReplicaInfo] = []
        roles = {pool.name: pool.role for pool in scenario.pool_list()}
        # A replica may run ahead of SimPy's clock only when it can foresee its inputs:
        # not in a disaggregated pool (handoffs come whenever prefills end, and a prefill
        # replica's blocks go free whenever their transfer ends), and not in a closed
        # loop or sessions over several replicas (another's completion sends a request
        # at any time).
        feedback = self.closed or self.session_sampler is not None
        blind = feedback and sum(b.replicas * b.dp for _, b in self.builds) > 1
        self.kv_links = KvLinks(self.env)
        self.kv_link_in: dict[Replica | DpGroup | PipelineGroup, int] = {}  # decode units'
        retried = scenario.faults is not None and scenario.faults.on_failure == "retry"
        for pool, build in self.builds:
            role = roles[pool]
            config = replace(
                build.config,
                role=role,
                multi_step=build.config.multi_step and not blind and role == "mixed",
                retried=retried,
            )
            keys = self._prefix_keys(config)
            size = replica_gpus(build.cost.tp, build.cost.pp, build.dp)
            for index in range(build.replicas):
                link = self.kv_links.add(_kv_tokens_per_s(build)) if role != "mixed" else -1
                unit_index = len(self.units)  # of the replica built next
                handoff = self._handoff_from(build, link, unit_index) if role == "prefill" else None
                info = replace(build.info, pool=pool)
                # Replicas packed in order over the pool's nodes (replica_placements).
                unit = self._replica(build, config, info, handoff, keys, index * size)
                self.units.append(unit)
                if role == "decode":
                    self.kv_link_in[unit] = link
        entry = [r for r in self.units if r.cfg.role in ("mixed", "prefill")]
        router = scenario.parallelism.router
        self.router = make_router(router, entry, scenario.seed, self.requests)
        decoders = [r for r in self.units if r.cfg.role == "decode"]
        self.decode_router = (
            make_router(router, decoders, scenario.seed + 1, self.requests) if decoders else None
        )

    def shares(self, shards: list[tuple[int, ...]]) -> list[Share]:
        """Each shard's part of the run, from this process's request table: the requests
        routed to its replicas, and the whole run's arrival timeline and routing, which
        every shard replays (the same arrays in each)."""
        from simulator.sharding import Share  # sharding imports this module

        req, n = self.requests, self.requests.size
        kind, seed = self.scenario.parallelism.router, self.scenario.seed
        routes = foreseen_routes(kind, len(self.router.replicas), seed, n)
        arrival = req.arrival[:n]  # in submission order: no API server reorders them here
        batch = RequestBatch(arrival, req.prompt[:n], req.output[:n], req.priority[:n],
                             req.priority_class[:n], tuple(self.class_names),
                             self.prompt_hashes)  # fmt: skip
        owned = [np.flatnonzero(np.isin(routes, shard)) for shard in shards]
        return [
            Share(shard, own, batch.take(own), arrival, routes)
            for shard, own in zip(shards, owned, strict=True)
        ]

    def _pools(
        self, built: BuiltScenario | None, batch: RequestBatch | None
    ) -> list[tuple[str, ReplicaBuild]]:
        """The replicas `built` holds, raising the warnings building them raised, or the
        replicas built now for the workload `batch`."""
        if built is None:
            return build_pools(self.scenario, shares_blocks_by_hash(batch))
        pass_on(list(built.raised))
        return built.pools

    def _replica(
        self,
        build: ReplicaBuild,
        config: ReplicaConfig,
        info: ReplicaInfo,
        handoff: Callable[[int], None] | None,
        keys: BlockKeys | None,
        first_gpu: int = 0,
    ) -> Replica | DpGroup | PipelineGroup:
        """One replica, from cluster GPU `first_gpu` on: an engine, dp ranks
        (engine_group.py, each rank's tp x pp GPUs after the last's), or pp pipelined
        engines (on the same GPUs)."""
        pp = build.cost.pp
        pipelined = build.pipelined_engines > 0
        if pp > 1 and not config.iterative:
            warn(
                f"{build.pp_field}={pp}: serving.policy {config.policy!r} runs whole "
                "batches, one at a time, so the stages run one after another (no pipelining; "
                "use continuous or chunked_prefill to pipeline)",
                stacklevel=2,
            )
        engines = build.dp if build.dp > 1 else build.pipelined_engines or 1
        driven = pipelined or (build.dp > 1 and build.arch.is_moe)
        configs = [config] * engines
        shared_kv = None
        if pipelined:  # one KV cache; max_num_seqs over all batches in flight
            configs = [replace(config, max_num_seqs=seqs, swap_blocks=config.swap_blocks // engines)
                       for seqs in _split(config.max_num_seqs, engines)]  # fmt: skip
            shared_kv = SharedKv(functools.partial(empty_kv_cache, config, keys))
            warn(  # per replica; simulate() passes each distinct one on once
                f"{build.pp_field}={pp}: serving.max_num_seqs={config.max_num_seqs} is split "
                f"as {_split(config.max_num_seqs, engines)} over the {engines} batches in "
                "flight, and a request stays in its batch; vLLM V1 caps only their total, "
                "so its batches may be less even than these",
                stacklevel=2,
            )
        index = len(self.replicas)
        members = []
        for rank, engine_config in enumerate(configs):
            rank_gpu = first_gpu + (0 if pipelined else rank * build.cost.tp * pp)
            members.append(
                Replica(self.env, index if pipelined else index + rank, engine_config,
                        build.cost.placed(rank_gpu, first_gpu), self.requests, self.clock,
                        self._on_finish, handoff, keys, driven=driven, kv_source=shared_kv)
            )  # fmt: skip
            if rank == 0 or not pipelined:  # a pipelined replica's engines share one log
                self.replicas.append(members[-1])
                self.infos.append(replace(info, dp_rank=rank) if build.dp > 1 else info)
        if pipelined:
            assert shared_kv is not None
            layers = [len(stage) for stage in stage_layers(build.arch, pp)]
            return PipelineGroup(self.env, members, layers, shared_kv)
        if build.dp > 1:
            return DpGroup(self.env, members, lockstep=driven)
        return members[0]

    def _prefix_keys(self, config: ReplicaConfig) -> BlockKeys | None:
        """Block identities of the trace's prompts, for a prefix cache shared by hash."""
        if self.prompt_hashes is None:
            return None
        if not config.prefix_caching:
            warn(
                "the trace's hash_ids are not used: serving.enable_prefix_caching is off, so "
                "no prompt reuses another's cached blocks",
                stacklevel=2,
            )
            return None
        assert config.kv_groups is None  # build_replica turned the hybrid manager off
        return BlockKeys(self.prompt_hashes, config.block_size)

    def _on_finish(self, rid: int) -> None:
        self.terminal += 1
        self.progress.update(self.terminal)
        if self.closed:
            self._schedule_user(float(self.sampler.think_time(1)[0]))
        if self.session_sampler is not None:
            finished = self._turn_done(rid)
        else:
            finished = self.expected is not None and self.terminal >= self.expected
        if finished and not self.done.triggered:
            self.done.succeed()

    # ---- arrivals ----------------------------------------------------------------------
    def _open_loop(self):
        """Requests in the order the engine sees them (`submission_order`: by arrival, or
        by when an API server process took each in)."""
        env, clock, order = self.env, self.clock, self.submission_order
        arrival = self.requests.arrival[order]
        n = self.requests.size
        for k in range(n):
            t = arrival.item(k)
            clock.next_arrival = t
            if t > env.now:
                yield env.timeout(t - env.now)
            clock.next_arrival = arrival.item(k + 1) if k + 1 < n else float("inf")
            clock.arrivals_done = k + 1 == n
            self._route(order.item(k))
        self._nudge_all()

    def _nudge_all(self) -> None:
        """No arrival is in sight: replicas holding partial batches may start them."""
        for unit in self.units:
            unit.nudge()

    def _routing_is_foreseeable(self) -> bool:
        """Round robin and random routing do not look at replica state, so every
        request's replica is known before the run: each replica then knows its own next
        arrival and runs ahead of SimPy's clock between them, not between the cluster's
        (the difference between a 64-replica run being event-per-step or not)."""
        return (
            self.scenario.parallelism.router in ("round_robin", "random")
            and self.session_sampler is None  # later turns arrive after completions
            and self.scenario.faults is None
            and len(self.router.replicas) > 1
        )

    def shardable(self) -> bool:
        """The replicas are independent simulations: every request's replica is known
        before the run (_routing_is_foreseeable) and no replica's output is another's
        input (no closed loop, decode pool, modelled API server or dp/pp group), so each
        may run in a process of its own (simulator/sharding.py)."""
        return (
            not self.closed
            and self.session_sampler is None
            and not self.scenario.frontend.modelled
            and self.decode_router is None
            and all(type(unit) is Replica for unit in self.units)
            and self._routing_is_foreseeable()
        )

    def _timeline_of_arrivals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The run's requests in submission order, each one's arrival and replica (an
        index into the router's replicas), and the table ids of this process's own
        requests (a shard's table holds those alone, in that order)."""
        if self.shard is not None:
            return self._timeline
        order, kind = self.submission_order, self.scenario.parallelism.router
        routes = foreseen_routes(kind, len(self.router.replicas), self.scenario.seed, len(order))
        return self.requests.arrival[order], routes, order

    def _open_loop_prerouted(self, arrival: np.ndarray, targets: np.ndarray, ids: np.ndarray):
        """Arrivals to replicas chosen before the run. A shard keeps the whole arrival
        timeline (the same timeouts, scheduled at the same times, so SimPy orders its
        replicas' events as the one-process run does) and submits only its own."""
        env, n = self.env, len(arrival)
        entry: list[Replica | None] = list(self.router.replicas)
        for i, replica in enumerate(self.router.replicas):
            replica.clock = Clock(self.horizon)
            if self.shard is not None and i not in self.shard:
                entry[i] = None  # another process's: no request comes to it here
                replica.clock.next_arrival, replica.clock.arrivals_done = math.inf, True
        own = [i for i, replica in enumerate(entry) if replica is not None]
        if len(own) < len(entry):
            mask = np.isin(targets, own)
            own_targets, own_arrival = targets[mask], arrival[mask]
        else:
            own_targets, own_arrival = targets, arrival
        next_own = np.full(len(ids), np.inf)  # the next arrival at the same replica
        for i in own:
            mine = np.flatnonzero(own_targets == i)
            next_own[mine[:-1]] = own_arrival[mine[1:]]
            clock = self.router.replicas[i].clock
            clock.next_arrival = own_arrival.item(mine[0]) if len(mine) else math.inf
            clock.arrivals_done = not len(mine)
        j = 0  # own requests submitted so far
        for k in range(n):
            t = arrival.item(k)  # .item(): Python numbers, with no numpy scalar made
            if t > env.now:
                yield env.timeout(t - env.now)
            replica = entry[targets.item(k)]
            if replica is None:
                continue
            after = next_own.item(j)
            replica.clock.next_arrival = after
            replica.clock.arrivals_done = after == math.inf
            replica.submit(ids.item(j))
            j += 1

    def _start_closed_loop(self) -> None:
        self.issued = 0
        self.pending: dict[int, float] = {}
        for _ in range(self.sampler.users):
            self._schedule_user(0.0)

    def _schedule_user(self, delay: float) -> None:
        wl = self.scenario.workload
        if wl.num_requests is not None and self.issued >= wl.num_requests:
            self.clock.arrivals_done = True
            return
        at = self.env.now + delay
        if at >= self.horizon:
            return
        self.issued += 1
        prompt, output = self.sampler.lengths(1)
        priority, cls = self.sampler.classes(1)
        rid = int(self.requests.add(np.array([at]), prompt, output, priority, cls)[0])
        self.pending[rid] = at
        self.clock.next_arrival = min(self.pending.values())
        self.env.process(self._arrive(rid, delay))

    def _arrive(self, rid: int, delay: float):
        if delay > 0:
            yield self.env.timeout(delay)
        del self.pending[rid]
        self.clock.next_arrival = min(self.pending.values(), default=float("inf"))
        self._route(rid)
        if not self.pending:
            self._nudge_all()

    # ---- multi-turn sessions ------------------------------------------------------------
    def _session_starts(self):
        """Start sessions at their drawn times; each sends its first turn at once."""
        sampler, state, env = self.session_sampler, self.sessions, self.env
        assert sampler is not None
        starts = sampler.starts.tolist()
        for index, t in enumerate(starts):
            state.next_start = t
            self._update_session_clock()
            if t > env.now:
                yield env.timeout(t - env.now)
            if state.starts_done:  # num_requests was reached by earlier turns
                break
            state.next_start = starts[index + 1] if index + 1 < len(starts) else float("inf")
            state.live[index] = _LiveSession(sampler.session(index))
            self._send_turn(index)
        state.starts_done = True
        state.next_start = float("inf")
        self._update_session_clock()
        if self._sessions_over() and not self.done.triggered:
            self.done.succeed()

    def _send_turn(self, session: int) -> None:
        """The session's next turn arrives now: register it and route it."""
        state, wl = self.sessions, self.scenario.workload
        live = state.live[session]
        s, k = live.session, live.turn
        rid = int(
            self.requests.add(
                np.array([self.env.now]), s.prompt[k : k + 1], s.output[k : k + 1],
                np.array([s.priority]), s.priority_class, session, k + 1,
            )[0]
        )  # fmt: skip
        self.issued += 1
        live.in_flight = True
        if wl.num_requests is not None and self.issued >= wl.num_requests:
            self._stop_sessions()
        self._update_session_clock()
        self._route(rid)
        if not state.due and state.next_start == float("inf"):
            self._nudge_all()  # no arrival in sight: partial batches may start

    def _stop_sessions(self) -> None:
        """num_requests turns were sent: no session starts or sends a turn any more."""
        state = self.sessions
        state.starts_done = True
        state.next_start = float("inf")
        for session in [s for s, live in state.live.items() if not live.in_flight]:
            self._end_session(session)
        state.due.clear()
        state.heap.clear()
        self.clock.arrivals_done = True

    def _turn_done(self, rid: int) -> bool:
        """A turn reached its outcome: schedule the session's next turn a think time
        after a completion, or end the session (last turn, the turn was rejected or
        failed, no more turns may be sent, or the next would come after the horizon).
        Returns whether the whole run is over."""
        state = self.sessions
        session = int(self.requests.session[rid])
        live = state.live[session]
        live.in_flight = False
        live.turn += 1
        s = live.session
        completed = self.requests.outcome[rid] == Outcome.COMPLETED
        if completed and live.turn < s.turns and not self.clock.arrivals_done:
            at = self.env.now + float(s.think_s[live.turn - 1])
            if at < self.horizon:
                state.due[session] = at
                heapq.heappush(state.heap, (at, session))
                self._update_session_clock()
                self.env.process(self._next_turn(session, at - self.env.now))
                return False
        self._end_session(session)
        return self._sessions_over()

    def _next_turn(self, session: int, delay: float):
        yield self.env.timeout(delay)
        if self.sessions.due.pop(session, None) is not None:  # else stopped meanwhile
            self._send_turn(session)

    def _end_session(self, session: int) -> None:
        del self.sessions.live[session]
        for router in (self.router, self.decode_router):
            if isinstance(router, SessionAffinity):
                router.end(session)

    def _update_session_clock(self) -> None:
        """The next arrival any replica may see: a session start or a due turn."""
        state = self.sessions
        heap = state.heap
        while heap and state.due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # sent or cancelled
        due = heap[0][0] if heap else float("inf")
        self.clock.next_arrival = min(state.next_start, due)

    def _sessions_over(self) -> bool:
        state = self.sessions
        return state.starts_done and not state.live and self.terminal >= self.issued

    # ---- disaggregated serving -------------------------------------------------------
    def _handoff_from(
        self, build: ReplicaBuild, link: int, unit_index: int
    ) -> Callable[[int, Callable[[], None]], None]:
        """The hand-off of prefill replica `self.units[unit_index]`, whose link is `link`
        (kv_links.py): the decode replica is chosen
        now, as vLLM's P/D proxy sends the request on when the prefill answers
        (benchmarks/disagg_benchmarks/disagg_prefill_proxy_server.py); the prompt's KV
        cache then crosses the sender's and the receiver's links, shared with their other
        transfers (kv_links.py), the sender's blocks going free once it has."""
        latency = _kv_link(build).latency_us * 1e-6

        def handoff(rid: int, release: Callable[[], None]) -> None:
            source = self.units[unit_index]
            target = self._healthy(rid, self.decode_router)
            if target is None:
                release()
                source.nudge()
                return
            tokens = int(self.requests.prompt[rid])
            target.incoming += 1
            sent = self.kv_links.send(tokens, link, self.kv_link_in[target], latency)
            sent.callbacks.append(lambda _: self._deliver(rid, tokens, source, target, release))

        return handoff

    def _deliver(
        self,
        rid: int,
        tokens: int,
        source: Replica | DpGroup | PipelineGroup,
        target: Replica | DpGroup | PipelineGroup,
        release: Callable[[], None],
    ) -> None:
        """The KV cache has crossed: the prefill replica frees its blocks (and may admit
        what waited for them), the decode replica takes the request."""
        release()
        source.nudge()
        target.incoming -= 1
        if target.down:  # failed meanwhile: another decode replica takes it
            self._route(rid, self.decode_router, kv_tokens=tokens)
        else:
            target.submit(rid, tokens)

    def _healthy(self, rid: int, router) -> Replica | DpGroup | PipelineGroup | None:
        """A healthy replica chosen by the router, or None (the request has then failed)."""
        replica = router.route(rid)
        if replica.down:
            healthy = [r for r in router.replicas if not r.down]
            if not healthy:
                self.requests.fail(rid, RejectReason.NO_HEALTHY_REPLICA, self.env.now)
                self._on_finish(rid)
                return None
            # State-blind routers (round robin, random) may land on a dead replica.
            replica = min(healthy, key=lambda r: r.outstanding)
        return replica

    def _route(self, rid: int, router=None, kv_tokens: int = 0) -> None:
        """Send a request to a healthy replica chosen by the router (or fail it)."""
        replica = self._healthy(rid, router or self.router)
        if replica is not None:
            replica.submit(rid, kv_tokens)

    # ---- faults --------------------------------------------------------------------------
    def _start_faults(self) -> None:
        faults = self.scenario.faults
        if faults is None:
            return
        events = sorted(
            [(e.at_s, "fail", e.replica) for e in faults.events]
            + [(e.recover_at_s, "recover", e.replica) for e in faults.events if e.recover_at_s]
        )
        self.clock.next_fault = min(t for t, kind, _ in events if kind == "fail")
        self.env.process(self._fault_process(events))

    def _fault_process(self, events):
        faults = self.scenario.faults
        failures = sorted(t for t, kind, _ in events if kind == "fail")
        for at, kind, index in events:
            if at > self.env.now:
                yield self.env.timeout(at - self.env.now)
            replica = self.units[index]
            if kind == "recover":
                replica.recover()
                continue
            failures.remove(at)
            self.clock.next_fault = failures[0] if failures else float("inf")
            if replica.down:
                continue
            for rid in replica.fail():
                if faults.on_failure == "retry" and self.requests.retries[rid] < faults.max_retries:
                    self.requests.restart(rid)
                    self._route(rid)
                    continue
                reason = (
                    RejectReason.REPLICA_FAILED
                    if faults.on_failure == "fail"
                    else RejectReason.TOO_MANY_RETRIES
                )
                self.requests.fail(rid, reason, self.env.now)
                self._on_finish(rid)

    def _warn_unfired_faults(self) -> None:
        """A failure timed after the run's last event never happens: say so, rather than
        report a fault-free run as the fault's outcome."""
        faults = self.scenario.faults
        for i, event in enumerate(faults.events if faults else ()):
            if event.at_s > self.env.now:
                warn(
                    f"faults.events[{i}]: at_s={event.at_s:g} s is after the run's end "
                    f"({self.env.now:.1f} s), so replica {event.replica} never failed; "
                    "fail it earlier or run longer (workload.duration_s / num_requests)",
                    stacklevel=2,
                )

    # ---- run ---------------------------------------------------------------------------
    def run(self) -> float:
        """Simulate to the stop condition; the time the run stopped at."""
        end = self.advance()
        self.wrap_up()
        return end

    def advance(self) -> float:
        """The event loop, to the stop condition (all requests ended, or the horizon), and
        the in-flight tokens counted at the end: all a shard's process does."""
        self._start_faults()
        if self.session_sampler is not None:
            self.issued = 0
            self.sessions = _SessionState()
            self.env.process(self._session_starts())
        elif self.closed:
            self._start_closed_loop()
        elif self._routing_is_foreseeable():
            self.env.process(self._open_loop_prerouted(*self._timeline_of_arrivals()))
        else:
            self.env.process(self._open_loop())
        until = self.done
        if np.isfinite(self.horizon):
            until = self.done | self.env.timeout(self.horizon)
        if self.expected == 0:
            return 0.0
        self.env.run(until=until)
        for unit in self.units:
            unit.settle(self.env.now)
        return float(self.env.now)

    def wrap_up(self) -> None:
        """After the loop, over the whole cluster's requests (merged, when shards ran)."""
        self.progress.close()
        self._warn_unfired_faults()
        self._warn_unmodelled_front_end()

    def _warn_unmodelled_front_end(self) -> None:
        """A run that leaves the API server out but streams more than one replica's API
        server processes could (at frontend's costs) says its client figures are optimistic."""
        section = self.scenario.frontend
        if section.modelled:
            return
        instance = instances([info.dp_rank for info in self.infos])
        load, window = unmodelled_load(section, self.requests, instance)
        if load > 1:
            dp = self.scenario.parallelism.dp
            offline = self.scenario.workload.arrivals.kind == "offline"
            text = unmodelled_warning(section, load, window, dp, offline)
            warn(text, stacklevel=3)


def _configuration_warnings(builds: list[tuple[str, ReplicaBuild]]) -> tuple[str, ...]:
    """Each pool's configuration warnings, named by pool when there are several."""
    named = len(builds) > 1
    return tuple(
        f"pool {pool}: {text}" if named else text
        for pool, build in builds
        for text in configuration_warnings(build)
    )
