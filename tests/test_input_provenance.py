"""Results that pin their inputs and not the folder they ran in: the same scenario in two
folders writes the same summary.json, and provenance.inputs holds each file's sha256."""

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest

from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.presets import calibration_path
from simulator.metrics.writer import summary_json
from simulator.model_catalog import CATALOG_DIR
from simulator.provenance import named_from
from simulator.scenario import Scenario
from simulator.simulation import simulate
from simulator.sweep import sweep
from tests.conftest import scenario_dict

PRESETS = Path(__file__).resolve().parents[1] / "hardware_models" / "presets"

# BurstGPT's columns; the row with 0 response tokens is left out, and a warning names the file
TRACE = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
0,GPT-4,100,10,110,API log
1,GPT-4,200,0,220,API log
2,GPT-4,300,20,220,API log
"""

SCENARIO = """name: inputs
seed: 1
hardware: {gpu: gpus/mine.yaml, node: node.yaml, calibration: profile.yaml}
model: {name: models/m.yaml}
workload:
  arrivals: {kind: trace, path: t0.csv}
output: {progress: false}
"""


def _checkout(folder: Path) -> Path:
    """The scenario with its own trace, GPU file and calibration profile in `folder`."""
    (folder / "gpus").mkdir(parents=True)
    (folder / "t0.csv").write_text(TRACE)
    shutil.copy(PRESETS / "gpus" / "h100-sxm.yaml", folder / "gpus" / "mine.yaml")
    shutil.copy(calibration_path("h100-sxm"), folder / "profile.yaml")
    shutil.copy(PRESETS / "nodes" / "dgx-h100.yaml", folder / "node.yaml")
    (folder / "models").mkdir()
    shutil.copy(CATALOG_DIR / "llama-3.1-8b.yaml", folder / "models" / "m.yaml")
    (folder / "s.yaml").write_text(SCENARIO)
    return folder / "s.yaml"


def _summary(path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InfersimWarning)
        return simulate(Scenario.from_yaml(path)).summary()


def test_the_same_scenario_in_two_folders_gives_the_same_summary(tmp_path):
    a, b = _summary(_checkout(tmp_path / "a")), _summary(_checkout(tmp_path / "b"))
    assert summary_json(a, include_wall_time=False) == summary_json(b, include_wall_time=False)
    assert str(tmp_path) not in summary_json(a, include_wall_time=False)
    assert any(w.startswith("t0.csv: 1 of its 3 rows left out") for w in a["warnings"])
    assert a["run"]["calibrations"][0].startswith("h100-sxm: profile.yaml (")


def test_provenance_pins_each_input_files_contents(tmp_path):
    scenario = _checkout(tmp_path)
    inputs = _summary(scenario)["provenance"]["inputs"]
    read = {"model.name": "models/m.yaml", "hardware.gpu": "gpus/mine.yaml",
            "hardware.node": "node.yaml", "hardware.calibration": "profile.yaml",
            "workload.arrivals.path": "t0.csv"}  # fmt: skip
    assert inputs == [
        {"field": field, "path": name,
         "sha256": hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()}
        for field, name in read.items()
    ]  # fmt: skip
    # an edited trace (in the same process: the hash is kept per version of the file)
    (tmp_path / "t0.csv").write_text(TRACE + "3,GPT-4,400,30,430,API log\n")
    edited = _summary(scenario)["provenance"]["inputs"][-1]["sha256"]
    assert edited == hashlib.sha256((tmp_path / "t0.csv").read_bytes()).hexdigest()
    assert edited != inputs[-1]["sha256"]


def test_presets_and_generated_load_record_no_inputs():
    """Presets are covered by build_id; a run reading no file keeps its summary as it was."""
    summary = simulate(scenario_dict(workload={"num_requests": 3})).summary()
    assert "inputs" not in summary["provenance"]


SMALL_LLAMA = {
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
}  # fmt: skip


def _model_folder_scenario(folder: Path, model: str) -> Path:
    """A scenario naming `model` bare, with a checkpoint folder `mine` next to it."""
    (folder / "mine").mkdir(parents=True)
    (folder / "mine" / "config.json").write_text(json.dumps(SMALL_LLAMA))
    data = scenario_dict(model={"name": model}, workload={"num_requests": 3})
    (folder / "s.yaml").write_text(json.dumps(data))
    return folder / "s.yaml"


def test_a_bare_model_folder_is_read_next_to_the_scenario(tmp_path, monkeypatch):
    """`model.name: mine` is the folder next to the scenario (the catalog first), from
    any working folder, and pinned in provenance.inputs; the working folder's is not
    read (it was: a run from the scenario's folder left it out of the inputs, one from
    elsewhere refused it as an unknown model)."""
    scenario = _model_folder_scenario(tmp_path / "w", "mine")
    config = tmp_path / "w" / "mine" / "config.json"
    monkeypatch.chdir(tmp_path)
    summary = simulate(Scenario.from_yaml("w/s.yaml")).summary()
    digest = hashlib.sha256(config.read_bytes()).hexdigest()
    assert summary["provenance"]["inputs"] == [
        {"field": "model.name", "path": "mine", "sha256": digest}
    ]
    monkeypatch.chdir(tmp_path / "w")
    assert _summary(scenario)["provenance"]["inputs"] == summary["provenance"]["inputs"]
    # a scenario elsewhere does not read the working folder's `mine`
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "s.yaml").write_text(scenario.read_text())
    refused = r"unknown model 'mine'.* a model folder is read from the scenario's folder, .*o,"
    with pytest.raises(InfersimError, match=refused):
        Scenario.from_yaml(tmp_path / "o" / "s.yaml")


def test_a_catalog_name_wins_over_a_folder_of_that_name(tmp_path):
    scenario = _model_folder_scenario(tmp_path, "llama-3.1-8b")
    (tmp_path / "mine").rename(tmp_path / "llama-3.1-8b")
    assert "inputs" not in _summary(scenario)["provenance"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("/w/a/t0.csv: 1 of its rows", "t0.csv: 1 of its rows"),
        ("calibration '/w/a/x y.yaml': its", "calibration 'x y.yaml': its"),
        ("h100-sxm: /w/a/../p.yaml (fitted", "h100-sxm: ../p.yaml (fitted"),
        ("/x/w/a/t0.csv and /w/ab/t.csv", "/x/w/a/t0.csv and /w/ab/t.csv"),
    ],
)
def test_results_name_files_from_the_scenarios_folder(text, named):
    assert named_from("/w/a", text) == named
    assert named_from("/", "/w/a/t0.csv") == "/w/a/t0.csv"
    assert named_from(".", "t0.csv") == "t0.csv"


def _sweep_checkout(folder: Path) -> Scenario:
    path = _checkout(folder)
    path.write_text(SCENARIO + "sweep: {grid: {serving.max_num_seqs: [4, 8]}}\n")
    return Scenario.from_yaml(path)


def _points(out: Path) -> dict[str, dict]:
    """Each point file less its timings, which differ between identical runs."""
    return {
        p.name: {k: v for k, v in json.loads(p.read_text()).items() if k not in ("wall_s", "cpu_s")}
        for p in sorted((out / "points").glob("*.json"))
    }


def test_a_sweeps_point_files_name_files_from_the_scenarios_folder(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InfersimWarning)
        for name in ("a", "b"):
            sweep(_sweep_checkout(tmp_path / name), workers=1, outdir=tmp_path / name / "out")
    a, b = _points(tmp_path / "a" / "out"), _points(tmp_path / "b" / "out")
    assert a == b and len(a) == 2
    assert str(tmp_path) not in json.dumps(a)
    assert any(w.startswith("t0.csv: 1 of its 3 rows") for w in next(iter(a.values()))["warnings"])


def test_resume_refuses_points_run_on_an_edited_trace(tmp_path):
    scenario = _sweep_checkout(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InfersimWarning)
        sweep(scenario, workers=1, outdir=tmp_path / "out")
        sweep(scenario, workers=1, outdir=tmp_path / "out", resume=True)  # unchanged: reused
        (tmp_path / "t0.csv").write_text(TRACE + "3,GPT-4,400,30,430,API log\n")
        with pytest.raises(InfersimError, match=r"other contents of workload\.arrivals\.path"):
            sweep(scenario, workers=1, outdir=tmp_path / "out", resume=True)
