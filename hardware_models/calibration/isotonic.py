"""Monotone efficiency curves from noisy per-row estimates.

Each measured row implies an efficiency (the value that makes the model match it). Rows
are binned by log size, each bin gives its median, and pool-adjacent-violators makes the
medians non-decreasing: a bigger operator never runs at a smaller fraction of peak, which
keeps interpolation between bins and extrapolation (clamping) well behaved.
"""

from __future__ import annotations

import numpy as np

from hardware_models.efficiency import EfficiencyCurve

MIN_EFFICIENCY = 1e-3


def isotonic_increasing(values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted least-squares non-decreasing fit (pool-adjacent-violators)."""
    y = np.asarray(values, dtype=float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    if y.shape != w.shape:
        raise ValueError("values and weights must have the same length")
    means: list[float] = []
    totals: list[float] = []
    counts: list[int] = []
    for yi, wi in zip(y, w, strict=True):
        means.append(float(yi))
        totals.append(float(wi))
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            wsum = totals[-2] + totals[-1]
            merged = (means[-2] * totals[-2] + means[-1] * totals[-1]) / wsum
            count = counts[-2] + counts[-1]
            del means[-1], totals[-1], counts[-1]
            means[-1], totals[-1], counts[-1] = merged, wsum, count
    return np.repeat(means, counts)


def binned_curve(
    sizes: np.ndarray,
    efficiencies: np.ndarray,
    bins_per_octave: float = 1.0,
    min_rows: int = 3,
) -> EfficiencyCurve | None:
    """A monotone curve through the per-bin medians of `efficiencies` against log2 size;
    None when no bin has `min_rows` finite estimates. Values are clamped to (0, 1]."""
    s = np.asarray(sizes, dtype=float)
    e = np.asarray(efficiencies, dtype=float)
    keep = np.isfinite(s) & np.isfinite(e) & (s > 0) & (e > 0)
    s, e = s[keep], e[keep]
    if len(s) == 0:
        return None
    log_s = np.log2(s)
    bins = np.floor(log_s * bins_per_octave).astype(np.int64)
    counts, (centres, medians) = _bin_medians(bins, log_s, e)
    full = counts >= min_rows
    centres, medians, counts = centres[full], medians[full], counts[full]
    if not len(centres):
        return None
    fitted = np.clip(isotonic_increasing(medians, counts.astype(int)), MIN_EFFICIENCY, 1)
    sizes_out = 2.0**centres
    # Neighbouring pooled bins carry equal values: keep the ends of each run only.
    keep_idx = [
        i
        for i in range(len(fitted))
        if i in (0, len(fitted) - 1) or not (fitted[i - 1] == fitted[i] == fitted[i + 1])
    ]
    return EfficiencyCurve(
        sizes=[float(x) for x in sizes_out[keep_idx]],
        values=[float(round(v, 5)) for v in fitted[keep_idx]],
    )


def _bin_medians(bins: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(rows per bin, each column's median per bin), bins in increasing order: what
    np.median gives bin by bin (the middle value, or the mean of the middle two), for
    every bin in one sort (a fit bins its rows for every candidate it tries)."""
    _, counts = np.unique(bins, return_counts=True)
    middle = np.cumsum(counts) - counts + counts // 2
    even = counts % 2 == 0
    medians = []
    for column in columns:
        ordered = column[np.lexsort((column, bins))]
        upper = ordered[middle]
        lower = ordered[np.where(even, middle - 1, middle)]
        medians.append(np.where(even, (lower + upper) / 2.0, upper))
    return counts, medians
