"""Metrics of a run: summary numbers, time series and result files.

Plots live in `simulator.metrics.plots`, imported only when drawn: matplotlib costs a
third of a second to import, which a run without plots should not pay.
"""

from simulator.metrics.context import SLO, ReplicaInfo, RunContext
from simulator.metrics.summary import latency_stats, summarize, weighted_percentile
from simulator.metrics.terminal import summary_table
from simulator.metrics.timeseries import nice_bin_width, timeseries
from simulator.metrics.writer import summary_json, write_run

__all__ = [
    "SLO",
    "ReplicaInfo",
    "RunContext",
    "latency_stats",
    "nice_bin_width",
    "summarize",
    "summary_json",
    "summary_table",
    "timeseries",
    "weighted_percentile",
    "write_run",
]
