"""One run's tables reduced to the numbers a capacity planner compares: a JSON-ready dict
(`summarize`) and its terminal rendering (`summary_table`).

Definitions (all times in seconds of simulated time, D = ctx.duration_s):

- counts: every arrived request is exactly one of completed, rejected (by reason), failed,
  or in flight; in-flight ones are `running` once they were first scheduled (a preempted
  and re-queued request stays `running`) and `queued` otherwise.
- throughput over D: completed requests, prompt tokens of requests whose prefill finished
  (a first token), and generated tokens of every request (in-flight ones included).
- latency blocks {count, mean, p50, p90, p95, p99, max}: TTFT over requests with a first
  token; TPOT and E2E over completed requests (TPOT undefined for one-token outputs);
  queueing over requests that were scheduled; ITL over the gap samples, each weighted by
  the number of tokens that saw it. Percentiles interpolate linearly between order
  statistics, exactly as `numpy.percentile` on the samples repeated `weight` times.
- goodput: completed requests for which every bound the SLO gives holds (a one-token
  output meets any TPOT bound).
- overload: the cluster is `overloaded` when, over the second half of the arrival window,
  it completed fewer than 90% of the servable requests that arrived in that half (judged
  on >= 50 such arrivals, and only when the window is at least one median time in system
  long, so a short run of long requests is not mistaken for one), when the median
  queueing delay grew by more than 0.111 s per s of arrivals from the second to the last
  quarter of the arrivals, or when more than 1% of arrivals were rejected because a
  waiting queue was full. docs/METRICS.md has the reasoning.
- utilisation: busy fraction = step time of a replica / D, averaged over replicas; MFU =
  sum of step FLOPs / (sum of replica peak FLOP/s x D); MBU the same with DRAM bytes and
  peak bandwidth; the `_busy` variants divide by each replica's busy time instead of D;
  bound_share = busy time per limiting resource / all busy time.
- kv: each step's used blocks / its replica's total blocks, mean weighted by step
  duration (busy time), and max.
- cost: price of every GPU for D; per completed request and per million tokens.
- energy: a GPU draws idle + (tdp - idle) x activity, activity of a step = max(achieved
  FLOP/s / peak, achieved DRAM bytes/s / peak) of its replica clipped to [0, 1], and
  idle power whenever no step runs. energy_kwh and the per-token and per-request joules
  are at the facility (x PUE); average_power_w is per GPU, before PUE.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from simulator.engine.requests import REJECT_TEXT, RejectReason
from simulator.engine.step_cost import StepBound
from simulator.metrics.context import RunContext
from simulator.metrics.step_totals import StepTotals

PERCENTILES = (50, 90, 95, 99)
OVERLOAD_SHORTFALL = 0.10
OVERLOAD_MIN_ARRIVALS = 50
QUEUE_FULL_SHARE = 0.01
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
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    # Sample k (0-based) of the expansion is the first value whose cumulative weight > k.
    top = max(cum[-1] - 1, 0.0)
    position = np.asarray(q, dtype=np.float64) / 100 * top
    below = np.floor(position)
    lo = values[np.searchsorted(cum, below, side="right")]
    hi = values[np.searchsorted(cum, np.minimum(below + 1, top), side="right")]
    return lo + (position - below) * (hi - lo)


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
        "mean": float(np.dot(values, w) / total),
        **{f"p{q}": float(p) for q, p in zip(PERCENTILES, pct, strict=True)},
        "max": float(values.max()),
    }


def _ratio(num: float, den: float) -> float | None:
    return float(num) / float(den) if den > 0 and math.isfinite(den) else None


def _masks(requests: pd.DataFrame) -> dict[str, np.ndarray]:
    outcome = requests["outcome"]
    return {name: (outcome == name).to_numpy() for name in _OUTCOMES}


def _counts(requests: pd.DataFrame, masks: dict[str, np.ndarray]) -> dict[str, Any]:
    started = requests["first_scheduled"].notna().to_numpy()
    reasons = requests.loc[masks["rejected"], "reason"].value_counts()
    return {
        "arrived": len(requests),
        "completed": int(masks["completed"].sum()),
        "rejected": int(masks["rejected"].sum()),
        "rejected_by_reason": {
            _REASON_KEY.get(text, text): int(n) for text, n in reasons.items() if n
        },
        "failed": int(masks["failed"].sum()),
        "in_flight": int(masks["in_flight"].sum()),
        "in_flight_queued": int((masks["in_flight"] & ~started).sum()),
        "in_flight_running": int((masks["in_flight"] & started).sum()),
    }


def _load(requests: pd.DataFrame, masks: dict[str, np.ndarray], end: float) -> dict[str, Any]:
    """Offered vs served rate, and queueing delay against arrival time; see module doc."""
    arrival = requests["arrival"].to_numpy()
    queue_full = int((requests["reason"] == _QUEUE_FULL).to_numpy().sum())
    load: dict[str, Any] = {
        "window_s": None,
        "offered_requests_per_s": None,
        "served_requests_per_s": None,
        "shortfall": None,
        "median_time_in_system_s": None,
        "queueing_growth": None,
        "queue_full_rejections": queue_full,
    }
    reasons = []
    if len(arrival) >= 2 and arrival.max() > arrival.min():
        first, last = float(arrival.min()), float(arrival.max())
        mid = (first + last) / 2
        servable = ~(masks["rejected"] & (requests["reason"] != _QUEUE_FULL).to_numpy())
        offered = int(((arrival >= mid) & servable).sum())
        finish = requests["finish"].to_numpy()
        completed = masks["completed"]
        served = int((completed & (finish >= mid) & (finish <= last)).sum())
        window = last - mid
        shortfall = 1 - served / offered if offered else 0.0
        settle = (
            float(np.median(finish[completed] - arrival[completed])) if completed.any() else 0.0
        )
        load |= {
            "window_s": window,
            "offered_requests_per_s": offered / window,
            "served_requests_per_s": served / window,
            "shortfall": shortfall,
            "median_time_in_system_s": settle,
        }
        # Completions in the window come from arrivals a time in system earlier: when
        # that reaches back before the first arrival, the window still sees the warm-up.
        if offered >= OVERLOAD_MIN_ARRIVALS and shortfall > OVERLOAD_SHORTFALL and settle <= window:
            reasons.append(
                f"served {served / offered:.0%} of the offered load in the second half of "
                f"the arrivals ({served / window:.3g} of {offered / window:.3g} req/s)"
            )
        growth = _queueing_growth(requests, servable, end)
        load["queueing_growth"] = growth
        if growth is not None and growth > OVERLOAD_SHORTFALL / (1 - OVERLOAD_SHORTFALL):
            reasons.append(
                f"queueing delay grew by {growth:.2f} s per second of arrivals (the queue "
                "kept growing)"
            )
    if queue_full > QUEUE_FULL_SHARE * len(arrival):
        reasons.append(f"waiting queue full: {queue_full} requests rejected")
    load["overloaded"] = bool(reasons)
    load["reason"] = "; ".join(reasons)
    return load


def _queueing_growth(requests: pd.DataFrame, servable: np.ndarray, end: float) -> float | None:
    """Slope of the median queueing delay from the second to the last quarter of the
    arrival window (a request never scheduled counts as waiting until the run's end);
    None when either quarter holds too few requests to say."""
    all_arrivals = requests["arrival"].to_numpy()
    first, last = float(all_arrivals.min()), float(all_arrivals.max())
    arrival = all_arrivals[servable]
    scheduled = requests["first_scheduled"].to_numpy()[servable]
    delay = np.where(np.isnan(scheduled), end, scheduled) - arrival
    span = last - first
    second = (arrival >= first + span / 4) & (arrival < first + span / 2)
    fourth = arrival >= first + 3 * span / 4
    if min(second.sum(), fourth.sum()) < OVERLOAD_MIN_ARRIVALS // 2:
        return None
    rise = np.median(delay[fourth]) - np.median(delay[second])
    return float(rise / (np.median(arrival[fourth]) - np.median(arrival[second])))


def _meets_slo(requests: pd.DataFrame, ctx: RunContext, completed: np.ndarray) -> np.ndarray:
    ok = completed.copy()
    slo = ctx.slo
    if slo.ttft_s is not None:
        ok &= (requests["ttft"] <= slo.ttft_s).to_numpy()
    if slo.tpot_s is not None:
        tpot = requests["tpot"]
        ok &= ((tpot <= slo.tpot_s) | tpot.isna()).to_numpy()
    if slo.e2e_s is not None:
        ok &= (requests["e2e"] <= slo.e2e_s).to_numpy()
    return ok


def _latency_blocks(requests: pd.DataFrame, completed: np.ndarray) -> dict[str, Any]:
    return {
        "ttft": latency_stats(requests["ttft"].to_numpy()),
        "tpot": latency_stats(requests["tpot"].to_numpy()[completed]),
        "e2e": latency_stats(requests["e2e"].to_numpy()[completed]),
        "queueing": latency_stats(requests["queueing"].to_numpy()),
    }


def _per_class(
    requests: pd.DataFrame, ctx: RunContext, masks: dict[str, np.ndarray], ok: np.ndarray
) -> dict[str, Any]:
    classes = requests["priority_class"].astype(str).to_numpy()
    present = set(classes.tolist())
    if len(present) < 2:
        return {}
    order = [n for n in ctx.priority_names if n in present] + sorted(
        present - set(ctx.priority_names)
    )
    blocks = {}
    for name in order:
        mine = classes == name
        done = masks["completed"] & mine
        blocks[name] = {
            "arrived": int(mine.sum()),
            "completed": int(done.sum()),
            "rejected": int((masks["rejected"] & mine).sum()),
            "slo_fraction": _ratio((ok & mine).sum(), done.sum()),
            **_latency_blocks(requests[mine], done[mine]),
        }
    return blocks


def _replica_arrays(ctx: RunContext) -> Arrays:
    fields = ("gpus", "peak_flops", "peak_bandwidth", "kv_total_blocks")
    fields += ("idle_power_w", "tdp_w", "usd_per_gpu_hour")
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


def _kv(totals: StepTotals, requests: pd.DataFrame) -> dict[str, Any]:
    preemptions = requests["preemptions"].to_numpy()
    return {
        "mean_utilisation": _ratio(totals.kv_time.sum(), totals.busy.sum()),
        "max_utilisation": float(totals.kv_max) if totals.steps.sum() else None,
        "preemptions": int(preemptions.sum()),
        "requests_preempted": int((preemptions > 0).sum()),
    }


def _prefix_cache(requests: pd.DataFrame) -> dict[str, Any]:
    """Prompt tokens found in the prefix cache when each request was first scheduled (a
    session's earlier turns), over the prompt tokens of the requests scheduled."""
    scheduled = requests["first_scheduled"].notna().to_numpy()
    prompt = int(requests["prompt"].to_numpy()[scheduled].sum())
    cached = int(requests["cached_prompt_tokens"].to_numpy()[scheduled].sum())
    return {
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "hit_rate": _ratio(cached, prompt),
    }


def _energy(
    totals: StepTotals, ctx: RunContext, rep: Arrays, output_tokens: float, completed: int
) -> dict[str, Any]:
    d = ctx.duration_s
    gpu_joules = rep["idle_power_w"] * d + (rep["tdp_w"] - rep["idle_power_w"]) * totals.active
    it_joules = float(np.dot(rep["gpus"], gpu_joules))
    facility = it_joules * ctx.pue
    kwh = facility / 3.6e6
    return {
        "model": "idle + (tdp - idle) x activity",
        "pue": ctx.pue,
        "energy_kwh": kwh,
        "average_power_w": _ratio(it_joules, ctx.gpus * d),
        "joules_per_output_token": _ratio(facility, output_tokens),
        "joules_per_request": _ratio(facility, completed),
        "usd_energy": kwh * ctx.usd_per_kwh,
    }


def _cost(
    ctx: RunContext, rep: Arrays, completed: int, input_tokens: float, output_tokens: float
) -> dict[str, Any]:
    per_hour = float(np.dot(rep["gpus"], rep["usd_per_gpu_hour"]))
    total = per_hour * ctx.duration_s / 3600
    return {
        "usd_per_hour": per_hour,
        "usd_total": total,
        "usd_per_request": _ratio(total, completed),
        "usd_per_million_output_tokens": _ratio(total * 1e6, output_tokens),
        "usd_per_million_total_tokens": _ratio(total * 1e6, input_tokens + output_tokens),
    }


def _per_replica(
    requests: pd.DataFrame, totals: StepTotals, ctx: RunContext, completed: np.ndarray
) -> list[dict[str, Any]]:
    n, d = len(ctx.replicas), ctx.duration_s
    if n < 2:
        return []
    replica = requests["replica"].to_numpy()
    mine = replica >= 0
    done = np.bincount(replica[completed & mine], minlength=n)[:n]
    tokens = np.bincount(
        replica[mine], weights=requests["generated"].to_numpy()[mine], minlength=n
    )[:n]
    busy = totals.busy
    return [
        {
            "replica": i,
            "pool": info.pool,
            "gpu": info.gpu,
            "gpus": info.gpus,
            "completed": int(done[i]),
            "requests_per_s": _ratio(done[i], d),
            "output_tokens_per_s": _ratio(tokens[i], d),
            "busy_fraction": _ratio(busy[i], d),
        }
        for i, info in enumerate(ctx.replicas)
    ]


def _per_pool(replicas: list[dict[str, Any]], ctx: RunContext) -> dict[str, Any]:
    """Replica blocks summed by pool (a heterogeneous or disaggregated cluster)."""
    pools: dict[str, dict[str, Any]] = {}
    for block in replicas:
        pool = pools.setdefault(
            block["pool"],
            {"gpu": block["gpu"], "replicas": 0, "gpus": 0, "completed": 0,
             "requests_per_s": 0.0, "output_tokens_per_s": 0.0, "busy_fraction": 0.0},
        )  # fmt: skip
        pool["replicas"] += 1
        pool["gpus"] += block["gpus"]
        pool["completed"] += block["completed"]
        for key in ("requests_per_s", "output_tokens_per_s", "busy_fraction"):
            pool[key] += block[key] or 0.0
    for pool in pools.values():
        pool["busy_fraction"] /= pool["replicas"]
    return pools if len(pools) > 1 else {}


def _run(ctx: RunContext, arrived: int) -> dict[str, Any]:
    run: dict[str, Any] = {
        "scenario": ctx.scenario,
        "seed": ctx.seed,
        "duration_s": ctx.duration_s,
        "replicas": len(ctx.replicas),
        "gpus": ctx.gpus,
        "gpu_types": sorted({r.gpu for r in ctx.replicas}),
        "calibrations": sorted({f"{r.gpu}: {r.calibration}" for r in ctx.replicas}),
    }
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
    requests: pd.DataFrame,
    steps: StepTotals | pd.DataFrame,
    itl: pd.DataFrame,
    ctx: RunContext,
) -> dict[str, Any]:
    """The run's headline numbers as a JSON-serialisable dict; definitions in the module
    docstring. `steps` is the run's step totals, or a step table to total."""
    totals = steps if isinstance(steps, StepTotals) else StepTotals.from_frame(steps, ctx)
    d = ctx.duration_s
    masks = _masks(requests)
    completed = masks["completed"]
    n_completed = int(completed.sum())
    has_first = requests["first_token"].notna().to_numpy()
    input_tokens = float(requests["prompt"].to_numpy()[has_first].sum())
    output_tokens = float(requests["generated"].to_numpy().sum())
    ok = _meets_slo(requests, ctx, completed)
    rep = _replica_arrays(ctx)
    load = _load(requests, masks, d)
    latency = _latency_blocks(requests, completed)
    latency["itl"] = latency_stats(itl["seconds"].to_numpy(), itl["weight"].to_numpy())
    summary = {
        "run": _run(ctx, len(requests)),
        "counts": _counts(requests, masks),
        "overloaded": load.pop("overloaded"),
        "overload_reason": load.pop("reason"),
        "load": load,
        "throughput": {
            "requests_per_s": _ratio(n_completed, d),
            "input_tokens_per_s": _ratio(input_tokens, d),
            "output_tokens_per_s": _ratio(output_tokens, d),
        },
        "latency": latency,
        "goodput": {
            "slo": {"ttft_s": ctx.slo.ttft_s, "tpot_s": ctx.slo.tpot_s, "e2e_s": ctx.slo.e2e_s},
            "requests_meeting_slo": int(ok.sum()),
            "fraction": _ratio(ok.sum(), n_completed),
            "fraction_of_arrived": _ratio(ok.sum(), len(requests)),
            "goodput_requests_per_s": _ratio(ok.sum(), d),
        },
        "utilisation": _utilisation(totals, ctx, rep),
        "kv": _kv(totals, requests),
        "prefix_cache": _prefix_cache(requests),
        "cost": _cost(ctx, rep, n_completed, input_tokens, output_tokens),
        "energy": _energy(totals, ctx, rep, output_tokens, n_completed),
    }
    if classes := _per_class(requests, ctx, masks, ok):
        summary["priority_classes"] = classes
    if replicas := _per_replica(requests, totals, ctx, completed):
        summary["per_replica"] = replicas
        if pools := _per_pool(replicas, ctx):
            summary["per_pool"] = pools
    return _jsonable(summary)


# ---- terminal rendering ------------------------------------------------------------------


def _num(x: float | None, spec: str = ",.1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _pct(x: float | None) -> str:
    return _num(None if x is None else 100 * x, ".1f", "%")


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    ms = 1000 * x
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:,.0f}"


def _usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.3g}"


def _latency_table(latency: Mapping[str, Any], rows: tuple[str, ...], indent: str) -> list[str]:
    cols = ("mean", *(f"p{q}" for q in PERCENTILES), "max")
    head = f"{indent}{'(ms)':<10}" + "".join(f"{c:>10}" for c in cols) + f"{'n':>13}"
    lines = [head]
    for name in rows:
        block = latency[name]
        cells = "".join(f"{_ms(block[c]):>10}" for c in cols)
        lines.append(f"{indent}{name.upper():<10}{cells}{block['count']:>13,}")
    return lines


def _slo_text(slo: Mapping[str, float | None]) -> str:
    parts = [f"{k.removesuffix('_s')}<={_ms(v)}ms" for k, v in slo.items() if v is not None]
    return ", ".join(parts) or "none set"


MAX_REPLICA_LINES = 8  # beyond this the table shows pools only; summary.json has them all


def summary_table(summary: Mapping[str, Any]) -> str:
    """A compact aligned text rendering of `summarize`'s dict for terminals and notebooks."""
    run, c, t = summary["run"], summary["counts"], summary["throughput"]
    g, u, kv = summary["goodput"], summary["utilisation"], summary["kv"]
    cost, e = summary["cost"], summary["energy"]
    prefix = summary.get("prefix_cache", {"hit_rate": None})
    head = (
        f"{run['scenario']}  seed {run['seed']}  {_num(run['duration_s'])} s simulated  "
        f"{run['gpus']} x {'/'.join(run['gpu_types'])} in {run['replicas']} replica(s)"
    )
    if "wall" in run:
        head += f"  [{run['wall']['seconds']:.2f} s wall]"
    lines = [head, *(f"calibration {line}" for line in run.get("calibrations", []))]
    if summary["overloaded"]:
        lines.append(f"*** OVERLOADED: {summary['overload_reason']} ***")
    rejected = ", ".join(f"{k} {v}" for k, v in c["rejected_by_reason"].items())
    lines += [
        f"requests    arrived {c['arrived']:,}  completed {c['completed']:,}  "
        f"rejected {c['rejected']:,}{f' ({rejected})' if rejected else ''}  "
        f"failed {c['failed']:,}  in flight {c['in_flight']:,} "
        f"(queued {c['in_flight_queued']:,}, running {c['in_flight_running']:,})",
        f"throughput  {_num(t['requests_per_s'], ',.2f')} req/s  "
        f"input {_num(t['input_tokens_per_s'], ',.0f')} tok/s  "
        f"output {_num(t['output_tokens_per_s'], ',.0f')} tok/s",
        "latency",
        *_latency_table(summary["latency"], ("ttft", "tpot", "itl", "e2e", "queueing"), "  "),
        f"goodput     SLO {_slo_text(g['slo'])}: {g['requests_meeting_slo']:,} of "
        f"{c['completed']:,} completed ({_pct(g['fraction'])})  "
        f"{_num(g['goodput_requests_per_s'], ',.2f')} req/s",
        f"utilisation busy {_pct(u['gpu_busy_fraction'])}  MFU {_pct(u['mfu'])} "
        f"(busy {_pct(u['mfu_busy'])})  MBU {_pct(u['mbu'])} (busy {_pct(u['mbu_busy'])})  "
        "bound " + ", ".join(f"{k} {_pct(v)}" for k, v in u["bound_share"].items() if v),
        f"kv cache    mean {_pct(kv['mean_utilisation'])}  max {_pct(kv['max_utilisation'])}  "
        f"preemptions {kv['preemptions']:,} ({kv['requests_preempted']:,} requests)"
        + (f"  prefix hits {_pct(hits)} of prompt tokens" if (hits := prefix["hit_rate"]) else ""),
        f"cost        {_usd(cost['usd_per_hour'])}/h  run {_usd(cost['usd_total'])}  "
        f"{_usd(cost['usd_per_request'])}/request  "
        f"{_usd(cost['usd_per_million_output_tokens'])}/1M output tok  "
        f"{_usd(cost['usd_per_million_total_tokens'])}/1M tok",
        f"energy      {_num(e['energy_kwh'], ',.3f')} kWh (PUE {e['pue']:g})  "
        f"{_num(e['average_power_w'], ',.0f')} W/GPU  "
        f"{_num(e['joules_per_output_token'], ',.3g')} J/output tok  {_usd(e['usd_energy'])}",
    ]
    for name, block in summary.get("priority_classes", {}).items():
        lines.append(
            f"class {name}: arrived {block['arrived']:,}  completed {block['completed']:,}  "
            f"meets SLO {_pct(block['slo_fraction'])}"
        )
        lines += _latency_table(block, ("ttft", "tpot", "e2e"), "  ")
    for name, p in summary.get("per_pool", {}).items():
        lines.append(
            f"pool {name:<10} {p['replicas']} x {p['gpus'] // p['replicas']} x {p['gpu']}  "
            f"completed {p['completed']:,}  {_num(p['requests_per_s'], ',.2f')} req/s  "
            f"{_num(p['output_tokens_per_s'], ',.0f')} tok/s  busy {_pct(p['busy_fraction'])}"
        )
    replicas = summary.get("per_replica", [])
    for r in replicas if len(replicas) <= MAX_REPLICA_LINES else []:
        lines.append(
            f"replica {r['replica']:<3} {r['gpus']} x {r['gpu']}  completed {r['completed']:,}  "
            f"{_num(r['requests_per_s'], ',.2f')} req/s  "
            f"{_num(r['output_tokens_per_s'], ',.0f')} tok/s  busy {_pct(r['busy_fraction'])}"
        )
    return "\n".join(lines)
