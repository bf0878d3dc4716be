"""The notebooks run top to bottom in a fresh kernel, and are committed without outputs.

Executing them is the only way to know the examples still match the API; outputs stay
out of git so that diffs show code changes, not re-rendered plots. Each notebook runs
with its kernel started in notebooks/, as Jupyter starts it (so its paths are relative to
that folder), and is never written back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300  # notebook 02 runs its 54-point grid (180 s of traffic each) in one cell


def _require_kernel() -> None:
    """Skip, saying why, where a notebook cannot be executed."""
    for package in ("nbformat", "nbclient"):
        pytest.importorskip(package, reason=f"{package} not installed (pip install -e '.[test]')")
    pytest.importorskip(
        "ipykernel",
        reason="ipykernel missing or broken, so no kernel can start (pip install -e '.[test]')",
        exc_type=ImportError,
    )


def test_notebooks_exist():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb files"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path: Path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    dirty = [
        i
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "code" and (cell["outputs"] or cell["execution_count"] is not None)
    ]
    assert not dirty, (
        f"{path.name}: cells {dirty} hold outputs; clear them before committing "
        "(in Jupyter: Edit > Clear Outputs of All Cells, then save)"
    )


# The quickstart runs in the default test run (12 s); the others take 20-40 s each on 2
# busy cores and run with -m slow.
QUICK = {"01_quickstart.ipynb"}
EXECUTED = [
    path if path.name in QUICK else pytest.param(path, marks=pytest.mark.slow) for path in NOTEBOOKS
]


def _execute(path: Path):
    """`path` run top to bottom in a fresh kernel started in notebooks/; the executed copy."""
    _require_kernel()
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},  # where Jupyter starts it
    )
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}", pytrace=False)
    return notebook


@pytest.mark.parametrize("path", EXECUTED, ids=lambda p: p.name)
def test_notebook_runs(path: Path):
    _execute(path)


def _output_texts(notebook) -> list[str]:
    return [
        "".join(output.get("text") or output.get("data", {}).get("text/markdown", ""))
        for cell in notebook.cells
        for output in cell.get("outputs", [])
    ]


@pytest.mark.slow
def test_the_moe_notebook_runs_deepseek_in_its_checkpoints_format_and_says_the_calibration():
    notebook = _execute(ROOT / "notebooks" / "06_moe_serving.ipynb")
    texts = "\n".join(_output_texts(notebook))
    assert "checkpoint is stored in" not in texts  # no re-quantised DeepSeek-V3
    assert "deepseek-v3 (fp8_block, tp=8" in texts
    table = next(c for c in notebook.cells if "calibrations" in c.source).outputs[0]
    assert "calibration" in table["data"]["text/plain"]
    assert {"h100-sxm", "none"} <= set(table["data"]["text/plain"].split())


@pytest.mark.slow
def test_the_calibration_notebook_says_when_it_runs_without_the_public_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Its text quotes the public tables' figures: on any other source the run must say
    # that its results are not those, not quietly show them under that text.
    monkeypatch.setenv("INFERSIM_SHARED_DATA", str(tmp_path / "none"))  # the kernel inherits it
    notebook = _execute(ROOT / "notebooks" / "05_calibration.ipynb")
    texts = _output_texts(notebook)
    warning = [t for t in texts if "InfersimWarning: notebook 05 runs on" in t]
    assert warning and "not the figures its text quotes" in warning[0]
    assert sum("not the figures the text quotes" in t for t in texts) == 3
