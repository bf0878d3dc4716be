"""Arguments of the Python API in the shapes analysts pass them, brought to the one shape
a function works with, or refused in one line that names the function and the argument
(an `InfersimError`, not a traceback from deep inside)."""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from hardware_models.errors import InfersimError

if TYPE_CHECKING:
    from hardware_models.accelerator import AcceleratorSpec
    from simulator.architecture import ModelArchitecture
    from simulator.results import Results

_SHOWN_CHARS = 60  # of a refused value in an error
T = TypeVar("T")


def shown(value: Any) -> str:
    """A refused value in an error: its type, and its text when that is short."""
    text = repr(value)
    return type(value).__name__ + (f" {text}" if len(text) <= _SHOWN_CHARS else "")


def named_runs(runs: Any, where: str) -> dict[str, Results]:
    """Runs to compare as name -> Results: a mapping of that, one Results, or a list of
    them, each named after its scenario (names must differ)."""
    from simulator.results import Results

    if isinstance(runs, Results):
        runs = [runs]
    if isinstance(runs, Mapping):
        named = dict(runs)
        labels = {name: f"run {name!r}" for name in named}
    elif isinstance(runs, Iterable) and not isinstance(runs, str | bytes):
        listed = list(runs)
        for i, result in enumerate(listed):
            _check_results(result, f"runs[{i}]", where)
        names = [r.scenario.name for r in listed]
        shared = sorted({n for n in names if names.count(n) > 1})
        if shared:
            raise InfersimError(
                f"{where}: runs share scenario names ({', '.join(map(repr, shared))}); pass "
                "a dict of name -> Results, or name each scenario apart (with_overrides"
                "({'name': ...}))"
            )
        named = dict(zip(names, listed, strict=True))
        labels = {}
    else:
        raise InfersimError(
            f"{where}: expected a dict of name -> Results, a list of Results or one, "
            f"got {shown(runs)}"
        )
    for name, result in named.items():
        _check_results(result, labels.get(name, f"run {name!r}"), where)
    return named


def _check_results(result: Any, what: str, where: str) -> None:
    from simulator.results import Results

    if not isinstance(result, Results):
        raise InfersimError(
            f"{where}: {what}: expected the Results simulate() returns, got "
            f"{shown(result) if not isinstance(result, Mapping) else 'a dict'}"
        )


def positive_int(value: Any, where: str) -> int:
    """A count (tp, replicas, a token budget): a whole number above zero, not its text."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InfersimError(f"{where}: expected a whole number >= 1, got {shown(value)}")
    return int(value)


def model_of(value: Any, where: str) -> ModelArchitecture:
    """A model: a ModelArchitecture, or what load_model takes (a catalog name, a file)."""
    from simulator.architecture import ModelArchitecture
    from simulator.model_catalog import load_model

    what = "a model (load_model's result, a catalog name or a config path)"
    return _given_or_loaded(value, ModelArchitecture, load_model, where, what)


def gpu_of(value: Any, where: str) -> AcceleratorSpec:
    """A GPU: an AcceleratorSpec, or what load_gpu takes (a preset name, a YAML file)."""
    from hardware_models.accelerator import AcceleratorSpec
    from hardware_models.presets import load_gpu

    what = "a GPU (load_gpu's result, a preset name or a YAML path)"
    return _given_or_loaded(value, AcceleratorSpec, load_gpu, where, what)


def _given_or_loaded(
    value: Any, kind: type[T], load: Callable[[Any], T], where: str, what: str
) -> T:
    """`value` when it is a `kind` already, else what `load` makes of a name or path."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, str | os.PathLike):
        raise InfersimError(f"{where}: expected {what}, got {shown(value)}")
    try:
        return load(value)
    except InfersimError as exc:
        raise InfersimError(f"{where}: {exc}") from None
