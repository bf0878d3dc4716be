"""Read a CSV of GEMM timings (your own, or published ones) into the long table.

Published GEMM figures usually come as throughput on one shape, not as a Parquet table
from a harness, so a calibration can start from a plain CSV: one row per measurement,
columns `m, n, k, dtype` (any case) and exactly one of `measured_s` (seconds per GEMM),
`latency_ms`, `latency_us` or `tflops` (2 m n k / seconds / 1e12); `gpu` (a preset or a
device name) and `source` (where the figure comes from) are optional, other columns are
kept out of the fit. Rows typed by hand invite unit slips, which `implausible_row`
catches once the GPU is known, naming the row's line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration.measured_tables import COLUMNS, long_rows
from hardware_models.dtypes import parse_dtype
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_cost

SHAPE = ("m", "n", "k")
# Time columns -> seconds per unit (tflops: a rate, turned into seconds from the shape).
SECONDS_PER = {"measured_s": 1.0, "latency_ms": 1e-3, "latency_us": 1e-6}
TIMES = (*SECONDS_PER, "tflops")
# Beyond these a row is a slip, not a kernel: faster than the tensor peak by half again
# (GeForce boost reaches ~1.15x its rated clock), or 100x slower than the uncalibrated
# model (the public H100 and A100 tables stay within 32x).
MAX_SHARE_OF_PEAK = 1.5
MAX_SLOWDOWN = 100.0


def read_gemm_csv(path: str | Path) -> pd.DataFrame:
    """The CSV's rows as GEMM rows of the long table (COLUMNS); every problem is refused
    with the file, the line and the column it is in."""
    path = Path(path)
    if not path.is_file():
        raise InfersimError(f"{path}: no such file (a GEMM table is a .csv file)")
    try:
        raw = pd.read_csv(path, index_col=False, dtype=str)
        text = path.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError) as exc:
        raise InfersimError(f"{path}: not a readable CSV ({exc})") from None
    raw.columns = [str(c).strip().lower() for c in raw.columns]  # M, N, K as m, n, k
    # Index each row by its line in the file (pandas skips blank lines) for the errors.
    lines = [i for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    fits = len(lines) > len(raw)
    raw.index = pd.Index(lines[1 : len(raw) + 1] if fits else range(2, len(raw) + 2))
    missing = [c for c in (*SHAPE, "dtype") if c not in raw.columns]
    if missing:
        raise InfersimError(
            f"{path}: missing column {missing[0]!r} (a GEMM table needs m, n, k, dtype and "
            f"one of {', '.join(TIMES)})"
        )
    times = [c for c in TIMES if c in raw.columns]
    if len(times) != 1:
        raise InfersimError(
            f"{path}: give exactly one of the columns measured_s (seconds), latency_ms, "
            f"latency_us or tflops, found {times or 'none'}"
        )
    if raw.empty:
        raise InfersimError(f"{path}: no rows")
    gpu = _text(raw, "gpu", "")
    if "gpu" in raw.columns and (gpu == "").any():
        line = int(raw.index[int(np.argmax((gpu == "").to_numpy()))])
        raise InfersimError(
            f"{path}: line {line}, column gpu: empty (name the preset the row ran on, or "
            "leave the column out and pass --gpu)"
        )
    out = long_rows("", "gemm", len(raw), path)
    for column in SHAPE:
        out[column] = _numbers(path, raw, column, whole=True)
    value = _numbers(path, raw, times[0], whole=False)
    out["dtype"] = [_dtype(path, line, v) for line, v in zip(raw.index, raw["dtype"], strict=True)]
    out["size"] = 2.0 * out["m"] * out["n"] * out["k"]
    if times[0] == "tflops":
        out["measured_s"] = out["size"] / (value * 1e12)
    else:
        out["measured_s"] = value * SECONDS_PER[times[0]]
    out["gpu"] = gpu.to_numpy()
    out["source"] = _text(raw, "source", str(path)).to_numpy()
    out["source_dtype"] = raw["dtype"].str.strip().str.lower().to_numpy()
    # Indexed by the rows' lines in the file, so that a refused row is named by its line.
    return out[list(COLUMNS)].set_axis(raw.index)


def _numbers(path: Path, raw: pd.DataFrame, column: str, whole: bool) -> np.ndarray:
    """`column` as floats: finite, > 0 and, for sizes, whole; else the first bad line."""
    text = raw[column].fillna("").str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values <= 0)
    if whole:
        bad |= values != np.round(values)
    if bad.any():
        at = int(np.argmax(bad))
        got = f"{text.iloc[at]!r}" if text.iloc[at] else "an empty cell"
        want = "a whole number > 0" if whole else "a finite number > 0"
        raise InfersimError(
            f"{path}: line {raw.index[at]}, column {column}: must be {want}, got {got}"
        )
    return values


def _text(raw: pd.DataFrame, column: str, default: str) -> pd.Series:
    if column not in raw.columns:
        return pd.Series(default, index=raw.index)
    return raw[column].fillna("").str.strip()


def _dtype(path: Path, line: int, value: object) -> str:
    text = "" if pd.isna(value) else str(value).strip().lower()
    try:
        return parse_dtype(text).value
    except InfersimError as exc:
        raise InfersimError(f"{path}: line {line}, column dtype: {exc}") from None


def implausible_row(rows: pd.DataFrame, spec: AcceleratorSpec) -> str | None:
    """A description of the first GEMM row no kernel on `spec` could have produced (a unit
    or a GPU mixed up), or None. Checked on hand-made tables only: pricing every row of a
    harness or aiconfigurator table would cost the fit seconds for slips they cannot make."""
    for row in rows[rows["op_class"] == "gemm"].itertuples():
        m, n, k = int(row.m), int(row.n), int(row.k)
        dtype = row.source_dtype if row.source_dtype == "fp8_block" else row.dtype
        try:
            predicted = gemm_cost(spec, m, n, k, dtype).seconds
        except InfersimError as exc:
            return f"line {row.Index}: {m}x{n}x{k} {dtype} ({row.source}): {exc}"
        share = row.size / row.measured_s / spec.peak_flops(parse_dtype(row.dtype))
        shape = f"line {row.Index}: {m}x{n}x{k} {dtype} in {row.measured_s:.3g} s ({row.source})"
        if share > MAX_SHARE_OF_PEAK:
            return (
                f"{shape} would run at {share:.0%} of the {spec.name}'s {row.dtype} tensor "
                "peak: a unit slip (tflops vs measured_s in seconds) or another GPU"
            )
        if row.measured_s > MAX_SLOWDOWN * predicted:
            return (
                f"{shape} is {row.measured_s / predicted:.0f}x the uncalibrated "
                f"{spec.name} time: is the time column in its unit (measured_s in seconds, "
                "not ms or us)?"
            )
    return None
