"""Read request traces (CSV, JSONL, or a vLLM bench serve result) into arrays, rejecting
bad rows by file and line.

A CSV trace has a header row (line 1) naming its columns; a JSONL trace has one object per
line (a dotted column name reaches into nested objects). Which columns hold arrivals and
prompt and output lengths (non-negative whole numbers) depends on the file's layout
(trace_layouts.py): infersim's own is `arrived_at` (seconds), `num_prefill_tokens`,
`num_decode_tokens`. Arrivals are counted from the earliest row and the rows replayed in
arrival order; either change to the file's own times is a warning. A trace without an
arrival column (lengths only) can give lengths but not arrivals. Only the columns asked
for are checked, so extra columns of any type are allowed.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hardware_models.errors import InfersimError
from hardware_models.warning_scope import warn
from hardware_models.yaml_io import load_json_object
from simulator.formats import vllm_bench_keys as bench_key
from simulator.formats.vllm_bench_requests import bench_requests
from simulator.workload.trace_layouts import (
    ARRIVAL_COLUMN,
    MAPPING_HINT,
    OUTPUT_COLUMN,
    PROMPT_COLUMN,
    TraceLayout,
    datetime_ns,
    detect_layout,
    seconds_from_earliest,
    shift_is_material,
    shown_name,
)

__all__ = ["ARRIVAL_COLUMN", "MAX_TOKENS", "OUTPUT_COLUMN", "PROMPT_COLUMN", "Trace", "read_trace"]

MAX_TOKENS = 2**31 - 1
"""Largest token count accepted: far beyond any context window, and safe in int64 sums."""

_CSV_SUFFIXES = (".csv",)
_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_BENCH_SUFFIXES = (".json",)
BENCH_LAYOUT = TraceLayout(
    "vllm-bench",
    bench_key.START_TIMES,
    bench_key.INPUT_LENS,
    bench_key.OUTPUT_LENS,
    "s",
    row="request",
)
"""A vLLM bench serve result's per-request lists, as a trace's columns."""


@dataclass(frozen=True)
class Trace:
    """The checked columns of a trace file, one entry per request: in arrival order when arrivals
    were read (rows out of order sorted), else in file order."""

    path: Path
    arrived_at: np.ndarray | None
    """float64 seconds from the earliest request, in arrival order; None when arrivals
    were not asked for."""
    tokens: dict[str, np.ndarray] = field(default_factory=dict)
    """int64 token counts (>= 0) by the column name asked for."""
    layout: TraceLayout | None = None
    """Which of the file's columns were read as what."""
    block_hashes: list[np.ndarray] | None = None
    """int64 hash of each block of each prompt (Mooncake's hash_ids), when the file has them
    and arrivals were read."""
    lines: np.ndarray | None = None
    """The file line of each row (in a vLLM bench result, its request index), for
    messages; rows replayed in arrival order keep theirs."""
    hashes_unread: bool = False
    """The file has block hashes that were not read (arrivals were not asked for)."""

    def __len__(self) -> int:
        if self.arrived_at is not None:
            return len(self.arrived_at)
        return len(next(iter(self.tokens.values()))) if self.tokens else 0

    def without_empty_rows(self) -> tuple[Trace, dict[str, int]]:
        """The trace less its rows with 0 tokens in a column read, and how many rows each
        such column emptied (BurstGPT logs failed requests with 0 response tokens)."""
        empty = {self.layout_name(c): int((v == 0).sum()) for c, v in self.tokens.items()}
        empty = {name: count for name, count in empty.items() if count}
        if not empty:
            return self, {}
        keep = np.logical_and.reduce([v > 0 for v in self.tokens.values()])
        hashes = self.block_hashes
        trace = replace(
            self,
            arrived_at=None if self.arrived_at is None else self.arrived_at[keep],
            tokens={c: v[keep] for c, v in self.tokens.items()},
            block_hashes=None if hashes is None else [hashes[i] for i in np.flatnonzero(keep)],
            lines=None if self.lines is None else self.lines[keep],
        )
        return trace, empty

    def layout_name(self, column: str) -> str:
        """The file's own name for one of infersim's column names."""
        return self.layout.file_column(column) if self.layout else column

    def line(self, row: int) -> int:
        """The file line of `row`."""
        return int(self.lines[row]) if self.lines is not None else row + 1


def read_trace(
    path: str | Path,
    token_columns: Sequence[str] = (),
    *,
    arrivals: bool = False,
    layout: TraceLayout | None = None,
) -> Trace:
    """Read `path`, checking the arrival times (when `arrivals`) and each of
    `token_columns`. Column names are infersim's (arrived_at, num_prefill_tokens,
    num_decode_tokens) or the file's own; the file's layout is detected from its columns
    unless `layout` says which columns are which. A layout with block hashes (Mooncake's
    hash_ids) gives them too when arrivals are read."""
    path = Path(path)
    wanted = ([ARRIVAL_COLUMN] if arrivals else []) + list(token_columns)
    text = _read_text(path)
    suffix = path.suffix.lower()
    if suffix in _CSV_SUFFIXES:
        found = _csv_header(path, text)
    elif suffix in _JSONL_SUFFIXES:
        found = _jsonl_keys(path, text)
    elif suffix in _BENCH_SUFFIXES:
        if layout is not None:
            raise InfersimError(
                f"{shown_name(path)}: arrivals.columns does not apply to a vLLM bench serve "
                f"result (its columns are {BENCH_LAYOUT.describe()}); leave it out"
            )
        return _bench_trace(path, token_columns, arrivals)
    else:
        raise InfersimError(
            f"{shown_name(path)}: unknown trace format {path.suffix!r}; use .csv, .jsonl, or "
            ".json (a `vllm bench serve --save-result --save-detailed` result)"
        )
    mapped = layout is not None
    layout = layout or detect_layout(path, found, wanted)
    columns = [layout.file_column(c) for c in wanted]
    hashes = layout.hashes if arrivals and layout.hashes in found else None
    unread = not arrivals and layout.hashes is not None and layout.hashes in found
    if suffix in _CSV_SUFFIXES:
        values, lines, found = _parse_csv(path, text, columns)
    else:
        as_text = {layout.arrival} if arrivals and layout.time_unit == "datetime" else set()
        read = {layout.file_column(c) for c in token_columns}
        lengths = tuple(c for c in (layout.prompt, layout.output) if c in read)
        values, lines, found = _parse_jsonl(path, text, columns, hashes, as_text, lengths)
    missing = [c for c in columns if c not in found]
    if missing:
        raise InfersimError(_missing_columns(path, layout, missing, found, arrivals, mapped))
    line_no = np.asarray(lines, dtype=np.int64)
    tokens = {}
    for column in token_columns:
        name = layout.file_column(column)
        numbers = _numbers(path, name, values[name], line_no)
        tokens[column] = _whole(path, name, numbers, line_no)
    trace = Trace(
        path=path,
        arrived_at=None,
        tokens=tokens,
        layout=layout,
        block_hashes=values[hashes] if hashes else None,
        lines=line_no,
        hashes_unread=unread,
    )
    return _with_arrivals(trace, values[layout.arrival]) if arrivals else trace


def _bench_trace(path: Path, token_columns: Sequence[str], arrivals: bool) -> Trace:
    """The requests of a `vllm bench serve --save-result --save-detailed` result, read as
    `infersim replay` reads them: lengths, and arrivals where the client recorded its
    send times (`start_times`). A file without them holds no arrival times (only the
    rate and burstiness they were drawn from), so it gives lengths only. Failed requests
    (0 output tokens as vLLM writes them, not what the server would have generated) are
    left out, and said."""
    sent = bench_requests(load_json_object(path), path)
    if arrivals and sent.start_times is None:
        raise InfersimError(
            f"{shown_name(path)}: this vLLM bench serve result records no send times (no "
            f"'{bench_key.START_TIMES}': the vLLM that wrote it saved only the request_rate and "
            "burstiness they were drawn from), so it cannot give arrivals; `infersim replay` "
            "draws them as vLLM's client did and compares the latencies, or take only its "
            "lengths (prompt_tokens/output_tokens: {kind: trace, path: ...}) with another "
            "arrival process"
        )
    columns = {bench_key.INPUT_LENS: sent.prompt, bench_key.OUTPUT_LENS: sent.output}
    if sent.start_times is not None:
        columns[bench_key.START_TIMES] = sent.start_times
    names = {c: BENCH_LAYOUT.file_column(c) for c in token_columns}
    missing = [name for name in names.values() if name not in columns]
    if missing:
        raise InfersimError(
            f"{shown_name(path)}: no column {', '.join(map(repr, missing))}: as a trace, a vLLM "
            f"bench serve result gives {', '.join(columns)}"
        )
    kept = np.flatnonzero(~sent.failed)
    if not len(kept):
        raise InfersimError(f"{shown_name(path)}: every request failed (see '{bench_key.ERRORS}')")
    if len(kept) < len(sent):
        warn(
            f"{shown_name(path)}: {len(sent) - len(kept):,} of its {len(sent):,} requests failed "
            f"(non-empty '{bench_key.ERRORS}') and are left out: their output_lens are 0, not "
            "what the server would have generated",
            stacklevel=4,
        )
    trace = Trace(
        path=path,
        arrived_at=None,
        tokens={c: columns[name][kept] for c, name in names.items()},
        layout=BENCH_LAYOUT,
        lines=kept,
    )
    return _with_arrivals(trace, sent.start_times[kept].tolist()) if arrivals else trace


def _with_arrivals(trace: Trace, cells: list[Any]) -> Trace:
    """`trace` with its arrival cells read as seconds from its earliest request, its rows
    in arrival order. Either change to the file's own times is said (a warning): rows
    out of order (logs written as requests complete) are sorted, stably, so rows of equal
    times keep their file order; times that do not start at 0 (Unix time, a window cut
    from a longer log) are counted from the earliest, as date-times always are, and said
    where that shift is material (trace_layouts.shift_is_material)."""
    layout, path, line_no = trace.layout, trace.path, trace.lines
    column, unit = layout.arrival, layout.time_unit
    if unit == "datetime":
        stamps = datetime_ns(path, column, cells, line_no)
    else:
        stamps = _numbers(path, column, cells, line_no)
    if not len(stamps):
        raise InfersimError(f"{shown_name(path)}: no rows to replay")
    arrived, offset_s = seconds_from_earliest(stamps, unit)
    order = _arrival_order(path, layout, stamps, line_no, cells)
    first = int(order[0])
    if unit != "datetime" and shift_is_material(offset_s, float(arrived.max())):
        warn(
            f"{shown_name(path)}: replayed from its earliest request ({column} "
            f"{_number(stamps[first])} {unit}, {layout.row} {line_no[first]}, is t = 0): "
            f"every arrival {_duration(offset_s)} earlier than the file writes it",
            stacklevel=4,
        )
    hashes = trace.block_hashes
    return replace(
        trace,
        arrived_at=arrived[order],
        tokens={c: v[order] for c, v in trace.tokens.items()},
        block_hashes=None if hashes is None else [hashes[i] for i in order],
        lines=line_no[order],
    )


def _arrival_order(
    path: Path, layout: TraceLayout, stamps: np.ndarray, line_no: np.ndarray, cells: list[Any]
) -> np.ndarray:
    """Row indices in arrival order (stable); when the file's rows are not in that order,
    it is said how many arrive before a row above them, and the first."""
    column, row = layout.arrival, layout.row
    late = stamps < np.maximum.accumulate(stamps)
    if not late.any():
        return np.arange(len(stamps))
    i = int(np.argmax(late))
    before = int(np.argmax(stamps == stamps[:i].max()))
    warn(
        f"{shown_name(path)}: {int(late.sum()):,} of its {len(stamps):,} rows arrive before a row "
        f"above them (first: {row} {line_no[i]}, {column} {_cell(cells[i])}, before {row} "
        f"{line_no[before]}'s {_cell(cells[before])}): replayed in order of {column}, rows "
        "of equal times in file order",
        stacklevel=5,
    )
    return np.argsort(stamps, kind="stable")


def _cell(value: Any) -> str:
    """A cell as the file writes it (one line)."""
    return shown_name(value)


def _number(value: float) -> str:
    """A time as the file counts it, for people: 1,733,011,200.029, 0.342795 (not
    0.34279452741857913)."""
    return f"{value:,.6f}".rstrip("0").rstrip(".")


def _duration(seconds: float) -> str:
    """e.g. 0.00025 s, 2.5 s, 1,733,011,200.029 s (54.9 years): a shift read at a glance."""
    shown = (f"{seconds:,.3f}".rstrip("0").rstrip(".") if seconds >= 1 else f"{seconds:.3g}") + " s"
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600)):
        if seconds >= size:
            return f"{shown} ({seconds / size:,.1f} {unit})"
    return shown


def _missing_columns(
    path: Path,
    layout: TraceLayout,
    missing: list[str],
    found: Sequence[str],
    arrivals: bool,
    mapped: bool,
) -> str:
    """Why the file lacks columns it was read for, with the columns it has and how to
    name them: a mapping's column mistyped, a layout recognised by some of its columns
    only, or a lengths-only trace asked for arrivals."""
    shown = ", ".join(shown_name(name) for name in found) or "none"
    roles = [layout.arrival, layout.prompt, layout.output]
    missing = sorted(missing, key=lambda c: roles.index(c) if c in roles else len(roles))
    absent = ", ".join(map(repr, missing))
    if mapped:
        return (
            f"{shown_name(path)}: no column{'s' * (len(missing) > 1)} {absent} (from "
            f"arrivals.columns); its columns: {shown}"
        )
    lengths = {layout.prompt, layout.output}
    if arrivals and missing == [layout.arrival] and lengths <= set(found):
        return (
            f"{shown_name(path)}: no '{layout.arrival}' column (found: {shown}): a lengths-only "
            "trace can give prompt/output lengths but not arrivals; if one of its columns "
            f"holds arrival times, {MAPPING_HINT}"
        )
    matched = [c for c in (layout.arrival, layout.prompt, layout.output) if c in found]
    assumed = (
        f" of the {layout.describe()} layout, assumed from its column(s) "
        f"{', '.join(map(repr, matched))}"
        if matched
        else ""
    )
    return (
        f"{shown_name(path)}: missing column(s) {absent}{assumed} (found: {shown}); {MAPPING_HINT}"
    )


def _csv_header(path: Path, text: str) -> list[str]:
    try:
        return [h.strip() for h in next(csv.reader(io.StringIO(text, newline="")))]
    except csv.Error as exc:
        raise InfersimError(f"{shown_name(path)}: line 1: bad CSV: {exc}") from None


def _jsonl_keys(path: Path, text: str) -> list[str]:
    """The keys of the first object (errors in it are reported by the full parse)."""
    line = next(line for line in text.split("\n") if line.strip())
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):
        _parse_jsonl(path, text, [], None, set())  # reports the line and what is wrong
    return _flat_keys(record) if isinstance(record, dict) else []


def _flat_keys(record: dict[str, Any]) -> list[str]:
    """An object's keys, those of nested objects as dotted paths (usage.prompt_tokens, as
    OpenAI's logs nest token counts), in file order. A loop, not recursion: JSON nests
    as deep as the parser allows."""
    keys: list[str] = []
    stack = [("", iter(record.items()))]
    while stack:
        prefix, items = stack[-1]
        for key, value in items:
            if isinstance(value, dict) and value:
                stack.append((f"{prefix}{key}.", iter(value.items())))
                break
            keys.append(f"{prefix}{key}")
        else:
            stack.pop()
    return keys


_ABSENT = object()


def _field(record: dict[str, Any], name: str) -> Any:
    """record[name]; for a dotted name that is not a key itself, the value at that path
    through nested objects; _ABSENT where there is none."""
    if name in record:
        return record[name]
    value: Any = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise InfersimError(f"{shown_name(path)}: no such trace file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        raise InfersimError(
            f"{shown_name(path)}: line {line}: not UTF-8 text "
            f"(byte {start}: {data[start : start + 1]!r})"
        ) from None
    if not text.strip():
        raise InfersimError(f"{shown_name(path)}: file is empty")
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
                    f"{shown_name(path)}: line 1: column {name!r} appears more than once"
                )
        wanted = [(c, index[c]) for c in columns if c in index]
        values: dict[str, list[Any]] = {c: [] for c, _ in wanted}
        lines: list[int] = []
        width = len(header)
        for row in reader:
            if not "".join(row).strip():  # no cells, or only blank ones (one C call a row)
                continue
            if len(row) != width:
                last = reader.line_num == text.rstrip("\r\n").count("\n") + 1
                hint = " (truncated last line?)" if last and len(row) < width else ""
                raise InfersimError(
                    f"{shown_name(path)}: line {reader.line_num}: expected {width} fields "
                    f"({', '.join(map(shown_name, header))}), got {len(row)}{hint}"
                )
            lines.append(reader.line_num)
            for c, i in wanted:
                values[c].append(row[i])
    except csv.Error as exc:
        raise InfersimError(f"{shown_name(path)}: line {reader.line_num}: bad CSV: {exc}") from None
    if not lines:
        raise InfersimError(f"{shown_name(path)}: no data rows after the header (line 1)")
    return values, lines, header


def _parse_jsonl(
    path: Path,
    text: str,
    columns: list[str],
    hashes: str | None,
    as_text: set[str],
    lengths: Sequence[str] = (),
) -> tuple[dict[str, list[Any]], list[int], list[str]]:
    """Values of the wanted keys (dotted for nested objects), numbers but for those in
    `as_text` (date-times, checked by their reader), and of the `hashes` key (lists of
    integers), with the file line of each object. The keys of the first object stand
    for the file's columns; a later object missing one is an error, but for one with
    none of the `lengths` (an error response an OpenAI log writes without `usage`): left
    out, and said once with how many."""
    values: dict[str, list[Any]] = {c: [] for c in [*columns, *([hashes] if hashes else [])]}
    lines: list[int] = []
    unused: list[tuple[int, dict[str, Any]]] = []  # (line, object) of rows without lengths
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
            raise InfersimError(f"{shown_name(path)}: line {number}: invalid JSON: {problem}")
        if not isinstance(record, dict):
            raise InfersimError(
                f"{shown_name(path)}: line {number}: expected a JSON object, got "
                f"{type(record).__name__}"
            )
        fields = [_field(record, c) for c in columns]
        if lengths and all(_field(record, c) in (_ABSENT, None) for c in lengths):
            unused.append((number, record))
            continue
        if not lines and any(value is _ABSENT for value in fields):
            return values, lines, _flat_keys(record)
        for c, value in zip(columns, fields, strict=True):
            if value is _ABSENT:
                raise InfersimError(f"{shown_name(path)}: line {number}: missing field {c!r}")
            number_wanted = c not in as_text
            if number_wanted and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise InfersimError(
                    f"{shown_name(path)}: line {number}: {c}: not a number ({value!r})"
                )
            values[c].append(value)
        if hashes is not None:
            values[hashes].append(_hash_list(path, number, hashes, record.get(hashes)))
        lines.append(number)
    if unused and not lines:  # no row has them: the file lacks the columns, or every
        keys = _flat_keys(unused[0][1])  # row names them without a value
        if any(c in keys for c in lengths):
            raise InfersimError(
                f"{shown_name(path)}: none of its {len(unused):,} rows has a value for "
                f"{' or '.join(lengths)} (first: line {unused[0][0]}): nothing to replay"
            )
        return values, lines, keys
    if unused:
        warn(
            f"{shown_name(path)}: {len(unused):,} of its {len(unused) + len(lines):,} rows have "
            f"no {' or '.join(lengths)} (first: line {unused[0][0]}; an error response "
            "is logged without token counts) and are left out",
            stacklevel=5,
        )
    return values, lines, columns


def _hash_list(path: Path, line: int, key: str, value: Any) -> np.ndarray:
    """One row's block hashes: a list of integers (each names one block of the prompt)."""
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 for v in value
    ):
        raise InfersimError(
            f"{shown_name(path)}: line {line}: {key}: expected a list of 64-bit integers, "
            f"got {str(value)[:60]}"
        )
    return np.array(value, dtype=np.int64)


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
                    f"{shown_name(path)}: line {line_no[i]}: {column}: not a number ({shown})"
                ) from None
    bad = ~np.isfinite(out)
    if bad.any():
        i = int(np.argmax(bad))
        where = f"{shown_name(path)}: line {line_no[i]}: {column}"
        raise InfersimError(f"{where}: {out[i]} is not finite")
    negative = out < 0
    if negative.any():
        i = int(np.argmax(negative))
        where = f"{shown_name(path)}: line {line_no[i]}: {column}"
        raise InfersimError(f"{where}: {out[i]:g} is negative")
    return out


def _whole(path: Path, column: str, values: np.ndarray, line_no: np.ndarray) -> np.ndarray:
    """Token counts as int64: whole numbers no larger than MAX_TOKENS."""
    bad = (values != np.floor(values)) | (values > MAX_TOKENS)
    if bad.any():
        i = int(np.argmax(bad))
        why = "too large" if values[i] > MAX_TOKENS else "not a whole number"
        where = f"{shown_name(path)}: line {line_no[i]}: {column}"
        raise InfersimError(f"{where}: {values[i]:g} is {why}")
    return values.astype(np.int64)
