"""Fit a collective link's alpha (latency per step) and beta (bandwidth efficiency).

One link per group of GPUs taking part, from all-reduce rows: NCCL's fixed per-call cost
and its bus bandwidth both change with the number of ranks (2-GPU calls move less, 8-GPU
half all-reduces use in-switch reduction), which one alpha-beta pair cannot follow. The
model prices a call as the faster of ring and tree, min over algorithms of
steps * alpha + bytes sent / (bandwidth * efficiency), so the fit searches a grid of
(alpha, efficiency) against that same expression and keeps the lowest MAPE. Over a PCIe
fabric the bytes are those sent at the GPU's full link rate (the share the fabric
leaves it divided out) and the fabric's fixed call latency is added as it is priced.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hardware_models.collectives import collective_cost
from hardware_models.node import LinkSpec

ALPHAS_US = np.geomspace(0.05, 100.0, 121)
EFFICIENCIES = np.linspace(0.02, 1.0, 99)
# Pricing over this link reads off (latency steps, bytes sent) of an algorithm.
_UNIT = LinkSpec(kind="nvlink", bandwidth_gbps=1.0, latency_us=1.0, efficiency=1.0)


def _terms(
    op: str, nbytes: float, gpus: int, algorithm: str, base: LinkSpec
) -> tuple[float, float, float]:
    """(latency steps, bytes at the full link rate, fixed seconds) of one algorithm."""
    if base.fabric is None:
        cost = collective_cost(op, nbytes, gpus, _UNIT, algorithm)
        return cost.overhead_seconds * 1e6, cost.memory_seconds * 1e9, 0.0
    fixed = base.fabric.call_latency_us * 1e-6
    unit = base.model_copy(update={"latency_us": 1.0, "efficiency": 1.0})
    cost = collective_cost(op, nbytes, gpus, unit, algorithm)
    sent = cost.memory_seconds * base.bandwidth_gbps * 1e9
    return (cost.overhead_seconds - fixed) * 1e6, sent, fixed


def fit_link(rows: pd.DataFrame, base: LinkSpec) -> LinkSpec:
    """`base` with latency_us and efficiency fitted to `rows` (one op, one GPU count)."""
    measured = rows["measured_s"].to_numpy(dtype=float)
    shapes = list(zip(rows["op_class"], rows["nbytes"], rows["num_gpus"], strict=True))
    algos = [
        np.array([_terms(op, nb, int(p), algorithm, base) for op, nb, p in shapes])
        for algorithm in ("ring", "tree")
    ]
    alpha = ALPHAS_US[:, None, None] * 1e-6
    beta = base.bandwidth_gbps * 1e9 * EFFICIENCIES[None, :, None]
    predicted = np.minimum(*(terms[:, 0] * alpha + terms[:, 1] / beta for terms in algos))
    predicted = predicted + algos[0][:, 2]
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
