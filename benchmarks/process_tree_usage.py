"""Wall time, CPU seconds and peak memory of a command and every process it starts.

`/usr/bin/time` reports the largest single process's peak RSS and only the CPU of children
that were waited for; a run split over worker processes (`infersim run --workers`) needs
both summed over the process tree. Samples the tree every 0.1 s with psutil (a dependency
of Dask's `distributed`, installed with the test extras), so a process that lives less
than that is missed, and CPU seconds are each process's last sample.

    python benchmarks/process_tree_usage.py infersim run benchmarks/perf_1m_cluster.yaml \
        -o /tmp/p1m --overwrite --quiet
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil


def _label(process: psutil.Process, root: int) -> str:
    if process.pid == root:
        return "parent"
    return f"{' '.join(process.cmdline()[-2:])[-40:]}#{process.pid}"


def main(command: list[str]) -> int:
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    root = psutil.Process(child.pid)
    cpu: dict[str, float] = {}
    peaks: dict[str, int] = {}  # each process's own peak RSS
    at_peak: dict[str, int] = {}  # each process's RSS when their sum peaked
    peak_parent = peak_sum = widest = 0
    while child.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        rss, labels = [], []
        for process in tree:
            try:
                with process.oneshot():
                    label, memory = _label(process, child.pid), process.memory_info().rss
                    times = process.cpu_times()
            except psutil.Error:
                continue
            rss.append(memory)
            labels.append(label)
            cpu[label] = times.user + times.system
            peaks[label] = max(peaks.get(label, 0), memory)
            if process is root:
                peak_parent = max(peak_parent, memory)
        if sum(rss) > peak_sum:
            peak_sum, at_peak = sum(rss), dict(zip(labels, rss, strict=True))
        widest = max(widest, len(rss))
        time.sleep(0.1)
    wall = time.perf_counter() - started
    print("CPU s by process:", {name: round(seconds, 1) for name, seconds in cpu.items()})
    print("peak RSS MB by process:", {name: round(b / 2**20) for name, b in peaks.items()})
    at = {name: round(b / 2**20) for name, b in at_peak.items()}
    print("RSS MB by process at the summed peak:", at)
    print(
        f"rc {child.returncode}  wall {wall:.1f} s  CPU over processes {sum(cpu.values()):.1f} s  "
        f"parent peak RSS {peak_parent / 2**20:.0f} MB  peak RSS summed over processes "
        f"{peak_sum / 2**20:.0f} MB ({widest} processes at most)"
    )
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
