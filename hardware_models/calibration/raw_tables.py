"""Read one table file of the aiconfigurator layout (Parquet, or the same columns as
comma-separated text: aiconfigurator's `.txt` tables), checked before any column is used:
a malformed table (a column missing, a latency that is empty, zero or negative, a dtype
no kernel has) is refused in one line naming the file, the column and what is allowed,
never a KeyError or a fit that fails deep inside on a NaN."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.calibration.benchmark_loops import TEXT_SUFFIXES
from hardware_models.dtypes import parse_dtype
from hardware_models.errors import InfersimError


def read_raw(
    path: Path,
    positive: Sequence[str],
    non_negative: Sequence[str] = (),
    dtypes: Sequence[str] = (),
    text: Sequence[str] = (),
    optional: Sequence[str] = (),
) -> pd.DataFrame:
    """The Parquet table at `path`, refused unless every named column but the `optional`
    ones is there, those in `positive` are finite and > 0 (latency in ms, sizes), those
    in `non_negative` (step) and `optional` (window_size, where present) finite and
    >= 0, and `dtypes` name known dtypes."""
    text_table = path.suffix in TEXT_SUFFIXES
    try:
        raw = pd.read_csv(path) if text_table else pd.read_parquet(path)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        kind = "CSV text" if text_table else "Parquet"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InfersimError(f"{path}: not a readable {kind} table ({first})") from None
    required = [*positive, *non_negative, *dtypes, *text]
    missing = [c for c in required if c not in raw.columns]
    if missing:
        raise InfersimError(
            f"{path}: missing column {missing[0]!r} (a {path.name} table needs "
            f"{', '.join(required)})"
        )
    for column, floor in [(c, 0.0) for c in positive] + [
        (c, -1.0) for c in (*non_negative, *optional) if c in raw.columns
    ]:
        _check_numbers(path, raw, column, floor)
    for column in dtypes:
        for value in pd.unique(raw[column]):
            try:
                parse_dtype(str(value))
            except InfersimError as exc:
                raise InfersimError(f"{path}: column {column}: {exc}") from None
    return raw


def _check_numbers(path: Path, raw: pd.DataFrame, column: str, floor: float) -> None:
    """Values finite and > `floor` (0: positive; -1 for whole counts: non-negative)."""
    values = pd.to_numeric(raw[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values <= floor)
    if bad.any():
        at = int(np.argmax(bad))
        want = "a finite number > 0" if floor == 0.0 else "a finite number >= 0"
        raise InfersimError(
            f"{path}: row {at}, column {column}: must be {want}, got {raw[column].iloc[at]}"
        )
