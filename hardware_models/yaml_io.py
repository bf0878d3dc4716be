"""Safe YAML loading with errors that name the file and line."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hardware_models.errors import InfersimError, describe_validation_error

M = TypeVar("M", bound=BaseModel)


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; never constructs objects from tags."""
    path = Path(path)
    if not path.is_file():
        raise InfersimError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InfersimError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InfersimError(f"{path}:{where}: invalid YAML: {problem}") from None
    if data is None:
        raise InfersimError(f"{path}: file is empty")
    if not isinstance(data, dict):
        raise InfersimError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    return data


def validate_model(model: type[M], data: dict[str, Any], source: str) -> M:
    """Validate `data` as `model`, turning pydantic's error into a one-line InfersimError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InfersimError(describe_validation_error(exc, source)) from None


def unknown_name_error(kind: str, name: str, known: list[str]) -> InfersimError:
    """'unknown gpu 'h10'; did you mean h100-sxm? known: ...'"""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.4)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InfersimError(f"unknown {kind} {name!r}{hint} known: {', '.join(sorted(known))}")
