"""Every request's life, column by column: arrival to finish, with its outcome.

Outcomes are explicit so that nothing disappears: at the end of a run each request is
completed, rejected (with a reason), failed, or still in flight (queued or running).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum

import numpy as np


class Outcome(IntEnum):
    IN_FLIGHT = 0
    COMPLETED = 1
    REJECTED = 2
    FAILED = 3


class RejectReason(IntEnum):
    NONE = 0
    EXCEEDS_KV_CACHE = 1
    EXCEEDS_MAX_MODEL_LEN = 2
    EXCEEDS_TOKEN_BUDGET = 3
    QUEUE_FULL = 4
    REPLICA_FAILED = 5
    NO_HEALTHY_REPLICA = 6
    TOO_MANY_RETRIES = 7


REJECT_TEXT = {
    RejectReason.NONE: "",
    RejectReason.EXCEEDS_KV_CACHE: "prompt + output exceed the replica's whole KV cache",
    RejectReason.EXCEEDS_MAX_MODEL_LEN: "prompt + output exceed max_model_len",
    RejectReason.EXCEEDS_TOKEN_BUDGET: "prompt exceeds max_num_batched_tokens and the policy "
    "cannot chunk prefills",
    RejectReason.QUEUE_FULL: "the replica's waiting queue was full",
    RejectReason.REPLICA_FAILED: "its replica failed (faults.on_failure: fail)",
    RejectReason.NO_HEALTHY_REPLICA: "no healthy replica to route it to",
    RejectReason.TOO_MANY_RETRIES: "its replicas failed more than faults.max_retries times",
}

_COLUMNS = {
    "arrival": np.float64,
    "prompt": np.int64,
    "output": np.int64,
    "priority": np.int16,
    "priority_class": np.int16,
    "first_scheduled": np.float64,
    "first_token": np.float64,
    "last_token": np.float64,
    "finish": np.float64,
    "generated": np.int64,
    "preemptions": np.int32,
    "swaps": np.int32,  # preemptions that swapped its KV cache to host memory
    "retries": np.int16,
    "replica": np.int32,
    "outcome": np.int8,
    "reason": np.int8,
    "session": np.int64,  # -1 outside multi-turn sessions
    "turn": np.int32,  # 1-based within its session; 0 outside sessions
    "cached_prompt_tokens": np.int64,  # prompt tokens found in the prefix cache
}
_MINUS_ONE = ("replica", "session")
# What `add` writes; the engine writes the others (a request's outcome, as it happens).
INPUT_COLUMNS = ("arrival", "prompt", "output", "priority", "priority_class", "session", "turn")
OUTCOME_COLUMNS = tuple(name for name in _COLUMNS if name not in INPUT_COLUMNS)


class RequestTable:
    """Columns indexed by request id; grows for closed-loop workloads.

    Each column of `_COLUMNS` is an attribute of its own (set by `_allocate`), declared
    here so readers and type checkers know them; a test keeps the two lists equal."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    priority: np.ndarray
    priority_class: np.ndarray
    first_scheduled: np.ndarray
    first_token: np.ndarray
    last_token: np.ndarray
    finish: np.ndarray
    generated: np.ndarray
    preemptions: np.ndarray
    swaps: np.ndarray
    retries: np.ndarray
    replica: np.ndarray
    outcome: np.ndarray
    reason: np.ndarray
    session: np.ndarray
    turn: np.ndarray
    cached_prompt_tokens: np.ndarray

    def __init__(self, capacity: int) -> None:
        self.size = 0
        self._arrays: dict[str, np.ndarray] = {}
        self._allocate(max(capacity, 16))

    @classmethod
    def of_inputs(cls, inputs: Mapping[str, np.ndarray]) -> RequestTable:
        """A table of exactly the requests in `inputs` (input columns of equal length;
        those not given are blank), each array of its column's dtype kept as it is, not
        copied: a shard's table and its share of the run hold its requests once. The
        engine writes only the outcome columns; the kept arrays are made read-only, so
        a write to an input raises rather than changes the share."""
        size = len(next(iter(inputs.values())))
        table = cls(0)
        for name in _COLUMNS:
            given = inputs.get(name)
            if given is not None and given.dtype == _COLUMNS[name]:
                given.flags.writeable = False
                table._set(name, given)
                continue
            column = _blank(name, size)
            if given is not None:
                column[:] = given
            table._set(name, column)
        table.size = size
        return table

    def _allocate(self, capacity: int) -> None:
        for name in _COLUMNS:
            fresh = _blank(name, capacity)
            old = self._arrays.get(name)
            if old is not None:
                fresh[: self.size] = old[: self.size]
            self._set(name, fresh)

    def _set(self, name: str, column: np.ndarray) -> None:
        self._arrays[name] = column
        setattr(self, name, column)

    def add(
        self,
        arrival: np.ndarray,
        prompt: np.ndarray,
        output: np.ndarray,
        priority: np.ndarray,
        priority_class: np.ndarray | int = 0,
        session: np.ndarray | int = -1,
        turn: np.ndarray | int = 0,
    ) -> np.ndarray:
        """Register requests; returns their ids."""
        count = len(arrival)
        if self.size + count > len(self.arrival):
            self._allocate(max(self.size + count, 2 * len(self.arrival)))
        ids = np.arange(self.size, self.size + count)
        self.arrival[ids] = arrival
        self.prompt[ids] = prompt
        self.output[ids] = output
        self.priority[ids] = priority
        self.priority_class[ids] = priority_class
        self.session[ids] = session
        self.turn[ids] = turn
        self.size += count
        return ids

    def reject(self, rid: int, reason: RejectReason, now: float) -> None:
        self.outcome[rid] = Outcome.REJECTED
        self.reason[rid] = reason
        self.finish[rid] = now

    def fail(self, rid: int, reason: RejectReason, now: float) -> None:
        self.outcome[rid] = Outcome.FAILED
        self.reason[rid] = reason
        self.finish[rid] = now

    def restart(self, rid: int) -> None:
        """Start a request over after its replica failed: the tokens it had are lost (the
        client saw them; the retry's first token shows as a long inter-token gap)."""
        self.generated[rid] = 0
        self.retries[rid] += 1

    def columns(self) -> dict[str, np.ndarray]:
        """Every column of the requests registered so far, outcome and reason as their
        codes (simulator.metrics.run_tables makes the table users read of them)."""
        return {name: array[: self.size] for name, array in self._arrays.items()}

    def outcomes(self) -> dict[str, np.ndarray]:
        """The columns the engine writes (OUTCOME_COLUMNS), of the requests so far."""
        return {name: self._arrays[name][: self.size] for name in OUTCOME_COLUMNS}

    def drop(self, names: Sequence[str]) -> None:
        """Free columns `names` in a process that reads none of them for a while: a
        sharded run's parent, while its shards run and hold the requests (`fill`)."""
        for name in names:
            self._set(name, _blank(name, 0))

    def fill(self, parts: list[tuple[np.ndarray, Mapping[str, np.ndarray]]]) -> None:
        """The dropped columns again, from processes' parts: (request ids, columns at
        those ids), which together hold every request once. A dropped column no part
        holds comes back blank, as `add` leaves a request's session and turn outside
        multi-turn sessions."""
        if sum(len(ids) for ids, _ in parts) != self.size:
            raise ValueError("the parts do not hold each request once")
        capacity = max(len(column) for column in self._arrays.values())
        dropped = [name for name, column in self._arrays.items() if len(column) < capacity]
        for name in dropped:
            column = _blank(name, capacity)
            for ids, columns in parts:
                if name in columns:
                    column[ids] = columns[name]
            self._set(name, column)


def _blank(name: str, capacity: int) -> np.ndarray:
    """Column `name` for `capacity` requests not yet served: NaN times, -1 replica and
    session, zero counts."""
    dtype = _COLUMNS[name]
    fill = -1 if name in _MINUS_ONE else np.nan if dtype == np.float64 else 0
    return np.full(capacity, fill, dtype=dtype)
