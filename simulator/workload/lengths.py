"""Prompt and output lengths drawn as whole arrays.

Order of operations: draw (clipped to the distribution's min/max), multiply by the length
scale, round to whole tokens, raise to at least 1, then apply max_total_tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from hardware_models.errors import InfersimError
from simulator.workload.config import FixedLength, NormalLength, SyntheticLength, UniformLength
from simulator.workload.traces import MAX_TOKENS


@dataclass(frozen=True)
class TableLengths:
    """Lengths taken from one column of a trace file."""

    values: np.ndarray
    """int64 token counts, one per trace row."""
    source: Path
    """The file: two roles from the same file draw the same rows, keeping their pairing."""
    aligned: bool = False
    """Request i takes row i (trace replay) instead of a row drawn at random."""


LengthSource = SyntheticLength | TableLengths


def draw(spec: SyntheticLength, rng: np.random.Generator, n: int) -> np.ndarray:
    """n raw lengths (float64, not yet rounded) clipped to the distribution's bounds."""
    if isinstance(spec, FixedLength):
        return np.full(n, float(spec.tokens))
    if isinstance(spec, UniformLength):
        return rng.integers(spec.low, spec.high, size=n, endpoint=True).astype(np.float64)
    if isinstance(spec, NormalLength):
        raw = rng.normal(spec.mean, spec.std, n)
    else:
        ratio = spec.std / spec.mean
        # ln(1 + r^2), without squaring r: std/mean may be as large as 1e308 / 1e-300
        sigma2 = math.log1p(ratio**2) if ratio < 1e150 else 2 * math.log(ratio)
        if not math.isfinite(sigma2):
            raise InfersimError(
                f"lognormal length: std/mean = {spec.std:g}/{spec.mean:g} is too large"
            )
        raw = rng.lognormal(math.log(spec.mean) - sigma2 / 2, math.sqrt(sigma2), n)
    return np.clip(raw, spec.min, spec.max, out=raw)


def to_tokens(raw: np.ndarray, scale: float) -> np.ndarray:
    """Scaled and rounded to whole tokens, at least 1 (a prompt is never empty and a
    generation request yields at least its first token) and at most MAX_TOKENS (longer
    than any context, so such a request is rejected, not wrapped around in int64)."""
    with np.errstate(over="ignore"):  # raw x scale beyond float64 is inf, clipped below
        tokens = np.rint(raw * scale)
    return np.clip(tokens, 1, MAX_TOKENS).astype(np.int64)


def clip_total(
    prompt: np.ndarray,
    output: np.ndarray,
    max_total: int,
    policy: Literal["output_first", "proportional"],
) -> tuple[np.ndarray, np.ndarray]:
    """Make prompt + output <= max_total, keeping both >= 1.

    output_first: shorten the output (down to 1 token), then the prompt.
    proportional: remove ceil(excess * share) from each, as Vidur and Sarathi-Serve clip
    traces; output_first then settles any token the ceilings and the floor of 1 left over.
    """
    if policy == "proportional":
        total = prompt + output
        excess = np.maximum(total - max_total, 0)
        prompt = np.maximum(prompt - np.ceil(excess * (prompt / total)).astype(np.int64), 1)
        output = np.maximum(output - np.ceil(excess * (output / total)).astype(np.int64), 1)
    output = np.minimum(output, np.maximum(max_total - prompt, 1))
    prompt = np.minimum(prompt, max_total - output)
    return prompt, output


@dataclass(frozen=True)
class LengthSampler:
    """Prompt and output lengths of a workload, with its trace columns already read."""

    prompt: LengthSource
    output: LengthSource
    prompt_scale: float = 1.0
    output_scale: float = 1.0
    max_total_tokens: int | None = None
    max_total_policy: Literal["output_first", "proportional"] = "output_first"

    def sample(
        self, rng_prompt: np.random.Generator, rng_output: np.random.Generator, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """n (prompt, output) int64 token counts, each on its own random stream."""
        prompt_rows = _rows(self.prompt, rng_prompt, n)
        output_rows = prompt_rows if self._paired() else _rows(self.output, rng_output, n)
        prompt = to_tokens(_raw(self.prompt, rng_prompt, n, prompt_rows), self.prompt_scale)
        output = to_tokens(_raw(self.output, rng_output, n, output_rows), self.output_scale)
        if self.max_total_tokens is not None:
            prompt, output = clip_total(
                prompt, output, self.max_total_tokens, self.max_total_policy
            )
        return prompt, output

    def _paired(self) -> bool:
        p, o = self.prompt, self.output
        return (
            isinstance(p, TableLengths)
            and isinstance(o, TableLengths)
            and p.source == o.source
            and not (p.aligned or o.aligned)
        )


def _rows(source: LengthSource, rng: np.random.Generator, n: int) -> np.ndarray | None:
    """Trace rows to read: in order for a replay, drawn with replacement otherwise."""
    if not isinstance(source, TableLengths):
        return None
    if source.aligned:
        return np.arange(n)
    return rng.integers(0, len(source.values), size=n)


def _raw(
    source: LengthSource, rng: np.random.Generator, n: int, rows: np.ndarray | None
) -> np.ndarray:
    if isinstance(source, TableLengths):
        return source.values[rows]
    return draw(source, rng, n)
