"""One run's tables reduced to the numbers a capacity planner compares: a JSON-ready dict
(`summarize`; simulator.metrics.summary_table renders it for terminals).

Definitions (all times in seconds of simulated time, D = ctx.duration_s):

- counts: every arrived request is exactly one of completed, rejected (by reason), failed
  (by reason) or in flight; in-flight ones are `running` once they were first scheduled (a
  preempted and re-queued request stays `running`) and `queued` otherwise.
- throughput over D: completed requests, prompt tokens of requests whose prefill finished
  (a first token), and generated tokens of every request (in-flight ones included); in
  steady state (`steady_*`): the output tokens made between the 10% and the 90% completion
  over that time (later tokens spread evenly between a request's first token and its
  finish), and the requests and prompt tokens that rate serves at the completed requests'
  mean output and prompt lengths.
- latency blocks {count, mean, p50, p90, p95, p99, max}: TTFT over requests with a first
  token; TPOT and E2E over completed requests (TPOT undefined for one-token outputs);
  queueing over requests that were scheduled; ITL over the gap samples, each weighted by
  the number of tokens that saw it. Percentiles interpolate linearly between order
  statistics, exactly as `numpy.percentile` on the samples repeated `weight` times.
- goodput: completed requests for which every bound the SLO gives holds (a one-token
  output meets any TPOT bound); per second over D (`goodput_requests_per_s`, the whole
  run, as `requests_per_s`) and in steady state (`steady_goodput_requests_per_s`: the
  steady request rate x the share of the requests finishing in the steady window that
  met the SLO, so on the basis of `steady_requests_per_s` and the costs, and never above
  it).
- overload: the cluster is `overloaded` when its waiting queue, or the requests in the
  system (waiting and running) after their ramp, grew over the arrivals (a significant
  and material trend beyond the arrivals' noise, simulator.metrics.overload), or when more
  than 1% of arrivals were rejected because a waiting queue was full; `overload_verdict`
  is overloaded, stable, too_short_to_judge (a rise the run is too short to tell from its
  bursts or from the system filling up) or None (not judged: fewer than 50 arrivals, or
  all at once). docs/METRICS.md has the reasoning.
- utilisation: busy fraction = step time of a replica / D, averaged over replicas; MFU =
  sum of step FLOPs / (sum of replica peak FLOP/s x D): hardware FLOPs (padding and
  recomputed prompts count) over the whole run, not model FLOPs; MBU the same with every
  DRAM byte of every step (prefill too, so not Databricks' decode-only MBU) and peak
  bandwidth; the `_busy` variants divide by each replica's busy time instead of D;
  bound_share = busy time per limiting resource / all busy time.
- kv: each step's used blocks / its replica's total blocks, mean weighted by step
  duration (busy time), and max.
- cost: price of every GPU for D (usd_total); per request and per million tokens at the
  steady-state rates (the fleet's price per second over them), or over D when the run has
  no steady state (`basis` says which, `note` why); run_usd_per_million_output_tokens is
  usd_total over every generated token, drain included.
- frontend (only where `frontend.kind` models vLLM's API server, simulator.api_server):
  the request times, latencies, throughput and D above are the client's, D lasting until
  it saw the last token; `utilisation` is the API server processes' CPU work / (processes
  x D), `utilisation_max` the busiest replica's, `load` the most any replica's engine
  asked of its processes' CPU in one of 20 equal windows of its serving span (first
  request sent to last token emitted, the engine's clock), `load_window_s` that window;
  `token_delay_s` how long the engine's tokens waited in them (weighted by token);
  `ingest_s` from the client sending a request to the engine seeing it. Busy for
  FRONTEND_BUSY of D or more on the busiest replica, or offered a load above 1, the
  processes capped the throughput, and a warning says so.
- energy (hardware_models.power): while a step runs each of its GPUs draws idle + busy +
  tensor_w x (step FLOP/s / peak) + memory_w x (step DRAM bytes/s / peak), at most its
  TDP (power_capped_share: the busy time the limit bound), and idle power whenever no
  step runs. Per output token and request on cost's basis: the steady window's GPU energy
  per second over its token and request rates (`basis`, `note`); run_joules_per_output_
  token over the whole run. GPU figures (gpu_energy_kwh, average_power_w, steady_power_w,
  joules_per_*) are before PUE, as ML.ENERGY, Zeus and MLPerf Power report them;
  energy_kwh, usd_energy and facility_joules_per_output_token add the hosts'
  (cost.host_w_per_gpu x GPUs, IT load) and multiply by PUE. per_replica and per_pool
  give each one's gpu_energy_kwh and average_power_w.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.engine.requests import REJECT_TEXT, RejectReason
from simulator.engine.step_cost import StepBound
from simulator.metrics.context import ReplicaInfo, RunContext
from simulator.metrics.overload import (
    IN_SYSTEM,
    OVERLOADED,
    TOO_SHORT,
    TREND_FIELDS,
    growing_text,
    in_system_trend,
    in_system_verdict,
    queue_trend,
    too_short_text,
    verdict,
    worst,
)
from simulator.metrics.step_totals import StepTotals
from simulator.metrics.table import Table, as_table
from simulator.provenance import configuration

if TYPE_CHECKING:
    import pandas as pd

PERCENTILES = (50, 90, 95, 99)
QUEUE_FULL_SHARE = 0.01
STEADY_FROM, STEADY_TO = 0.10, 0.90  # steady-state throughput between these completions
STEADY_MIN_COMPLETIONS = 20
# What a cost per request or per token is measured over (`cost.basis`).
COST_STEADY, COST_RUN = "steady_state", "whole_run"
STEADY_FIELDS = (
    "steady_window_s",
    "steady_requests_per_s",
    "steady_input_tokens_per_s",
    "steady_output_tokens_per_s",
)
# Warn when steps filled the token budget, not compute-bound, for this share of busy time
# while requests waited with the KV cache at most this full; and when this share of
# arrivals was preempted.
BUDGET_CAP_SHARE, BUDGET_CAP_KV = 0.25, 0.50
PREEMPTED_SHARE = 0.05
# Warn when a modelled front end's processes were busy this share of the run.
FRONTEND_BUSY = 0.9
# Warn when more than this share of arrivals was rejected for one reason a setting decides.
REJECTED_SHARE = 0.01
_REJECT_ADVICE = {
    RejectReason.EXCEEDS_KV_CACHE: "the KV cache is too small for them: {more_kv} or shorten "
    "the workload",
    RejectReason.EXCEEDS_MAX_MODEL_LEN: "serving.max_model_len is too short for them",
    RejectReason.EXCEEDS_TOKEN_BUDGET: "the token budget (serving.max_num_batched_tokens) is "
    "below their prompts: raise it or use the chunked_prefill policy",
}
# Why requests failed on faulted replicas (faults), and the setting that saves them.
_FAIL_ADVICE = {
    RejectReason.REPLICA_FAILED: "faults.on_failure: retry restarts them on another replica",
    RejectReason.NO_HEALTHY_REPLICA: "every replica of their pool was down when they were "
    "routed or retried: give that pool more replicas",
    RejectReason.TOO_MANY_RETRIES: "raise faults.max_retries",
}
_REASON_KEY = {text: reason.name.lower() for reason, text in REJECT_TEXT.items()}
_QUEUE_FULL = REJECT_TEXT[RejectReason.QUEUE_FULL]
_OUTCOMES = ("in_flight", "completed", "rejected", "failed")
Arrays = dict[str, np.ndarray]


def weighted_percentile(
    values: np.ndarray, weights: np.ndarray | None, q: float | np.ndarray
) -> np.ndarray:
    """Percentiles q (0-100) of `values` where value i occurs `weights[i]` times.

    For integer weights this equals numpy.percentile (linear method) on the expanded
    samples, without expanding them: ITL samples stand for billions of tokens.
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.ones_like(values) if weights is None else np.asarray(weights, np.float64)
    keep = np.isfinite(values) & (weights > 0)
    values, weights = values[keep], weights[keep]
    if len(values) == 0:
        return np.full(np.shape(q), np.nan)
    return percentile_sorted_by(
        values, weights, q, "stable" if _fractional(weights) else "quicksort"
    )


def percentile_sorted_by(
    values: np.ndarray, weights: np.ndarray, q: float | np.ndarray, kind: str
) -> np.ndarray:
    """weighted_percentile of finite values and positive weights, sorted by numpy's sort
    `kind`: the sort is the one choice _fractional makes, which the tests check gives
    the same floats either way for whole weights."""
    order = np.argsort(values, kind=kind)
    values, cum = values[order], np.cumsum(weights[order])
    # Sample k (0-based) of the expansion is the first value whose cumulative weight > k.
    top = max(cum[-1] - 1, 0.0)
    position = np.asarray(q, dtype=np.float64) / 100 * top
    below = np.floor(position)
    lo = values[np.searchsorted(cum, below, side="right")]
    hi = values[np.searchsorted(cum, np.minimum(below + 1, top), side="right")]
    return lo + (position - below) * (hi - lo)


def _fractional(weights: np.ndarray) -> bool:
    """Whether a weight is not a whole number. Whole weights (counts; each 1 when none are
    given) let equal values sort in any order: the cumulative weight at the end of each
    run of equal values is the same exact integer whatever their order, so the same
    values are picked, and picking a zero of either sign gives the same percentile
    (`lo + f * (hi - lo)` is +0.0 for zeros of any sign, and hi >= lo). numpy's default
    sort is several times faster than its stable one (ITL: 111,000 gaps in perf_10k)."""
    return not np.array_equal(weights, np.trunc(weights))


def latency_stats(values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, Any]:
    """{count, mean, p50, p90, p95, p99, max} of the finite values, in their own unit."""
    values = np.asarray(values, dtype=np.float64)
    w = np.ones_like(values) if weights is None else np.asarray(weights, np.float64)
    keep = np.isfinite(values) & (w > 0)
    values, w = values[keep], w[keep]
    total = float(w.sum())
    if total <= 0:
        return {"count": 0, "mean": None, "max": None, **{f"p{q}": None for q in PERCENTILES}}
    pct = weighted_percentile(values, w, np.asarray(PERCENTILES))
    return {
        "count": round(total),
        # fsum, not np.dot: BLAS splits a long dot product over its threads, so the last bit
        # would depend on OPENBLAS_NUM_THREADS (Dask sets it to 1 in its workers).
        "mean": math.fsum(values * w) / total,
        **{f"p{q}": float(p) for q, p in zip(PERCENTILES, pct, strict=True)},
        "max": float(values.max()),
    }


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den > 0 and math.isfinite(den) else None


def _masks(requests: Table) -> dict[str, np.ndarray]:
    outcome = requests["outcome"]
    return {name: outcome.equals(name) for name in _OUTCOMES}


def _counts(requests: Table, masks: dict[str, np.ndarray]) -> dict[str, Any]:
    started = ~np.isnan(requests["first_scheduled"])
    by_reason = {
        outcome: {_REASON_KEY.get(text, text): n for text, n in reasons.items()}
        for outcome in ("rejected", "failed")
        for reasons in [requests["reason"].counts(masks[outcome])]
    }
    return {
        "arrived": len(requests),
        "completed": int(masks["completed"].sum()),
        "rejected": int(masks["rejected"].sum()),
        "rejected_by_reason": by_reason["rejected"],
        "failed": int(masks["failed"].sum()),
        "failed_by_reason": by_reason["failed"],
        # restarted on another replica after theirs failed (faults.on_failure: retry)
        "retried": int((requests["retries"] > 0).sum()),
        "retries": int(requests["retries"].sum()),
        "in_flight": int(masks["in_flight"].sum()),
        "in_flight_queued": int((masks["in_flight"] & ~started).sum()),
        "in_flight_running": int((masks["in_flight"] & started).sum()),
    }


def _load(requests: Table, masks: dict[str, np.ndarray], end: float) -> dict[str, Any]:
    """The trends of the waiting queue and of the requests in the system over the
    arrivals, and the queue-full rejections; the verdict from all three (module doc of
    simulator.metrics.overload)."""
    queue_full = int(requests["reason"].equals(_QUEUE_FULL).sum())
    # Rejected requests never wait: the unservable are not load, queue-full is counted below.
    servable = ~masks["rejected"]
    arrival = requests["arrival"][servable]
    started, finish = requests["first_scheduled"][servable], requests["finish"][servable]
    trend = queue_trend(arrival, np.where(np.isnan(started), end, started))
    system = in_system_trend(arrival, np.where(np.isnan(finish), end, finish))
    judged = verdict(trend) if trend else None
    system_judged = in_system_verdict(system) if system else None
    load: dict[str, Any] = {
        **(trend or dict.fromkeys(TREND_FIELDS)),
        "in_system": _in_system_fields(system, system_judged),
        "queue_full_rejections": queue_full,
    }
    reasons = [growing_text(trend)] if judged == OVERLOADED else []
    if system_judged == OVERLOADED:
        reasons.append(growing_text(system, IN_SYSTEM))
    if queue_full > QUEUE_FULL_SHARE * len(requests):
        reasons.append(f"waiting queue full: {queue_full} requests rejected")
    load["overloaded"] = bool(reasons)
    load["verdict"] = OVERLOADED if reasons else worst(judged, system_judged)
    load["reason"] = "; ".join(reasons)  # explains `overloaded`, and only it
    notes = [too_short_text(trend)] if judged == TOO_SHORT else []
    if system_judged == TOO_SHORT:
        notes.append(too_short_text(system, IN_SYSTEM))
    load["note"] = "; ".join(notes) if load["verdict"] == TOO_SHORT else ""
    return load


def _in_system_fields(trend: dict[str, Any] | None, judged: str | None) -> dict[str, Any]:
    """`load.in_system`: the trend's figures under names that do not say `waiting`."""
    names = {"waiting_first": "first", "waiting_last": "last", "queue_growth_per_s": "growth_per_s"}
    fields = (*TREND_FIELDS, "ramp_end_s", "ramp_over")
    values = trend or dict.fromkeys(fields)
    return {names.get(k, k): values[k] for k in fields} | {"verdict": judged}


def _steady_throughput(requests: Table, completed: np.ndarray, end: float) -> dict[str, Any]:
    """The output tokens produced per second between the 10% and the 90% completion (no
    ramp-up, no drain), and the requests and prompt tokens that rate serves: requests of
    the completed ones' mean output length, with their mean prompt. Measured by time, not
    by the requests that finished or were prefilled in the window: those are the short
    ones early in a run, and an offline batch prefills before the window."""
    finish = requests["finish"][completed]
    order = np.argsort(finish, kind="stable")
    n = len(order)
    lo, hi = int(np.ceil(STEADY_FROM * n)), int(np.floor(STEADY_TO * n)) - 1
    if n < STEADY_MIN_COMPLETIONS or finish[order[hi]] <= finish[order[lo]]:
        return dict.fromkeys(STEADY_FIELDS)
    start, stop = float(finish[order[lo]]), float(finish[order[hi]])
    output_per_s = _output_between(requests, start, stop, end) / (stop - start)
    requests_per_s = output_per_s / float(np.mean(requests["generated"][completed]))
    return {
        "steady_window_s": [start, stop],
        "steady_requests_per_s": requests_per_s,
        "steady_input_tokens_per_s": requests_per_s * float(np.mean(requests["prompt"][completed])),
        "steady_output_tokens_per_s": output_per_s,
    }


def _output_between(requests: Table, start: float, stop: float, end: float) -> float:
    """Output tokens produced in [start, stop]: a request's first token when it came, and
    its later tokens spread evenly from its first token to its finish (`end` for one in
    flight)."""
    first = requests["first_token"]
    has = ~np.isnan(first)
    first, generated = first[has], requests["generated"][has].astype(np.float64)
    finish = np.nan_to_num(requests["finish"][has], nan=end)
    at_first = (first >= start) & (first <= stop)
    overlap = np.clip(np.minimum(finish, stop) - np.maximum(first, start), 0.0, None)
    length = finish - first
    spread = np.divide(overlap, length, out=np.zeros_like(length), where=length > 0)
    later = np.maximum(generated - 1, 0.0)
    return math.fsum(at_first * np.minimum(generated, 1.0) + later * spread)


def _meets_slo(requests: Table, ctx: RunContext, completed: np.ndarray) -> np.ndarray:
    ok = completed.copy()
    slo = ctx.slo
    if slo.ttft_s is not None:
        ok &= requests["ttft"] <= slo.ttft_s
    if slo.tpot_s is not None:
        tpot = requests["tpot"]
        ok &= (tpot <= slo.tpot_s) | np.isnan(tpot)
    if slo.e2e_s is not None:
        ok &= requests["e2e"] <= slo.e2e_s
    return ok


def _steady_goodput(
    requests: Table, completed: np.ndarray, ok: np.ndarray, throughput: Mapping[str, Any]
) -> float | None:
    """Requests meeting the SLO per second in steady state: `steady_requests_per_s` x the
    share of the requests finishing in the steady window that met it. Neither the ramp
    (light load, everything meets it) nor the drain weighs in, and the rate is the one
    the steady throughput and costs are on; None where the run has no steady state."""
    window, rate = throughput["steady_window_s"], throughput["steady_requests_per_s"]
    if window is None or rate is None:
        return None
    finish = requests["finish"]
    inside = completed & (finish >= window[0]) & (finish <= window[1])
    return rate * float(ok[inside].mean())


def _latency_blocks(requests: Table, completed: np.ndarray) -> dict[str, Any]:
    return {
        "ttft": latency_stats(requests["ttft"]),
        "tpot": latency_stats(requests["tpot"][completed]),
        "e2e": latency_stats(requests["e2e"][completed]),
        "queueing": latency_stats(requests["queueing"]),
    }


def _per_class(
    requests: Table, ctx: RunContext, masks: dict[str, np.ndarray], ok: np.ndarray
) -> dict[str, Any]:
    classes = requests["priority_class"]
    present = set(classes.counts())
    if len(present) < 2:
        return {}
    order = [n for n in ctx.priority_names if n in present] + sorted(
        present - set(ctx.priority_names)
    )
    blocks = {}
    for name in order:
        mine = classes.equals(name)
        done = masks["completed"] & mine
        blocks[name] = {
            "arrived": int(mine.sum()),
            "completed": int(done.sum()),
            "rejected": int((masks["rejected"] & mine).sum()),
            "slo_fraction": _ratio((ok & mine).sum(), done.sum()),  # of completed
            "slo_fraction_of_arrived": _ratio((ok & mine).sum(), mine.sum()),
            **_latency_blocks(requests.rows(mine), done[mine]),
        }
    return blocks


def _replica_arrays(ctx: RunContext) -> Arrays:
    fields = ("gpus", "peak_flops", "peak_bandwidth", "kv_total_blocks", "usd_per_gpu_hour")
    return {f: np.array([getattr(r, f) for r in ctx.replicas], np.float64) for f in fields}


def _utilisation(totals: StepTotals, ctx: RunContext, rep: Arrays) -> dict[str, Any]:
    n, d = len(ctx.replicas), ctx.duration_s
    busy = totals.busy
    flops, dram = totals.flops.sum(), totals.dram_bytes.sum()
    names = [b.name.lower() for b in StepBound]
    total_busy = float(busy.sum())
    return {
        "gpu_busy_fraction": _ratio(busy.sum() / n, d) if n else None,
        "mfu": _ratio(flops, rep["peak_flops"].sum() * d),
        "mbu": _ratio(dram, rep["peak_bandwidth"].sum() * d),
        "mfu_busy": _ratio(flops, np.dot(rep["peak_flops"], busy)),
        "mbu_busy": _ratio(dram, np.dot(rep["peak_bandwidth"], busy)),
        "bound_share": {
            name: _ratio(t, total_busy) for name, t in zip(names, totals.bound_time, strict=True)
        },
    }


def _kv(totals: StepTotals, requests: Table) -> dict[str, Any]:
    preemptions = requests["preemptions"]
    return {
        "mean_utilisation": _ratio(totals.kv_time.sum(), totals.busy.sum()),
        "max_utilisation": float(totals.kv_max) if totals.steps.sum() else None,
        "preemptions": int(preemptions.sum()),
        "requests_preempted": int((preemptions > 0).sum()),
        "swaps": int(requests["swaps"].sum()),
    }


def _prefix_cache(requests: Table) -> dict[str, Any]:
    """Prompt tokens found in the prefix cache when each request was first scheduled (a
    session's earlier turns), over the prompt tokens of the requests scheduled."""
    scheduled = ~np.isnan(requests["first_scheduled"])
    prompt = int(requests["prompt"][scheduled].sum())
    cached = int(requests["cached_prompt_tokens"][scheduled].sum())
    return {
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "hit_rate": _ratio(cached, prompt),
    }


def _no_steady_state(what: str) -> str:
    """The note of a run whose per-request and per-token `what` are over D."""
    return (
        f"fewer than {STEADY_MIN_COMPLETIONS} completions for a steady state: per-request "
        f"and per-token {what} are the whole run's, ramp-up and drain included"
    )


def _fleet_power(
    totals: StepTotals, ctx: RunContext, gpu_joules: float, throughput: Mapping[str, Any]
) -> tuple[str, str, float, float | None, float | None]:
    """(basis, note, the fleet's GPU power W, requests/s, output tokens/s) that energy per
    request and per token divide: the steady window's, as `_cost` takes them, or the
    whole run's (and why) when the run has no steady state."""
    window = throughput["steady_window_s"]
    if window is None:
        note = _no_steady_state("energy")
        power = _ratio(gpu_joules, ctx.duration_s) or 0.0
        output_per_s = throughput["output_tokens_per_s"]
        return COST_RUN, note, power, throughput["requests_per_s"], output_per_s
    start, stop = window
    power = ctx.idle_power_w + totals.joules_between(start, stop) / (stop - start)
    requests_per_s = throughput["steady_requests_per_s"]
    return COST_STEADY, "", power, requests_per_s, throughput["steady_output_tokens_per_s"]


def _energy(
    totals: StepTotals, ctx: RunContext, output_tokens: float, throughput: Mapping[str, Any]
) -> dict[str, Any]:
    """GPU energy from the power model (hardware_models.power), and what a token and a
    request cost in it while the fleet is busy at this load, on `_cost`'s basis. The
    headline figures are the GPUs' alone, as ML.ENERGY, Zeus and MLPerf Power report
    them; energy_kwh and the `facility_` figure add the hosts (cost.host_w_per_gpu) and
    multiply by PUE."""
    d = ctx.duration_s
    gpu_joules = ctx.idle_power_w * d + float(totals.joules.sum())
    basis, note, power, requests_per_s, output_per_s = _fleet_power(
        totals, ctx, gpu_joules, throughput
    )
    host_w = ctx.host_w_per_gpu * ctx.gpus
    facility_kwh = (gpu_joules + host_w * d) * ctx.pue / 3.6e6
    defaults = sorted({r.power.note for r in ctx.replicas if r.power.note})
    return {
        "model": "idle + busy + tensor FLOP/s x J/FLOP + DRAM bit/s x J/bit, capped at TDP",
        "basis": basis,
        "note": "; ".join(filter(None, [note, *defaults])),
        "pue": ctx.pue,
        "gpu_energy_kwh": gpu_joules / 3.6e6,
        "host_energy_kwh": host_w * d / 3.6e6,
        "energy_kwh": facility_kwh,
        "average_power_w": _ratio(gpu_joules, ctx.gpus * d),
        "steady_power_w": _ratio(power, ctx.gpus) if basis == COST_STEADY else None,
        "power_capped_share": _ratio(totals.capped.sum(), totals.busy.sum()),
        "joules_per_output_token": _ratio(power, output_per_s or 0.0),
        "facility_joules_per_output_token": _ratio((power + host_w) * ctx.pue, output_per_s or 0.0),
        "joules_per_request": _ratio(power, requests_per_s or 0.0),
        "run_joules_per_output_token": _ratio(gpu_joules, output_tokens),
        "usd_energy": facility_kwh * ctx.usd_per_kwh,
    }


def cost_basis_text(cost: Mapping[str, Any]) -> str:
    """`steady state` or `whole run`: what a summary's per-request and per-token costs were
    measured over (a summary written before `basis` existed: the whole run)."""
    return "steady state" if cost.get("basis") == COST_STEADY else "whole run"


def _cost(
    ctx: RunContext,
    rep: Arrays,
    completed: int,
    output_tokens: float,
    throughput: Mapping[str, Any],
) -> dict[str, Any]:
    """The run's price, and what a request and a million tokens cost while the fleet is
    busy at this load: at the steady-state rates, so that neither the ramp-up nor the
    drain after the last arrival (whose length depends on the run's length, not on the
    fleet) is billed to the tokens. Without a steady state (too few completions) the
    whole run's figures stand in, and `note` says so."""
    per_hour = float(np.dot(rep["gpus"], rep["usd_per_gpu_hour"]))
    per_second = per_hour / 3600
    total = per_second * ctx.duration_s
    requests_per_s = throughput["steady_requests_per_s"]
    output_per_s = throughput["steady_output_tokens_per_s"]
    tokens_per_s = (throughput["steady_input_tokens_per_s"] or 0.0) + (output_per_s or 0.0)
    basis, note = COST_STEADY, ""
    if requests_per_s is None:
        basis = COST_RUN
        note = _no_steady_state("costs")
        requests_per_s = _ratio(completed, ctx.duration_s)
        output_per_s = throughput["output_tokens_per_s"]
        tokens_per_s = (throughput["input_tokens_per_s"] or 0.0) + (output_per_s or 0.0)
    return {
        "usd_per_hour": per_hour,
        "usd_total": total,
        "basis": basis,
        "note": note,
        "usd_per_request": _ratio(per_second, requests_per_s or 0.0),
        "usd_per_million_output_tokens": _ratio(per_second * 1e6, output_per_s or 0.0),
        "usd_per_million_total_tokens": _ratio(per_second * 1e6, tokens_per_s),
        "run_usd_per_million_output_tokens": _ratio(total * 1e6, output_tokens),
    }


def _per_replica(
    requests: Table, totals: StepTotals, ctx: RunContext, completed: np.ndarray
) -> list[dict[str, Any]]:
    n, d = len(ctx.replicas), ctx.duration_s
    if n < 2:
        return []
    replica = requests["replica"]
    mine = replica >= 0
    done = np.bincount(replica[completed & mine], minlength=n)[:n]
    tokens = np.bincount(replica[mine], weights=requests["generated"][mine], minlength=n)[:n]
    busy = totals.busy
    joules = [
        info.gpus * info.power.idle_w * d + totals.joules[i] for i, info in enumerate(ctx.replicas)
    ]
    return [
        {
            "replica": i,  # the engine's index, as in the request and step tables
            **({} if info.dp_rank is None else {"dp_rank": info.dp_rank}),
            "pool": info.pool,
            "gpu": info.gpu,
            "gpus": info.gpus,
            "completed": int(done[i]),
            "requests_per_s": _ratio(done[i], d),
            "output_tokens_per_s": _ratio(tokens[i], d),
            "busy_fraction": _ratio(busy[i], d),
            "gpu_energy_kwh": joules[i] / 3.6e6,  # its GPUs', before PUE, as energy's
            "average_power_w": _ratio(joules[i], info.gpus * d),  # per GPU
        }
        for i, info in enumerate(ctx.replicas)
    ]


def _per_pool(replicas: list[dict[str, Any]], ctx: RunContext) -> dict[str, Any]:
    """Replica blocks summed by pool (a heterogeneous or disaggregated cluster)."""
    pools: dict[str, dict[str, Any]] = {}
    engines: dict[str, int] = {}
    for block in replicas:
        pool = pools.setdefault(
            block["pool"],
            {"gpu": block["gpu"], "replicas": 0, "gpus": 0, "completed": 0,
             "requests_per_s": 0.0, "output_tokens_per_s": 0.0, "busy_fraction": 0.0,
             "gpu_energy_kwh": 0.0},
        )  # fmt: skip
        pool["replicas"] += not block.get("dp_rank")  # a dp group counts once
        engines[block["pool"]] = engines.get(block["pool"], 0) + 1
        pool["gpus"] += block["gpus"]
        pool["completed"] += block["completed"]
        for key in ("requests_per_s", "output_tokens_per_s", "busy_fraction", "gpu_energy_kwh"):
            pool[key] += block[key] or 0.0
    for name, pool in pools.items():
        pool["busy_fraction"] /= engines[name]
        pool["average_power_w"] = _ratio(
            pool["gpu_energy_kwh"] * 3.6e6, pool["gpus"] * ctx.duration_s
        )
    return pools if len(pools) > 1 else {}


def _rejection_warnings(counts: Mapping[str, Any], configuration: Mapping[str, Any]) -> list[str]:
    """A warning per reason a setting decides, when it rejected or failed more than
    REJECTED_SHARE of the arrivals."""
    warnings, arrived = [], counts["arrived"]
    outcomes = (("rejected", "were rejected", _REJECT_ADVICE), ("failed", "failed", _FAIL_ADVICE))
    for outcome, verb, advices in outcomes:
        for reason, advice in advices.items():
            n = counts[f"{outcome}_by_reason"].get(reason.name.lower(), 0)
            if n > REJECTED_SHARE * arrived:
                warnings.append(
                    f"{n:,} of {arrived:,} requests ({n / arrived:.0%}) {verb} because "
                    f"{REJECT_TEXT[reason]}; {advice.format(more_kv=_more_kv(configuration))}"
                )
    return warnings


def _capped(sums: np.ndarray, busy: float) -> tuple[float, float] | None:
    """(Share of busy time, KV use) when steps that filled a cap (StepTotals' rows:
    seconds, x KV used, compute-bound seconds) took BUDGET_CAP_SHARE of the busy time with
    the KV cache at most BUDGET_CAP_KV used. A compute-bound step would take as much longer
    as a bigger cap gave it work: only the full steps that are not compute-bound count."""
    full, full_kv, full_compute = (float(column.sum()) for column in sums.T)
    kv_use = full_kv / full if full else 1.0
    capped = full - full_compute
    if busy and capped >= BUDGET_CAP_SHARE * busy and kv_use <= BUDGET_CAP_KV:
        return capped / busy, kv_use
    return None


def _run_warnings(
    totals: StepTotals, kv: Mapping[str, Any], arrived: int, configuration: Mapping[str, Any]
) -> list[str]:
    """What the run's figures show a setting quietly limited (module doc)."""
    if arrived == 0:  # a short duration_s at a low rate: said, not an empty table alone
        return [
            "no request arrived before the workload stopped: every latency, throughput, "
            "cost and energy figure is empty; lengthen workload.duration_s or raise the rate"
        ]
    warnings = []
    busy = float(totals.busy.sum())
    caps = (  # (what capped the batch, its configuration key, its sums, how steps met it)
        ("the token budget (serving.max_num_batched_tokens={})", "max_num_batched_tokens",
         totals.budget_full, "steps filled it"),
        ("serving.max_num_seqs={}", "max_num_seqs", totals.seqs_full,
         "steps ran that many sequences"),
    )  # fmt: skip
    for label, key, sums, how in caps:
        if (found := _capped(sums, busy)) is not None:
            share, kv_use = found
            warnings.append(
                f"{label.format(configuration.get(key, 'its value'))}, not memory, capped the "
                f"batch: {how}, not compute-bound, for {share:.0%} of the busy time while "
                f"requests waited and the KV cache was {kv_use:.0%} used"
            )
    preempted = kv["requests_preempted"]
    if preempted > PREEMPTED_SHARE * arrived:
        warnings.append(
            f"the KV cache is short for this load: {preempted:,} requests "
            f"({preempted / arrived:.0%}) were preempted {kv['preemptions']:,} times to free "
            f"blocks{_preempted_for(configuration)}, {_redone(kv)}; {_more_kv(configuration)}"
            " or admit fewer (max_num_seqs)"
        )
    return warnings


def _more_kv(configuration: Mapping[str, Any]) -> str:
    """The way to a bigger KV cache: serving.num_gpu_blocks where it fixes the count
    (vLLM's num_gpu_blocks_override replaces the block count the memory profile gave,
    vllm/v1/core/kv_cache_utils.py may_override_num_blocks: no memory setting moves
    it), else more memory for it."""
    if (blocks := configuration.get("num_gpu_blocks")) is not None:
        return f"raise serving.num_gpu_blocks ({blocks:,}; it fixes the block count)"
    return "give the KV cache more memory (gpu_memory_utilization, tp, kv_dtype)"


def _preempted_for(configuration: Mapping[str, Any]) -> str:
    """Whom the preemptions freed blocks for: running requests, and under vLLM v0's
    priority scheduling (continuous) also waiting ones ahead in (priority, arrival)."""
    v0_priority = configuration.get("scheduling_policy") == "priority"
    if v0_priority and configuration.get("policy") == "continuous":
        return (
            " for running requests or for waiting ones ahead of them (vLLM v0's priority "
            "preemption)"
        )
    return " for running requests"


def _redone(kv: Mapping[str, Any]) -> str:
    """What the preempted requests paid: recompute, or a swap out and back in."""
    swaps, recomputes = kv["swaps"], kv["preemptions"] - kv["swaps"]
    if not swaps:
        return "which recompute their work"
    return f"{swaps:,} swapped to host memory and back, {recomputes:,} recomputed"


def _frontend_saturated(frontend: Mapping[str, Any] | None) -> bool:
    """The busiest replica's API server processes busy for FRONTEND_BUSY of the run, or
    asked for more than their CPU in a window of it."""
    if frontend is None:
        return False
    return (frontend["utilisation_max"] or 0) >= FRONTEND_BUSY or frontend["load"] > 1


def _frontend_backlog(frontend: Mapping[str, Any] | None) -> str:
    """What an overload verdict's reason adds when the backlog sits (partly) in a
    modelled API server rather than before the GPUs."""
    if not _frontend_saturated(frontend):
        return ""
    assert frontend is not None
    return (
        "; part of it is in the API server processes, not the GPUs: the busiest replica's "
        f"were {frontend['utilisation_max']:.0%} busy and tokens waited "
        f"{frontend['token_delay_s']['mean']:.3g} s in them on average (more processes, "
        "frontend.api_server_count, serve it)"
    )


def _frontend_warnings(frontend: Mapping[str, Any] | None) -> list[str]:
    """A modelled API server busy enough to have set the client's throughput: the busiest
    replica's processes, busy for FRONTEND_BUSY of the run or offered more than they
    could do while its engine streamed (a short saturation a whole run's mean hides)."""
    if not _frontend_saturated(frontend):
        return []
    assert frontend is not None
    busiest, load = frontend["utilisation_max"], frontend["load"]
    count = frontend["api_server_count"]
    return [
        f"the busiest replica's API server processes (frontend.api_server_count={count} per "
        f"replica) were {busiest:.0%} busy over the run, and its engine asked {load:.0%} of "
        f"their CPU in its busiest {frontend['load_window_s']:.3g} s: they, not the GPUs, "
        "set when the client saw tokens (and capped its throughput where busy throughout); "
        f"tokens waited {frontend['token_delay_s']['mean']:.3g} s in them on average; more "
        "processes (frontend.api_server_count) raise the cap"
    ]


def _calibrations(replicas: Sequence[ReplicaInfo]) -> list[str]:
    """'gpu: profile' per GPU type; '[pool] gpu: profile' where pools on one GPU type run
    different profiles (as the default lines name their pool)."""
    lines = {(r.pool, r.gpu, r.calibration) for r in replicas}
    if len({(gpu, c) for _, gpu, c in lines}) > len({gpu for _, gpu, _ in lines}):
        return sorted(f"[{pool}] {gpu}: {c}" for pool, gpu, c in lines)
    return sorted({f"{gpu}: {c}" for _, gpu, c in lines})


def _run(ctx: RunContext, arrived: int) -> dict[str, Any]:
    run: dict[str, Any] = {
        "scenario": ctx.scenario,
        "seed": ctx.seed,
        "duration_s": ctx.duration_s,
        "replicas": sum(not r.dp_rank for r in ctx.replicas),  # a dp rank's first or none
        "gpus": ctx.gpus,
        "gpu_types": sorted({r.gpu for r in ctx.replicas}),
        "calibrations": _calibrations(ctx.replicas),
    }
    if ranks := sum(r.dp_rank is not None for r in ctx.replicas):
        run["dp_ranks"] = ranks  # of all replicas; `replicas` counts each dp group once
    all_reduce = sorted({f"{r.gpu}: {r.all_reduce}" for r in ctx.replicas if r.all_reduce})
    if all_reduce:  # only tensor-parallel runs have all-reduces to tell of
        run["all_reduce"] = all_reduce
    moe_kernel = sorted({f"{r.gpu}: {r.moe_kernel}" for r in ctx.replicas if r.moe_kernel})
    if moe_kernel:  # where vLLM picks the experts' kernel by GPU (MXFP4)
        run["moe_kernel"] = moe_kernel
    if "scenario" in ctx.provenance:
        run["configuration"] = configuration(
            ctx.provenance["scenario"],
            ctx.provenance.get("defaults", ()),
            {r.pool: r.gpu for r in ctx.replicas},
        )
    if ctx.wall_seconds > 0:
        run["wall"] = {
            "seconds": ctx.wall_seconds,
            "simulated_s_per_wall_s": ctx.duration_s / ctx.wall_seconds,
            "requests_per_wall_s": arrived / ctx.wall_seconds,
        }
    return run


def _jsonable(value: Any) -> Any:
    """Plain Python types, NaN and infinities as None: json.dumps(allow_nan=False) safe."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    return value


def summarize(
    requests: Table | pd.DataFrame,
    steps: StepTotals | Table | pd.DataFrame,
    itl: Table | pd.DataFrame,
    ctx: RunContext,
) -> dict[str, Any]:
    """The run's headline numbers as a JSON-serialisable dict; definitions in the module
    docstring. `steps` is the run's step totals, or a step table to total; the tables are
    Tables or the DataFrames `Results` shows."""
    totals = steps if isinstance(steps, StepTotals) else StepTotals.from_table(steps, ctx)
    requests, itl = as_table(requests), as_table(itl)
    d = ctx.duration_s
    masks = _masks(requests)
    completed = masks["completed"]
    n_completed = int(completed.sum())
    has_first = ~np.isnan(requests["first_token"])
    input_tokens = float(requests["prompt"][has_first].sum())
    output_tokens = float(requests["generated"].sum())
    ok = _meets_slo(requests, ctx, completed)
    rep = _replica_arrays(ctx)
    load = _load(requests, masks, d)
    if load["overloaded"]:
        load["reason"] += _frontend_backlog(ctx.frontend)
    latency = _latency_blocks(requests, completed)
    latency["itl"] = latency_stats(itl["seconds"], itl["weight"])
    run = _run(ctx, len(requests))
    kv = _kv(totals, requests)
    counts = _counts(requests, masks)
    throughput = {
        "requests_per_s": _ratio(n_completed, d),
        "input_tokens_per_s": _ratio(input_tokens, d),
        "output_tokens_per_s": _ratio(output_tokens, d),
        **_steady_throughput(requests, completed, d),
    }
    summary = {
        "run": run,
        "warnings": [
            *ctx.warnings,
            *_rejection_warnings(counts, run.get("configuration", {})),
            *_run_warnings(totals, kv, len(requests), run.get("configuration", {})),
            *_frontend_warnings(ctx.frontend),
        ],
        "counts": counts,
        "overloaded": load.pop("overloaded"),
        "overload_verdict": load.pop("verdict"),
        "overload_reason": load.pop("reason"),
        "overload_note": load.pop("note"),
        "load": load,
        "throughput": throughput,
        "latency": latency,
        "goodput": {
            "slo": {"ttft_s": ctx.slo.ttft_s, "tpot_s": ctx.slo.tpot_s, "e2e_s": ctx.slo.e2e_s},
            "requests_meeting_slo": int(ok.sum()),
            "fraction": _ratio(ok.sum(), n_completed),
            "fraction_of_arrived": _ratio(ok.sum(), len(requests)),
            "goodput_requests_per_s": _ratio(ok.sum(), d),
            "steady_goodput_requests_per_s": _steady_goodput(requests, completed, ok, throughput),
        },
        "utilisation": _utilisation(totals, ctx, rep),
        "kv": kv,
        "prefix_cache": _prefix_cache(requests),
        "cost": _cost(ctx, rep, n_completed, output_tokens, throughput),
        "energy": _energy(totals, ctx, output_tokens, throughput),
    }
    if ctx.frontend is not None:
        summary["frontend"] = ctx.frontend
    if classes := _per_class(requests, ctx, masks, ok):
        summary["priority_classes"] = classes
    if ctx.provenance:
        summary["provenance"] = ctx.provenance
    if replicas := _per_replica(requests, totals, ctx, completed):
        summary["per_replica"] = replicas
        if pools := _per_pool(replicas, ctx):
            summary["per_pool"] = pools
    return _jsonable(summary)
