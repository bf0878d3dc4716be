"""Fit a collective link's alpha (latency per step) and beta (bandwidth efficiency).

One link per group of GPUs taking part, from all-reduce rows: NCCL's fixed per-call cost
and its bus bandwidth both change with the number of ranks (2-GPU calls move less, 8-GPU
half all-reduces use in-switch reduction), which one alpha-beta pair cannot follow. The
model prices a call as the fastest of its ways (collectives.ways: ring and tree; over a
PCIe fabric the ring's two protocols), min over ways of steps * alpha + fixed + bytes /
(bandwidth * efficiency), so the fit searches a grid of (alpha, efficiency) against that
same expression and keeps the lowest MAPE.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hardware_models.collectives import ways
from hardware_models.node import LinkSpec

ALPHAS_US = np.geomspace(0.05, 100.0, 121)
EFFICIENCIES = np.linspace(0.02, 1.0, 99)


def _predicted(rows: pd.DataFrame, base: LinkSpec) -> np.ndarray:
    """Seconds of every row (last axis) for every (alpha, efficiency) of the grid: the
    fastest of the ways the model weighs, each at that latency and efficiency."""
    alpha = ALPHAS_US[:, None, None, None] * 1e-6
    beta = base.bandwidth_gbps * 1e9 * EFFICIENCIES[None, :, None, None]
    shapes = zip(rows["op_class"], rows["nbytes"], rows["num_gpus"], strict=True)
    per_row = np.array([ways(op, nb, int(p), base) for op, nb, p in shapes])  # row, way, field
    steps, fixed, wire = per_row[..., 0], per_row[..., 1], per_row[..., 2]
    return np.min(steps * alpha + fixed + wire / beta, axis=-1)


def fit_link(rows: pd.DataFrame, base: LinkSpec) -> LinkSpec:
    """`base` with latency_us and efficiency fitted to `rows` (one op, one GPU count)."""
    measured = rows["measured_s"].to_numpy(dtype=float)
    predicted = _predicted(rows, base)
    score = np.mean(np.abs(predicted - measured) / measured, axis=2)
    i, j = np.unravel_index(np.argmin(score), score.shape)
    return base.model_copy(
        update={
            "latency_us": round(float(ALPHAS_US[i]), 3),
            "efficiency": round(float(EFFICIENCIES[j]), 3),
        }
    )


def fit_links(table: pd.DataFrame, base: LinkSpec, op: str = "all_reduce") -> dict[int, LinkSpec]:
    """One fitted link per GPU count among the `op` rows of `table`."""
    rows = table[(table["op_class"] == op) & (table["num_gpus"] > 1)]
    return {int(gpus): fit_link(group, base) for gpus, group in rows.groupby("num_gpus", sort=True)}
