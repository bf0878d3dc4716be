"""Which columns of a trace file hold arrivals, prompt and output lengths: the public
layouts users already have, recognised from the file's own column names, or a mapping
the scenario states for any other file.

Every layout is read into the same three quantities: arrival time in seconds from the
trace start, prompt tokens and output tokens; a Mooncake trace also gives each prompt's
block hashes (`hash_ids`). Matching is by exact column name, so a layout is never guessed
from a partial or misspelt header.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from hardware_models.errors import InfersimError
from hardware_models.warning_scope import warn

if TYPE_CHECKING:
    import pandas as pd

ARRIVAL_COLUMN = "arrived_at"
PROMPT_COLUMN = "num_prefill_tokens"
OUTPUT_COLUMN = "num_decode_tokens"

TimeUnit = Literal["s", "ms", "us", "datetime"]
_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "datetime": 1e9}
"""Units of each time_unit per second (a date-time is read as nanoseconds since the epoch)."""


@dataclass(frozen=True)
class TraceLayout:
    """The file's names for the arrival, prompt and output columns, and how its arrival
    times are written."""

    name: str
    arrival: str
    prompt: str
    output: str
    time_unit: TimeUnit = "s"
    hashes: str | None = None
    """Column of per-prompt block hashes (a JSON list per row), when the layout has one."""
    row: str = "line"
    """What messages call a row: a line of the file, or a request of a vLLM bench result."""

    def file_column(self, column: str) -> str:
        """The file's name for one of infersim's column names (other names are the file's)."""
        return {ARRIVAL_COLUMN: self.arrival, PROMPT_COLUMN: self.prompt}.get(
            column, self.output if column == OUTPUT_COLUMN else column
        )

    def describe(self) -> str:
        names = [self.arrival, self.prompt, self.output] + ([self.hashes] if self.hashes else [])
        return f"{self.name} ({', '.join(names)})"


LAYOUTS = (
    TraceLayout("infersim", ARRIVAL_COLUMN, PROMPT_COLUMN, OUTPUT_COLUMN),
    TraceLayout("burstgpt", "Timestamp", "Request tokens", "Response tokens"),
    TraceLayout("azure2023", "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime"),
    TraceLayout("mooncake", "timestamp", "input_length", "output_length", "ms", "hash_ids"),
)
"""infersim's own (Vidur's processed traces), BurstGPT's CSV (Timestamp in seconds from the
trace start), Azure's 2023 LLM inference CSV (TIMESTAMP a date and time) and Mooncake's
JSONL (timestamp in milliseconds, hash_ids one per block of the prompt)."""

MAPPING_HINT = (
    "or name the columns with a mapping (arrivals.columns: {arrival, prompt, output, "
    "time_unit}; for trace lengths, `column`)"
)


def detect_layout(path: Path, found: Sequence[str], wanted: Sequence[str]) -> TraceLayout:
    """The layout whose columns the file has: the first with every column `wanted` (given
    in infersim's names), else the one with most of them (its missing columns are then
    reported). A file with none of any layout's columns is refused with the list."""
    present = set(found)
    # Only the columns layouts rename tell them apart; a column named by the user ("b")
    # reads the same in every layout.
    renamed = [c for c in wanted if c in (ARRIVAL_COLUMN, PROMPT_COLUMN, OUTPUT_COLUMN)]

    def has(layout: TraceLayout) -> int:
        return sum(layout.file_column(c) in present for c in wanted)

    best = max(LAYOUTS, key=has)  # max keeps the first of equals
    complete = [
        layout.name
        for layout in LAYOUTS
        if has(layout) == len(wanted) and any(layout.file_column(c) in present for c in renamed)
    ]
    if len(complete) > 1:
        warn(
            f"{shown_name(path)}: its columns fit the layouts {' and '.join(complete)}: read "
            f"as {best.describe()} (arrivals.columns names the columns otherwise)",
            stacklevel=3,
        )
    if has(best) == 0 and wanted:
        shown = ", ".join(shown_name(name) for name in found) or "none"
        known = "; ".join(layout.describe() for layout in LAYOUTS)
        raise InfersimError(
            f"{shown_name(path)}: its columns ({shown}) match no known trace layout: "
            f"{known}; {MAPPING_HINT}"
        )
    return best


def datetime_ns(path: Path, column: str, cells: list, line_no: np.ndarray) -> np.ndarray:
    """Date-time cells as int64 nanoseconds since the epoch; the first that is not a date
    and time is reported with its line."""
    stamps = _datetimes(path, column, cells, line_no)
    bad = stamps.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise InfersimError(
            f"{shown_name(path)}: line {line_no[i]}: {column}: not a date and time "
            f"({cells[i]!r}); expected e.g. 2023-11-16 18:15:46.680"
        )
    if stamps.dt.tz is not None:
        stamps = stamps.dt.tz_convert(None)
    return stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)


# Counting a trace from its earliest request is said when, replayed as written, the run
# would have idled before its first request for more than this share of the time to its
# last arrival.
SHIFT_SAID_SHARE = 0.1


def shift_is_material(offset_s: float, span_s: float) -> bool:
    """Whether moving a trace to start at its first request (by `offset_s`, its arrivals
    spanning `span_s` after it) changes the run enough to say: an absolute clock (Unix
    time: decades), a window cut from a longer log (an offset of hours before minutes of
    requests). A first arrival one gap after 0, as any arrival process draws it (the
    mooncake sample: 0.34 s before 7.75 s of requests; infersim's own bench JSON), is
    not."""
    return offset_s > SHIFT_SAID_SHARE * (offset_s + span_s)


def seconds_from_earliest(stamps: np.ndarray, unit: TimeUnit) -> tuple[np.ndarray, float]:
    """Arrival times (in the file's `unit`) as seconds after the earliest, and how far
    that earliest is from the file's own zero, in seconds. A trace is replayed from its
    first request: an absolute clock (Unix time, a date) or a window cut out of a longer
    log would otherwise open the run with idle years or hours that every per-second
    figure (throughput, utilisation, cost) is divided by. Subtracted in the file's unit,
    so integer milliseconds stay exact."""
    earliest = stamps.min()
    per_second = _PER_SECOND[unit]
    return (stamps - earliest) / per_second, float(earliest) / per_second


def _datetimes(path: Path, column: str, cells: list, line_no: np.ndarray) -> pd.Series:
    """Date-time cells as timestamps (NaT where not one). Rows in different time zones
    (a daylight-saving change) are the instants they name; a row without a zone among
    rows with one names no instant, and is refused. (pandas parses them: imported here,
    as only a trace with date-time arrivals needs it.) A cell that is not text (a JSON
    number) is not a date and time: pandas would read it as nanoseconds."""
    import pandas as pd

    series = pd.Series([c if isinstance(c, str) else None for c in cells], dtype=object)
    try:
        return pd.to_datetime(series, format="ISO8601", errors="coerce")
    except ValueError:  # rows in different zones, or zoned and unzoned rows
        pass
    zones = [_zone(cell) for cell in cells]
    if "none" in zones and "named" in zones:
        i, j = zones.index("none"), zones.index("named")
        raise InfersimError(
            f"{shown_name(path)}: line {line_no[i]}: {column}: {cells[i]!r} has no time "
            f"zone, but line {line_no[j]}'s {cells[j]!r} has one; give every row a zone or none"
        )
    return pd.to_datetime(series, format="ISO8601", errors="coerce", utc=True)


def _zone(cell) -> Literal["named", "none", "bad"]:
    """Whether a date-time cell names its time zone ("bad": not a date-time, which the
    caller reports with its line)."""
    import pandas as pd

    if not isinstance(cell, str):
        return "bad"
    try:
        stamp = pd.Timestamp(cell)
    except (TypeError, ValueError):
        return "bad"
    return "none" if stamp.tzinfo is None else "named"


def shown_name(name: str | Path) -> str:
    """A column or file name as messages show it: as it is, or quoted when it holds a line
    break or another unprintable character (so that every message stays one line)."""
    text = str(name)
    return text if text.isprintable() else repr(text)
