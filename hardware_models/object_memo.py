"""What an object's contents imply, worked out once per object while it lives.

A fit prices the same rows (a class's rows, its search sample) for every candidate
efficiency it tries, hundreds of times: the parts of pricing that depend on the rows
alone (distinct shapes, head layouts, expert loads) are the same each time. And a
chip's hash covers its efficiency profile, whose content is costly to read out. Both are
kept per object here. The objects are never modified once built (frames the fit and the
validation only read; frozen pydantic models, whose dict fields refuse changes in place:
hardware_models.read_only), so the object stands for its contents. A changed profile is a
new object (`model_copy(update=...)`), as the fitter builds them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
Obj = TypeVar("Obj")

_MEMO: dict[tuple[int, str], tuple[weakref.ref, object]] = {}


def per_object(obj: Obj, what: str, build: Callable[[Obj], T]) -> T:
    """`build(obj)`, computed once per (object, what) while the object lives."""
    slot = (id(obj), what)
    held = _MEMO.get(slot)
    if held is not None and held[0]() is obj:
        return held[1]  # type: ignore[return-value]
    value = build(obj)
    _MEMO[slot] = (weakref.ref(obj, lambda ref, slot=slot: _forget(slot, ref)), value)
    return value


def _forget(slot: tuple[int, str], ref: weakref.ref) -> None:
    """Drop a dead object's entry (unless the slot already holds a newer object's)."""
    held = _MEMO.get(slot)
    if held is not None and held[0] is ref:
        del _MEMO[slot]
