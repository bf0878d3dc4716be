"""The requests a `vllm bench serve --save-result --save-detailed` JSON records, read once
for its two readers: `infersim replay` (which also compares the latencies) and a trace
replay (`workload.arrivals: {kind: trace, path: result.json}`, which takes only the
requests). Per request: prompt and output lengths, whether it failed, and when the client
sent it where the file says so (`start_times`, written only by recent vLLMs; older files
hold only the request_rate and burstiness the send times were drawn from)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hardware_models.errors import InfersimError
from simulator.formats import vllm_bench_keys as key


@dataclass(frozen=True)
class BenchRequests:
    """One entry per request sent, in the file's order."""

    prompt: np.ndarray
    """int64 prompt tokens (input_lens)."""
    output: np.ndarray
    """int64 output tokens (output_lens); 0 for a failed request, as vLLM writes it."""
    failed: np.ndarray
    """bool: a non-empty entry in `errors`. Its lengths are not checked: vLLM writes 0."""
    start_times: np.ndarray | None
    """float64 send times, seconds, as recorded (not shifted); None when not recorded."""

    def __len__(self) -> int:
        return len(self.prompt)


def bench_requests(data: dict[str, Any], path: Path) -> BenchRequests:
    """The requests of a loaded bench result; a file saved without --save-detailed has
    no per-request lengths and is refused, saying so."""
    if key.INPUT_LENS not in data or key.OUTPUT_LENS not in data:
        raise InfersimError(
            f"{path}: no {key.INPUT_LENS!r} and {key.OUTPUT_LENS!r}: not a vLLM bench serve "
            "result saved with --save-result --save-detailed"
        )
    prompts = bench_list(data, key.INPUT_LENS, path, None)
    count = len(prompts)
    if not count:
        raise InfersimError(f"{path}: no requests ({key.INPUT_LENS} is empty)")
    outputs = bench_list(data, key.OUTPUT_LENS, path, count)
    errors = bench_list(data, key.ERRORS, path, count) if key.ERRORS in data else [""] * count
    failed = np.array([bool(e) for e in errors], dtype=bool)
    lengths = np.zeros((count, 2), dtype=np.int64)
    for i in np.flatnonzero(~failed):
        where = f"request {i}"
        prompt = bench_number(prompts[i], f"{where}: {key.INPUT_LENS}", path)
        output = bench_number(outputs[i], f"{where}: {key.OUTPUT_LENS}", path)
        if prompt < 1 or output < 1 or prompt != int(prompt) or output != int(output):
            raise InfersimError(f"{path}: {where}: lengths must be whole numbers >= 1")
        lengths[i] = prompt, output
    starts = None
    if isinstance(data.get(key.START_TIMES), list):
        starts = np.array(
            [bench_number(v, f"{key.START_TIMES} entry", path) for v in data[key.START_TIMES]]
        )
        if len(starts) != count:
            raise InfersimError(
                f"{path}: {key.START_TIMES!r} has {len(starts)} entries, {key.INPUT_LENS} {count}"
            )
    return BenchRequests(lengths[:, 0], lengths[:, 1], failed, starts)


def bench_list(data: dict[str, Any], name: str, path: Path, length: int | None) -> list[Any]:
    """A per-request list, of `length` entries when given."""
    values = data.get(name)
    if not isinstance(values, list):
        raise InfersimError(f"{path}: {name!r} must be a list, got {type(values).__name__}")
    if length is not None and len(values) != length:
        raise InfersimError(
            f"{path}: {name!r} has {len(values)} entries, {key.INPUT_LENS} {length}"
        )
    return values


def bench_number(value: Any, what: str, path: Path) -> float:
    """A finite JSON number (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InfersimError(f"{path}: {what} is {value!r}; expected a finite number")
    return float(value)
