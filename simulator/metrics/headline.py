"""The headline figures as table columns: one name and one unit per figure, whichever
table shows it (compare_table, the sweep table, the plan table), so tables join and plot
without a silent x100 between a percentage and a fraction.

The names are the summary's own (docs/METRICS.md), snake_case, with the unit of the
summary except latencies, in ms and named `_ms`; shares are fractions (0-1). A figure
over the whole run D has no prefix (`requests_per_s`) or `run_` where the steady one
took the plain name first (`run_goodput_requests_per_s`); the steady-state figures start
`steady_`. `LABELS` gives each the short header with its unit that terminals print
(`TTFT p99 ms`, `KV max %`, shares x 100), which compare tables used as column names
before; `labelled` turns a table into that view and `canonical` back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

LATENCIES = ("ttft", "tpot", "itl", "e2e")
# (column, path into the summary, scale): latencies in ms, everything else as summarised.
HEADLINE: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("completed", ("counts", "completed"), 1),
    ("failed", ("counts", "failed"), 1),
    ("rejected", ("counts", "rejected"), 1),
    ("retried", ("counts", "retried"), 1),
    ("requests_per_s", ("throughput", "requests_per_s"), 1),  # over the whole run
    ("output_tokens_per_s", ("throughput", "output_tokens_per_s"), 1),
    # Steady state (10%-90% of completions): the whole run's means also count the drain
    # after the last arrival, as long on a fast fleet as on a slow one.
    ("steady_requests_per_s", ("throughput", "steady_requests_per_s"), 1),
    ("steady_output_tokens_per_s", ("throughput", "steady_output_tokens_per_s"), 1),
    *(
        (f"{name}_{p}_ms", ("latency", name, p), 1000)
        for name in LATENCIES
        for p in ("p50", "p90", "p99")
    ),
    ("steady_goodput_requests_per_s", ("goodput", "steady_goodput_requests_per_s"), 1),
    ("run_goodput_requests_per_s", ("goodput", "goodput_requests_per_s"), 1),  # over D
    ("goodput_fraction", ("goodput", "fraction"), 1),  # of completed requests
    ("goodput_fraction_of_arrived", ("goodput", "fraction_of_arrived"), 1),
    ("preemptions", ("kv", "preemptions"), 1),
    ("kv_max_utilisation", ("kv", "max_utilisation"), 1),
    ("prefix_hit_rate", ("prefix_cache", "hit_rate"), 1),
    ("mfu", ("utilisation", "mfu"), 1),
    ("mbu", ("utilisation", "mbu"), 1),
    ("usd_per_hour", ("cost", "usd_per_hour"), 1),
    ("usd_per_million_output_tokens", ("cost", "usd_per_million_output_tokens"), 1),
    ("joules_per_output_token", ("energy", "joules_per_output_token"), 1),
)
COUNTS = ("completed", "failed", "rejected", "retried", "preemptions")
PER_USD = "output_tokens_per_s_per_usd_hour"

# column -> (printed header, scale from the column to the header's unit)
LABELS: dict[str, tuple[str, float]] = {
    "requests_per_s": ("req/s (whole run)", 1),
    "output_tokens_per_s": ("out tok/s (whole run)", 1),
    "steady_requests_per_s": ("steady req/s", 1),
    "steady_output_tokens_per_s": ("steady out tok/s", 1),
    **{f"{n}_{p}_ms": (f"{n.upper()} {p} ms", 1) for n in LATENCIES for p in ("p50", "p90", "p99")},
    "steady_goodput_requests_per_s": ("steady goodput req/s", 1),
    "run_goodput_requests_per_s": ("goodput req/s (whole run)", 1),
    "goodput_fraction": ("SLO met %", 100),
    "goodput_fraction_of_arrived": ("SLO met % arrived", 100),
    "kv_max_utilisation": ("KV max %", 100),
    "prefix_hit_rate": ("prefix hit %", 100),
    "mfu": ("MFU %", 100),
    "mbu": ("MBU %", 100),
    "usd_per_hour": ("$/h", 1),
    "usd_per_million_output_tokens": ("$/1M out tok", 1),
    "joules_per_output_token": ("GPU J/out tok", 1),
    PER_USD: ("steady tok/s per $/h", 1),
    "max_num_seqs": ("seqs", 1),  # the batch limits a sweep point or plan candidate ran
    "max_num_batched_tokens": ("tok/step", 1),
    "cost_basis": ("basis", 1),  # of $/1M and J/out tok: whole_run without a steady state
    "overload_verdict": ("overload", 1),
}
_BY_LABEL = {label: (column, scale) for column, (label, scale) in LABELS.items()}


def get(summary: Mapping[str, Any] | None, path: tuple[str, ...]) -> Any:
    """The value at `path` in a summary, None where any step is missing or None."""
    node: Any = summary
    for key in path:
        if not isinstance(node, Mapping) or node.get(key) is None:
            return None
        node = node[key]
    return node


def headline_row(summary: Mapping[str, Any] | None, columns: tuple[str, ...]) -> dict[str, Any]:
    """`columns` (names in HEADLINE) of one summary, scaled; None where it has no value."""
    wanted = set(columns)
    values = {
        column: None if (v := get(summary, path)) is None else v * scale
        for column, path, scale in HEADLINE
        if column in wanted
    }
    return {column: values[column] for column in columns}


def labelled(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with the printed headers (`LABELS`): shares as percentages; columns with
    no label keep their names."""
    out = table.copy()
    for column, (_, scale) in LABELS.items():
        if column in out and scale != 1:
            out[column] = out[column].astype(float) * scale
    return out.rename(columns={c: label for c, (label, _) in LABELS.items()})


def readable(table: pd.DataFrame, column: str) -> pd.Series | None:
    """`column` of `table`, read under its other name where the table has only that: a
    printed header (`TTFT p99 ms`, `KV max %`) from the column it labels, or a column
    from its header, converted to the asked name's unit; None where neither is there."""
    if column in table:
        return table[column]
    if column in _BY_LABEL:
        source, scale = _BY_LABEL[column]
        if source in table:
            return table[source] * scale if scale != 1 else table[source]
    elif column in LABELS:
        label, scale = LABELS[column]
        if label in table:
            return table[label] / scale if scale != 1 else table[label]
    return None


def other_name(column: str) -> str | None:
    """The printed header of a column, or the column a header labels."""
    if column in LABELS:
        return LABELS[column][0]
    return _BY_LABEL[column][0] if column in _BY_LABEL else None
