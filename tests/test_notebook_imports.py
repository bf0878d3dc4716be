"""The notebooks use the documented API only (review 14, item 9: they imported a CLI
module's helper, `simulator.sizing` and the calibration package's internals): every name
a notebook imports from infersim is one the docs name, from a module that is not a CLI
command's, and every `sim.X` is in `simulator.__all__`."""

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import simulator

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DOCS = "\n".join(
    p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
)


def _code(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    lines = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    kept = [line for line in lines.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return "\n".join(kept)


def _documented(name: str) -> bool:
    return re.search(rf"`[\w.]*\b{re.escape(name)}[`(\[]", DOCS) is not None


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_imports_documented_names_only(notebook):
    code = _code(notebook)
    wrong = []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        if node.module.split(".")[0] not in ("simulator", "hardware_models"):
            continue
        module = importlib.import_module(node.module)
        for alias in node.names:
            if node.module.startswith("simulator.cli") or alias.name.startswith("_"):
                wrong.append(f"{node.module}.{alias.name}: not public")
            elif not hasattr(module, alias.name):
                wrong.append(f"{node.module}.{alias.name}: missing")
            elif not _documented(alias.name):
                wrong.append(f"{node.module}.{alias.name}: not in README or docs/")
    used = sorted(set(re.findall(r"\bsim\.(\w+)", code)))
    wrong += [f"sim.{n}: not in simulator.__all__" for n in used if n not in simulator.__all__]
    assert wrong == []
