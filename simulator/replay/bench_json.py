"""Read the JSON of `vllm bench serve --save-result --save-detailed`: a client's view of a
run (per request: lengths, TTFT, every inter-token gap, latency). Arrivals are the
recorded send times where the file has them; otherwise they are drawn as the client drew
them: gamma inter-arrival gaps at the recorded rate and burstiness (Poisson at
burstiness 1), seeded, and stretched so the last lands at n / rate. A file infersim wrote
also holds the simulated engine's settings (`infersim_meta`), which the replay reads as a
run folder's meta.json."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hardware_models.errors import InfersimError
from hardware_models.yaml_io import load_json_object
from simulator.formats import vllm_bench_keys as key
from simulator.formats.vllm_bench import ESTIMATED_ITLS_KEY
from simulator.formats.vllm_bench_requests import (
    BenchRequests,
    bench_list,
    bench_number,
    bench_requests,
)
from simulator.replay.measured import MeasuredRun

BENCH_DEFAULT_SEED = 0  # `vllm bench serve --seed` default


def vllm_client_arrivals(count: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times as vLLM's client spaces them (`get_request`): each gap drawn from a
    gamma of shape `burstiness` and mean 1 / rate from NumPy's seeded global generator,
    summed from the first gap on, then scaled so the last is at count / rate. The client
    seeds that generator before sampling its dataset, which may draw from it first, so
    these equal the run's own times only where the dataset drew nothing."""
    if math.isinf(burstiness):  # no randomness left: evenly spaced
        return np.arange(1, count + 1) / rate
    gaps = np.random.RandomState(seed).gamma(burstiness, 1.0 / (rate * burstiness), count)
    times = np.cumsum(gaps)
    return times * (count / rate) / times[-1]


def _arrivals(data: dict[str, Any], requests: BenchRequests, path: Path) -> tuple[np.ndarray, str]:
    count, starts = len(requests), requests.start_times
    if starts is not None:
        return starts - starts.min(), "arrivals: the client's recorded send times (start_times)"
    if data.get(key.RAMP_UP_STRATEGY):
        raise InfersimError(
            f"{path}: no {key.START_TIMES!r} and a ramp-up ({data[key.RAMP_UP_STRATEGY]}): "
            "infersim cannot place these arrivals; save the run with a vLLM recent enough to "
            "record start_times"
        )
    if data.get(key.MAX_CONCURRENCY) is not None:
        raise InfersimError(
            f"{path}: no {key.START_TIMES!r} and the client capped concurrency at "
            f"{data[key.MAX_CONCURRENCY]}: when each request was sent depends on the server, "
            "so it cannot be replayed; save the run with a vLLM that records start_times"
        )
    rate = data.get(key.REQUEST_RATE)
    if rate in ("inf", float("inf")):
        return np.zeros(count), "arrivals: all at once (request_rate inf, no start_times)"
    rate = bench_number(rate, key.REQUEST_RATE, path)
    burstiness = data.get(key.BURSTINESS, 1.0)
    if burstiness in ("inf", float("inf")):  # as infersim writes a constant rate
        burstiness = math.inf
    else:
        burstiness = bench_number(burstiness, key.BURSTINESS, path)
    if rate <= 0 or burstiness <= 0:
        raise InfersimError(f"{path}: request_rate and burstiness must be > 0")
    seed = data.get(key.SEED)
    seed_note = f"seed {seed}"
    if seed is None:
        seed, seed_note = BENCH_DEFAULT_SEED, f"seed {BENCH_DEFAULT_SEED} (bench's default; "
        seed_note += "the file records none)"
    elif isinstance(seed, str) and seed.isdigit():
        seed = int(seed)  # --metadata values are strings
    elif not isinstance(seed, int) or isinstance(seed, bool):
        raise InfersimError(f"{path}: seed {seed!r} is not a whole number")
    process = {1.0: "Poisson", math.inf: "evenly spaced (burstiness inf)"}.get(
        burstiness, f"gamma (burstiness {burstiness:g})"
    )
    note = (
        f"arrivals: the file has no start_times; drawn {process} at the recorded "
        f"{rate:g} requests/s with {seed_note}, as vLLM's client draws them: the same "
        "process, not necessarily the same times"
    )
    return vllm_client_arrivals(count, rate, burstiness, int(seed)), note


def read_bench_json(path: Path) -> MeasuredRun:
    """A `vllm bench serve --save-result --save-detailed` file. Failed requests (a
    non-empty entry in `errors`) are left out of both sides and counted in the notes."""
    data = load_json_object(path)
    missing = [name for name in key.DETAILED if name not in data]
    if missing:
        raise InfersimError(
            f"{path}: no {', '.join(map(repr, missing))}: not a vLLM bench serve result saved "
            "with --save-result --save-detailed"
        )
    sent = bench_requests(data, path)
    count = len(sent)
    ttfts = bench_list(data, key.TTFTS, path, count)
    itls = bench_list(data, key.ITLS, path, count)
    latencies = bench_list(data, key.LATENCIES, path, count) if key.LATENCIES in data else None
    arrivals, arrival_note = _arrivals(data, sent, path)
    rows, gaps = [], []
    for i in np.flatnonzero(~sent.failed):
        where = f"request {i}"
        prompt, output = int(sent.prompt[i]), int(sent.output[i])
        ttft = bench_number(ttfts[i], f"{where}: ttft", path)
        if not isinstance(itls[i], list):
            raise InfersimError(f"{path}: {where}: itls entry must be a list")
        request_gaps = [bench_number(g, f"{where}: itl", path) for g in itls[i]]
        gaps += request_gaps
        if latencies is not None:
            e2e = bench_number(latencies[i], f"{where}: latency", path)
        else:
            e2e = ttft + sum(request_gaps)
        tpot = (e2e - ttft) / (output - 1) if output > 1 else math.nan
        rows.append((arrivals[i], prompt, output, ttft, tpot, e2e))
    if not rows:
        raise InfersimError(f"{path}: every request failed (see 'errors')")
    requests = pd.DataFrame(rows, columns=["arrival", "prompt", "output", "ttft", "tpot", "e2e"])
    requests["arrival"] -= requests["arrival"].min()
    simulated = data.get(key.BACKEND) == key.INFERSIM_BACKEND
    meta = data.get(key.INFERSIM_META) or {}
    if not isinstance(meta, dict):
        raise InfersimError(f"{path}: {key.INFERSIM_META!r} must be an object, got {meta!r}")
    if not simulated:
        seen = (
            "latencies as the client measured them, through vLLM's API server (HTTP, "
            "tokenisation, streaming): replayed with the engine alone unless --set "
            "frontend.kind=vllm_api_server models the API server"
        )
    elif meta.get("frontend"):
        seen = (
            "latencies as infersim simulated them (written by `infersim run --bench-json`) "
            "through its model of vLLM's API server, replayed through it too"
        )
    else:
        seen = (
            "latencies as infersim simulated them (written by `infersim run --bench-json`): "
            "the engine alone, no HTTP, tokenisation or streaming, on both sides"
        )
    notes = [
        arrival_note,
        seen,
        "prefix reuse: the file records lengths, not prompts, so the replayed prompts share "
        "no prefix; any prefix-cache hits the server had are not rebuilt",
    ]
    if len(rows) < count:
        notes.append(f"{count - len(rows)} failed requests (non-empty 'errors') left out")
    estimated = data.get(ESTIMATED_ITLS_KEY) or 0
    if estimated:
        notes.append(
            f"ITL: {estimated:,} of the file's requests have their gaps spread evenly over "
            "their decode time, as infersim writes a request it has no token times for (a "
            "front-end run, a request that skipped steps): the ITL percentiles compare "
            "those with the replay's exact gaps, its mean and TPOT are exact"
        )
    if meta:
        notes.append(
            f"engine settings: the simulated run's own ({key.INFERSIM_META}, written by "
            "`infersim run --bench-json`)"
        )
    version = meta.get("vllm_version")
    if version is not None and not isinstance(version, str):
        raise InfersimError(
            f"{path}: {key.INFERSIM_META}.vllm_version must be a version text, got {version!r}"
        )
    itl = pd.DataFrame({"seconds": np.asarray(gaps, np.float64), "weight": 1.0})
    return MeasuredRun(
        source=path,
        files=(path,),
        kind="infersim-simulated vLLM bench serve JSON" if simulated else "vLLM bench serve JSON",
        requests=requests.sort_values("arrival", kind="stable", ignore_index=True),
        model=data.get(key.MODEL_ID),
        vllm_version=version,
        meta=meta,
        itl=itl,
        itl_mean=float(np.mean(gaps)) if gaps else None,
        notes=tuple(notes),
    )
