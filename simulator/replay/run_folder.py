"""Read a serving run in the layout of ../shared/data/e2e/: `meta.json` (engine settings),
`requests.jsonl` (one request a line, engine timestamps) and an optional `timeseries.csv`
(the engine's one-second log). Bad input is refused in one line naming file, line and key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.errors import InfersimError
from hardware_models.yaml_io import load_json_object
from simulator.replay.measured import TIMELINE_COLUMNS, MeasuredRun

META = "meta.json"
REQUESTS = "requests.jsonl"
TIMESERIES = "timeseries.csv"
_TIMES = ("queued_ts", "first_token_ts", "last_token_ts")
_LENGTHS = ("input_toks", "output_toks")


def _request_row(path: Path, line_no: int, text: str) -> list[float]:
    where = f"{path}: line {line_no}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InfersimError(f"{where}: invalid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise InfersimError(f"{where}: expected a JSON object, got {type(row).__name__}")
    values = []
    for key in (*_LENGTHS, *_TIMES):
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            got = "missing" if key not in row else f"{value!r} is not a number"
            raise InfersimError(f"{where}: {key!r} {got}")
        if not math.isfinite(value):
            raise InfersimError(f"{where}: {key!r} is {value!r}; expected a finite number")
        values.append(float(value))
    prompt, output, queued, first, last = values
    if prompt != int(prompt) or prompt < 1 or output != int(output) or output < 1:
        raise InfersimError(f"{where}: input_toks and output_toks must be whole numbers >= 1")
    if not queued <= first <= last:
        raise InfersimError(
            f"{where}: expected queued_ts <= first_token_ts <= last_token_ts, got "
            f"{queued}, {first}, {last}"
        )
    return values


def read_requests(path: Path) -> pd.DataFrame:
    """Per-request lengths and latencies as vLLM's engine clock gives them: TTFT from
    queueing to the first token, TPOT over the tokens after it, E2E to the last."""
    if not path.is_file():
        raise InfersimError(f"{path}: no such file (a run folder needs {REQUESTS})")
    rows = [
        _request_row(path, number, text)
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if text.strip()
    ]
    if not rows:
        raise InfersimError(f"{path}: no requests")
    prompt, output, queued, first, last = np.asarray(rows, dtype=np.float64).T
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (last - first) / (output - 1), np.nan)
    frame = pd.DataFrame(
        {
            "arrival": queued - queued.min(),
            "prompt": prompt.astype(np.int64),
            "output": output.astype(np.int64),
            "ttft": first - queued,
            "tpot": tpot,
            "e2e": last - queued,
        }
    )
    return frame.sort_values("arrival", kind="stable", ignore_index=True)


def read_timeline(path: Path) -> pd.DataFrame | None:
    """The engine's log, or None when the run has none."""
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InfersimError(f"{path}: not a CSV table ({exc})") from None
    missing = [c for c in TIMELINE_COLUMNS if c not in frame.columns]
    if missing:
        raise InfersimError(
            f"{path}: missing column(s) {', '.join(missing)} (found: {', '.join(frame.columns)})"
        )
    frame = frame[list(TIMELINE_COLUMNS)]
    if not all(pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns):
        bad = next(c for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c]))
        raise InfersimError(f"{path}: column {bad!r} holds values that are not numbers")
    return frame


def read_run_folder(folder: Path) -> MeasuredRun:
    """The run in `folder`; its model and vLLM version come from meta.json."""
    meta_path = folder / META
    if not meta_path.is_file():
        raise InfersimError(f"{folder}: no {META} (a run folder holds {META} and {REQUESTS})")
    meta = load_json_object(meta_path)
    requests = read_requests(folder / REQUESTS)
    gaps = (requests["output"] - 1).sum()
    decode_time = ((requests["e2e"] - requests["ttft"]) * (requests["output"] > 1)).sum()
    engine = meta.get("engine_kwargs") or {}
    return MeasuredRun(
        source=folder,
        kind="run folder",
        requests=requests,
        model=meta.get("model") or engine.get("model"),
        vllm_version=meta.get("vllm_version"),
        meta=meta,
        itl_mean=float(decode_time / gaps) if gaps else None,
        timeline=read_timeline(folder / TIMESERIES),
        files=tuple(
            folder / name for name in (META, REQUESTS, TIMESERIES) if (folder / name).is_file()
        ),
        notes=(
            "arrivals: the engine's own queue times (queued_ts); ITL: the run logs first "
            "and last token times only, so its mean alone is measured",
        ),
    )
