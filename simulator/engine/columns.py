"""Growable columnar storage: metrics go into preallocated numpy arrays, not objects."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd


class ColumnStore:
    """Named numpy columns of equal length that grow by doubling."""

    def __init__(self, dtypes: Mapping[str, str], capacity: int = 1024) -> None:
        self._dtypes = dict(dtypes)
        self._cols = {name: np.empty(capacity, dtype=dt) for name, dt in self._dtypes.items()}
        self.size = 0

    def _reserve(self, extra: int) -> None:
        needed = self.size + extra
        capacity = len(next(iter(self._cols.values())))
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity)
        for name, col in self._cols.items():
            grown = np.empty(new_capacity, dtype=col.dtype)
            grown[: self.size] = col[: self.size]
            self._cols[name] = grown

    def append(self, **values: float) -> None:
        self._reserve(1)
        i = self.size
        for name, value in values.items():
            self._cols[name][i] = value
        self.size += 1

    def extend(self, count: int, **values: np.ndarray | float) -> None:
        """Append `count` rows; each value is an array of that length or a scalar."""
        if count <= 0:
            return
        self._reserve(count)
        lo, hi = self.size, self.size + count
        for name, value in values.items():
            self._cols[name][lo:hi] = value
        self.size = hi

    def column(self, name: str) -> np.ndarray:
        return self._cols[name][: self.size]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({name: col[: self.size] for name, col in self._cols.items()})
