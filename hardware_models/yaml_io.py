"""Safe YAML loading with errors that name the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hardware_models.errors import InfersimError, describe_validation_error

M = TypeVar("M", bound=BaseModel)


class _Strict:
    """PyYAML's safe loading (no tags that build Python objects), stricter where a silent
    answer would mislead: a key given twice in one mapping is an error, not the last value,
    and an integer Python cannot convert is reported with its line. Mixed into both
    loaders below: the constructors are the same Python code whichever parser feeds them."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = first.setdefault(key, key_node.start_mark)
                except TypeError:  # unhashable: the base class reports it
                    continue
                if earlier is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None,
                        f"duplicate key {key!r} (first given on line {earlier.line + 1})",
                        key_node.start_mark,
                    )  # fmt: skip
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.Node) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError as exc:  # e.g. more digits than int() accepts (4300)
            problem = str(exc).split(";")[0]
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this integer: {problem}", node.start_mark
            ) from None


class _Loader(_Strict, yaml.SafeLoader):
    """The pure-Python parser: its messages are the ones reported."""


class _FastLoader(_Strict, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's parser where PyYAML was built with it, about 8x faster (`calibration:
    auto` reads the four shipped profiles: 45 ms with the pure-Python parser, 6 ms with
    this one), with the same resolver and constructors. Only for the package's own files:
    on those it gives the same data (tests/test_yaml_io.py compares every shipped file),
    but on malformed text the two parsers part (libyaml takes, for one, tabs that PyYAML
    refuses), so what users write is read by `_Loader` alone."""


for _loader in (_Loader, _FastLoader):
    _loader.add_constructor("tag:yaml.org,2002:int", _loader.construct_yaml_int)
    _loader.add_constructor(
        yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _loader.construct_mapping
    )


def _name(path: Path) -> str:
    """A file as messages name it: quoted when its name holds a line break or another
    unprintable character, so that every message stays one line."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def _line_of(data: bytes | str, offset: int) -> int:
    newline = b"\n" if isinstance(data, bytes) else "\n"
    return data.count(newline, 0, offset) + 1


def parse_yaml(text: str, source: str, *, shipped: bool = False) -> Any:
    """YAML text (a file's, or a --set value) as Python data, with the loaders above
    (libyaml's for a `shipped` file of the package); every problem is one InfersimError
    line, `source: line L, column C: invalid YAML: ...`, as the pure-Python parser has it."""
    if shipped:
        try:
            return yaml.load(text, Loader=_FastLoader)  # safe loaders: no Python object tags
        except Exception:  # a shipped file libyaml refuses: reported as below
            pass
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        position = getattr(exc, "position", None)  # reader errors: bad characters
        if mark is not None:
            where = f" line {mark.line + 1}, column {mark.column + 1}:"
        elif position is not None:
            where = f" line {_line_of(text, position)}:"
        else:
            where = ""
        problem = getattr(exc, "problem", None)
        if isinstance(exc, yaml.reader.ReaderError):
            code = exc.character if isinstance(exc.character, int) else ord(exc.character)
            problem = f"unacceptable character #x{code:04x}: {exc.reason}"
        problem = problem or (str(exc).splitlines() or ["unreadable"])[0]
        raise InfersimError(f"{source}:{where} invalid YAML: {problem}") from None
    except RecursionError:
        raise InfersimError(f"{source}: invalid YAML: nested too deeply") from None


def load_yaml_mapping(path: str | Path, *, shipped: bool = False) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; never constructs objects from tags.
    Every problem is one line naming the file, and the line where there is one.
    `shipped`: one of the package's own files (presets, profiles, the model catalog)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.y*ml"))[:5]
        hint = f" (it holds {', '.join(found)}, ...)" if found else ""
        raise InfersimError(f"{_name(path)}: is a folder; give one YAML file in it{hint}")
    if not path.exists():
        raise InfersimError(f"{_name(path)}: no such file")
    if not path.is_file():
        raise InfersimError(f"{_name(path)}: not a regular file (a device, pipe or socket)")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        utf16 = raw.startswith((b"\xff\xfe", b"\xfe\xff"))
        hint = "; it looks like UTF-16, save it as UTF-8" if utf16 else ""
        raise InfersimError(
            f"{_name(path)}: line {_line_of(raw, exc.start)}: not UTF-8 text "
            f"(byte {exc.start}: {raw[exc.start : exc.start + 1]!r}){hint}"
        ) from None
    data = parse_yaml(text, _name(path), shipped=shipped)
    if data is None:
        raise InfersimError(f"{_name(path)}: file is empty")
    if not isinstance(data, dict):
        got = type(data).__name__
        raise InfersimError(f"{_name(path)}: expected a mapping of fields, got {got}")
    return data


def load_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object, or a one-line error naming where it went wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise InfersimError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise InfersimError(
            f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except ValueError as exc:  # an integer of more digits than int() accepts
        raise InfersimError(f"{path}: invalid JSON: {str(exc).split(';')[0]}") from None
    except RecursionError:
        raise InfersimError(f"{path}: invalid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise InfersimError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def validate_model(model: type[M], data: dict[str, Any], source: str) -> M:
    """Validate `data` as `model`, turning pydantic's error into a one-line InfersimError."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InfersimError(describe_validation_error(exc, source)) from None


def unknown_name_error(kind: str, name: str, known: list[str]) -> InfersimError:
    """'unknown gpu 'h10'; did you mean 'h100-sxm'?; known: ...'"""
    hint = did_you_mean(name, known, cutoff=0.4)
    return InfersimError(f"unknown {kind} {name!r}{hint}; known: {', '.join(sorted(known))}")


def did_you_mean(name: str, known: list[str], cutoff: float) -> str:
    """ "; did you mean 'x'?" for the known name closest to `name`, or "" for none within
    `cutoff` (difflib's ratio)."""
    import difflib  # only when input was wrong: a run that reads good files never loads it

    close = difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""
