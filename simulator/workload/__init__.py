"""Workload: which requests arrive, when, and how long their prompts and outputs are."""

from simulator.workload.config import (
    ClosedLoopArrivals,
    ConstantArrivals,
    FixedLength,
    GammaArrivals,
    LognormalLength,
    NormalLength,
    PoissonArrivals,
    PriorityClass,
    SessionConfig,
    TraceArrivals,
    TraceLength,
    UniformLength,
    WorkloadConfig,
)
from simulator.workload.generate import (
    ClosedLoopSampler,
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
    "PoissonArrivals",
    "PriorityClass",
    "RequestBatch",
    "Session",
    "SessionConfig",
    "SessionSampler",
    "Trace",
    "TraceArrivals",
    "TraceLength",
    "UniformLength",
    "WorkloadConfig",
    "generate_requests",
    "read_trace",
]
