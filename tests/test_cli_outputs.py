"""What a CI reads from infersim: exit codes, and output folders and files that are
refused before simulating when they cannot be written, never half-written, never shared
by two commands, and never holding an earlier command's results."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simulator.cli.main import main
from simulator.cli.outputs import free_results_dir
from tests.conftest import scenario_dict

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def small(tmp_path: Path, name: str = "s.yaml", **sections) -> Path:
    return write(tmp_path / name, scenario_dict(workload={"num_requests": 20}, **sections))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *needles: str) -> None:
    assert err.startswith("infersim: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


# ---- a path that cannot take the results: one line, exit 2, before simulating ---------------
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "{s}", "-o", "afile/sub"], "-o afile/sub: cannot write there: Not a directory"),
        (["run", "{s}", "-o", "/proc/foo"], "-o /proc/foo: cannot write there"),
        (["run", "{s}", "--trace-out", "afile/t.json", "--set", "output.step_table=true"],
         "--trace-out afile/t.json: cannot write there"),
        (["run", "{s}", "--bench-json", "/proc/b.json"], "--bench-json /proc/b.json: cannot"),
        (["compare", "{s}", "{s2}", "-o", "afile/sub"], "-o afile/sub: cannot write there"),
        (["sweep", "{g}", "-o", "afile/sub", "--workers", "1"], "-o afile/sub: cannot write"),
        (["plan", "{p}", "-o", "afile/sub", "--workers", "1"], "-o afile/sub: cannot write"),
        (["roofline", "--gpu", "l4", "--op", "gemm", "--m", "8", "--n", "8", "--k", "8",
          "--output", "afile/x.csv"], "--output afile/x.csv: cannot write there"),
        (["roofline", "--gpu", "l4", "--op", "gemm", "--m", "8", "--n", "8", "--k", "8",
          "--plot", "afile/x.png"], "--plot afile/x.png: cannot write there"),
        (["calibrate", "fit", "nowhere", "-o", "afile/p.yaml"], "-o afile/p.yaml: cannot write"),
    ],
)  # fmt: skip
def test_an_output_path_that_cannot_be_written_is_refused_before_simulating(
    tmp_path, capsys, monkeypatch, argv, needle
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file, not a folder")
    paths = {
        "s": small(tmp_path),
        "s2": small(tmp_path, "s2.yaml", seed=4),
        "g": write(tmp_path / "g.yaml", {**scenario_dict(), "sweep": {"grid": {"seed": [1, 2]}}}),
        "p": write(tmp_path / "p.yaml", scenario_dict(slo={"ttft_ms": 900}, plan={"gpus": ["l4"]})),
    }  # fmt: skip
    quiet = ["--quiet"] if argv[0] in ("run", "compare", "sweep", "plan") else []
    code, out, err = run(capsys, *(a.format(**paths) for a in argv), *quiet)
    assert code == 2
    one_error_line(err, needle)
    assert out == ""  # nothing was simulated (a run prints its summary when it ends)
    assert not (tmp_path / "results").exists()


def test_a_full_disk_while_writing_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    """Not `internal error ... please report it` (exit 3); and no summary.json says the
    half-written run is complete."""
    import simulator.metrics.parquet

    def full(table, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(simulator.metrics.parquet, "write_parquet", full)
    out = tmp_path / "out"
    code, _, err = run(capsys, "run", str(small(tmp_path)), "-o", str(out), "--quiet")
    assert code == 2
    one_error_line(err, f"{out / 'requests.parquet'}: No space left on device")
    assert not (out / "summary.json").exists()


# ---- the default folder ---------------------------------------------------------------------
def test_the_default_results_folder_is_reserved_when_chosen(tmp_path):
    """Two commands started together each get their own folder, the second results/<name>-2,
    instead of both choosing results/<name> and the later one refusing its finished run."""
    first = free_results_dir("sc", tmp_path / "results")
    second = free_results_dir("sc", tmp_path / "results")
    assert (first.name, second.name) == ("sc", "sc-2")
    assert first.is_dir() and second.is_dir()


def test_a_default_folder_a_failed_command_made_is_removed_again(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = small(tmp_path, model={"name": "llama-2-70b"}, hardware={"gpu": "l4"})
    code, _, err = run(capsys, "run", str(path), "--quiet")
    assert code == 2 and "does not fit" in err
    assert list((tmp_path / "results").iterdir()) == []


# ---- SIGTERM --------------------------------------------------------------------------------
def test_sigterm_ends_a_sweeps_worker_processes_too(tmp_path):
    """SIGTERM (a CI's timeout) is handled as ^C: the pool's workers are ended, not left
    running after infersim exits."""
    psutil = pytest.importorskip("psutil")
    data = scenario_dict(workload={"num_requests": 50_000})
    data["sweep"] = {"grid": {"seed": [1, 2, 3, 4]}}
    path = write(tmp_path / "s.yaml", data)
    argv = ["sweep", str(path), "-o", str(tmp_path / "out"), "--workers", "2", "--quiet"]
    command = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli.main", *argv],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        workers = _pool_workers(psutil.Process(command.pid))
        command.send_signal(signal.SIGTERM)
        _, err = command.communicate(timeout=60)
    finally:
        command.kill()
    assert command.returncode == 128 + signal.SIGTERM
    assert err.strip().endswith("infersim: terminated")
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert alive == []


def _pool_workers(parent, timeout: float = 60.0) -> list:
    """The workers of `parent`'s process pool (children of its forkserver), once running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in parent.children():
            if "forkserver" in " ".join(child.cmdline()) and len(child.children()) >= 2:
                return child.children()
        time.sleep(0.05)
    raise AssertionError("no pool workers appeared")


# ---- variants -------------------------------------------------------------------------------
VARIANTS = {"small": {"serving.max_num_seqs": 16}, "big": {"model.name": "llama-2-70b"}}


def test_run_builds_every_variant_before_any_simulates(tmp_path, capsys):
    """A later variant that cannot start stops the run before the earlier ones have run and
    written their folders."""
    path = write(tmp_path / "v.yaml", {**scenario_dict(), "variants": VARIANTS})
    code, out, err = run(capsys, "run", str(path), "-o", str(tmp_path / "out"), "--quiet")
    assert code == 2
    one_error_line(err, f"{path}: variant big: ", "does not fit")
    assert out == "" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--bench-json", "--trace-out"])
def test_a_variants_export_file_is_not_replaced_without_overwrite(tmp_path, capsys, flag):
    variants = {"a": {"serving.max_num_seqs": 8}, "b": {"serving.max_num_seqs": 16}}
    data = scenario_dict(workload={"num_requests": 20}, variants=variants)
    data["output"] = {**data["output"], "step_table": True}
    path = write(tmp_path / "v.yaml", data)
    kept = tmp_path / "x-b.json"
    kept.write_text("an earlier run's")
    argv = ["run", str(path), "-o", str(tmp_path / "out"), flag, str(tmp_path / "x.json")]
    code, out, err = run(capsys, *argv, "--quiet")
    assert code == 2 and out == ""
    one_error_line(err, f"{flag} {kept}: exists; pass --overwrite or another name")
    assert kept.read_text() == "an earlier run's"


def test_calibrate_fit_does_not_replace_a_profile_without_overwrite(tmp_path, capsys):
    profile = tmp_path / "p.yaml"
    profile.write_text("an earlier fit")
    code, _, err = run(capsys, "calibrate", "fit", str(tmp_path), "-o", str(profile))
    assert code == 2
    one_error_line(err, f"-o {profile}: exists; pass --overwrite or another name")
    assert profile.read_text() == "an earlier fit"


# ---- exit codes -----------------------------------------------------------------------------
def test_the_exit_codes_are_in_the_help_and_the_readme(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    shown = capsys.readouterr().out
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    for code in ("0", "1", "2", "3", "130", "143"):
        assert f"\n  {code} " in shown.split("exit codes:")[1] or f"{code}: " in shown, code
        assert f"| {code} |" in section, code


# ---- --overwrite ------------------------------------------------------------------------------
def test_overwrite_removes_what_an_earlier_command_wrote_and_nothing_else(tmp_path, capsys):
    """An earlier compare's subfolders, or a sweep's points/ and sweep.parquet, do not
    outlive the run that replaced them; a file infersim did not write stays."""
    out = tmp_path / "out"
    variants = {"a": {"serving.max_num_seqs": 8}, "b": {"serving.max_num_seqs": 16}}
    with_variants = small(tmp_path, "v.yaml", variants=variants)
    grid = write(tmp_path / "g.yaml", {**scenario_dict(workload={"num_requests": 20}),
                                       "sweep": {"grid": {"seed": [1, 2]}}})  # fmt: skip
    plain = small(tmp_path)
    for argv in (["run", str(with_variants)], ["sweep", str(grid), "--workers", "1"]):
        assert run(capsys, *argv, "-o", str(out), "--quiet", "--overwrite")[0] == 0
        (out / "notes.txt").write_text("mine")
        (out / "photos").mkdir(exist_ok=True)
        (out / "photos" / "a.jpg").write_text("mine too")
        assert run(capsys, "run", str(plain), "-o", str(out), "--quiet", "--overwrite")[0] == 0
        left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
        assert left == [".infersim-files", "itl.parquet", "notes.txt", "photos", "photos/a.jpg",
                        "requests.parquet", "steps.parquet", "summary.json",
                        "timeseries.parquet"]  # fmt: skip
        assert (out / ".infersim-files").read_text().splitlines() == left[1:2] + left[5:]


def test_overwrite_removes_what_results_write_wrote(tmp_path, capsys):
    """Results.write lists its files in the MANIFEST as the CLI does; a folder a run wrote
    before writers kept one loses the run's own file names, and only those: neither
    outlives the sweep that replaced it (its summary.json and tables stayed beside it)."""
    from simulator.metrics.manifest import MANIFEST
    from simulator.scenario import Scenario
    from simulator.simulation import simulate

    grid = write(tmp_path / "g.yaml", {**scenario_dict(workload={"num_requests": 20}),
                                       "sweep": {"grid": {"seed": [1, 2]}}})  # fmt: skip
    result = simulate(Scenario.from_yaml(small(tmp_path)), progress=False)
    for manifest in (True, False):
        out = tmp_path / f"out{manifest}"
        written = result.write(out, plots=False)
        assert (out / MANIFEST).read_text().splitlines() == sorted(p.name for p in written)
        if not manifest:
            (out / MANIFEST).unlink()
        (out / "notes.txt").write_text("mine")
        assert run(capsys, "sweep", str(grid), "-o", str(out), "--workers", "1", "--quiet",
                   "--overwrite")[0] == 0  # fmt: skip
        assert not (out / "summary.json").exists() and not (out / "requests.parquet").exists()
        assert (out / "sweep.parquet").is_file() and (out / "notes.txt").read_text() == "mine"
        # and Results.write over the sweep removes the sweep's files
        result.write(out, plots=False, overwrite=True)
        assert not (out / "sweep.parquet").exists() and not (out / "points").exists()
        assert "sweep.parquet" not in (out / MANIFEST).read_text()


# ---- what a run says ----------------------------------------------------------------------------
def test_run_of_a_file_with_a_sweep_grid_says_it_runs_the_base_scenario(tmp_path, capsys):
    data = {**scenario_dict(workload={"num_requests": 10}), "sweep": {"grid": {"seed": [1, 2]}}}
    path = write(tmp_path / "g.yaml", data)
    code, _, err = run(capsys, "run", str(path), "-o", str(tmp_path / "out"), "--quiet")
    assert code == 0
    assert f"infersim: warning: {path}: sweep.grid is not run by `infersim run`" in err


def test_a_run_where_no_request_arrived_says_so(tmp_path, capsys):
    """Exit 0, as for any run that ended: arrivals are random, and a short run at a low
    rate may see none; but every figure is empty, which a warning says (stderr and
    summary.json)."""
    workload = {
        "num_requests": None,
        "duration_s": 0.01,
        "arrivals": {"kind": "poisson", "rate_per_s": 0.01},
    }
    path = write(tmp_path / "z.yaml", scenario_dict(workload=workload))
    code, _, err = run(capsys, "run", str(path), "-o", str(tmp_path / "out"), "--quiet")
    assert code == 0
    assert "infersim: warning: no request arrived before the workload stopped" in err
    assert "no request arrived" in (tmp_path / "out" / "summary.json").read_text()


def test_a_scenario_that_is_not_a_regular_file_is_not_called_missing(capsys):
    code, _, err = run(capsys, "run", os.devnull)
    assert code == 2
    one_error_line(err, f"{os.devnull}: not a regular file")
