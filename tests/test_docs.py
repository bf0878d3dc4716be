"""Documentation that cannot drift from the code: the scenario reference is regenerated and
compared, `infersim schema` works in both formats, and every public name is documented."""

from __future__ import annotations

import difflib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import simulator
from simulator.cli.main import main
from simulator.schema_docs import REGENERATE, scenario_reference, scenario_schema
from simulator.workload.config import ARRIVAL_KINDS, LENGTH_KINDS

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "SCENARIO_REFERENCE.md"
API = ROOT / "docs" / "API.md"


def test_scenario_reference_is_up_to_date():
    committed = REFERENCE.read_text(encoding="utf-8")
    fresh = scenario_reference()
    if committed != fresh:
        diff = difflib.unified_diff(
            committed.splitlines(), fresh.splitlines(), "committed", "generated", lineterm=""
        )
        shown = "\n".join(list(diff)[:40])
        pytest.fail(
            f"docs/SCENARIO_REFERENCE.md differs from the scenario models; regenerate it "
            f"from the repository root with\n    {REGENERATE}\n{shown}",
            pytrace=False,
        )


def test_reference_lists_every_field_and_kind():
    reference = scenario_reference()
    paths = re.findall(r"^\| `([^`]+)` \|", reference, flags=re.M)
    leaves = {path.rsplit(".", 1)[-1] for path in paths}
    schema = scenario_schema()
    for name, definition in [("Scenario", schema), *schema["$defs"].items()]:
        missing = set(definition.get("properties", {})) - leaves
        assert not missing, f"{name}: fields {sorted(missing)} missing from the reference"
    for kind in ARRIVAL_KINDS:
        assert f"### `workload.arrivals`, kind `{kind}`" in reference
    for kind in LENGTH_KINDS:
        assert f"### `workload.prompt_tokens`, kind `{kind}`" in reference
        assert f"### `workload.output_tokens`, kind `{kind}`" in reference
    assert "base_dir" not in reference  # set by the loader, not by users


def test_schema_command_markdown(capsys):
    assert main(["schema", "--format", "markdown"]) == 0
    assert capsys.readouterr().out == scenario_reference()


def test_schema_command_json(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].endswith("2020-12/schema")
    assert {"hardware", "model", "workload"} <= set(schema["properties"])
    assert {"model", "workload"} <= set(schema["required"])
    serving = schema["$defs"]["ServingSection"]["properties"]
    assert serving["policy"]["default"] == "chunked_prefill"
    assert schema["properties"]["parallelism"]["default"]["replicas"] == 1  # factory default


def test_every_scenario_file_satisfies_the_json_schema():
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(scenario_schema())
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(data)]
        assert not errors, f"{path.name}: {errors}"


def test_every_public_name_is_documented_in_api_md():
    text = API.read_text(encoding="utf-8")
    undocumented = [
        name
        for name in simulator.__all__
        if not re.search(rf"`(?:sim\.)?{re.escape(name)}[`(]", text)
    ]
    assert not undocumented, f"docs/API.md does not mention {undocumented}"


def test_every_public_name_resolves():
    for name in simulator.__all__:
        assert getattr(simulator, name) is not None
        assert name in dir(simulator)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        simulator.nope  # noqa: B018


def test_import_simulator_loads_nothing_heavy():
    """`import simulator` must stay cheap for the CLI and a notebook's first cell."""
    # hardware_models itself is as lazy (its names load on first use): its models are not.
    heavy = ("matplotlib", "pandas", "simpy", "pydantic", "numpy", "hardware_models.accelerator")
    probe = f"import simulator, sys; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"
