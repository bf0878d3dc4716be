"""The speed tools in benchmarks/ drive the engine's internals (`Run`, `Results.from_run`),
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


def test_the_sharding_tools_measure_and_compare(tmp_path):
    """process_tree_usage.py times a run over several processes; same_results.py finds
    its results equal to one process's, and names what differs between two runs that
    differ."""
    runs = {}
    for name, extra in (("one", ["--workers", "1"]), ("two", ["--workers", "2"]),
                        ("other", ["--workers", "1", "--set", "seed=7"])):  # fmt: skip
        out = tmp_path / name
        command = [sys.executable, "-m", "simulator.cli.main", "run", *SMALL, "--set",
                   "parallelism.replicas=2", "--set", "parallelism.router=round_robin",
                   "-o", str(out), "--quiet", *extra]  # fmt: skip
        usage = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "process_tree_usage.py"), *command],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert usage.returncode == 0 and "peak RSS summed over processes" in usage.stdout
        runs[name] = out

    def compare(a: str, b: str) -> subprocess.CompletedProcess:
        script = REPO / "benchmarks" / "same_results.py"
        return subprocess.run([sys.executable, str(script), str(runs[a]), str(runs[b])],
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    same = compare("one", "two")
    assert same.returncode == 0 and same.stdout.startswith("same results:")
    differ = compare("one", "other")
    assert differ.returncode == 1 and "summary.json:" in differ.stdout
