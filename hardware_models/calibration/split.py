"""Seeded fit/holdout split by shape, the same whichever table or order the rows come in.

A shape (op class, dtypes and every shape column) goes wholly to one half, so repeated
measurements of a shape never sit on both sides. The half is decided by a hash of the
shape and the seed, not by row order or GPU, so `fit` and `validate` agree without sharing
state, and a shape held out on one GPU is held out on every GPU.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hardware_models.calibration.measured_tables import SHAPE_COLUMNS
from hardware_models.calibration.moe_mla_tables import EXTRA_COLUMNS

KEY_COLUMNS: tuple[str, ...] = ("op_class", "dtype", "source_dtype", *SHAPE_COLUMNS)


def holdout_mask(table: pd.DataFrame, holdout: float, seed: int) -> pd.Series:
    """True for rows whose shape belongs to the held-out fraction `holdout` (0..1)."""
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    cols = [c for c in KEY_COLUMNS if c in table.columns]
    hashed = _hash(table[cols], seed)
    # MoE and MLA rows hash their own shape columns too; the others hash as they always
    # did, so adding those tables moves no other row across the split.
    extra = [c for c in EXTRA_COLUMNS if c in table.columns]
    if extra:
        own = table[extra].notna().any(axis=1).to_numpy()
        if own.any():
            hashed[own] = _hash(table.loc[own, cols + extra], seed)
    unit = (hashed >> np.uint64(11)) / float(2**53)
    return pd.Series(unit < holdout, index=table.index)


def _hash(keys: pd.DataFrame, seed: int) -> np.ndarray:
    text = pd.DataFrame({c: _as_text(keys[c]) for c in keys.columns}, index=keys.index)
    hashed = pd.util.hash_pandas_object(text, index=False, hash_key=f"{seed:016d}"[-16:])
    return hashed.to_numpy(dtype=np.uint64).copy()


def _as_text(column: pd.Series) -> np.ndarray:
    """`column.astype(str)`'s strings (what the split hashes), each distinct value
    converted once (floats told apart by their bits, so -0.0 stays "-0.0"): a table has
    a few hundred thousand rows but few distinct values a column."""
    raw = column.to_numpy()
    key = raw.view(np.int64) if raw.dtype == np.float64 else column
    codes, _ = pd.factorize(key, use_na_sentinel=False)
    first = np.zeros(codes.max(initial=-1) + 1, dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    return column.iloc[first].astype(str).to_numpy(dtype=object)[codes]
