"""A result table as named numpy columns: what a run builds, summarises and writes.

pandas costs more to import (about 0.3 s and 100 MB) than a 10,000-request run costs to
simulate, so the results are kept, summarised and written (simulator.metrics.parquet)
as numpy columns, and a DataFrame is made only when someone reads one (`to_pandas`,
what `Results.requests` and the others return). `Table.from_pandas` goes the other way,
so the summary and the time series accept a DataFrame too with one implementation.

A column is a numpy array, or `Labels`: text drawn from a few values, kept as codes
into the values (the engine's outcome, reject reason, priority class and step bound).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Labels:
    """Text column as `codes` into `names`. `categorical` ones are pandas Categoricals
    (every name a category, used or not) and dictionary-encoded in Parquet; the others
    are plain text (pandas' string dtype)."""

    codes: np.ndarray
    names: tuple[str, ...]
    categorical: bool = False

    def __len__(self) -> int:
        return len(self.codes)

    def equals(self, name: str) -> np.ndarray:
        """Mask of the rows that read `name`."""
        return np.array([n == name for n in self.names], dtype=bool)[self.codes]

    def counts(self, rows: np.ndarray | None = None) -> dict[str, int]:
        """How many rows (of those `rows` selects) read each name, the unused ones left out."""
        codes = self.codes if rows is None else self.codes[rows]
        counts: dict[str, int] = {}
        for name, n in zip(self.names, np.bincount(codes, minlength=len(self.names)), strict=True):
            if n:
                counts[name] = counts.get(name, 0) + int(n)
        return counts

    def text(self) -> np.ndarray:
        """The column as an object array of str."""
        return np.array(self.names, dtype=object)[self.codes]

    def take(self, rows: np.ndarray) -> Labels:
        return Labels(self.codes[rows], self.names, self.categorical)


Column = np.ndarray | Labels


class Table:
    """Columns of equal length by name, in order, with a RangeIndex named `index_name`
    when made a DataFrame."""

    def __init__(self, columns: Mapping[str, Column], index_name: str | None = None) -> None:
        self.columns = dict(columns)
        self.index_name = index_name
        lengths = {len(c) for c in self.columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self._length = lengths.pop() if lengths else 0

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, name: str) -> Any:
        """The column: a numpy array, or Labels for a text column."""
        return self.columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __repr__(self) -> str:
        return f"Table({len(self)} rows: {', '.join(self.columns)})"

    def rows(self, selected: np.ndarray) -> Table:
        """The rows a mask or index array selects, renumbered from 0."""
        taken = {
            name: col.take(selected) if isinstance(col, Labels) else col[selected]
            for name, col in self.columns.items()
        }
        return Table(taken, self.index_name)

    # ---- pandas ---------------------------------------------------------------------------
    def to_pandas(self) -> pd.DataFrame:
        """A DataFrame with these columns: Labels as Categoricals or strings."""
        import pandas as pd

        index = pd.RangeIndex(len(self), name=self.index_name)
        data: dict[str, Any] = {}
        for name, col in self.columns.items():
            if isinstance(col, Labels) and col.categorical:
                data[name] = pd.Categorical.from_codes(col.codes, categories=list(col.names))
            elif isinstance(col, Labels):  # pandas' text dtype (str in pandas 3), even empty
                data[name] = pd.Series(col.text(), index=index, dtype=str)
            else:
                data[name] = col
        return pd.DataFrame(data, index=index)

    @classmethod
    def from_pandas(cls, frame: pd.DataFrame) -> Table:
        """A DataFrame's columns (its index dropped): categoricals and text as Labels."""
        import pandas as pd

        columns: dict[str, Column] = {}
        for name, series in frame.items():
            dtype = series.dtype
            if isinstance(dtype, pd.CategoricalDtype):
                names = tuple(str(c) for c in dtype.categories)
                columns[str(name)] = Labels(series.cat.codes.to_numpy(), names, True)
            elif pd.api.types.is_string_dtype(dtype) or pd.api.types.is_object_dtype(dtype):
                codes, uniques = pd.factorize(series.astype(str))
                columns[str(name)] = Labels(codes, tuple(uniques), False)
            else:
                columns[str(name)] = series.to_numpy()
        return cls(columns, frame.index.name)


def as_table(table: Table | pd.DataFrame) -> Table:
    """A Table as it is, a DataFrame as a Table."""
    return table if isinstance(table, Table) else Table.from_pandas(table)


def from_rows(rows: np.ndarray, index_name: str | None = None) -> Table:
    """A structured array's fields as contiguous columns (copies: the rows can go)."""
    return Table({name: np.ascontiguousarray(rows[name]) for name in rows.dtype.names}, index_name)
