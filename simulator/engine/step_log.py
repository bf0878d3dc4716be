"""Per-step records and inter-token-latency samples of one replica, folded as the run goes.

Steps go into a small columnar buffer; whenever it fills, the steps that can no longer
change (those that ended by the SimPy clock: a failure later cuts only steps still in
flight) are folded into the replica's StepTotals in whole chunks of CHUNK_ROWS rows
counted from the replica's first step (so the float sums depend on the rows alone, not
on when a fold happened), and kept as table rows only when the scenario asks for a
step table. Without one, inter-token gaps are folded into a log histogram too, so
memory stays bounded however long the run.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import numpy as np

from simulator.engine.columns import ColumnStore
from simulator.metrics.log_histogram import LogHistogram
from simulator.metrics.step_totals import StepTotals, clip_to

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
GAP_COLUMNS = {"seconds": "f8", "weight": "i4", "end": "f8"}  # end: when the token came
CHUNK_ROWS = 8192  # rows per fold: step rows are folded in chunks of this many


# A replica's log when the run stopped: its step rows (None unless kept), its gap samples,
# when each token came that a prefill sampled again (`StepLog.resampled`).
ClosedLog = tuple[np.ndarray | None, np.ndarray, np.ndarray]


class StepLog:
    def __init__(
        self,
        replica: int,
        totals: StepTotals,
        now: Callable[[], float],
        *,
        keep_rows: bool = True,
        gaps_final: bool = True,
    ) -> None:
        """`totals` covers this replica alone; `now` is the SimPy clock; `gaps_final`
        says a failure never takes back logged gaps (only a padded batch logs them
        ahead of its steps)."""
        self.replica = replica
        self.totals, self._now, self._keep = totals, now, keep_rows
        self._gaps_final = gaps_final
        # A fold takes whole chunks: an eighth of one more is room for the steps still in
        # flight when a chunk's last step ends, so the buffer seldom has to grow.
        capacity = CHUNK_ROWS + CHUNK_ROWS // 8
        self.steps = ColumnStore(STEP_COLUMNS, capacity, on_full=self._fold_steps)
        # ITL samples as (seconds, how many tokens saw that gap): a decode step of n
        # sequences is one value with weight n, so storage grows with steps, not tokens.
        fold_gaps = None if keep_rows else self._fold_gaps
        self.itl = ColumnStore(GAP_COLUMNS, CHUNK_ROWS, on_full=fold_gaps)
        self.histogram = LogHistogram()
        self._kept_steps: list[np.ndarray] = []
        self._folded = [0, 0]  # steps, gaps no longer in the buffers
        # Without a table, runs' step ends (and each run's (steps, weight)) until binned.
        self._run_ends: list[float] = []
        self._run_sizes: list[tuple[int, int]] = []
        self._gap_mark = 0  # gaps before the latest mark can no longer be taken back
        # When each token came that a prefill sampled for a request that had had tokens
        # before (recomputed after a preemption, or retried): an output token that no
        # step's decode count and no first token holds, for the time series.
        self.resampled: list[float] = []

    # ---- logging (the engine's hot path) --------------------------------------------------
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

    def gap(self, end: float, seconds: float, weight: int = 1) -> None:
        """`weight` tokens that came at `end`, each `seconds` after its request's previous
        one (the API server model maps both times to the client's)."""
        self.itl.append((seconds, weight, end))

    def run_gaps(self, ends: list[float], weight: int) -> None:
        """`weight` tokens at each of `ends` but the first (a run's step ends, led by the
        previous token's time where that is the same for all): the gaps between
        consecutive ends, as `gap` takes them one at a time. Without a table (and
        when no gap can be taken back) the ends are kept as they come and binned a chunk
        at a time: the histogram's counts do not depend on the order of the samples, and
        numpy's differences are the same subtractions."""
        if self._keep or not self._gaps_final:
            self.itl.append_rows(
                [(after - before, weight, after) for before, after in pairwise(ends)]
            )
            return
        self._run_ends += ends
        self._run_sizes.append((len(ends), weight))
        if len(self._run_ends) >= CHUNK_ROWS:
            self._bin_run_gaps()

    def gaps(
        self, end: np.ndarray | float, seconds: np.ndarray, weight: np.ndarray | int = 1
    ) -> None:
        self.itl.extend(len(seconds), seconds=seconds, weight=weight, end=end)

    # ---- failures ---------------------------------------------------------------------------
    def mark(self) -> tuple[int, int]:
        """Where the log stands now, to roll back to if what follows is cut short."""
        mark = self._folded[0] + self.steps.size, self._folded[1] + self.itl.size
        self._gap_mark = mark[1]
        return mark

    def cut(self, mark: tuple[int, int], now: float, *, gaps: bool) -> None:
        """Keep what was logged before `mark` plus the steps after it that ended by `now`;
        with `gaps`, forget the inter-token gaps logged since `mark` too (a padded batch
        logs its gaps ahead; an iteration-level replica only for steps applied)."""
        # Folded steps ended by an earlier clock, so they are all kept.
        first = max(mark[0] - self._folded[0], 0)
        rows = self.steps.rows()[first:]
        ends = rows["start"] + rows["duration"]
        self.steps.truncate(first + int(np.searchsorted(ends, now, side="right")))
        if gaps:
            self.itl.truncate(mark[1] - self._folded[1])

    def keep_gaps(self, mark: tuple[int, int], kept: int) -> None:
        """Keep only the first `kept` gaps logged since `mark`: a padded batch logs one per
        decode step ahead of time, and the run stopped after `kept` of its steps."""
        self.itl.truncate(mark[1] - self._folded[1] + kept)

    # ---- folding ----------------------------------------------------------------------------
    def _fold_steps(self) -> None:
        """Fold the whole chunks of buffered steps that ended by the SimPy clock. A chunk
        still holding a step in flight waits (the buffer grows): how many steps had ended
        depends on when this runs (multi-step or not), where the chunks fall must not."""
        rows = self.steps.rows()
        ends = rows["start"] + rows["duration"]
        done = int(np.searchsorted(ends, self._now(), side="right"))
        done -= done % CHUNK_ROWS
        if done:
            self._take(self.steps.drain(done))
            self._folded[0] += done

    def _take(self, rows: np.ndarray) -> None:
        """Fold `rows` (which start a chunk) one chunk at a time."""
        for first in range(0, max(len(rows), 1), CHUNK_ROWS):
            chunk = rows[first : first + CHUNK_ROWS]
            self.totals.fold(chunk, replica=0)
            if self._keep:
                self._kept_steps.append(chunk)

    def _fold_gaps(self) -> None:
        done = self.itl.size if self._gaps_final else self._gap_mark - self._folded[1]
        if done > 0:
            rows = self.itl.drain(done)
            self.histogram.add(rows["seconds"], rows["weight"])
            self._folded[1] += done

    def _bin_run_gaps(self) -> None:
        if not self._run_sizes:
            return
        ends = np.array(self._run_ends)
        sizes, weights = np.array(self._run_sizes).T
        gaps = ends[1:] - ends[:-1]
        within = np.ones(len(gaps), dtype=bool)
        within[np.cumsum(sizes)[:-1] - 1] = False  # from one run's last end to the next's first
        self.histogram.add(gaps[within], np.repeat(weights, sizes - 1))
        self._run_ends, self._run_sizes = [], []

    def close(self, end: float) -> ClosedLog:
        """The run stopped at `end`: fold what is left (a step in flight counts up to
        `end`) and return this replica's step rows (None unless kept) and its gap
        samples (binned into a histogram unless steps are kept), as structured arrays, and
        the times of its resampled tokens."""
        self._take(clip_to(self.steps.drain(self.steps.size), end))
        if self._keep:
            rows = np.concatenate(self._kept_steps)
            self._kept_steps = []  # handed over: the chunks need not outlive the table
            return rows, self.itl.rows(), np.array(self.resampled, np.float64)
        self._gaps_final = True
        self._fold_gaps()
        self._bin_run_gaps()
        return None, self.histogram.rows(), np.array(self.resampled, np.float64)
