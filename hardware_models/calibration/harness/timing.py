"""Median time of a callable: CUDA events on a GPU, perf_counter on a CPU.

Warm-up calls first (allocator, cuBLAS heuristics, caches), then each repeat is timed on
its own and the median is kept, which shrugs off the odd preempted or throttled run.

On a GPU an operator's time is its kernels' time: a short sleep kernel keeps the stream
busy while the host enqueues the start event, the call and the end event, so the 5-30 us
the host takes to launch an op (which the simulator prices apart, as launch overhead) is
not inside the events. A whole layer is timed with its launches (`hide_launch=False`):
its eager launches are part of what the layer model predicts.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from types import ModuleType

# GPU cycles of the sleep kernel queued ahead of a timed call: ~50-100 us at 1-2 GHz,
# longer than the host takes to launch one op.
LAUNCH_COVER_CYCLES = 100_000


def median_seconds(
    torch: ModuleType,
    device: str,
    fn: Callable[[], object],
    warmup: int,
    repeats: int,
    hide_launch: bool = True,
) -> float:
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        sleep = getattr(torch.cuda, "_sleep", None) if hide_launch else None
        times = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if sleep is not None:
                sleep(LAUNCH_COVER_CYCLES)
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
