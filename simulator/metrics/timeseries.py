"""The run over time in fixed bins, for plots that show when a cluster falls behind.

Columns per bin [t_start, t_end) (the last bin ends at the run's end):

- arrivals, completions: request counts (their sums are the run's totals).
- output_tokens_per_s: decode tokens of the steps that ended in the bin plus the first
  tokens of requests whose prefill finished in it (at `first_token`). Exact except the
  token sampled when a request preempted by recompute finishes its second prefill.
- prefill_tokens_per_s: prefill tokens of the steps that ended in the bin.
- busy_fraction: step time inside the bin / (bin width x replicas).
- batch_size, kv_utilisation: means over the step time inside the bin (NaN when no
  step runs), i.e. the batch a replica worked on and its used / total KV blocks.
- waiting: time-weighted mean of the cluster's waiting requests, summed over replicas;
  an idle replica counts as having an empty queue.

Steps that straddle a bin edge are split exactly by time, with bincounts and no sort, so
10^6 steps take well under a second.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simulator.metrics.context import RunContext

TARGET_BINS = 200
_NICE = (1.0, 2.0, 2.5, 5.0, 10.0)
COLUMNS = (
    "t_start",
    "t_end",
    "arrivals",
    "completions",
    "output_tokens_per_s",
    "prefill_tokens_per_s",
    "busy_fraction",
    "batch_size",
    "kv_utilisation",
    "waiting",
)


def nice_bin_width(duration_s: float, target_bins: int = TARGET_BINS) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k seconds giving at most `target_bins` bins."""
    raw = duration_s / target_bins
    scale = 10.0 ** math.floor(math.log10(raw))
    return next(m * scale for m in _NICE if m * scale >= raw * (1 - 1e-12))


def _bin_index(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each time; the end of the run falls in the last bin, outside times are -1."""
    idx = np.searchsorted(edges, times, side="right") - 1
    idx[times == edges[-1]] = len(edges) - 2
    idx[~np.isfinite(times) | (idx >= len(edges) - 1)] = -1
    return idx


def _count(times: np.ndarray, edges: np.ndarray, weights: np.ndarray | None = None):
    idx = _bin_index(times, edges)
    keep = idx >= 0
    w = None if weights is None else weights[keep]
    return np.bincount(idx[keep], weights=w, minlength=len(edges) - 1).astype(np.float64)


def _integrals(start: np.ndarray, end: np.ndarray, values: np.ndarray, edges: np.ndarray):
    """Integral over each bin of sum_i values[k, i] x [start_i <= t < end_i], per row k.

    A step inside one bin adds value x duration to it; a step that crosses edges adds its
    partial first and last bins, and value x width to every bin in between through a
    running sum of +value at the first such bin and -value after the last.
    """
    n = len(edges) - 1
    start = np.clip(start, edges[0], edges[-1])
    end = np.clip(end, edges[0], edges[-1])
    first, last = _bin_index(start, edges), _bin_index(end, edges)
    inside, cross = first == last, first != last
    seconds = (end - start)[inside]
    head = edges[first[cross] + 1] - start[cross]
    tail = end[cross] - edges[last[cross]]
    span = np.diff(edges)
    out = np.empty((len(values), n))
    for row, v in zip(out, values, strict=True):
        row[:] = np.bincount(first[inside], v[inside] * seconds, minlength=n)
        if len(head):
            vc = v[cross]
            row += np.bincount(first[cross], vc * head, minlength=n)
            row += np.bincount(last[cross], vc * tail, minlength=n)
            between = np.bincount(first[cross] + 1, vc, minlength=n + 1)
            between -= np.bincount(last[cross], vc, minlength=n + 1)
            row += np.cumsum(between)[:n] * span
    return out


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=np.float64) for c in COLUMNS})


def timeseries(
    requests: pd.DataFrame, steps: pd.DataFrame, ctx: RunContext, bin_s: float | None = None
) -> pd.DataFrame:
    """Per-bin counts, rates and time-weighted means over [0, duration]; see module doc."""
    duration = ctx.duration_s
    if not duration > 0:
        return _empty()
    width = nice_bin_width(duration) if bin_s is None else float(bin_s)
    if not width > 0:
        raise ValueError(f"bin_s must be positive, got {bin_s}")
    n = max(1, math.ceil(duration / width - 1e-6))
    edges = np.minimum(np.arange(n + 1) * width, duration)
    edges[-1] = duration
    span = np.diff(edges)

    completed = (requests["outcome"] == "completed").to_numpy()
    start = steps["start"].to_numpy(np.float64)
    dur = steps["duration"].to_numpy(np.float64)
    end = start + dur
    replica = steps["replica"].to_numpy().astype(np.int64)
    total_blocks = np.array([r.kv_total_blocks for r in ctx.replicas], np.float64)[replica]
    used = steps["kv_blocks_used"].to_numpy(np.float64)
    kv = np.divide(used, total_blocks, out=np.zeros(len(used)), where=total_blocks > 0)

    first_tokens = _count(requests["first_token"].to_numpy(np.float64), edges)
    decode = _count(end, edges, steps["decode_tokens"].to_numpy(np.float64))
    prefill = _count(end, edges, steps["prefill_tokens"].to_numpy(np.float64))
    signals = np.stack(
        [
            np.ones(len(start)),
            steps["batch_size"].to_numpy(np.float64),
            kv,
            steps["waiting"].to_numpy(np.float64),
        ]
    )
    busy, batch, kv_time, waiting = _integrals(start, end, signals, edges)
    ran = busy > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        frame = pd.DataFrame(
            {
                "t_start": edges[:-1],
                "t_end": edges[1:],
                "arrivals": _count(requests["arrival"].to_numpy(np.float64), edges),
                "completions": _count(requests["finish"].to_numpy(np.float64)[completed], edges),
                "output_tokens_per_s": (decode + first_tokens) / span,
                "prefill_tokens_per_s": prefill / span,
                "busy_fraction": busy / (span * max(len(ctx.replicas), 1)),
                "batch_size": np.where(ran, batch / busy, np.nan),
                "kv_utilisation": np.where(ran, kv_time / busy, np.nan),
                "waiting": waiting / span,
            }
        )
    return frame.astype({"arrivals": np.int64, "completions": np.int64})
