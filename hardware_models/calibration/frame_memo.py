"""What a table's rows say about their shapes, worked out once per frame.

A fit prices the same rows (a class's rows, its search sample) for every candidate
efficiency it tries, hundreds of times; the parts of pricing that depend on the rows
alone (distinct shapes, head layouts, expert loads) are the same each time. `per_frame`
keeps them for as long as the frame lives. Frames are never modified after they are
built here (the fit and the validation only read them), so the frame object stands for
its contents.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

import pandas as pd

T = TypeVar("T")

_MEMO: dict[tuple[int, str], tuple[weakref.ref, object]] = {}


def per_frame(frame: pd.DataFrame, what: str, build: Callable[[pd.DataFrame], T]) -> T:
    """`build(frame)`, computed once per (frame, what) while the frame lives."""
    slot = (id(frame), what)
    held = _MEMO.get(slot)
    if held is not None and held[0]() is frame:
        return held[1]  # type: ignore[return-value]
    value = build(frame)
    _MEMO[slot] = (weakref.ref(frame, lambda _ref, slot=slot: _forget(slot, _ref)), value)
    return value


def _forget(slot: tuple[int, str], ref: weakref.ref) -> None:
    """Drop a dead frame's entry (unless the slot already holds a newer frame's)."""
    held = _MEMO.get(slot)
    if held is not None and held[0] is ref:
        del _MEMO[slot]
