"""Is the backlog growing? The overload verdict of a run, as trend tests of the waiting
queue and of the requests in the system.

A stable server's waiting queue fluctuates about a level; an overloaded one's grows for as
long as traffic arrives, by (offered - served rate) per second. The test therefore looks
at the waiting queue over the arrivals, not at how many requests finished in some window
(which a short run of long requests gets wrong: nothing finishes yet, nothing waits).

- signal: the number of servable requests waiting (arrived, not yet first scheduled; one
  never scheduled waits until the run's end) just before each arrival, which for Poisson
  arrivals samples the time average;
- warm-up: the first 10% of the arrivals are left out, the rest cut into 10 blocks of
  equal arrival counts; each block's mean waiting count is one point of the series;
- trend: Mann-Kendall's statistic over the 10 points, with its exact one-sided p-value
  (no assumption on the shape or scale of the queue); blocks, not single arrivals, so
  the short-range correlation of a queue does not pass for a trend;
- size: the Theil-Sen slope of the points (requests per second), as a fraction of the
  offered rate, is the share of the offered load left unserved.

Overloaded means a significant trend (p < 0.01) that is also material (at least 2% of
the offered load unserved, a queue at least 5 requests longer at the end) and beyond the
arrivals' noise. A queue growing by a share g of n arrivals drifts g x n against a random
walk of about cv x sqrt(n), cv the coefficient of variation of the inter-arrival times
(1 for Poisson, measured from the run, never taken below 1): bursts make a stable queue's
block means swing together, so Mann-Kendall alone, which assumes exchangeable points,
reads a burst late in a short run as a trend. The rise must therefore also exceed
2.3 x cv x sqrt(n), so a share g is detectable from n = (2.3 x cv / g)^2 arrivals: for
Poisson 105% of capacity (g = 0.048) from ~2,300 requests, 120% from ~200; for cv = 4,
150% from ~800. A significant, material rise below that bound is `too_short_to_judge`,
not overloaded; `detectable_unserved_share` (2.3 x cv / sqrt(n)) is the smallest share
the run could have told from noise.

Those lengths hold where the excess waits. vLLM admits waiting requests while the
running set is below max_num_seqs and KV blocks fit (`Scheduler.schedule`,
vllm/v1/core/sched/scheduler.py), so with a large max_num_seqs and KV to spare the
excess first joins the running batch (TPOT rises) and the waiting queue stays flat for
as long as the batch grows. The requests in the system (arrived, not finished: waiting
and running) grow either way and are tested the same way (`in_system_trend`), after
their ramp: a stable system's count also rises, by rate x time in system, until its
first requests are through (`ramp_end`). After the ramp, over at least RAMPS_TO_JUDGE
ramps' time and MIN_IN_SYSTEM_ARRIVALS arrivals, a rise is overload; any shorter run
with a significant, material rise of that count is `too_short_to_judge`, never stable.
So 120% of capacity on an 8B H100 replica with 256 sequences reads too short to judge
at 200 requests and overloaded from 1,000. docs/METRICS.md has the reasoning and
measurements.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

BLOCKS = 10
WARMUP_SHARE = 0.10
TREND_P_VALUE = 0.01
MIN_UNSERVED_SHARE = 0.02
MIN_QUEUE_RISE = 5.0
MIN_ARRIVALS = 5 * BLOCKS
NOISE_Z = 2.3  # the rise must beat NOISE_Z random-walk standard deviations
RAMP_RESIDUAL = 0.05  # the ramp is over once the count lacks at most 5% of its level
RAMPS_TO_JUDGE = 3  # the in-system count is judged over at least 3 ramps' time after its ramp
MIN_IN_SYSTEM_ARRIVALS = 1000  # and called overloaded from at least 1,000 arrivals after it
STABLE, OVERLOADED, TOO_SHORT = "stable", "overloaded", "too_short_to_judge"
TREND_FIELDS = (  # the keys of queue_trend's dict
    "from_s",
    "arrivals",
    "window_s",
    "offered_requests_per_s",
    "waiting_first",
    "waiting_last",
    "queue_growth_per_s",
    "unserved_share",
    "trend_p_value",
    "arrival_cv",
    "detectable_unserved_share",
)


def present_at_arrivals(arrival: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Requests present just before each arrival (arrivals in time order): those arrived
    earlier minus those gone by then. `left` is when each left the set counted: its first
    scheduling for the waiting queue, its finish for the requests in the system."""
    arrival = np.sort(arrival)
    return np.arange(len(arrival)) - np.searchsorted(np.sort(left), arrival, side="left")


@cache
def _kendall_s_tail(n: int) -> np.ndarray:
    """P(S >= s) for Mann-Kendall's S of n distinct values in random order, s indexed
    from -n(n-1)/2. S = pairs - 2 x inversions, and the inversion counts of random
    permutations follow the Mahonian numbers (built one element at a time)."""
    counts = np.array([1.0])
    for k in range(1, n):
        counts = np.convolve(counts, np.ones(k + 1))
    pairs = n * (n - 1) // 2
    # inversions i -> S = pairs - 2i: reversed order gives S ascending in steps of 2
    by_s = np.zeros(2 * pairs + 1)
    by_s[::2] = counts[::-1]
    return np.cumsum(by_s[::-1])[::-1] / counts.sum()


def trend_p_value(points: np.ndarray) -> float:
    """One-sided p-value that `points` rise by chance (Mann-Kendall, exact, ties as 0)."""
    n = len(points)
    diffs = np.sign(points[None, :] - points[:, None])
    s = int(np.triu(diffs, 1).sum())
    return float(_kendall_s_tail(n)[s + n * (n - 1) // 2])


def _theil_sen(t: np.ndarray, y: np.ndarray) -> float:
    """Median slope over the pairs of points at different times (blocks of a burst can
    share one); the caller ensures there is such a pair."""
    i, j = np.triu_indices(len(t), 1)
    apart = t[j] > t[i]
    i, j = i[apart], j[apart]
    return _median((y[j] - y[i]) / (t[j] - t[i]))


def _median(values: np.ndarray) -> float:
    """`np.median` of a non-empty 1-d array, computed as it does (the mean of the middle
    value, or of the two middle values, of the sorted array; NaN when one is NaN) without
    the masked-array module its NaN check imports (7 ms, a run's only use of it)."""
    ordered = np.sort(values)  # NaNs sort last
    if np.isnan(ordered[-1]):
        return float("nan")
    n = len(ordered)
    return float(np.mean(ordered[(n - 1) // 2 : n // 2 + 1]))


def queue_trend(
    arrival: np.ndarray, left: np.ndarray, since: float | None = None
) -> dict[str, Any] | None:
    """The trend of the requests present (waiting: `left` = first scheduled; in the
    system: `left` = finish) over the arrivals after the warm-up and after `since`
    (module doc); None with fewer than MIN_ARRIVALS arrivals to judge."""
    times = np.sort(arrival)
    waiting = present_at_arrivals(arrival, left)
    skip = int(len(times) * WARMUP_SHARE)
    if since is not None:
        skip = max(skip, int(np.searchsorted(times, since, side="left")))
    if len(times) - (0 if since is None else skip) < MIN_ARRIVALS:
        return None
    times, waiting = times[skip:], waiting[skip:]
    window = float(times[-1] - times[0])
    if window <= 0:
        return None
    blocks = np.array_split(np.arange(len(times)), BLOCKS)
    t = np.array([times[b].mean() for b in blocks])
    w = np.array([waiting[b].mean() for b in blocks])
    if np.ptp(t) <= 0:
        return None
    offered = (len(times) - 1) / window
    growth = _theil_sen(t, w)
    cv = arrival_cv(times)
    return {
        "from_s": float(times[0]),  # the window's first arrival
        "arrivals": len(times),  # the window's arrivals
        "window_s": window,
        "offered_requests_per_s": offered,
        "waiting_first": float(w[0]),
        "waiting_last": float(w[-1]),
        "queue_growth_per_s": growth,
        "unserved_share": growth / offered,
        "trend_p_value": trend_p_value(w),
        "arrival_cv": cv,
        "detectable_unserved_share": NOISE_Z * max(cv, 1.0) / np.sqrt(len(times)),
    }


def arrival_cv(times: np.ndarray) -> float:
    """Coefficient of variation of the gaps between arrivals (sorted times): 1 for a
    Poisson process, above 1 for bursty traffic."""
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def verdict(trend: dict[str, Any]) -> str:
    """STABLE, OVERLOADED or TOO_SHORT (module doc): a significant and material rise of
    the waiting queue is overload only where it beats the arrivals' noise."""
    rise = trend["queue_growth_per_s"] * trend["window_s"]
    if not (
        trend["trend_p_value"] < TREND_P_VALUE
        and trend["unserved_share"] >= MIN_UNSERVED_SHARE
        and rise >= MIN_QUEUE_RISE
    ):
        return STABLE
    # rise / arrivals is the unserved share, the noise bound / arrivals the detectable one
    return (
        OVERLOADED if trend["unserved_share"] >= trend["detectable_unserved_share"] else TOO_SHORT
    )


def ramp_end(arrival: np.ndarray, finish: np.ndarray) -> float:
    """When a stable system's count of requests in it has reached its level, to within
    RAMP_RESIDUAL of it: the count at time tau after an arrival lacks the time those
    arrivals still spend in the system past tau, sum((s - tau)+) over their times in
    system s (M/G/infinity: level x E[(S - tau)+] / E[S]). tau is the smallest time in
    system of the first WARMUP_SHARE arrivals past which they spent at most RAMP_RESIDUAL
    of their time, counted from the last of them: one request of a rare long output
    (the maximum) does not set the ramp."""
    order = np.argsort(arrival, kind="stable")
    first = order[: max(1, int(len(order) * WARMUP_SHARE))]
    stay = np.sort(finish[first] - arrival[first])
    # time spent past each stay[k] by the longer ones: sum_{j>k} (stay[j] - stay[k])
    past = np.cumsum(stay[::-1])[::-1] - stay * np.arange(len(stay), 0, -1)
    tau = stay[np.argmax(past <= RAMP_RESIDUAL * stay.sum())]
    return float(arrival[first[-1]] + tau)


def in_system_trend(arrival: np.ndarray, finish: np.ndarray) -> dict[str, Any] | None:
    """The trend of the requests in the system (arrived, not finished: waiting and running)
    over the arrivals after its ramp (which ends at `ramp_end_s`; `ramp_over` True). The
    count keeps a burst (or a run of long requests) for a time in system, so the window
    must span RAMPS_TO_JUDGE ramps (each about a time in system) for its blocks to be more
    than one fluctuation; where it is shorter, or under MIN_ARRIVALS arrive after the ramp,
    the trend is taken over the arrivals after the warm-up, ramp included (`ramp_over`
    False). Either way its `from_s` and `arrivals` are those of the window its figures
    cover. None with too few arrivals."""
    if len(arrival) < MIN_ARRIVALS:
        return None
    start = ramp_end(arrival, finish)
    trend = queue_trend(arrival, finish, since=start)
    ramp_over = trend is not None and trend["window_s"] >= RAMPS_TO_JUDGE * (
        start - float(arrival.min())
    )
    trend = trend if ramp_over else queue_trend(arrival, finish)
    if trend is None:
        return None
    return {**trend, "ramp_end_s": start, "ramp_over": ramp_over}


def in_system_verdict(trend: dict[str, Any]) -> str:
    """`verdict` of the requests in the system. A rise that may be the ramp of a stable
    system (`ramp_over` False) is TOO_SHORT, never overload; so is one over fewer than
    MIN_IN_SYSTEM_ARRIVALS arrivals after the ramp, where the count of a stable system
    near capacity (its running set as well as its queue) still swings by as much (a
    long-prompt workload at 90% of capacity rose by 24% of 157 arrivals)."""
    judged = verdict(trend)
    if judged == STABLE:
        return STABLE
    return judged if judged_long_enough(trend) else TOO_SHORT


def judged_long_enough(trend: dict[str, Any]) -> bool:
    """An in-system trend over RAMPS_TO_JUDGE ramps and MIN_IN_SYSTEM_ARRIVALS arrivals
    after its ramp: long enough to call a rise overload."""
    return bool(trend["ramp_over"]) and trend["arrivals"] >= MIN_IN_SYSTEM_ARRIVALS


def worst(*verdicts: str | None) -> str | None:
    """The verdict of a run from its signals': OVERLOADED if any is, else TOO_SHORT if any
    is, else STABLE if any was judged, else None."""
    for judged in (OVERLOADED, TOO_SHORT, STABLE):
        if judged in verdicts:
            return judged
    return None


WAITING, IN_SYSTEM = "the waiting queue", "the requests in the system (waiting and running)"


def growing_text(trend: dict[str, Any], what: str = WAITING) -> str:
    return (
        f"{what} grew from {trend['waiting_first']:,.0f} to "
        f"{trend['waiting_last']:,.0f} requests over {trend['window_s']:,.0f} s of "
        f"arrivals from {trend['from_s']:,.0f} s: {trend['unserved_share']:.0%} of the offered "
        f"load ({trend['offered_requests_per_s']:,.2f} req/s) went unserved "
        f"(trend p = {trend['trend_p_value']:.1g})"
    )


def too_short_text(trend: dict[str, Any], what: str = WAITING) -> str:
    head = (
        f"too short to judge overload: {what} rose from {trend['waiting_first']:,.0f} "
        f"to {trend['waiting_last']:,.0f} requests"
    )
    if "ramp_over" in trend and not judged_long_enough(trend):
        return (
            f"{head}, as a stable system's do while it fills up (or swings near capacity): "
            f"its first {WARMUP_SHARE:.0%} of arrivals were through only at "
            f"{trend['ramp_end_s']:,.0f} s, and a verdict needs {RAMPS_TO_JUDGE} times that "
            f"long of arrivals after it, {MIN_IN_SYSTEM_ARRIVALS:,} at least; run more requests"
        )
    return (
        f"{head}, within the noise of arrivals this bursty "
        f"(inter-arrival cv {trend['arrival_cv']:.1f}); this run could only detect "
        f"{trend['detectable_unserved_share']:.0%} or more of the offered load unserved"
    )
