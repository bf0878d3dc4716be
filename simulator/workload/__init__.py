"""Workload: which requests arrive, when, and how long their prompts and outputs are."""

from simulator.workload.config import (
    ClosedLoopArrivals,
    ConstantArrivals,
    FixedLength,
    GammaArrivals,
    LognormalLength,
    NormalLength,
    OfflineArrivals,
    PoissonArrivals,
    PriorityClass,
    SessionConfig,
    TraceArrivals,
    TraceColumns,
    TraceLength,
    UniformLength,
    WorkloadConfig,
)
from simulator.workload.generate import (
    ClosedLoopSampler,
    PromptHashes,
    RequestBatch,
    Session,
    SessionSampler,
    generate_requests,
)
from simulator.workload.traces import Trace, read_trace

__all__ = [
    "ClosedLoopArrivals",
    "ClosedLoopSampler",
    "ConstantArrivals",
    "FixedLength",
    "GammaArrivals",
    "LognormalLength",
    "NormalLength",
    "OfflineArrivals",
    "PoissonArrivals",
    "PriorityClass",
    "PromptHashes",
    "RequestBatch",
    "Session",
    "SessionConfig",
    "SessionSampler",
    "Trace",
    "TraceArrivals",
    "TraceColumns",
    "TraceLength",
    "UniformLength",
    "WorkloadConfig",
    "generate_requests",
    "read_trace",
]
