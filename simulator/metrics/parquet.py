"""Write a Table as a Parquet file with pyarrow alone: no pandas in the process.

The file is what `DataFrame.to_parquet` wrote for the same table (the Arrow types,
nulls, dictionary encoding and the "pandas" schema metadata that gives the columns and
the index back), so `pandas.read_parquet` returns `Table.to_pandas()` exactly.

The Arrow arrays are made from the numpy buffers (`Array.from_buffers`, no copy of a
number column) rather than with `pyarrow.array`, which imports pandas to inspect its
argument whatever it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.metrics.table import Column, Labels, Table


def write_parquet(table: Table, path: str | Path) -> None:
    """One row group, snappy, dictionary encoding only for categorical columns (numbers
    of a simulation rarely repeat: trying a dictionary on every column, pyarrow's
    default, takes a third of the writing time and gives larger files)."""
    categorical = [n for n, c in table.columns.items() if isinstance(c, Labels) and c.categorical]
    pq.write_table(arrow_table(table), path, use_dictionary=categorical)


def arrow_table(table: Table) -> pa.Table:
    """The Table as Arrow columns with pandas' schema metadata."""
    arrays = [_arrow(col) for col in table.columns.values()]
    metadata = {b"pandas": json.dumps(_pandas_metadata(table)).encode()}
    return pa.Table.from_arrays(arrays, names=list(table.columns), metadata=metadata)


def _arrow(col: Column) -> pa.Array:
    if isinstance(col, Labels):
        if col.categorical:
            kind = pa.dictionary(pa.from_numpy_dtype(col.codes.dtype), pa.string())
            codes = pa.py_buffer(np.ascontiguousarray(col.codes))
            names = _strings(pa.string(), col.names, np.arange(len(col.names)))
            return pa.DictionaryArray.from_buffers(kind, len(col), [None, codes], names)
        return _strings(pa.large_string(), col.names, col.codes)
    values = np.ascontiguousarray(col)
    validity, nulls = None, 0
    if values.dtype.kind == "f":  # NaN is a null, as pandas writes it
        missing = np.isnan(values)
        nulls = int(missing.sum())
        if nulls:
            validity = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    kind = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(values)], nulls)


def _strings(kind: pa.DataType, names: tuple[str, ...], codes: np.ndarray) -> pa.Array:
    """Text column `names[codes]` as Arrow strings, built from offsets and bytes."""
    encoded = [name.encode() for name in names]
    lengths = np.array([len(e) for e in encoded], np.int64)[codes]
    offsets = np.zeros(len(codes) + 1, np.int64 if kind == pa.large_string() else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(np.array(encoded, dtype=object)[codes]) if len(codes) else b""
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, len(codes), buffers)


def _pandas_metadata(table: Table) -> dict[str, Any]:
    """pandas' description of the frame (pyarrow.pandas_compat's format, as pandas 2
    wrote it: pandas 3 reads its text columns as its string dtype): how to give back
    the index, the categoricals and the column dtypes."""
    columns = []
    for name, col in table.columns.items():
        meta = None
        if isinstance(col, Labels) and col.categorical:
            kinds = ("categorical", str(col.codes.dtype))
            meta = {"num_categories": len(col.names), "ordered": False}
        elif isinstance(col, Labels):
            kinds = ("unicode", "object")
        else:
            kinds = (str(col.dtype), str(col.dtype))
        columns.append(
            {"name": name, "field_name": name, "pandas_type": kinds[0], "numpy_type": kinds[1],
             "metadata": meta}
        )  # fmt: skip
    index = {"kind": "range", "name": table.index_name, "start": 0, "stop": len(table), "step": 1}
    names = {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object"}
    return {
        "index_columns": [index],
        "column_indexes": [{**names, "metadata": {"encoding": "UTF-8"}}],
        "columns": columns,
        "attributes": {},
        "creator": {"library": "infersim"},
    }
