"""Weighted samples in geometric bins 0.1% wide: bounded memory for billions of samples.

Runs of millions of requests produce tens of millions of inter-token gaps; keeping each
one costs more than the rest of the run. Binned on a log scale, any percentile read
back is within half a bin (0.05%) of the exact one, whatever the spread of the values,
and the bins a run touches (a few thousand) are all the memory it takes.
"""

from __future__ import annotations

import math

import numpy as np

RELATIVE_WIDTH = 1e-3
_LOG_STEP = math.log1p(RELATIVE_WIDTH)


class LogHistogram:
    """Counts of positive values per geometric bin, plus the exact minimum and maximum;
    zeros are counted apart (they have no logarithm)."""

    def __init__(self) -> None:
        self._lo = 0  # bin index of counts[0]
        self._counts = np.zeros(0, dtype=np.int64)
        self.zeros = 0
        self.min = math.inf
        self.max = -math.inf

    def add(self, values: np.ndarray, weights: np.ndarray) -> None:
        values = np.asarray(values, np.float64)
        weights = np.asarray(weights, np.int64)
        keep = np.isfinite(values) & (weights > 0)
        values, weights = values[keep], weights[keep]
        if not len(values):
            return
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))
        positive = values > 0
        self.zeros += int(weights[~positive].sum())
        index = np.floor(np.log(values[positive]) / _LOG_STEP).astype(np.int64)
        if not len(index):
            return
        self._cover(int(index.min()), int(index.max()))
        self._counts += np.bincount(index - self._lo, weights[positive], len(self._counts)).astype(
            np.int64
        )

    def _cover(self, lo: int, hi: int) -> None:
        """Widen the bin range to hold indices lo..hi."""
        if not len(self._counts):
            self._lo, self._counts = lo, np.zeros(hi - lo + 1, dtype=np.int64)
            return
        new_lo, new_hi = min(lo, self._lo), max(hi, self._lo + len(self._counts) - 1)
        if (new_lo, new_hi) == (self._lo, self._lo + len(self._counts) - 1):
            return
        grown = np.zeros(new_hi - new_lo + 1, dtype=np.int64)
        grown[self._lo - new_lo : self._lo - new_lo + len(self._counts)] = self._counts
        self._lo, self._counts = new_lo, grown

    def merge(self, other: LogHistogram) -> None:
        if len(other._counts):
            self._cover(other._lo, other._lo + len(other._counts) - 1)
            start = other._lo - self._lo
            self._counts[start : start + len(other._counts)] += other._counts
        self.zeros += other.zeros
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)

    def rows(self) -> np.ndarray:
        """(seconds, weight) rows, one per occupied bin at its geometric centre (the
        extreme bins at the exact minimum and maximum), as an exact sample table has."""
        occupied = np.flatnonzero(self._counts)
        centres = np.exp((occupied + self._lo + 0.5) * _LOG_STEP)
        weights = self._counts[occupied]
        if len(centres):
            centres = np.clip(centres, self.min, self.max)
            centres[-1] = self.max
            if not self.zeros:
                centres[0] = self.min
        if self.zeros:
            centres = np.concatenate(([0.0], centres))
            weights = np.concatenate(([self.zeros], weights))
        rows = np.empty(len(centres), dtype=[("seconds", "f8"), ("weight", "i8")])
        rows["seconds"], rows["weight"] = centres, weights
        return rows
