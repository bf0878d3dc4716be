"""Everything the summary and the time series need from the engine steps, as running sums.

A cluster serving a million requests runs tens of millions of engine steps; a table of
them takes gigabytes. The summary needs only per-replica sums (busy time, FLOPs, DRAM
bytes, energy above idle, KV occupancy weighted by time, time per limiting resource) and
the time series only per-bin sums, so steps are folded in chunks as the run goes and the
table is kept only when a user asks for it (`output.step_table`).

Time bins: sums are kept in at most FINE_BINS bins of width 0.5 x 10^m s, m the
smallest that covers the run so far (when the run outgrows them, ten bins merge into
one). Every width the time series may choose (1, 2, 2.5 or 5 x 10^k s, at most 200 bins
over the run) is then a whole number of these bins, so regrouping them is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.engine.step_cost import StepBound
from simulator.metrics.bins import integrals, uniform_bin_index
from simulator.metrics.table import Labels, Table, as_table

if TYPE_CHECKING:
    import pandas as pd

    from hardware_models.power import PowerModel
    from simulator.metrics.context import RunContext

FINE_BINS = 5000  # a multiple of 10, so merging ten bins into one leaves no remainder
_FIRST_WIDTH = 0.5e-9
# per-bin sums: decode and prefill tokens of steps ending in the bin, then integrals
# over the bin of 1 (busy time), batch size, KV fraction and power above idle (joules;
# the waiting series comes from the request table: simulator.metrics.timeseries)
BIN_ROWS = ("decode_tokens", "prefill_tokens", "busy", "batch", "kv", "joules")
# Columns of StepTotals.power: a replica's draw above idle, W, all its GPUs together:
# while any step runs, at its full tensor rate, at its full DRAM bandwidth, and the most
# it may add (its board power limits less idle), hardware_models.power.
POWER_COLUMNS = ("busy", "tensor", "memory", "headroom")
Rows = Any  # a numpy structured array, or a Table or DataFrame of the step-table columns


def clip_to(rows: np.ndarray, end: float) -> np.ndarray:
    """Steps as far as a run that stopped at `end` went: a step in flight then counts only
    up to `end`, its FLOPs and bytes pro rata; steps that had not started are dropped."""
    rows = rows[rows["start"] < end]
    stop = rows["start"] + rows["duration"]
    over = stop > end
    if not over.any():
        return rows
    rows = rows.copy()
    kept = (end - rows["start"][over]) / rows["duration"][over]
    for column in ("flops", "dram_bytes"):
        rows[column][over] *= kept
    rows["duration"][over] = end - rows["start"][over]
    return rows


def _per_replica(values: Sequence[float] | None, n: int) -> np.ndarray:
    return np.full(n, np.inf) if values is None else np.asarray(values, np.float64)


def power_row(model: PowerModel, gpus: int) -> tuple[float, ...]:
    """One replica's row of StepTotals.power: a GPU's coefficients x its GPUs."""
    per_gpu = (model.busy_w, model.tensor_w, model.memory_w, model.headroom_w)
    return tuple(w * gpus for w in per_gpu)


class StepTotals:
    """Per-replica sums over steps and cluster-wide per-bin sums over time."""

    def __init__(self, peak_flops: Sequence[float], peak_bandwidth: Sequence[float],
                 kv_total_blocks: Sequence[float],
                 token_budget: Sequence[float] | None = None,
                 max_num_seqs: Sequence[float] | None = None,
                 power: Sequence[Sequence[float]] | None = None) -> None:  # fmt: skip
        """`power`: each replica's POWER_COLUMNS row (power_row); None: no draw above idle
        (a totals object that only counts work)."""
        self.peak_flops = np.asarray(peak_flops, np.float64)
        self.peak_bandwidth = np.asarray(peak_bandwidth, np.float64)
        self.kv_total_blocks = np.asarray(kv_total_blocks, np.float64)
        n = len(self.peak_flops)
        shape = (n, len(POWER_COLUMNS))
        self.power = np.zeros(shape) if power is None else np.asarray(power, np.float64)
        self.power = self.power.reshape(shape)
        # Per replica, the rows `_draw` reads: busy W, J per FLOP, J per DRAM byte, headroom W
        busy, tensor, memory, headroom = self.power.T
        self._draw_terms = np.stack(
            [busy, tensor / self.peak_flops, memory / self.peak_bandwidth, headroom]
        )
        # Each replica's token budget and sequence cap per step (inf: not tracked), for the
        # warnings that one of them, not memory, capped the batch.
        self.token_budget = _per_replica(token_budget, n)
        self.max_num_seqs = _per_replica(max_num_seqs, n)
        self.steps = np.zeros(n, np.int64)
        self.busy = np.zeros(n)  # seconds of steps
        self.flops = np.zeros(n)
        self.dram_bytes = np.zeros(n)
        self.joules = np.zeros(n)  # energy above idle, all the replica's GPUs
        self.capped = np.zeros(n)  # seconds of steps whose draw the board limit capped
        self.kv_time = np.zeros(n)  # seconds x used / total KV blocks
        self.kv_max = 0.0
        # Steps that filled the token budget (seqs: max_num_seqs) while requests waited,
        # per replica: their seconds, those x used / total KV, the compute-bound ones' seconds
        self.budget_full = np.zeros((n, 3))
        self.seqs_full = np.zeros((n, 3))
        self.bound_time = np.zeros(len(StepBound))  # seconds by StepBound code
        self.bin_width = _FIRST_WIDTH
        self.bins = np.zeros((len(BIN_ROWS), FINE_BINS))

    @classmethod
    def for_context(cls, ctx: RunContext) -> StepTotals:
        reps = ctx.replicas
        return cls(
            [r.peak_flops for r in reps],
            [r.peak_bandwidth for r in reps],
            [r.kv_total_blocks for r in reps],
            [r.token_budget for r in reps],
            [r.max_num_seqs for r in reps],
            [power_row(r.power, r.gpus) for r in reps],
        )

    @classmethod
    def from_table(cls, steps: Table | pd.DataFrame, ctx: RunContext) -> StepTotals:
        """Totals of a step table (as `Results.steps` has it), clipped to the run's end."""
        totals = cls.for_context(ctx)
        steps = as_table(steps)
        columns = [_codes(steps[name]) for name in steps]
        rows = np.rec.fromarrays(columns, names=list(steps))
        totals.fold(clip_to(rows, ctx.duration_s))
        return totals

    # ---- folding -------------------------------------------------------------------------
    def fold(self, rows: Rows, replica: np.ndarray | int | None = None) -> None:
        """Add steps; `replica` (an index into this object's replicas) defaults to the
        rows' own `replica` column."""
        start = np.asarray(rows["start"], np.float64)
        if not len(start):
            return
        dur = np.asarray(rows["duration"], np.float64)
        stop = start + dur
        n = len(self.busy)
        if replica is None:
            replica = np.asarray(rows["replica"], np.int64)
        rep = np.broadcast_to(np.asarray(replica, np.int64), start.shape)
        flops = np.asarray(rows["flops"], np.float64)
        dram = np.asarray(rows["dram_bytes"], np.float64)
        total = self.kv_total_blocks[rep]
        used = np.asarray(rows["kv_blocks_used"], np.float64)
        kv = np.divide(used, total, out=np.zeros(len(used)), where=total > 0)
        watts, capped = self._draw(rep, flops, dram, dur)

        self.steps += np.bincount(rep, minlength=n)
        self.busy += np.bincount(rep, dur, n)
        self.flops += np.bincount(rep, flops, n)
        self.dram_bytes += np.bincount(rep, dram, n)
        self.joules += np.bincount(rep, watts * dur, n)
        self.capped += np.bincount(rep, np.where(capped, dur, 0.0), n)
        self.kv_time += np.bincount(rep, kv * dur, n)
        self.kv_max = max(self.kv_max, float(kv.max()))
        tokens = np.asarray(rows["prefill_tokens"], np.float64) + rows["decode_tokens"]
        waited = np.asarray(rows["waiting"], np.float64) > 0
        bound = np.asarray(rows["bound"], np.int64)
        weights = (np.ones(len(dur)), kv, bound == StepBound.COMPUTE)
        batch = np.asarray(rows["batch_size"], np.float64)
        for sums, at_cap in ((self.budget_full, tokens >= self.token_budget[rep]),
                             (self.seqs_full, batch >= self.max_num_seqs[rep])):  # fmt: skip
            full = np.where(at_cap & waited, dur, 0.0)
            for column, weight in enumerate(weights):
                sums[:, column] += np.bincount(rep, full * weight, n)
        self.bound_time += np.bincount(bound, dur, len(StepBound))

        self._cover(float(stop.max()))
        edges = np.arange(FINE_BINS + 1) * self.bin_width
        ended = uniform_bin_index(stop, edges)
        for row, column in enumerate(("decode_tokens", "prefill_tokens")):
            tokens = np.asarray(rows[column], np.float64)
            self.bins[row] += np.bincount(ended, tokens, FINE_BINS)
        signals = np.stack(
            [
                np.ones(len(start)),
                np.asarray(rows["batch_size"], np.float64),
                kv,
                watts,
            ]
        )
        self.bins[2:] += integrals(start, stop, signals, edges, uniform_bin_index)

    def _draw(
        self, rep: np.ndarray, flops: np.ndarray, dram: np.ndarray, dur: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each step's draw above idle, W (its replica's GPUs together), and whether the
        board limit capped it: busy + tensor x FLOP-rate share + memory x bandwidth
        share, at most the headroom (hardware_models.power)."""
        # one replica (every engine's own totals): its scalars, no gather per step
        busy, per_flop, per_byte, headroom = self._draw_terms[:, 0 if len(self.busy) == 1 else rep]
        seconds = np.where(dur > 0, dur, np.inf)  # an empty step draws nothing extra
        uncapped = busy + (per_flop * flops + per_byte * dram) / seconds
        return np.minimum(uncapped, headroom), uncapped > headroom

    def _cover(self, t: float) -> None:
        """Widen the bins (ten into one) until they reach past time t."""
        while t >= FINE_BINS * self.bin_width:
            self._coarsen()

    def _coarsen(self) -> None:
        rows = len(BIN_ROWS)
        self.bins = self.bins.reshape(rows, FINE_BINS // 10, 10).sum(axis=2)
        self.bins = np.concatenate([self.bins, np.zeros((rows, FINE_BINS - FINE_BINS // 10))], 1)
        self.bin_width *= 10

    # ---- combining and reading ----------------------------------------------------------
    @classmethod
    def merge(cls, parts: Sequence[StepTotals]) -> StepTotals:
        """One object for the cluster from per-replica ones, replicas in order."""
        merged = cls(
            np.concatenate([p.peak_flops for p in parts]),
            np.concatenate([p.peak_bandwidth for p in parts]),
            np.concatenate([p.kv_total_blocks for p in parts]),
            np.concatenate([p.token_budget for p in parts]),
            np.concatenate([p.max_num_seqs for p in parts]),
            np.concatenate([p.power for p in parts]),
        )
        for name in ("steps", "busy", "flops", "dram_bytes", "joules", "capped", "kv_time",
                     "budget_full", "seqs_full"):  # fmt: skip
            setattr(merged, name, np.concatenate([getattr(p, name) for p in parts]))
        merged.kv_max = max((p.kv_max for p in parts), default=0.0)
        merged.bound_time = np.sum([p.bound_time for p in parts], axis=0)
        merged.bin_width = max((p.bin_width for p in parts), default=_FIRST_WIDTH)
        for part in parts:
            while part.bin_width < merged.bin_width * (1 - 1e-9):
                part._coarsen()
            merged.bins += part.bins
        return merged

    def binned(self, edges: np.ndarray) -> np.ndarray:
        """The per-bin sums regrouped onto `edges` (multiples of a width that is a whole
        number of fine bins, the last edge the run's end)."""
        width = edges[1] - edges[0] if len(edges) > 1 else self.bin_width
        ratio = width / self.bin_width
        if len(edges) > 2 and abs(ratio - round(ratio)) > 1e-6 * ratio:
            raise ValueError(
                f"bin width {width:g} s is not a multiple of the {self.bin_width:g} s the "
                "run's totals were kept in"
            )
        groups = np.arange(FINE_BINS) // max(round(ratio), 1)
        groups = np.minimum(groups, len(edges) - 2)
        out = np.zeros((len(BIN_ROWS), len(edges) - 1))
        for row, fine in zip(out, self.bins, strict=True):
            row += np.bincount(groups, fine, len(edges) - 1)
        return out

    def joules_between(self, start: float, stop: float) -> float:
        """Energy above idle drawn in [start, stop], all replicas: the fine bins' sums,
        the two partial bins pro rata."""
        cumulative = np.concatenate([[0.0], np.cumsum(self.bins[BIN_ROWS.index("joules")])])
        edges = np.arange(FINE_BINS + 1) * self.bin_width
        return float(np.interp(stop, edges, cumulative) - np.interp(start, edges, cumulative))

    def __repr__(self) -> str:
        return (
            f"StepTotals({len(self.busy)} replicas, {int(self.steps.sum()):,} steps, "
            f"bins of {self.bin_width:g} s)"
        )


def _codes(column: np.ndarray | Labels) -> np.ndarray:
    """A column as numbers: a categorical bound as its codes."""
    return column.codes if isinstance(column, Labels) else column
