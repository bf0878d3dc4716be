"""Turn a WorkloadConfig and a seed into requests: all at once for open-loop arrivals,
on demand (ClosedLoopSampler) when each request waits for the previous one to finish,
and one conversation at a time (SessionSampler) for multi-turn sessions.

Randomness: the seed spawns independent streams for arrivals (or think times), prompt
lengths, output lengths and classes (and, for sessions, think times and turn counts), so
changing one distribution leaves the others' draws unchanged, and the same config and
seed always give identical arrays.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hardware_models.errors import InfersimError
from hardware_models.warning_scope import warn
from simulator.workload.arrivals import open_loop_arrivals, think_times, trace_arrivals
from simulator.workload.config import (
    ClosedLoopArrivals,
    OfflineArrivals,
    PriorityClass,
    RateArrivals,
    TraceArrivals,
    TraceLength,
    WorkloadConfig,
)
from simulator.workload.lengths import LengthSampler, LengthSource, TableLengths, draw, to_tokens
from simulator.workload.trace_layouts import OUTPUT_COLUMN, PROMPT_COLUMN, shown_name
from simulator.workload.traces import MAX_TOKENS, Trace, read_trace

_ROLES = (("prompt_tokens", PROMPT_COLUMN), ("output_tokens", OUTPUT_COLUMN))


@dataclass(frozen=True)
class PromptHashes:
    """Per request, the hash of each block of `block_tokens` prompt tokens, as a Mooncake
    trace gives them: requests whose prompts start with the same hashes share those
    tokens (a system prompt, a document), so a prefix cache keyed by hash can serve them.
    `covered[i]` is how many leading tokens of request i's prompt the hashes describe: no
    more than its blocks hold, than the trace's prompt, or than the prompt simulated (a
    prompt lengthened by prompt_length_scale has distinct tokens after them)."""

    ids: tuple[np.ndarray, ...]
    block_tokens: int
    covered: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class RequestBatch:
    """Open-loop requests as columns, sorted by arrival. Arrays are read-only."""

    arrival_s: np.ndarray
    """float64 arrival times, seconds, non-decreasing."""
    prompt_tokens: np.ndarray
    """int64, >= 1."""
    output_tokens: np.ndarray
    """int64, >= 1: tokens to generate, the first one included."""
    priority: np.ndarray
    """int8, lower is more important."""
    priority_class: np.ndarray
    """int16 index into class_names."""
    class_names: tuple[str, ...]
    prompt_hashes: PromptHashes | None = None
    """Block hashes of the prompts, from a trace that has them (Mooncake's hash_ids)."""

    def __post_init__(self) -> None:
        arrays = (
            self.arrival_s,
            self.prompt_tokens,
            self.output_tokens,
            self.priority,
            self.priority_class,
        )
        if len({len(a) for a in arrays}) != 1:
            raise ValueError("RequestBatch columns differ in length")
        for a in arrays:
            a.flags.writeable = False

    def __len__(self) -> int:
        return len(self.arrival_s)

    def take(self, ids: np.ndarray) -> RequestBatch:
        """The requests `ids` (ascending, so still sorted by arrival), as a batch of
        their own: a shard's share of the run (simulator/sharding.py)."""
        hashes = self.prompt_hashes
        if hashes is not None:
            hashes = PromptHashes(
                tuple(hashes.ids[i] for i in ids.tolist()), hashes.block_tokens, hashes.covered[ids]
            )
        return RequestBatch(
            self.arrival_s[ids],
            self.prompt_tokens[ids],
            self.output_tokens[ids],
            self.priority[ids],
            self.priority_class[ids],
            self.class_names,
            hashes,
        )


def generate_requests(
    config: WorkloadConfig, seed: int, base_dir: str | Path = "."
) -> RequestBatch:
    """All requests of an open-loop workload. Trace paths are relative to `base_dir`."""
    if isinstance(config.arrivals, ClosedLoopArrivals):
        raise InfersimError(
            "workload: closed_loop arrivals depend on completions; the engine draws them "
            "with ClosedLoopSampler, not generate_requests"
        )
    if config.sessions is not None:
        raise InfersimError(
            "workload: a session's later turns arrive after earlier ones complete; the "
            "engine draws them with SessionSampler, not generate_requests"
        )
    arrival_rng, prompt_rng, output_rng, class_rng = _streams(seed)
    traces = _read_traces(config, Path(base_dir))
    if isinstance(config.arrivals, TraceArrivals):
        arrival_trace = traces[_resolve(base_dir, config.arrivals.path)]
        arrival_s = trace_arrivals(
            arrival_trace, config.arrivals.time_scale, config.num_requests, config.duration_s
        )
    elif isinstance(config.arrivals, OfflineArrivals):
        arrival_trace = None
        assert config.num_requests is not None  # WorkloadConfig requires it
        arrival_s = np.zeros(config.num_requests)
    else:
        arrival_trace = None
        arrival_s = open_loop_arrivals(
            config.arrivals, arrival_rng, config.num_requests, config.duration_s
        )
    n = len(arrival_s)
    lengths = _length_sampler(config, Path(base_dir), traces, arrival_trace)
    prompt, output = lengths.sample(prompt_rng, output_rng, n)
    priority, klass = _classes(config.priorities, class_rng, n)
    return RequestBatch(
        arrival_s=arrival_s,
        prompt_tokens=prompt,
        output_tokens=output,
        priority=priority,
        priority_class=klass,
        class_names=tuple(c.name for c in config.priorities),
        prompt_hashes=_prompt_hashes(config, arrival_trace, prompt),
    )


def _prompt_hashes(
    config: WorkloadConfig, trace: Trace | None, prompt: np.ndarray
) -> PromptHashes | None:
    """The arrival trace's block hashes for the requests replayed, when it has them and
    the prompts are its own (not drawn from another distribution)."""
    if trace is None or trace.block_hashes is None:
        return None
    if config.prompt_tokens is not None:
        _warn(
            f"{shown_name(trace.path)}: its hash_ids are not used: the prompts are drawn from "
            "workload.prompt_tokens, not the trace's"
        )
        return None
    assert isinstance(config.arrivals, TraceArrivals)
    size = config.arrivals.hash_block_tokens
    ids = tuple(trace.block_hashes[: len(prompt)])
    blocks = np.fromiter((len(h) for h in ids), np.int64, len(ids))
    tokens = trace.tokens[PROMPT_COLUMN][: len(prompt)]
    most = -(-tokens // size)
    over = blocks > most
    if over.any():  # hashed in smaller blocks than hash_block_tokens: hits would be too many
        i = int(np.argmax(over))
        name = trace.layout_name(PROMPT_COLUMN)
        raise InfersimError(
            f"{shown_name(trace.path)}: line {trace.line(i)}: {blocks[i]} hash_ids for {name} "
            f"{tokens[i]:,}, more than ceil({tokens[i]} / arrivals.hash_block_tokens {size}) "
            f"= {most[i]}; set hash_block_tokens to the block size the trace was hashed with"
        )
    covered = np.minimum.reduce([blocks * size, tokens, prompt])
    return PromptHashes(ids=ids, block_tokens=size, covered=covered)


class ClosedLoopSampler:
    """What an engine needs to run a closed-loop workload: `users` requests start
    together; when one completes, its user waits `think_time` and sends the next one,
    until num_requests have been sent or duration_s has passed. Each method draws n
    values at once (e.g. for all requests completed in one engine step)."""

    def __init__(self, config: WorkloadConfig, seed: int, base_dir: str | Path = ".") -> None:
        if not isinstance(config.arrivals, ClosedLoopArrivals):
            raise InfersimError(
                f"workload: ClosedLoopSampler needs arrivals.kind 'closed_loop', "
                f"got {config.arrivals.kind!r}; use generate_requests"
            )
        self._spec = config.arrivals
        self._priorities = config.priorities
        self._think_rng, self._prompt_rng, self._output_rng, self._class_rng = _streams(seed)
        traces = _read_traces(config, Path(base_dir))
        self._lengths = _length_sampler(config, Path(base_dir), traces, None)
        self.users: int = config.arrivals.users
        self.num_requests: int | None = config.num_requests
        self.duration_s: float | None = config.duration_s
        self.class_names: tuple[str, ...] = tuple(c.name for c in config.priorities)

    def think_time(self, n: int) -> np.ndarray:
        """n think times, seconds (float64)."""
        return think_times(self._spec, self._think_rng, n)

    def lengths(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n (prompt, output) token counts, int64 >= 1."""
        return self._lengths.sample(self._prompt_rng, self._output_rng, n)

    def classes(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n (priority int8, priority_class int16 index into class_names)."""
        return _classes(self._priorities, self._class_rng, n)


MAX_TURNS = 100_000
"""Turns one session may have; longer draws are lowered to it (a conversation that long
outgrows any context window first)."""


@dataclass(frozen=True, eq=False)
class Session:
    """One conversation, drawn in full when it starts, so that what the user says does not
    depend on the cluster (only when the later turns arrive does). Arrays are per turn."""

    prompt: np.ndarray
    """int64: the conversation so far (earlier prompts and outputs) plus new user tokens."""
    output: np.ndarray
    """int64, >= 1: tokens each turn generates."""
    think_s: np.ndarray
    """float64, one fewer than the turns: the pause before each turn after the first."""
    priority: int
    priority_class: int
    drawn_turns: int
    """Turns drawn before the context limit cut the conversation short."""

    @property
    def turns(self) -> int:
        return len(self.prompt)


class SessionSampler:
    """What an engine needs to run multi-turn sessions: when sessions start (drawn up
    front, like open-loop arrivals), and each session's turns, drawn when it starts.

    A session never sends a turn whose prompt + output exceeds `context_limit`: it ends
    before that turn. Turn 1 is drawn (and clipped by max_total_tokens) like any request,
    so a replica may still reject it."""

    def __init__(
        self,
        config: WorkloadConfig,
        seed: int,
        base_dir: str | Path = ".",
        context_limit: int | None = None,
    ) -> None:
        spec = config.sessions
        if spec is None or not isinstance(config.arrivals, RateArrivals):
            raise InfersimError(
                "workload: SessionSampler needs a sessions section and poisson, gamma or "
                f"constant arrivals, got arrivals.kind {config.arrivals.kind!r}"
            )
        self._spec = spec
        start_rng, self._prompt_rng, self._output_rng, class_rng, self._think_rng, turn_rng = (
            _streams(seed, 6)
        )
        # At most num_requests sessions can start: each sends at least one turn.
        self.starts: np.ndarray = open_loop_arrivals(
            config.arrivals, start_rng, config.num_requests, config.duration_s
        )
        n = len(self.starts)
        most = min(MAX_TURNS, config.num_requests or MAX_TURNS)
        self._turns = np.minimum(to_tokens(draw(spec.turns, turn_rng, n), 1.0), most)
        self._priority, self._class = _classes(config.priorities, class_rng, n)
        traces = _read_traces(config, Path(base_dir))
        self._lengths = _length_sampler(config, Path(base_dir), traces, None)
        limits = [config.max_total_tokens, context_limit, MAX_TOKENS]
        self.context_limit: int = min(x for x in limits if x is not None)
        self.class_names: tuple[str, ...] = tuple(c.name for c in config.priorities)

    def session(self, index: int) -> Session:
        """Session `index` (in start order; draw them in that order for reproducibility)."""
        turns = int(self._turns[index])
        user, output = self._lengths.sample(self._prompt_rng, self._output_rng, turns)
        think = think_times(self._spec, self._think_rng, turns - 1)
        prompt = np.cumsum(user)
        prompt[1:] += np.cumsum(output[:-1])
        # prompt + output grows strictly with the turn: keep the turns within the limit.
        fits = int(np.searchsorted(prompt + output, self.context_limit, side="right"))
        keep = max(fits, 1)
        return Session(
            prompt=prompt[:keep],
            output=output[:keep],
            think_s=think[: keep - 1],
            priority=int(self._priority[index]),
            priority_class=int(self._class[index]),
            drawn_turns=turns,
        )


def _streams(seed: int, count: int = 4) -> list[np.random.Generator]:
    """Independent generators: arrivals, prompt lengths, output lengths, classes, then
    (sessions) think times and turn counts. The first four are the same whatever `count`."""
    try:
        value = operator.index(seed)
    except TypeError:
        raise InfersimError(f"workload: seed must be an integer, got {seed!r}") from None
    if value < 0:
        raise InfersimError(f"workload: seed must be >= 0, got {value}")
    return [np.random.default_rng(s) for s in np.random.SeedSequence(value).spawn(count)]


def _resolve(base_dir: str | Path, path: str) -> Path:
    return Path(base_dir) / Path(path).expanduser()


def _read_traces(config: WorkloadConfig, base_dir: Path) -> dict[Path, Trace]:
    """Each trace file the config names, read once with every column it is used for."""
    columns: dict[Path, set[str]] = {}
    arrival_path = None
    if isinstance(config.arrivals, TraceArrivals):
        arrival_path = _resolve(base_dir, config.arrivals.path)
        columns[arrival_path] = {
            default for role, default in _ROLES if getattr(config, role) is None
        }
    for role, default in _ROLES:
        spec = getattr(config, role)
        if isinstance(spec, TraceLength):
            columns.setdefault(_resolve(base_dir, spec.path), set()).add(spec.column or default)
    mapping = config.arrivals.columns if isinstance(config.arrivals, TraceArrivals) else None
    traces = {}
    for path, cols in columns.items():
        trace = read_trace(
            path,
            sorted(cols),
            arrivals=path == arrival_path,
            layout=mapping.layout() if mapping and path == arrival_path else None,
        )
        if trace.hashes_unread:
            _warn(
                f"{shown_name(path)}: its hash_ids are not used: lengths drawn from a trace share "
                "no prompt blocks (replay it with arrivals.kind trace for that)"
            )
        traces[path] = _drop_empty_rows(trace) if config.zero_token_rows == "drop" else trace
    return traces


def _drop_empty_rows(trace: Trace) -> Trace:
    """`trace` less its rows with 0 tokens, which are said; no request is 0 tokens long."""
    kept, empty = trace.without_empty_rows()
    if empty:
        counts = ", ".join(f"{n:,} with 0 {name!r}" for name, n in empty.items())
        if not len(kept):
            raise InfersimError(
                f"{shown_name(trace.path)}: every row has 0 tokens ({counts}): no request to "
                "simulate (workload.zero_token_rows: one_token replays them as 1 token)"
            )
        _warn(
            f"{shown_name(trace.path)}: {len(trace) - len(kept):,} of its {len(trace):,} rows left "
            f"out ({counts}; BurstGPT logs failed requests so); workload.zero_token_rows: "
            "one_token keeps them as 1-token requests"
        )
    return kept


def _warn(message: str) -> None:
    warn(message, stacklevel=3)


def _length_sampler(
    config: WorkloadConfig,
    base_dir: Path,
    traces: dict[Path, Trace],
    arrival_trace: Trace | None,
) -> LengthSampler:
    sources: list[LengthSource] = []
    for role, default in _ROLES:
        spec = getattr(config, role)
        if spec is None:
            assert arrival_trace is not None  # WorkloadConfig requires a spec otherwise
            sources.append(
                TableLengths(arrival_trace.tokens[default], arrival_trace.path, aligned=True)
            )
        elif isinstance(spec, TraceLength):
            path = _resolve(base_dir, spec.path)
            sources.append(TableLengths(traces[path].tokens[spec.column or default], path))
        else:
            sources.append(spec)
    return LengthSampler(
        prompt=sources[0],
        output=sources[1],
        prompt_scale=config.prompt_length_scale,
        output_scale=config.output_length_scale,
        max_total_tokens=config.max_total_tokens,
        max_total_policy=config.max_total_policy,
    )


def _classes(
    classes: list[PriorityClass], rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each request's class, drawn by weight, and that class's priority."""
    if len(classes) == 1:
        index = np.zeros(n, dtype=np.int16)
    else:
        weights = np.array([c.weight for c in classes])
        weights /= weights.max()  # first, so that a sum of huge weights cannot overflow
        index = rng.choice(len(classes), size=n, p=weights / weights.sum()).astype(np.int16)
    priorities = np.array([c.priority for c in classes], dtype=np.int8)
    return priorities[index], index
