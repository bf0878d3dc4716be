"""The scenario file's schema and field reference, generated from its pydantic models.

`scenario_schema()` is the JSON Schema (`infersim schema`), for editors and other tools;
`scenario_reference()` renders the same schema as a markdown field reference (`infersim
schema --format markdown`), committed as docs/SCENARIO_REFERENCE.md. Both come from the
models, so the reference cannot say something the validator does not do: tests/test_docs.py
fails when the committed file differs from a fresh rendering.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from simulator.scenario import Scenario

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
HIDDEN_FIELDS = ("base_dir",)
"""Set by the loader from the scenario file's folder; never written by hand."""
REGENERATE = "infersim schema --format markdown > docs/SCENARIO_REFERENCE.md"

Schema = Mapping[str, Any]


class _FactoryDefaults(GenerateJsonSchema):
    """Pydantic leaves out defaults made by a default_factory; calling the factory makes
    every optional field state what it defaults to (a whole section, the one priority
    class, an empty mapping)."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()
        return super().get_default_value(schema)


def scenario_schema() -> JsonSchemaValue:
    """The JSON Schema (draft 2020-12) a scenario file satisfies, with every default."""
    schema = Scenario.model_json_schema(schema_generator=_FactoryDefaults)
    for name in HIDDEN_FIELDS:
        schema["properties"].pop(name, None)
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


# ---- markdown -------------------------------------------------------------------------------

_INTRO = f"""\
# Scenario file reference

<!-- Generated from the pydantic models: do not edit. Regenerate with
     `{REGENERATE}`; tests/test_docs.py fails when this file is stale. -->

Every field a scenario YAML file may hold, section by section. The field column gives the
dotted path that `--set`, `variants` and sweep grids use (`--set serving.max_num_seqs=64`);
`[]` stands for each item of a list. A field marked required has no default; in the
allowed column, x is the value. Unknown keys are errors, reported with the closest known
name. `infersim schema` prints the same schema as JSON Schema for editors. Sweep grid and
variant keys are such paths themselves, so `--set sweep.grid.serving.max_num_seqs=[64,256]`
sets the one grid key `serving.max_num_seqs`. The command line wins over the file, variants
included: a `--set` field is applied again after each variant's changes (with a warning
naming the variant field it beat); a field a sweep grid or `infersim plan` varies is
refused, pointing to the grid key or plan field to give instead.
"""
_HEADER = "| field | type | default | allowed | description |\n|---|---|---|---|---|"


@dataclass(frozen=True)
class _Table:
    """One mapping of the schema: a heading, the model's own description, its fields."""

    path: str
    kind: str | None
    description: str
    rows: list[str]

    def markdown(self) -> str:
        level = "#" * min(2 + self.path.count("."), 4)
        title = f"`{self.path}`" if self.path else "Top level"
        if self.kind is not None:
            title += f", kind `{self.kind}`"
        parts = [f"{level} {title}"]
        if self.description:
            parts.append(self.description)
        parts.append("\n".join([_HEADER, *self.rows]))
        return "\n\n".join(parts)


def _text(description: str) -> str:
    """Docstring-style text as markdown: lines joined, paragraphs kept."""
    paragraphs = description.strip().split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _cell(text: str) -> str:
    return _text(text).replace("\n\n", " ").replace("|", "\\|")


def _value(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def _members(prop: Schema) -> list[Schema]:
    """The alternatives of a field that may also be null, without the null."""
    return [m for m in prop.get("anyOf", [prop]) if m.get("type") != "null"]


def _type(prop: Schema) -> str:
    if "$ref" in prop:
        return "mapping"
    if "oneOf" in prop:
        return f"mapping (by `{prop['discriminator']['propertyName']}`)"
    if "anyOf" in prop:
        return " or ".join(_type(m) for m in prop["anyOf"])
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items") or {}
        return f"list of {_type(items)}" if items else "list"
    if kind == "object":
        values = prop.get("additionalProperties")
        return f"mapping of string to {_type(values)}" if isinstance(values, dict) else "mapping"
    return kind or "any"


def _bounds(prop: Schema) -> str:
    low = next(((f"{prop[k]}", op) for k, op in (("minimum", "<="), ("exclusiveMinimum", "<"))
                if k in prop), None)  # fmt: skip
    high = next(((f"{prop[k]}", op) for k, op in (("maximum", "<="), ("exclusiveMaximum", "<"))
                 if k in prop), None)  # fmt: skip
    if low and high:
        return f"{low[0]} {low[1]} x {high[1]} {high[0]}"
    if low:
        return f"x {'>=' if low[1] == '<=' else '>'} {low[0]}"
    if high:
        return f"x {high[1]} {high[0]}"
    return ""


def _allowed(prop: Schema) -> str:
    if "oneOf" in prop:
        kinds = prop["discriminator"]["mapping"]
        return "kind: " + ", ".join(f"`{k}`" for k in kinds)
    found = []
    for member in _members(prop):
        if "oneOf" in member:
            found.append(_allowed(member))
        if "enum" in member:
            found.append(", ".join(_value(v) for v in member["enum"]))
        if "const" in member:
            found.append(_value(member["const"]))
        if bounds := _bounds(member):
            found.append(bounds)
        for key, unit in (("minLength", "characters"), ("minItems", "items"),
                          ("minProperties", "entries")):  # fmt: skip
            if key in member:
                found.append(f">= {member[key]} {unit}")
        if "pattern" in member:
            found.append(f"matches `{member['pattern']}`")
        if member.get("type") == "array" and (each := _allowed(member.get("items") or {})):
            found.append(f"each: {each}")
    return "; ".join(found)


def _default(prop: Schema, required: bool) -> str:
    if required:
        return "required"
    if "default" not in prop:
        return ""
    if all("$ref" in m for m in _members(prop)) and prop["default"] is not None:
        return "defaults below"
    return _value(prop["default"])


def _row(path: str, prop: Schema, required: bool, defs: Schema) -> str:
    description = prop.get("description")
    if description is None and "$ref" in prop:
        description = _resolve(prop, defs).get("description", "")
    cells = (f"`{path}`", _type(prop), _default(prop, required), _allowed(prop),
             _cell(description or ""))  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _resolve(prop: Schema, defs: Schema) -> Schema:
    return defs[prop["$ref"].rsplit("/", 1)[-1]]


def _tables(
    node: Schema, path: str, defs: Schema, kind: tuple[str, str] | None = None
) -> Iterator[_Table]:
    """This mapping's table, then the tables of the mappings its fields hold, depth first.
    `kind` is (field, value) when the mapping is one member of a union chosen by it."""
    required = set(node.get("required", ()))
    rows, children = [], []
    properties = dict(node.get("properties", {}))
    if kind is not None:  # the discriminator first, then the fields of that kind
        properties = {kind[0]: properties.pop(kind[0]), **properties}
    for name, prop in properties.items():
        dotted = f"{path}.{name}" if path else name
        if kind is not None and name == kind[0]:
            # The discriminator has a default in the model, but a union cannot pick a
            # member without it: it is required, with one allowed value.
            prop = {"type": "string", "const": kind[1], "description": "selects this kind"}
            rows.append(_row(dotted, prop, True, defs))
            continue
        rows.append(_row(dotted, prop, name in required, defs))
        children.extend(_nested(dotted, prop, defs))
    yield _Table(path, kind and kind[1], _text(node.get("description", "")), rows)
    for child_path, child, child_kind in children:
        yield from _tables(child, child_path, defs, child_kind)


def _nested(path: str, prop: Schema, defs: Schema) -> Iterator[tuple[str, Schema, Any]]:
    """(path, mapping schema, kind) of each mapping a field may hold."""
    for member in _members(prop):
        if "$ref" in member:
            yield path, _resolve(member, defs), None
        elif "oneOf" in member:
            field = member["discriminator"]["propertyName"]
            for option in member["oneOf"]:
                resolved = _resolve(option, defs)
                yield path, resolved, (field, resolved["properties"][field]["const"])
        elif member.get("type") == "array" and "$ref" in member.get("items", {}):
            yield f"{path}[]", _resolve(member["items"], defs), None


def scenario_reference() -> str:
    """docs/SCENARIO_REFERENCE.md: every field with its type, default, allowed values and
    description, one table per section and per kind of a union."""
    schema = scenario_schema()
    defs = schema.get("$defs", {})
    tables = [table.markdown() for table in _tables(schema, "", defs)]
    return "\n\n".join([_INTRO.rstrip("\n"), *tables]) + "\n"
