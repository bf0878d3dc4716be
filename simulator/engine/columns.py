"""Growable columnar storage: metrics go into preallocated numpy arrays, not objects."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

DEFER_ROWS = 2048  # deferred rows that wait at most


class ColumnStore:
    """Named columns of equal length that grow by doubling.

    The rows live in one numpy structured array, so appending a row is a single
    assignment of a tuple (the engine appends one per step) and a run of rows is one
    slice assignment per column. Short runs of rows given as columns (`defer`) wait in
    Python lists, one per column, and go into the array together before anything else
    touches it: converting a tuple into a structured row costs more than the
    arithmetic that priced the step.
    """

    def __init__(
        self,
        dtypes: Mapping[str, str],
        capacity: int = 1024,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self._dtype = np.dtype(list(dtypes.items()))
        self._size = 0
        self._use(np.empty(capacity, dtype=self._dtype))
        # Called when the rows fill the store, before it grows: it may `drain` rows.
        self._on_full = on_full
        self._pending: list[list] = [[] for _ in self._dtype.names]  # deferred rows
        self._pending_rows = 0

    @property
    def size(self) -> int:
        """Rows stored (deferred ones included)."""
        return self._size + self._pending_rows

    def defer(self, count: int, *columns: list | float) -> None:
        """Append `count` rows, each column in order a list of `count` values or one
        value for every row; they reach the array before the next read or other append
        (or once DEFER_ROWS wait)."""
        if self._size + self._pending_rows + count > len(self._rows):
            # Where append_rows would fill the store: fold (or grow) now, as it would,
            # so that what is folded when does not depend on the deferring.
            self._flush()
            self._reserve(count)
        for pending, values in zip(self._pending, columns, strict=True):
            if isinstance(values, list):
                pending += values
            else:
                pending += [values] * count
        self._pending_rows += count
        if self._pending_rows >= DEFER_ROWS:
            self._flush()

    def _flush(self) -> None:
        """Move the deferred rows into the array."""
        count = self._pending_rows
        if not count:
            return
        pending = self._pending
        self._pending, self._pending_rows = [[] for _ in pending], 0
        lo, hi = self._size, self._size + count  # they fit: defer made room
        for name, values in zip(self._dtype.names, pending, strict=True):
            self._fields[name][lo:hi] = values
        self._size = hi

    def _use(self, rows: np.ndarray) -> None:
        self._rows = rows
        self._fields = {name: rows[name] for name in self._dtype.names}  # column views

    def _reserve(self, extra: int) -> None:
        capacity = len(self._rows)
        if self._size + extra > capacity and self._on_full is not None:
            self._on_full()
        needed = self._size + extra
        if needed > capacity:
            grown = np.empty(max(needed, 2 * capacity), dtype=self._dtype)
            grown[: self._size] = self._rows[: self._size]
            self._use(grown)

    def append(self, row: tuple) -> None:
        """One row, its values in column order."""
        if self._pending_rows:
            self._flush()
        if self._size == len(self._rows):
            self._reserve(1)
        self._rows[self._size] = row
        self._size += 1

    def append_rows(self, rows: list[tuple]) -> None:
        """Rows, each a tuple of values in column order."""
        self._flush()
        self._reserve(len(rows))
        self._rows[self._size : self._size + len(rows)] = rows
        self._size += len(rows)

    def extend(self, count: int, **values: np.ndarray | float) -> None:
        """Append `count` rows; each value is an array of that length or a scalar."""
        if count <= 0:
            return
        self._flush()
        self._reserve(count)
        lo, hi = self._size, self._size + count
        fields = self._fields
        for name, value in values.items():
            fields[name][lo:hi] = value
        self._size = hi

    def rows(self) -> np.ndarray:
        """The stored rows (a view: valid until the next append)."""
        self._flush()
        return self._rows[: self._size]

    def drain(self, count: int) -> np.ndarray:
        """Remove the first `count` rows and return them (a copy)."""
        self._flush()
        taken = self._rows[:count].copy()
        self._rows[: self._size - count] = self._rows[count : self._size]
        self._size -= count
        return taken

    def truncate(self, size: int) -> None:
        """Forget rows from `size` on (a step a failure cut short never happened)."""
        self._flush()
        self._size = min(self._size, size)

    def frame(self) -> pd.DataFrame:
        return frame_of(self.rows())


def frame_of(rows: np.ndarray) -> pd.DataFrame:
    """A structured array as a DataFrame, one column per field."""
    return pd.DataFrame({name: rows[name] for name in rows.dtype.names})
