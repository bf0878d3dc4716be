"""Per-step records and inter-token-latency samples, in growable numpy columns."""

from __future__ import annotations

import numpy as np

from simulator.engine.columns import ColumnStore

STEP_COLUMNS = {
    "start": "f8",
    "duration": "f8",
    "batch_size": "i4",
    "decode_tokens": "i4",
    "prefill_tokens": "i4",
    "kv_blocks_used": "i8",
    "waiting": "i4",
    "flops": "f8",
    "dram_bytes": "f8",
    "bound": "i1",
    "replica": "i4",
}


class StepLog:
    def __init__(self, replica: int) -> None:
        self.replica = replica
        self.steps = ColumnStore(STEP_COLUMNS, capacity=4096)
        # ITL samples as (seconds, how many tokens saw that gap): a decode step of n
        # sequences is one value with weight n, so storage grows with steps, not tokens.
        self.itl = ColumnStore({"seconds": "f8", "weight": "i4"}, capacity=4096)

    def step(self, start, duration, batch, decodes, prefill, kv_used, waiting, flops, dram, bound):
        self.steps.append(
            (start, duration, batch, decodes, prefill, kv_used, waiting, flops, dram, bound,
             self.replica)
        )  # fmt: skip

    def step_rows(self, rows: list[tuple]) -> None:
        """Whole rows, each with every column in order (the replica's index last)."""
        self.steps.append_rows(rows)

    def steps_many(self, starts, durations, batch, decodes, kv_used, waiting, flops, dram, bound):
        self.steps.extend(
            len(starts),
            start=starts,
            duration=durations,
            batch_size=batch,
            decode_tokens=decodes,
            prefill_tokens=0,
            kv_blocks_used=kv_used,
            waiting=waiting,
            flops=flops,
            dram_bytes=dram,
            bound=bound,
            replica=self.replica,
        )

    def gap(self, seconds: float, weight: int = 1) -> None:
        """`weight` tokens that each came `seconds` after their request's previous one."""
        self.itl.append((seconds, weight))

    def gap_rows(self, rows: list[tuple[float, int]]) -> None:
        """(seconds, weight) samples, as `gap` takes them one at a time."""
        self.itl.append_rows(rows)

    def gaps(self, seconds: np.ndarray, weight: np.ndarray | int = 1) -> None:
        self.itl.extend(len(seconds), seconds=seconds, weight=weight)

    def mark(self) -> tuple[int, int]:
        """Where the log stands now, to roll back to if what follows is cut short."""
        return self.steps.size, self.itl.size

    def cut(self, mark: tuple[int, int], now: float, *, gaps: bool) -> None:
        """Keep what was logged before `mark` plus the steps after it that ended by `now`;
        with `gaps`, forget the inter-token gaps logged since `mark` too (a padded batch
        logs its gaps ahead; an iteration-level replica only for steps applied)."""
        steps, itl = mark
        ends = self.steps.frame_column_end(steps)
        self.steps.truncate(steps + int(np.searchsorted(ends, now, side="right")))
        if gaps:
            self.itl.truncate(itl)
