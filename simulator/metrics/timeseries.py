"""The run over time in fixed bins, for plots that show when a cluster falls behind.

Columns per bin [t_start, t_end) (the last bin ends at the run's end):

- arrivals, completions: request counts (their sums are the run's totals).
- output_tokens_per_s: every output token, binned when its step ended: decode tokens
  of the steps, first tokens of requests (at `first_token`), and the token a prefill
  samples for a request that had tokens before (recomputed after a preemption by
  recompute, or retried after a failure: `resampled`), which is neither. Its sum over
  the run is the summary's output tokens (METRICS.md) when no request was retried.
  With the API server modelled (`tokens`: the client's inter-token gaps, with the time
  each token reached the client) every output token is binned at the client's time
  instead, as the request columns are: what a client streaming the output counts.
- prefill_tokens_per_s: prefill tokens of the steps that ended in the bin.
- busy_fraction: step time inside the bin / (bin width x replicas).
- batch_size, kv_utilisation: means over the step time inside the bin (NaN when no
  step runs), i.e. the batch a replica worked on and its used / total KV blocks.
- power_w: mean power of every GPU of the cluster together, W, before PUE: idle power,
  and the energy above it of the steps inside the bin (hardware_models.power).
- waiting: time-weighted mean number of requests waiting in the cluster (arrived, not
  yet first scheduled), computed exactly from the request table: each request waits from
  its arrival to its first scheduling (one never scheduled: to its rejection or failure,
  else to the run's end). A request preempted back to the queue is not counted again
  (the table keeps only the first scheduling). Not from the steps: a step logs the queue
  after its admission, which misses every request that arrived during a step and was
  admitted at the next.

Step quantities come from the run's StepTotals (summed into fine bins as the run goes,
regrouped exactly here), so the series needs no step table. They stay the engine's
(its clock) with the API server modelled: prefill_tokens_per_s, busy_fraction,
batch_size and kv_utilisation say what the GPUs did when; arrivals, completions,
output_tokens_per_s and waiting are the client's (waiting then includes the time a
request waits in the API server before the engine sees it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simulator.metrics.bins import count_in_bins, integrals
from simulator.metrics.context import RunContext
from simulator.metrics.step_totals import StepTotals
from simulator.metrics.table import Table, as_table

if TYPE_CHECKING:
    import pandas as pd

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
    "power_w",
)


def nice_bin_width(duration_s: float, target_bins: int = TARGET_BINS) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k seconds giving at most `target_bins` bins."""
    raw = duration_s / target_bins
    scale = 10.0 ** math.floor(math.log10(raw))
    return next(m * scale for m in _NICE if m * scale >= raw * (1 - 1e-12))


def timeseries(
    requests: Table | pd.DataFrame,
    steps: StepTotals | Table | pd.DataFrame,
    ctx: RunContext,
    bin_s: float | None = None,
    tokens: Table | pd.DataFrame | None = None,
    resampled: np.ndarray | None = None,
) -> pd.DataFrame:
    """Per-bin counts, rates and time-weighted means over [0, duration] as a DataFrame;
    see module doc. `steps` is the run's step totals, or a step table to total; `tokens`
    the client's gaps (end, weight) when the API server is modelled; `resampled` the
    times of the tokens prefills sampled for requests that had tokens before
    (`Results.resampled`; without them those tokens are missing)."""
    return timeseries_table(requests, steps, ctx, bin_s, tokens, resampled).to_pandas()


def timeseries_table(
    requests: Table | pd.DataFrame,
    steps: StepTotals | Table | pd.DataFrame,
    ctx: RunContext,
    bin_s: float | None = None,
    tokens: Table | pd.DataFrame | None = None,
    resampled: np.ndarray | None = None,
) -> Table:
    """`timeseries` as a Table (what a run writes)."""
    duration = ctx.duration_s
    if not duration > 0:  # no bins; every column float, as an empty DataFrame's
        return Table({c: np.empty(0) for c in COLUMNS})
    width = nice_bin_width(duration) if bin_s is None else float(bin_s)
    if not width > 0:
        raise ValueError(f"bin_s must be positive, got {bin_s}")
    totals = steps if isinstance(steps, StepTotals) else StepTotals.from_table(steps, ctx)
    requests = as_table(requests)
    n = max(1, math.ceil(duration / width - 1e-6))
    edges = np.minimum(np.arange(n + 1) * width, duration)
    edges[-1] = duration
    span = np.diff(edges)

    completed = requests["outcome"].equals("completed")
    first_tokens = count_in_bins(requests["first_token"].astype(np.float64), edges)
    decode, prefill, busy, batch, kv_time, joules = totals.binned(edges)
    if tokens is not None:  # the client's times, not the engine's step ends
        tokens = as_table(tokens)
        decode = count_in_bins(
            tokens["end"].astype(np.float64), edges, tokens["weight"].astype(np.float64)
        )  # which include the resampled tokens' gaps
    elif resampled is not None and len(resampled):
        decode = decode + count_in_bins(np.asarray(resampled, np.float64), edges)
    ran = busy > 0
    arrivals = count_in_bins(requests["arrival"].astype(np.float64), edges)
    completions = count_in_bins(requests["finish"].astype(np.float64)[completed], edges)
    with np.errstate(invalid="ignore", divide="ignore"):
        return Table(
            {
                "t_start": edges[:-1],
                "t_end": edges[1:],
                "arrivals": arrivals.astype(np.int64),
                "completions": completions.astype(np.int64),
                "output_tokens_per_s": (decode + first_tokens) / span,
                "prefill_tokens_per_s": prefill / span,
                "busy_fraction": busy / (span * max(len(ctx.replicas), 1)),
                "batch_size": np.where(ran, batch / busy, np.nan),
                "kv_utilisation": np.where(ran, kv_time / busy, np.nan),
                "waiting": waiting_seconds(requests, edges) / span,
                "power_w": ctx.idle_power_w + joules / span,
            }
        )


def waiting_seconds(requests: Table, edges: np.ndarray) -> np.ndarray:
    """Request-seconds spent waiting in each bin: from arrival to first scheduling, or,
    never scheduled, to the request's end (rejected, failed) or the run's (edges[-1])."""
    arrival = requests["arrival"].astype(np.float64)
    left = requests["first_scheduled"].astype(np.float64)
    left = np.where(np.isnan(left), requests["finish"], left)
    left = np.where(np.isnan(left), edges[-1], left)
    return integrals(arrival, left, np.ones((1, len(arrival))), edges)[0]
