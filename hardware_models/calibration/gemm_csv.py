"""Read a CSV of GEMM timings (your own, or published ones) into the long table.

Published GEMM figures usually come as throughput on one shape, not as a Parquet table
from a harness, so a calibration can start from a plain CSV: one row per measurement,
columns `m, n, k, dtype` and exactly one of `measured_s` (seconds per GEMM) or `tflops`
(2 m n k / seconds / 1e12); `gpu` (a preset name) and `source` (where the figure comes
from) are optional, other columns are kept out of the fit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.calibration.measured_tables import COLUMNS, NUMERIC_COLUMNS
from hardware_models.dtypes import parse_dtype
from hardware_models.errors import InfersimError

SHAPE = ("m", "n", "k")
TIMES = ("measured_s", "tflops")


def read_gemm_csv(path: str | Path) -> pd.DataFrame:
    """The CSV's rows as GEMM rows of the long table (COLUMNS); every problem is refused
    with the file, the row and the column it is in."""
    path = Path(path)
    try:
        raw = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise InfersimError(f"{path}: not a readable CSV ({exc})") from None
    missing = [c for c in (*SHAPE, "dtype") if c not in raw.columns]
    if missing:
        raise InfersimError(
            f"{path}: missing column {missing[0]!r} (a GEMM table needs m, n, k, dtype and "
            "measured_s or tflops)"
        )
    times = [c for c in TIMES if c in raw.columns]
    if len(times) != 1:
        raise InfersimError(
            f"{path}: give exactly one of the columns measured_s (seconds) or tflops, "
            f"found {times or 'neither'}"
        )
    if raw.empty:
        raise InfersimError(f"{path}: no rows")
    out = pd.DataFrame({c: np.nan for c in NUMERIC_COLUMNS}, index=raw.index)
    for column in (*SHAPE, times[0]):
        values = pd.to_numeric(raw[column], errors="coerce")
        bad = values.isna() | (values <= 0)
        if bad.any():
            row = int(bad.idxmax())
            raise InfersimError(
                f"{path}: row {row + 2}, column {column}: must be a number > 0, "
                f"got {raw[column].iloc[row]!r}"
            )
        out[column if column in SHAPE else "value"] = values.to_numpy(dtype=float)
    out["dtype"] = [_dtype(path, i, v) for i, v in enumerate(raw["dtype"])]
    out["size"] = 2.0 * out["m"] * out["n"] * out["k"]
    value = out.pop("value")
    out["measured_s"] = value if times[0] == "measured_s" else out["size"] / (value * 1e12)
    out["gpu"] = raw["gpu"].astype(str) if "gpu" in raw.columns else ""
    out["op_class"] = "gemm"
    out["kv_dtype"] = None
    out["source"] = raw["source"].astype(str) if "source" in raw.columns else str(path)
    out["source_dtype"] = raw["dtype"].astype(str).str.strip().str.lower()
    return out[list(COLUMNS)]


def _dtype(path: Path, index: int, value: object) -> str:
    try:
        return parse_dtype(str(value).strip().lower()).value
    except InfersimError as exc:
        raise InfersimError(f"{path}: row {index + 2}, column dtype: {exc}") from None
