"""A measured serving run, whatever file it came from: per-request lengths, arrivals and
latencies, the engine's settings where recorded, and its own one-second log if any."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

TIMELINE_COLUMNS = (
    "t",
    "prompt_throughput",
    "gen_throughput",
    "running",
    "waiting",
    "kv_cache_pct",
)
"""The engine log's columns (vLLM's periodic stats line, one row per tick)."""


@dataclass(frozen=True)
class MeasuredRun:
    """What a replay compares against. `meta` is the run's meta.json (for a bench JSON,
    empty, as a client records no engine settings, unless infersim wrote the file);
    `notes` say how the file was read (how arrivals were obtained, requests left out) and
    are printed with the replay."""

    source: Path
    kind: str
    requests: pd.DataFrame
    """arrival (s from the first), prompt and output tokens, and the latencies ttft, tpot
    and e2e in seconds (NaN where the run did not give one)."""
    model: str | None = None
    vllm_version: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    itl: pd.DataFrame | None = None
    """Every inter-token gap (`seconds`, `weight`), when the run recorded them."""
    itl_mean: float | None = None
    """The mean gap, which a run recording only first and last token times still gives."""
    timeline: pd.DataFrame | None = None
    notes: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()
    """The files it was read from (replay.json pins each by its sha256)."""

    @property
    def name(self) -> str:
        return self.source.stem if self.source.is_file() else self.source.name

    @property
    def first_token_at(self) -> pd.Series:
        """Seconds from the first arrival to each request's first token."""
        return self.requests["arrival"] + self.requests["ttft"]
