"""A module's private names (leading underscore) stay in it: a name another module needs
is public, so a reader sees what a module offers and can change the rest freely (review
14, item 12: traces._name, executors._job_error, trace_layouts._shown were imported)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simulator", "hardware_models")


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_another_modules_private_name(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    assert [line for path in files for line in _private_imports(path)] == []
