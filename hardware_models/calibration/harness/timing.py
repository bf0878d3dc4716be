"""Median time of a callable: CUDA events on a GPU, perf_counter on a CPU.

Warm-up calls first (allocator, cuBLAS heuristics, caches), then each repeat is timed on
its own and the median is kept, which shrugs off the odd preempted or throttled run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from types import ModuleType


def median_seconds(
    torch: ModuleType, device: str, fn: Callable[[], object], warmup: int, repeats: int
) -> float:
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)
