"""Arrival times drawn as whole arrays: open-loop processes, trace replay, think times.

A synthetic process starts at t = 0 and its first request arrives one inter-arrival gap
later. Gamma gaps with shape 1/cv^2 and mean 1/rate have exactly the requested coefficient
of variation; cv = 1 is the Poisson process.
"""

from __future__ import annotations

import math

import numpy as np

from hardware_models.errors import InfersimError
from simulator.workload.config import (
    MAX_REQUESTS,
    MAX_TIME_S,
    ClosedLoopArrivals,
    ConstantArrivals,
    GammaArrivals,
    PoissonArrivals,
    RateArrivals,
    SessionConfig,
)
from simulator.workload.trace_layouts import shown_name
from simulator.workload.traces import ARRIVAL_COLUMN, Trace

MAX_OPEN_LOOP_REQUESTS = MAX_REQUESTS
"""Refuse larger open-loop workloads: their arrays alone would need several GB."""

_MIN_CHUNK = 1024


def interarrival_gaps(spec: RateArrivals, rng: np.random.Generator, n: int) -> np.ndarray:
    """n gaps between consecutive arrivals, seconds."""
    mean = 1.0 / spec.rate_per_s
    if isinstance(spec, PoissonArrivals):
        return rng.exponential(mean, n)
    if isinstance(spec, GammaArrivals):
        shape = 1.0 / spec.cv**2
        return rng.gamma(shape, mean / shape, n)
    return np.full(n, mean)


def open_loop_arrivals(
    spec: RateArrivals,
    rng: np.random.Generator,
    num_requests: int | None,
    duration_s: float | None,
) -> np.ndarray:
    """Sorted arrival times: num_requests of them, or all before duration_s, whichever is
    fewer. Without a count, gaps are drawn in chunks sized from the expected count."""
    expected = math.inf if duration_s is None else spec.rate_per_s * duration_s
    limit = math.inf if num_requests is None else num_requests
    target = min(expected, limit)
    if target > MAX_OPEN_LOOP_REQUESTS:
        raise InfersimError(
            f"workload: about {target:.3g} requests exceeds the open-loop limit of "
            f"{MAX_OPEN_LOOP_REQUESTS:,}; lower num_requests, duration_s or the rate"
        )
    if isinstance(spec, ConstantArrivals):
        count = int(min(limit, expected + 1))
        with np.errstate(over="ignore"):  # a rate near 0 overflows: _check_clock says so
            times = np.arange(1, count + 1, dtype=np.float64) / spec.rate_per_s
    elif duration_s is None:
        times = np.cumsum(interarrival_gaps(spec, rng, num_requests))
    else:
        times = _until(spec, rng, duration_s, num_requests)
    if duration_s is not None:
        times = times[: np.searchsorted(times, duration_s, side="left")]
    times = times[:num_requests] if num_requests is not None else times
    _check_clock(times, f"workload.arrivals.rate_per_s={spec.rate_per_s:g}")
    return times


def _check_clock(times: np.ndarray, cause: str) -> None:
    """Arrival times the simulated clock can hold: finite and at most MAX_TIME_S."""
    if len(times) and not times[-1] <= MAX_TIME_S:  # sorted, so the last is the latest
        raise InfersimError(
            f"{cause}: the last request would arrive at {times[-1]:.3g} s of simulated time, "
            f"beyond the {MAX_TIME_S:.0e} s the simulator's clock covers"
        )


def _until(
    spec: RateArrivals, rng: np.random.Generator, horizon: float, limit: int | None
) -> np.ndarray:
    """Arrivals until one lands at or past `horizon` (or `limit` are drawn)."""
    chunks = []
    drawn, now = 0, 0.0
    while now < horizon and (limit is None or drawn < limit):
        expected = spec.rate_per_s * (horizon - now)  # may overflow to inf: capped below
        size = int(min(expected + 6 * math.sqrt(expected), MAX_OPEN_LOOP_REQUESTS)) + _MIN_CHUNK
        if limit is not None:
            size = min(size, limit - drawn)
        chunk = now + np.cumsum(interarrival_gaps(spec, rng, size))
        chunks.append(chunk)
        drawn += size
        now = float(chunk[-1])
    return np.concatenate(chunks) if chunks else np.empty(0)


def trace_arrivals(
    trace: Trace, time_scale: float, num_requests: int | None, duration_s: float | None
) -> np.ndarray:
    """The trace's arrival times scaled by `time_scale`, cut at the stop condition. A
    trace that ends before num_requests (and before duration_s) is an error, not a
    silently shorter run."""
    if trace.arrived_at is None:
        raise InfersimError(f"{shown_name(trace.path)}: no '{ARRIVAL_COLUMN}' column was read")
    times = trace.arrived_at * time_scale
    _check_clock(times, f"{shown_name(trace.path)} x time_scale {time_scale:g}")
    if duration_s is not None:
        times = times[: np.searchsorted(times, duration_s, side="left")]
    if num_requests is not None and len(times) == len(trace) < num_requests:
        raise InfersimError(
            f"{shown_name(trace.path)}: the trace has {len(trace):,} requests, fewer than "
            f"num_requests={num_requests:,}; lower num_requests or stop on duration_s"
        )
    return times[:num_requests] if num_requests is not None else times


def think_times(
    spec: ClosedLoopArrivals | SessionConfig, rng: np.random.Generator, n: int
) -> np.ndarray:
    """n pauses between a user's completion and its next request, seconds."""
    if spec.think_distribution == "constant" or spec.think_time_s == 0:
        return np.full(n, spec.think_time_s)
    return rng.exponential(spec.think_time_s, n)
