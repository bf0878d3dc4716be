"""Dict fields of frozen models that refuse changes in place.

A loaded GPU preset is one object shared by every run of the process (presets.load_gpu
reads each file once per version), and operator costs, a chip's hash and object_memo's
entries are kept per object, so a frozen model's contents must never change. pydantic's
`frozen` refuses `gpu.sm_count = ...` but not `gpu.tensor_flops_per_core_per_clock[dtype]
*= 2`: the edit reached every later load of the preset and left the caches keyed on it
serving the old figures. A ReadOnlyDict is a dict (pydantic serialises it, and a YAML or
JSON round trip reads it back, as any dict) whose changes raise a TypeError naming the
field and the way to a changed copy. ReadOnlyModel is the base of such models: it freezes
the dict fields after validation and on `model_copy` too, which skips validation (a copy
built with `update={"field": {...}}` held a plain dict, so an edit in place changed the
copy's costs under its memoised hash: object_memo).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn, Self, TypeVar

from pydantic import BaseModel, model_validator

K = TypeVar("K")
V = TypeVar("V")


class ReadOnlyDict(dict[K, V]):
    """A dict whose item changes raise TypeError; `field` names it in the error."""

    __slots__ = ("field",)

    def __init__(self, items: dict[K, V], field: str) -> None:
        super().__init__(items)
        self.field = field

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        name = self.field.rpartition(".")[2]
        raise TypeError(
            f"{self.field} is read-only (a loaded preset or profile is shared by every run "
            f"in the process): build a changed copy, model_copy(update={{{name!r}: {{...}}}})"
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type, tuple[dict[K, V], str]]:
        # pickling and copy.deepcopy rebuild it from a plain dict, not item by item
        return type(self), (dict(self), self.field)


def freeze_dict_fields(model: BaseModel) -> None:
    """Each dict field of a just-validated frozen `model` as a ReadOnlyDict (from its
    after-validator: field validators that return a new dict run before it)."""
    for name, value in list(model.__dict__.items()):
        if type(value) is dict:
            model.__dict__[name] = ReadOnlyDict(value, f"{type(model).__name__}.{name}")


class ReadOnlyModel(BaseModel):
    """A frozen model whose dict fields are ReadOnlyDicts, its copies' too."""

    @model_validator(mode="after")
    def _read_only(self) -> Self:
        """Its tables refuse changes in place: a loaded one is shared by every run."""
        freeze_dict_fields(self)
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's copy (no validation), its dict fields frozen as validation would."""
        copy = super().model_copy(update=update, deep=deep)
        freeze_dict_fields(copy)
        return copy
