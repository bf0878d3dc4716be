"""Metrics of a run: summary numbers, time series, plots and result files."""

from simulator.metrics.context import SLO, ReplicaInfo, RunContext
from simulator.metrics.plots import kv_and_batch, latency_cdfs, save_run_plots, throughput_and_queue
from simulator.metrics.summary import latency_stats, summarize, summary_table, weighted_percentile
from simulator.metrics.timeseries import nice_bin_width, timeseries
from simulator.metrics.writer import summary_json, write_run

__all__ = [
    "SLO",
    "ReplicaInfo",
    "RunContext",
    "kv_and_batch",
    "latency_cdfs",
    "latency_stats",
    "nice_bin_width",
    "save_run_plots",
    "summarize",
    "summary_json",
    "summary_table",
    "throughput_and_queue",
    "timeseries",
    "weighted_percentile",
    "write_run",
]
