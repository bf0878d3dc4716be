"""Read request traces (CSV or JSONL) into arrays, rejecting bad rows by file and line.

A CSV trace has a header row (line 1) naming its columns; a JSONL trace has one object per
line. Columns: `arrived_at` (seconds from trace start, never decreasing) for arrivals,
`num_prefill_tokens` and `num_decode_tokens` (non-negative whole numbers) for lengths. A
trace without `arrived_at` (lengths only) can give lengths but not arrivals. Only the
columns asked for are checked, so extra columns of any type are allowed.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hardware_models.errors import InfersimError

ARRIVAL_COLUMN = "arrived_at"
PROMPT_COLUMN = "num_prefill_tokens"
OUTPUT_COLUMN = "num_decode_tokens"
MAX_TOKENS = 2**31 - 1
"""Largest token count accepted: far beyond any context window, and safe in int64 sums."""

_CSV_SUFFIXES = (".csv",)
_JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class Trace:
    """The checked columns of a trace file, one entry per request, in file order."""

    path: Path
    arrived_at: np.ndarray | None
    """float64 seconds, non-decreasing; None when arrivals were not asked for."""
    tokens: dict[str, np.ndarray] = field(default_factory=dict)
    """int64 token counts (>= 0) by column name."""

    def __len__(self) -> int:
        if self.arrived_at is not None:
            return len(self.arrived_at)
        return len(next(iter(self.tokens.values()))) if self.tokens else 0


def read_trace(
    path: str | Path, token_columns: Sequence[str] = (), *, arrivals: bool = False
) -> Trace:
    """Read `path`, checking `arrived_at` (when `arrivals`) and each of `token_columns`."""
    path = Path(path)
    columns = ([ARRIVAL_COLUMN] if arrivals else []) + list(token_columns)
    text = _read_text(path)
    suffix = path.suffix.lower()
    if suffix in _CSV_SUFFIXES:
        values, lines, found = _parse_csv(path, text, columns)
    elif suffix in _JSONL_SUFFIXES:
        values, lines, found = _parse_jsonl(path, text, columns)
    else:
        raise InfersimError(
            f"{_name(path)}: unknown trace format {path.suffix!r}; use .csv or .jsonl"
        )
    missing = [c for c in columns if c not in found]
    if missing:
        found = [_shown(name) for name in found]
        if arrivals and missing == [ARRIVAL_COLUMN]:
            raise InfersimError(
                f"{_name(path)}: no '{ARRIVAL_COLUMN}' column: a lengths-only trace can give "
                "prompt/output lengths but not arrivals"
            )
        raise InfersimError(
            f"{_name(path)}: missing column(s) {', '.join(map(repr, missing))} "
            f"(found: {', '.join(found) or 'none'})"
        )
    line_no = np.asarray(lines, dtype=np.int64)
    arrived = None
    if arrivals:
        arrived = _numbers(path, ARRIVAL_COLUMN, values[ARRIVAL_COLUMN], line_no)
        _check_order(path, arrived, line_no)
    tokens = {}
    for column in token_columns:
        numbers = _numbers(path, column, values[column], line_no)
        tokens[column] = _whole(path, column, numbers, line_no)
    return Trace(path=path, arrived_at=arrived, tokens=tokens)


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise InfersimError(f"{_name(path)}: no such trace file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        raise InfersimError(
            f"{_name(path)}: line {line}: not UTF-8 text "
            f"(byte {start}: {data[start : start + 1]!r})"
        ) from None
    if not text.strip():
        raise InfersimError(f"{_name(path)}: file is empty")
    return text


def _parse_csv(
    path: Path, text: str, columns: list[str]
) -> tuple[dict[str, list[Any]], list[int], list[str]]:
    """Cells of the wanted columns as strings, with the file line of each data row."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
        index = {name: i for i, name in enumerate(header)}
        for name in columns:
            if header.count(name) > 1:
                raise InfersimError(
                    f"{_name(path)}: line 1: column {name!r} appears more than once"
                )
        wanted = [(c, index[c]) for c in columns if c in index]
        values: dict[str, list[Any]] = {c: [] for c, _ in wanted}
        lines: list[int] = []
        width = len(header)
        for row in reader:
            if not row or not any(cell.strip() for cell in row):
                continue
            if len(row) != width:
                last = reader.line_num == text.rstrip("\r\n").count("\n") + 1
                hint = " (truncated last line?)" if last and len(row) < width else ""
                raise InfersimError(
                    f"{_name(path)}: line {reader.line_num}: expected {width} fields "
                    f"({', '.join(map(_shown, header))}), got {len(row)}{hint}"
                )
            lines.append(reader.line_num)
            for c, i in wanted:
                values[c].append(row[i])
    except csv.Error as exc:
        raise InfersimError(f"{_name(path)}: line {reader.line_num}: bad CSV: {exc}") from None
    if not lines:
        raise InfersimError(f"{_name(path)}: no data rows after the header (line 1)")
    return values, lines, header


def _parse_jsonl(
    path: Path, text: str, columns: list[str]
) -> tuple[dict[str, list[Any]], list[int], list[str]]:
    """Values of the wanted keys, with the file line of each object. The keys of the first
    object stand for the file's columns; a later object missing one is an error."""
    values: dict[str, list[Any]] = {c: [] for c in columns}
    lines: list[int] = []
    physical = text.split("\n")
    last = max(i for i, line in enumerate(physical, start=1) if line.strip())
    for number, line in enumerate(physical, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            hint = " (truncated last line?)" if number == last else ""
            problem = f"{exc.msg}{hint}"
        except ValueError as exc:  # an integer of more digits than int() accepts
            problem = str(exc).split(";")[0]
        except RecursionError:
            problem = "nested too deeply"
        else:
            problem = None
        if problem is not None:
            raise InfersimError(f"{_name(path)}: line {number}: invalid JSON: {problem}")
        if not isinstance(record, dict):
            raise InfersimError(
                f"{_name(path)}: line {number}: expected a JSON object, got {type(record).__name__}"
            )
        if not lines and any(c not in record for c in columns):
            return values, lines, list(record)
        for c in columns:
            if c not in record:
                raise InfersimError(f"{_name(path)}: line {number}: missing field {c!r}")
            value = record[c]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InfersimError(f"{_name(path)}: line {number}: {c}: not a number ({value!r})")
            values[c].append(value)
        lines.append(number)
    return values, lines, columns


def _numbers(path: Path, column: str, cells: list[Any], line_no: np.ndarray) -> np.ndarray:
    """float64 values of one column; the first missing, non-numeric, NaN/inf or negative
    cell is reported with its line."""
    try:
        out = np.array(cells, dtype=np.float64)
    except (ValueError, OverflowError):  # text that is not a number; an int beyond float64
        out = np.empty(len(cells))
        for i, cell in enumerate(cells):
            try:
                out[i] = float(cell)
            except OverflowError:
                out[i] = np.inf  # reported as not finite below, with its line
            except ValueError:
                shown = repr(cell) if cell.strip() else "empty"
                raise InfersimError(
                    f"{_name(path)}: line {line_no[i]}: {column}: not a number ({shown})"
                ) from None
    bad = ~np.isfinite(out)
    if bad.any():
        i = int(np.argmax(bad))
        raise InfersimError(f"{_name(path)}: line {line_no[i]}: {column}: {out[i]} is not finite")
    negative = out < 0
    if negative.any():
        i = int(np.argmax(negative))
        raise InfersimError(f"{_name(path)}: line {line_no[i]}: {column}: {out[i]:g} is negative")
    return out


def _name(path: Path | str) -> str:
    """A file as messages name it (quoted when its name would break the line)."""
    return _shown(str(path))


def _shown(name: str) -> str:
    """A column name as messages show it: as it is, or quoted when it holds a line break or
    another unprintable character (so that every message stays one line)."""
    return name if name.isprintable() else repr(name)


def _whole(path: Path, column: str, values: np.ndarray, line_no: np.ndarray) -> np.ndarray:
    """Token counts as int64: whole numbers no larger than MAX_TOKENS."""
    bad = (values != np.floor(values)) | (values > MAX_TOKENS)
    if bad.any():
        i = int(np.argmax(bad))
        why = "too large" if values[i] > MAX_TOKENS else "not a whole number"
        raise InfersimError(f"{_name(path)}: line {line_no[i]}: {column}: {values[i]:g} is {why}")
    return values.astype(np.int64)


def _check_order(path: Path, arrived: np.ndarray, line_no: np.ndarray) -> None:
    back = np.diff(arrived) < 0
    if back.any():
        i = int(np.argmax(back)) + 1
        raise InfersimError(
            f"{_name(path)}: line {line_no[i]}: {ARRIVAL_COLUMN} {arrived[i]:g} is earlier than "
            f"the previous request's {arrived[i - 1]:g}; arrival times must not decrease"
        )
