"""Numbers as the terminal tables, notebooks and plan/compare/sweep tables show them: fixed
point with a few significant digits, never scientific notation, '-' for what is missing,
and text wrapped to the 100 columns a terminal is assumed to have."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

WIDTH = 100


def sig(x: float | None, digits: int = 3) -> str:
    """`digits` significant digits in fixed point with thousands separators (1,080 not
    1.08e+03, 0.000897 not 8.97e-04); integers of more digits are shown whole."""
    if x is None or not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def num(x: float | None, spec: str = ",.1f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def pct(x: float | None) -> str:
    return num(None if x is None else 100 * x, ".1f", "%")


def ms(x: float | None) -> str:
    """Seconds as milliseconds: two decimals below 10 ms, one below 1 s, whole above."""
    if x is None:
        return "-"
    value = 1000 * x
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:,.0f}"


def usd(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.2f}" if abs(x) >= 1 else f"${sig(x)}"


def slo_text(slo: Mapping[str, float | None]) -> str:
    parts = [f"{k.removesuffix('_s')} <= {ms(v)} ms" for k, v in slo.items() if v is not None]
    return ", ".join(parts) or "none set"


def fleet_text(run: Mapping[str, Any]) -> str:
    """`16 x h100-sxm in 2 replicas`, `8 x h200-sxm in 1 replica of 8 dp ranks`: a dp rank
    is one of the data-parallel ranks of a replica's engine (vLLM's DP), not a replica."""
    n = run["replicas"]
    ranks = f" of {run['dp_ranks']:,} dp ranks" if run.get("dp_ranks") else ""
    return (
        f"{run['gpus']} x {'/'.join(run['gpu_types'])} in {n:,} replica{'' if n == 1 else 's'}"
        f"{ranks}"
    )


def engine_labels(dp_ranks: Sequence[int | None]) -> list[str]:
    """The engines' names, one per `per_replica` row (its `dp_rank`, None where the replica
    has one engine): `replica 3`, or `rank 5` for a dp rank (`replica 1 rank 5` among
    several replicas, each replica counted from its rank 0)."""
    labels, replica = [], -1
    replicas = sum(not rank for rank in dp_ranks)
    for rank in dp_ranks:
        replica += not rank
        if rank is None:
            labels.append(f"replica {replica}")
        else:
            labels.append(f"rank {rank}" if replicas == 1 else f"replica {replica} rank {rank}")
    return labels


def preemption_text(kv: Mapping[str, Any]) -> str:
    """`51 (51 requests, 41 swapped out)`: the swap count only where some preemptions
    swapped (the others recomputed)."""
    swaps = kv.get("swaps") or 0
    swapped = f", {swaps:,} swapped out" if swaps else ""
    return f"{kv['preemptions']:,} ({kv['requests_preempted']:,} requests{swapped})"


def wrapped(text: str, first: str, rest: str | None = None) -> list[str]:
    """`text` after `first`, wrapped to WIDTH columns, continuation lines indented."""
    indent = " " * len(first) if rest is None else rest
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=indent) or [first]


def front_end_text(front: Mapping[str, Any]) -> str:
    """A summary's `frontend` block (simulator.api_server) in a line: how busy the API
    server processes were, how long tokens and requests waited in them."""
    delay, ingest = front["token_delay_s"], front["ingest_s"]
    return (
        f"{front['kind']} x{front['api_server_count']} per replica: busy "
        f"{pct(front['utilisation'])} (busiest replica {pct(front['utilisation_max'])}, "
        f"offered load {pct(front['load'])})  tokens waited mean {ms(delay['mean'])} ms, p99 "
        f"{ms(delay['p99'])} ms  requests reached the engine after mean "
        f"{ms(ingest['mean'])} ms (latencies are the client's)"
    )


def busy_text(fraction: float | None) -> str:
    """The busy fraction with what it means: the share of the run a step was running,
    whatever its batch size, so near 100% at light load too (decode steps follow each
    other while any request is in flight). Headroom is in MFU, MBU, the KV cache and the
    latencies against the SLO, which is why summaries put those first."""
    return f"busy {pct(fraction)} (time a step ran, at any batch size: not saturation)"


def goodput_rate_text(goodput: Mapping[str, Any]) -> str:
    """Goodput in req/s on the steady basis of the steady throughput and the costs, then
    over the whole run (ramp and drain included); the whole run's alone where the run
    had no steady state."""
    run = f"{sig(goodput['goodput_requests_per_s'])} req/s"
    steady = goodput.get("steady_goodput_requests_per_s")
    return run + " (whole run)" if steady is None else f"{sig(steady)} req/s ({run} whole run)"
