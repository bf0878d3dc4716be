"""Draw a chip's roofline (memory slope, one compute ceiling per dtype) with operators on it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype
from hardware_models.op_cost import OpCost
from hardware_models.plot_labels import LEADER, spread_labels


def plot_roofline(gpu: AcceleratorSpec, costs: Sequence[OpCost] = (), ax=None):
    """Return a matplotlib Figure: attainable FLOP/s against arithmetic intensity; with
    several operators each label starts with its number in `costs` (from 1, the CSV's
    data rows), as the `roofline` table's index does."""
    from matplotlib.figure import Figure

    if ax is None:
        fig = Figure(figsize=(7, 4.5))
        ax = fig.subplots()
    else:
        fig = ax.figure
    intensity = np.logspace(-2, 5, 400)
    bandwidth = gpu.memory_bandwidth
    ceilings: dict[float, list[str]] = {}  # dtypes sharing a peak share a line
    for dtype in [Dtype.FP32, *gpu.tensor_flops_per_core_per_clock]:
        name = "fp32 (CUDA cores)" if dtype == Dtype.FP32 else dtype.value
        ceilings.setdefault(gpu.peak_flops(dtype), []).append(name)
    for peak, names in sorted(ceilings.items()):
        label = f"{'/'.join(names)}: {peak / 1e12:.0f} TFLOP/s"
        ax.loglog(intensity, np.minimum(peak, intensity * bandwidth), lw=1.2, label=label)
    labels = []
    for number, cost in enumerate(costs, start=1):
        if cost.flops <= 0 or cost.dram_bytes <= 0:
            continue
        point = (cost.arithmetic_intensity, cost.achieved_flops)
        ax.scatter(*point, s=28, zorder=3)
        text = f"{number} {cost.name}" if len(costs) > 1 else cost.name
        labels.append(ax.annotate(text, point, xytext=(4, 3), textcoords="offset points",
                                  fontsize=7, arrowprops=LEADER))  # fmt: skip
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(f"{gpu.display_name}: roofline ({gpu.memory.bandwidth_gbps:.0f} GB/s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    # Points in order of intensity, so a label moves away from its right-hand neighbours.
    spread_labels(fig, sorted(labels, key=lambda t: (t.xy[0], -t.xy[1])))
    return fig
