"""vLLM's `bench serve` result JSON (`vllm bench serve --save-result --save-detailed`, and
the older benchmarks/benchmark_serving.py): its key names in one place, shared by the
writer (`infersim run --bench-json`, `bench_result` below) and any reader, so that a
simulated run and a measured one can be compared with the tools users already have.

Definitions follow vLLM's `calculate_metrics`: latencies in ms over successful requests;
TPOT = (latency - TTFT) / (output tokens - 1) over those with more than one token; ITL
over every inter-token gap; std is the population standard deviation; percentiles are
numpy's linear ones; throughputs divide by the run's duration. Per-request lists (the
"detailed" keys) hold one entry per request sent, failed ones with TTFT 0, no gaps and
0 output tokens, as vLLM writes them.
"""

from __future__ import annotations

import contextlib
import datetime
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from hardware_models.errors import InfersimError
from hardware_models.presets import load_gpu
from simulator.formats import vllm_bench_keys as key
from simulator.metrics.summary import weighted_percentile
from simulator.metrics.table import Table, as_table
from simulator.vllm_defaults import EMULATED_VLLM_VERSION

if TYPE_CHECKING:
    import pandas as pd

    from simulator.results import Results

# ---- the format's keys ------------------------------------------------------------------

SETUP_KEYS = (
    "date",
    "endpoint_type",
    key.BACKEND,
    "label",
    key.MODEL_ID,
    "tokenizer_id",
    "num_prompts",
    key.REQUEST_RATE,
    key.BURSTINESS,
    key.MAX_CONCURRENCY,
)
"""What the benchmark client was asked to do."""
RESULT_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)
"""Whole-run figures (durations in s, throughputs per s)."""
DETAILED_KEYS = (*key.DETAILED, "generated_texts", key.ERRORS)
"""Per-request lists, in request order (TTFTs and ITLs in s); only with --save-detailed."""
METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std")
PERCENTILES = (99.0,)
"""vLLM's default --metric-percentiles."""


def stat_key(stat: str, metric: str) -> str:
    """e.g. mean_ttft_ms."""
    return f"{stat}_{metric}_ms"


def percentile_key(p: float, metric: str) -> str:
    """e.g. p99_ttft_ms, p99.9_itl_ms: vLLM writes whole percentiles without a decimal."""
    word = str(int(p)) if int(p) == p else str(p)
    return f"p{word}_{metric}_ms"


METRIC_KEYS = tuple(
    key
    for metric in METRICS
    for key in (
        *(stat_key(stat, metric) for stat in STATS),
        *(percentile_key(p, metric) for p in PERCENTILES),
    )
)
ESTIMATED_ITLS_KEY = "infersim_itls_estimated"
"""infersim's own addition (vLLM's --metadata adds keys the same way): how many requests'
per-request `itls` are spread evenly over their decode time rather than read off steps."""


# ---- writing a simulated run in the format ---------------------------------------------


def bench_result(results: Results, *, date: datetime.datetime | None = None) -> dict[str, Any]:
    """The run as `vllm bench serve --save-result --save-detailed` would have saved it."""
    requests, ctx, scenario = results.request_table, results.context, results.scenario
    completed = requests["outcome"].equals("completed")
    generated = np.where(completed, requests["generated"], 0)
    # The steps are the engine's times; through a modelled API server the client's
    # tokens come later, so its requests' gaps are spread evenly (and counted estimated).
    steps = None if scenario.frontend.modelled else results.step_table
    itls, estimated = request_itls(requests, steps)
    duration = ctx.duration_s
    total_input = int(requests["prompt"][completed].sum())
    total_output = int(generated.sum())
    setup = {
        "date": (date or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": key.INFERSIM_BACKEND,
        key.BACKEND: key.INFERSIM_BACKEND,
        "label": scenario.name,
        key.MODEL_ID: scenario.model.name,
        "tokenizer_id": scenario.model.name,
        "num_prompts": len(requests),
        **_traffic(scenario, requests),
    }
    result = {
        "duration": duration,
        "completed": int(completed.sum()),
        "failed": int((~completed).sum()),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": _per(completed.sum(), duration),
        "request_goodput": _goodput(requests, results, completed, duration),
        "output_throughput": _per(total_output, duration),
        "total_token_throughput": _per(total_input + total_output, duration),
        **_peaks(requests, completed, itls),
        key.INPUT_LENS: requests["prompt"].astype(int).tolist(),
        key.OUTPUT_LENS: generated.astype(int).tolist(),
        key.TTFTS: np.where(completed, requests["ttft"], 0.0).tolist(),
        key.ITLS: [gaps.tolist() for gaps in itls],
        "generated_texts": [""] * len(requests),
        key.ERRORS: _errors(requests, completed),
        ESTIMATED_ITLS_KEY: estimated,
    }
    if (meta := engine_meta(results)) is not None:
        result[key.INFERSIM_META] = meta
    itl = results.itl_table
    ms = {
        "ttft": (requests["ttft"][completed] * 1000, None),
        "tpot": (_finite(requests["tpot"][completed]) * 1000, None),
        "itl": (itl["seconds"] * 1000, itl["weight"]),
        "e2el": (requests["e2e"][completed] * 1000, None),
    }
    for metric, (values, weights) in ms.items():
        result.update(_stats(metric, values, weights))
    return {**setup, **result}


_VLLM_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}


def engine_meta(results: Results) -> dict[str, Any] | None:
    """The run's engine as vLLM's arguments name it (the fields of `EngineArgs`,
    vllm/engine/arg_utils.py, as a run folder's meta.json records them), for
    `key.INFERSIM_META`; None for a run no single vLLM engine describes (pools, several
    replicas, static or dynamic batching), whose replay then needs --vllm-version and
    --set as a client file does."""
    scenario = results.scenario
    par, serving, engine = scenario.parallelism, scenario.serving, scenario.engine
    if (
        scenario.pools
        or par.replicas != 1
        or serving.policy not in ("chunked_prefill", "continuous")
    ):
        return None
    resolved = (results.context.provenance or {}).get("scenario", {})
    model, served = resolved.get("model", {}), resolved.get("serving", {})
    weights = model.get("weight_dtype") or scenario.model.weight_dtype
    activation = scenario.model.activation_dtype
    kwargs = {
        "tensor_parallel_size": par.tp,
        "pipeline_parallel_size": par.pp,
        "data_parallel_size": par.dp,
        "enable_expert_parallel": bool(par.enable_expert_parallel),
        "disable_custom_all_reduce": bool(par.disable_custom_all_reduce),
        "enable_chunked_prefill": serving.policy == "chunked_prefill",
        # the values the run used: vLLM's defaults where the scenario left them unset
        "max_num_seqs": served.get("max_num_seqs") or serving.max_num_seqs,
        "max_num_batched_tokens": (
            served.get("max_num_batched_tokens") or serving.max_num_batched_tokens
        ),
        "block_size": serving.block_size,
        "gpu_memory_utilization": serving.gpu_memory_utilization,
        "enable_prefix_caching": serving.prefix_caching,
        "num_gpu_blocks": serving.num_gpu_blocks,
        "max_model_len": serving.max_model_len,
        "enforce_eager": not engine.cuda_graphs,
        "async_scheduling": engine.async_scheduling,
        "dtype": _VLLM_DTYPE[activation],
        "kv_cache_dtype": str(scenario.model.kv_dtype),
        # vLLM's --quantization: none for a model served in its activation type
        "quantization": None if weights in (None, activation) else str(weights),
    }
    meta: dict[str, Any] = {
        "engine_kwargs": {k: v for k, v in kwargs.items() if v is not None},
        # whose defaults the replay gives the settings left out (max_model_len, ...)
        "vllm_version": ".".join(map(str, EMULATED_VLLM_VERSION)),
    }
    if scenario.frontend.modelled:  # the client's latencies went through it: replay with it
        meta["frontend"] = scenario.frontend.model_dump()
    with contextlib.suppress(InfersimError):  # a GPU from a YAML file: replay asks for --gpu
        meta["hardware"] = {"device_name": load_gpu(results.context.replicas[0].gpu).display_name}
    return meta


def request_itls(
    requests: Table | pd.DataFrame, steps: Table | pd.DataFrame | None
) -> tuple[list[np.ndarray], int]:
    """Each request's inter-token gaps (s), and how many were estimated.

    A running request decodes one token in every decode step of its replica, so its
    tokens after the first are the ends of the decode steps between its first and last
    token: read off the step table whenever their count matches its tokens. A request
    that skipped steps (preempted, or left out of a step by the token budget) or a run
    without a step table gets its decode time spread evenly over its gaps (its TPOT);
    the summary ITL statistics never use these, only the exact gap samples.
    """
    ends = _decode_step_ends(None if steps is None else as_table(steps))
    requests = as_table(requests)
    first = requests["first_token"]
    last = requests["last_token"]
    tokens = requests["generated"]
    replica = requests["replica"]
    completed = requests["outcome"].equals("completed")
    out: list[np.ndarray] = []
    estimated = 0
    for i in range(len(requests)):
        gaps = int(tokens[i]) - 1
        if not completed[i] or gaps < 1:
            out.append(np.empty(0))
            continue
        own = ends.get(int(replica[i]))
        if own is not None:
            lo = np.searchsorted(own, _after(first[i]), side="right")
            hi = np.searchsorted(own, _after(last[i]), side="right")
            if hi - lo == gaps and math.isclose(own[hi - 1], last[i], rel_tol=1e-12):
                out.append(np.diff(np.concatenate(([first[i]], own[lo:hi]))))
                continue
        estimated += 1
        out.append(np.full(gaps, (last[i] - first[i]) / gaps))
    return out, estimated


def _decode_step_ends(steps: Table | None) -> dict[int, np.ndarray]:
    """Sorted end times of each replica's steps that decoded."""
    if steps is None:
        return {}
    decoding = steps["decode_tokens"] > 0
    ends = steps["start"][decoding] + steps["duration"][decoding]
    replicas = steps["replica"][decoding]
    return {int(r): np.sort(ends[replicas == r]) for r in np.unique(replicas)}


def _after(t: float) -> float:
    """Just past t, so a step ending at t (to the last bit or so) counts as ending by t."""
    return t + 1e-12 * max(abs(t), 1.0)


INFINITE = "inf"
"""An infinite request_rate or burstiness (evenly spaced sends), as vLLM writes an infinite
request_rate: valid JSON, where a float infinity would not be."""


def _traffic(scenario, requests: Table) -> dict[str, Any]:
    """request_rate, burstiness, max_concurrency as vLLM's client settings would be."""
    arrivals = scenario.workload.arrivals
    rate: Any = INFINITE
    burstiness = 1.0
    concurrency = None
    if arrivals.kind in ("poisson", "gamma", "constant"):
        rate = arrivals.rate_per_s
        burstiness = {"poisson": 1.0, "constant": INFINITE}.get(
            arrivals.kind, 1.0 / getattr(arrivals, "cv", 1.0) ** 2
        )
    elif arrivals.kind == "closed_loop":
        concurrency = arrivals.users
    elif arrivals.kind == "trace":
        span = float(requests["arrival"].max()) if len(requests) else 0.0
        rate = len(requests) / span if span > 0 else INFINITE  # the trace's mean rate
    return {
        key.REQUEST_RATE: rate,
        key.BURSTINESS: burstiness,
        key.MAX_CONCURRENCY: concurrency,
        # recent vLLMs record each request's send time; a replay then needs no rate
        key.START_TIMES: requests["arrival"].astype(float).tolist(),
    }


def _per(amount: float, duration: float) -> float:
    return float(amount) / duration if duration > 0 else 0.0


def _goodput(
    requests: Table, results: Results, completed: np.ndarray, duration: float
) -> float | None:
    """vLLM's request_goodput: completed requests within every SLO bound, per s; None
    when no SLO is set (as vLLM without --goodput)."""
    slo = results.context.slo
    if slo.ttft_s is None and slo.tpot_s is None and slo.e2e_s is None:
        return None
    good = completed.copy()
    bounds = (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s))
    for column, bound in bounds:
        if bound is not None:  # a one-token output's TPOT counts as 0, as vLLM's
            values = requests[column]
            good &= np.where(np.isnan(values), 0.0, values) <= bound
    return _per(good.sum(), duration)


def _errors(requests: Table, completed: np.ndarray) -> list[str]:
    outcome = requests["outcome"].text()
    reason = requests["reason"].text()
    return [
        "" if done else (f"{kind}: {why}" if why else "in flight when the simulation stopped")
        for done, kind, why in zip(completed, outcome, reason, strict=True)
    ]


def _peaks(requests: Table, completed: np.ndarray, itls: list[np.ndarray]) -> dict[str, Any]:
    """vLLM's peak output tokens per second (tokens counted in 1 s buckets from the first
    successful send) and peak concurrent requests: the most successful requests in flight
    at once, each over [send, send + latency) (an end before a start at the same time)."""
    if not completed.any():
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start = requests["arrival"][completed]
    end = requests["finish"][completed]
    first = requests["first_token"][completed]
    origin = start.min()
    buckets = int(np.ceil(end.max() - origin)) + 1
    done = np.flatnonzero(completed)
    times = np.concatenate(
        [np.concatenate(([f], f + np.cumsum(itls[i]))) for f, i in zip(first, done, strict=True)]
    )
    index = (times - origin).astype(np.int64)
    index = index[(index >= 0) & (index < buckets)]
    tokens = np.bincount(index, minlength=buckets)
    times = np.concatenate((start, end))
    steps = np.concatenate((np.ones(len(start), np.int64), -np.ones(len(end), np.int64)))
    in_flight = np.cumsum(steps[np.lexsort((steps, times))])  # by time, ends first
    return {
        "max_output_tokens_per_s": float(tokens.max()),
        "max_concurrent_requests": int(in_flight.max()),
    }


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def _stats(metric: str, values: np.ndarray, weights: np.ndarray | None) -> dict[str, float]:
    """mean, median, std and percentiles of samples (each `weights` times), 0 when there
    are none, as vLLM's np.mean(x or 0)."""
    w = np.ones_like(values) if weights is None else weights.astype(np.float64)
    keep = np.isfinite(values) & (w > 0)
    values, w = values[keep], w[keep]
    if not len(values):
        return {key: 0.0 for key in _keys(metric)}
    mean = float(np.dot(values, w) / w.sum())
    std = math.sqrt(float(np.dot((values - mean) ** 2, w) / w.sum()))
    median, *tail = weighted_percentile(values, w, np.array([50.0, *PERCENTILES]))
    stats = {
        stat_key("mean", metric): mean,
        stat_key("median", metric): float(median),
        stat_key("std", metric): std,
    }
    stats.update(
        {percentile_key(p, metric): float(v) for p, v in zip(PERCENTILES, tail, strict=True)}
    )
    return stats


def _keys(metric: str) -> list[str]:
    return [stat_key(s, metric) for s in STATS] + [percentile_key(p, metric) for p in PERCENTILES]
