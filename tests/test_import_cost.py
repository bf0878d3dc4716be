"""A command pays only for what it uses: which modules `infersim --help`, `import
simulator` and `infersim run` load, checked in a fresh interpreter (sys.modules), not
timed, so these fail when an eager import comes back whatever the machine's speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hardware_models
from simulator.cli.main import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "pyarrow", "matplotlib", "hardware_models.calibration")


def loaded_after(
    code: str, watched: tuple[str, ...] = (*HEAVY, "numpy", "numpy.ma", "pydantic", "simpy")
) -> list[str]:
    """Which of `watched` `code` leaves in sys.modules."""
    listing = f"print(json.dumps([m for m in {watched!r} if m in sys.modules]))"
    probe = f"{code}\nimport sys, json\n{listing}"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_help_loads_no_library():
    code = (
        "from simulator.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    )
    assert loaded_after(code) == []


def test_import_simulator_and_errors_load_no_library():
    assert loaded_after("import simulator, hardware_models, hardware_models.errors") == []


def test_run_loads_no_pandas_plotting_or_calibration(tmp_path):
    """A run that writes its tables and exports (overwriting an earlier run) summarises
    and writes them from numpy columns: pyarrow, but no pandas."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # an earlier run: --overwrite clears it
    files = ["-o", str(out), "--trace-out", str(tmp_path / "t.json")]
    files += ["--bench-json", str(tmp_path / "b.json")]
    code = (
        "from simulator.cli.main import main\n"
        f"main(['run', 'scenarios/quickstart.yaml', *{files!r}, '--overwrite', "
        "'--quiet', '--no-plots', '--set', 'workload.num_requests=60'])"
    )
    loaded = loaded_after(code)
    assert "pyarrow" in loaded  # it wrote Parquet files
    for heavy in ("pandas", "matplotlib", "hardware_models.calibration"):
        assert heavy not in loaded
    assert len((out / "summary.json").read_text()) > 2  # it did run
    assert {p.name for p in out.iterdir()} >= {"requests.parquet", "steps.parquet"}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_subcommand_still_has_its_arguments(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert f"usage: infersim {command}" in capsys.readouterr().out


@pytest.mark.parametrize("package", ["simulator", "hardware_models"])
def test_dir_of_a_package_lists_its_public_api_alone(package):
    """Not the module's own imports (TYPE_CHECKING, annotations, lazy_names)."""
    module = __import__(package)
    assert dir(module) == sorted(module.__all__)


def test_hardware_models_names_resolve_lazily():
    for name in hardware_models.__all__:
        assert getattr(hardware_models, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hardware_models.nope  # noqa: B018


def test_a_plain_run_loads_no_masked_arrays(tmp_path):
    """A run with enough arrivals for the overload verdict's trend (50) summarises
    without numpy.ma (np.median's NaN check imports it: 7 ms), and loads nothing for
    what it was not asked to do."""
    code = (
        "from simulator.cli.main import main\n"
        f"main(['run', 'scenarios/quickstart.yaml', '-o', {str(tmp_path)!r}, '--quiet', "
        "'--no-plots', '--set', 'workload.num_requests=60'])"
    )
    unused = ("numpy.ma", "html", "difflib", "simulator.display", "simulator.formats.vllm_bench")
    assert loaded_after(code, unused) == []  # nor a notebook's HTML, typo hints, bench JSON
    assert "queue_growth_per_s" in (tmp_path / "summary.json").read_text()  # the trend ran


def test_the_program_freezes_what_its_imports_made():
    """`infersim` (main() reading sys.argv) imports with the collector off and hands the
    objects its imports made to gc.freeze, so that collections skip them, and turns the
    collector back on for the command; main() called in-process with its own arguments
    (tests, notebooks) leaves the caller's collector alone."""
    code = (
        "import gc, sys\n"
        "from simulator.cli.main import main\n"
        "unfrozen = []  # collections while nothing was frozen\n"
        "gc.callbacks.append(lambda phase, info: unfrozen.append(gc.get_freeze_count() == 0))\n"
        "main(['models'])\n"
        "counts = [gc.get_freeze_count(), gc.isenabled()]\n"
        "sys.argv = ['infersim', 'run', '--help']  # imports pydantic, SimPy, the simulator\n"
        "unfrozen.clear()\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(*counts, gc.get_freeze_count(), gc.isenabled(), sum(unfrozen))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    fields = result.stdout.strip().splitlines()[-1].split()
    assert fields[:2] == ["0", "True"]  # in-process: nothing frozen, collector as it was
    assert int(fields[2]) > 10_000  # modules, classes, pydantic validators
    assert fields[3] == "True"  # on again for the command (here --help ended it)
    assert fields[4] == "0"  # no collection while `run`'s modules loaded
