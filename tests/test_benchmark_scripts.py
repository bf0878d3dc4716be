"""The speed tools in benchmarks/ drive the engine's internals (`_Run`, `Results.from_run`),
so a change there can break them without any other test noticing: run each on a small
scenario."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMALL = ["scenarios/quickstart.yaml", "--set", "workload.num_requests=40"]


@pytest.mark.parametrize(
    ("script", "extra", "expected"),
    [
        ("perf_phases.py", ["--out", "{tmp}"], "| loop |"),
        ("perf_calls.py", [], "| method | calls |"),
    ],
)
def test_the_speed_tools_run(script, extra, expected, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *SMALL, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert expected in out.stdout
