"""The package's own YAML files are read with libyaml, everything else with PyYAML's
pure-Python parser: the two give the same data on every shipped file, and part on
malformed text, where the pure-Python parser's verdict and message stand."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hardware_models.errors import InfersimError
from hardware_models.presets import PRESET_DIR
from hardware_models.yaml_io import _FastLoader, _Loader, parse_yaml
from simulator.model_catalog import CATALOG_DIR

SHIPPED = sorted([*PRESET_DIR.rglob("*.yaml"), *CATALOG_DIR.rglob("*.yaml")])
needs_libyaml = pytest.mark.skipif(
    not yaml.__with_libyaml__, reason="PyYAML built without libyaml: one parser only"
)


@needs_libyaml
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_every_shipped_file_reads_the_same_with_both_parsers(path: Path):
    text = path.read_text(encoding="utf-8")
    fast, python = yaml.load(text, Loader=_FastLoader), yaml.load(text, Loader=_Loader)
    assert repr(fast) == repr(python)  # repr: 1 and 1.0 differ, as do key orders


def test_shipped_files_are_found():
    assert len([p for p in SHIPPED if "calibrations" in p.parts]) >= 4
    assert any(p.parent == CATALOG_DIR for p in SHIPPED)


@needs_libyaml
def test_what_users_write_is_read_by_the_pure_python_parser():
    """libyaml takes a tab inside a plain scalar; PyYAML refuses it, and so does infersim
    for a user's file or --set value."""
    assert yaml.load("a: b\tc\n", Loader=_FastLoader) == {"a": "b\tc"}
    with pytest.raises(InfersimError, match=r"^x\.yaml: line 1, column 5: invalid YAML"):
        parse_yaml("a: b\tc\n", "x.yaml")


@pytest.mark.parametrize(
    "text", ["{a: 1, a: 2}", "9" * 5000, "a: *nope\n", "[1, 2", "a\x00", "name: x\n\tseed: 1\n"]
)
def test_a_shipped_file_libyaml_refuses_is_reported_as_pyyaml_words_it(text: str):
    with pytest.raises(InfersimError) as python:
        parse_yaml(text, "f.yaml")
    with pytest.raises(InfersimError) as shipped:
        parse_yaml(text, "f.yaml", shipped=True)
    assert str(shipped.value) == str(python.value)
