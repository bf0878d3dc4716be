"""Growable columnar storage: metrics go into preallocated numpy arrays, not objects."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np


class ColumnStore:
    """Named columns of equal length that grow by doubling.

    The rows live in one numpy structured array, so appending a row is a single
    assignment of a tuple (the engine appends one per step) and a run of rows is one
    slice assignment per column.
    """

    def __init__(
        self,
        dtypes: Mapping[str, str],
        capacity: int = 1024,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self._dtype = np.dtype(list(dtypes.items()))
        self.size = 0
        self._use(np.empty(capacity, dtype=self._dtype))
        # Called when the rows fill the store, before it grows: it may `drain` rows.
        self._on_full = on_full

    def _use(self, rows: np.ndarray) -> None:
        self._rows = rows
        self._capacity = len(rows)
        self._fields = {name: rows[name] for name in self._dtype.names}  # column views

    def _reserve(self, extra: int) -> None:
        capacity = self._capacity
        if self.size + extra > capacity and self._on_full is not None:
            self._on_full()
        needed = self.size + extra
        if needed > capacity:
            grown = np.empty(max(needed, 2 * capacity), dtype=self._dtype)
            grown[: self.size] = self._rows[: self.size]
            self._use(grown)

    def append(self, row: tuple) -> None:
        """One row, its values in column order."""
        if self.size == self._capacity:
            self._reserve(1)
        self._rows[self.size] = row
        self.size += 1

    def append_rows(self, rows: list[tuple]) -> None:
        """Rows, each a tuple of values in column order."""
        count = len(rows)
        if self.size + count > self._capacity:
            self._reserve(count)
        self._rows[self.size : self.size + count] = rows
        self.size += count

    def extend(self, count: int, **values: np.ndarray | float) -> None:
        """Append `count` rows; each value is an array of that length or a scalar."""
        if count <= 0:
            return
        self._reserve(count)
        lo, hi = self.size, self.size + count
        fields = self._fields
        for name, value in values.items():
            fields[name][lo:hi] = value
        self.size = hi

    def rows(self) -> np.ndarray:
        """The stored rows (a view: valid until the next append)."""
        return self._rows[: self.size]

    def drain(self, count: int) -> np.ndarray:
        """Remove the first `count` rows and return them (a copy)."""
        taken = self._rows[:count].copy()
        self._rows[: self.size - count] = self._rows[count : self.size]
        self.size -= count
        return taken

    def truncate(self, size: int) -> None:
        """Forget rows from `size` on (a step a failure cut short never happened)."""
        self.size = min(self.size, size)
