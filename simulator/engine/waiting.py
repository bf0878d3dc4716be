"""Requests waiting for a replica, ordered by priority class then arrival (FCFS)."""

from __future__ import annotations

from collections import deque

import numpy as np


class WaitingQueue:
    """One deque per priority level; lower level = more important."""

    def __init__(self) -> None:
        self._queues: dict[int, deque[int]] = {}
        self._levels: list[int] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _queue(self, level: int) -> deque[int]:
        queue = self._queues.get(level)
        if queue is None:
            queue = self._queues[level] = deque()
            self._levels = sorted(self._queues)
        return queue

    def push(self, rid: int, level: int) -> None:
        self._queue(level).append(rid)
        self._size += 1

    def push_front(self, rid: int, level: int) -> None:
        """Preempted requests resume before newer arrivals of their class (vLLM's FCFS
        queue prepends them: FCFSRequestQueue.prepend_request)."""
        self._queue(level).appendleft(rid)
        self._size += 1

    def push_by_arrival(self, rid: int, level: int, arrival: np.ndarray) -> None:
        """A preempted request back in its class in (arrival, id) order: vLLM's priority
        queue is a heap of requests ordered by priority, arrival_time, then request id
        (Request.__lt__; PriorityRequestQueue.prepend_request adds it like a new one)."""
        queue = self._queue(level)
        key = (arrival[rid], rid)
        index = next(
            (i for i, other in enumerate(queue) if (arrival[other], other) > key), len(queue)
        )
        queue.insert(index, rid)
        self._size += 1

    def peek(self) -> tuple[int, int]:
        """(request id, level) of the next request to admit."""
        for level in self._levels:
            queue = self._queues[level]
            if queue:
                return queue[0], level
        raise IndexError("peek on an empty waiting queue")

    def oldest_arrival(self, arrival: np.ndarray) -> float:
        """When the longest-waiting request arrived (each class's head is its oldest
        where nothing was preempted back in, as in run-to-completion batches)."""
        return min(arrival[queue[0]] for queue in self._queues.values() if queue)

    def pop(self, level: int) -> int:
        self._size -= 1
        return self._queues[level].popleft()

    def drain(self) -> list[int]:
        """Every waiting id, emptying the queue (for failures and end-of-run accounting)."""
        ids = [rid for level in self._levels for rid in self._queues[level]]
        for queue in self._queues.values():
            queue.clear()
        self._size = 0
        return ids
