"""Scenario files as users write them, and `infersim run` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hardware_models.errors import InfersimError, InfersimWarning
from simulator.cli.main import main
from simulator.scenario import Scenario
from simulator.ways_out import on_command_line
from tests.conftest import scenario_dict

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, data: dict | str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_shipped_scenarios_validate():
    for path in sorted((REPO / "scenarios").glob("*.yaml")):
        scenario = Scenario.from_yaml(path)
        assert scenario.description, f"{path.name} should say what question it answers"
        assert scenario.expand()


def test_overrides_and_variants(tmp_path):
    path = write(tmp_path, scenario_dict())
    scenario = Scenario.from_yaml(path, ["serving.max_num_seqs=7", "engine.cuda_graphs=false"])
    assert scenario.serving.max_num_seqs == 7 and scenario.engine.cuda_graphs is False
    assert Path(scenario.base_dir) == tmp_path.resolve()
    data = scenario_dict(variants={"a": {"serving.policy": "static"}, "b": {"seed": 9}})
    runs = Scenario.from_dict(data).expand()
    assert [r.name for r in runs] == ["a", "b"]
    assert runs[0].serving.policy == "static" and runs[1].seed == 9


def test_set_wins_over_variants_and_says_which_it_overrode(tmp_path):
    """The command line wins over the file, variants included: a variant runs (and its
    provenance records) what --set says, and a warning names the variant field it beat."""
    data = scenario_dict(
        variants={"a": {"serving.max_num_seqs": 16, "seed": 3}, "b": {"serving.policy": "static"}}
    )
    path = write(tmp_path, data)
    sets = ["serving.max_num_seqs=8", "variants.b.seed=5"]
    with pytest.warns(InfersimWarning) as caught:
        runs = Scenario.from_yaml(path, sets).expand()
    messages = {str(w.message) for w in caught if issubclass(w.category, InfersimWarning)}
    assert messages == {
        "override serving.max_num_seqs=8 overrides variants.a.serving.max_num_seqs=16 "
        "(overrides win over the scenario file, variants included)"
    }  # said on loading and on expanding again: the CLI shows an identical warning once
    with on_command_line(), pytest.warns(InfersimWarning) as caught:
        Scenario.from_yaml(path, sets)
    assert str(caught[0].message).startswith("--set serving.max_num_seqs=8 overrides ")
    assert "(the command line wins over" in str(caught[0].message)
    assert [(r.name, r.serving.max_num_seqs, r.seed) for r in runs] == [("a", 8, 3), ("b", 8, 5)]
    assert runs[1].serving.policy == "static" and runs[0].overrides == tuple(sets)
    # a whole section set on the command line beats a variant's field inside it
    with pytest.warns(InfersimWarning, match="override serving=.* overrides variants.a.serving"):
        runs = Scenario.from_yaml(path, ["serving={max_num_seqs: 2}"]).expand()
    assert [r.serving.max_num_seqs for r in runs] == [2, 2]
    assert runs[1].serving.policy == "chunked_prefill"  # the section replaced, as --set does


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(servng={}), "did you mean 'serving'"),
        (lambda d: d["serving"].update(max_num_seq=3), "did you mean 'max_num_seqs'"),
        (lambda d: d["serving"].update(policy="contnuous"), "serving.policy"),
        (lambda d: d["serving"].update(max_num_seqs=-1), "serving.max_num_seqs"),
        (lambda d: d["workload"]["arrivals"].update(rate_per_s=float("nan")), "rate_per_s"),
        (lambda d: d["workload"].update(num_requests=None), "stop condition"),
        (lambda d: d.pop("model"), "model: Field required"),
        (lambda d: d.update(variants={"x": {"serving.policy": "nope"}}), "variants.x"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path, mutate, needle):
    data = scenario_dict()
    mutate(data)
    with pytest.raises(InfersimError) as info:
        Scenario.from_yaml(write(tmp_path, data))
    message = str(info.value)
    assert needle in message and "s.yaml" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "file is empty"),
        ("- a\n- b\n", "expected a mapping"),
        ("a: [1, 2\n", "invalid YAML"),
        ("!!python/object:os.system {}\n", "invalid YAML"),  # safe loader: no objects
    ],
)
def test_malformed_yaml(tmp_path, text, needle):
    with pytest.raises(InfersimError, match=needle):
        Scenario.from_yaml(write(tmp_path, text))


def test_run_writes_results_and_is_deterministic(tmp_path, capsys):
    path = write(tmp_path, scenario_dict())
    assert main(["run", str(path), "-o", str(tmp_path / "a"), "--quiet"]) == 0
    assert main(["run", str(path), "-o", str(tmp_path / "b"), "--quiet", "--csv"]) == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "goodput" in out
    a = (tmp_path / "a" / "summary.json").read_bytes()
    assert a == (tmp_path / "b" / "summary.json").read_bytes()
    summary = json.loads(a)
    assert summary["counts"]["completed"] == 300
    for name in ("requests.parquet", "steps.parquet", "timeseries.parquet", "itl.parquet"):
        assert (tmp_path / "a" / name).is_file()
    assert (tmp_path / "b" / "requests.csv").is_file()


def test_summary_records_what_produced_it(tmp_path, capsys):
    from simulator.build_id import build_id

    path = write(tmp_path, scenario_dict())
    sets = ["--set", "serving.max_num_seqs=32", "--set", "workload.num_requests=50"]
    assert main(["run", str(path), "-o", str(tmp_path / "a"), "--quiet", *sets]) == 0
    assert main(["run", str(path), "-o", str(tmp_path / "b"), "--quiet", *sets]) == 0
    a = (tmp_path / "a" / "summary.json").read_bytes()
    assert a == (tmp_path / "b" / "summary.json").read_bytes()  # no wall clock in it
    origin = json.loads(a)["provenance"]
    assert origin["overrides"] == ["serving.max_num_seqs=32", "workload.num_requests=50"]
    assert origin["build_id"] == build_id() and build_id().startswith(origin["infersim_version"])
    resolved = origin["scenario"]
    assert resolved["serving"]["max_num_seqs"] == 32 and resolved["workload"]["num_requests"] == 50
    assert Scenario.model_validate(resolved).serving.max_num_seqs == 32  # it runs again as is
    out = capsys.readouterr().out
    assert "(weights bf16, KV bf16, activations bf16) on 1 replica x 1 a100-80gb-sxm" in out


def test_run_refuses_to_overwrite_before_simulating(tmp_path, capsys):
    path = write(tmp_path, scenario_dict())
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    assert main(["run", str(path), "-o", str(out), "--quiet"]) == 2
    assert "already has results" in capsys.readouterr().err
    assert (out / "summary.json").read_text() == "{}"
    assert main(["run", str(path), "-o", str(out), "--quiet", "--overwrite"]) == 0


def test_run_variants_writes_a_comparison(tmp_path, capsys):
    data = scenario_dict(variants={"small": {"serving.max_num_seqs": 4}, "big": {}})
    path = write(tmp_path, data)
    assert main(["run", str(path), "-o", str(tmp_path / "cmp"), "--quiet", "--no-plots"]) == 0
    table = (tmp_path / "cmp" / "comparison.csv").read_text()
    assert table.startswith("run,") and "small" in table and "big" in table
    assert (tmp_path / "cmp" / "small" / "summary.json").is_file()
    frame = pd.read_csv(tmp_path / "cmp" / "comparison.csv", index_col="run")
    for run in ("small", "big"):  # the verdict beside the flag: a short run is not "stable"
        summary = json.loads((tmp_path / "cmp" / run / "summary.json").read_text())
        verdict = frame.loc[run, "overload_verdict"]
        assert (None if pd.isna(verdict) else verdict) == summary["overload_verdict"]


def test_run_bad_input_is_one_line(tmp_path, capsys):
    path = write(tmp_path, scenario_dict(model={"name": "llama-2-70b"}))
    assert main(["run", str(path), "--quiet", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("infersim: error:") and "does not fit" in err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert main(["run", str(path), "--set", "nonsense"]) == 2


def test_set_addresses_one_sweep_grid_key_and_one_variant_field():
    """Grid and variant keys are dotted paths themselves: what follows is one key."""
    scenario = Scenario.from_yaml(REPO / "scenarios" / "sweep-rate-batch.yaml").with_overrides(
        ["sweep.grid.serving.max_num_seqs=[8, 16]", "variants.small.serving.max_num_seqs=4"]
    )
    assert scenario.sweep.grid["serving.max_num_seqs"] == [8, 16]
    assert scenario.sweep.grid["workload.arrivals.rate_per_s"]  # the file's key is kept
    assert scenario.variants == {"small": {"serving.max_num_seqs": 4}}


def test_the_build_id_covers_the_calibration_tables_that_change_results(tmp_path):
    from simulator.build_id import source_digest

    table = tmp_path / "hardware_models/presets/calibrations/published/gpu-gemm.csv"
    table.parent.mkdir(parents=True)
    (tmp_path / "simulator").mkdir()
    (tmp_path / "simulator/a.py").write_text("x = 1\n")
    table.write_text("m,n,k,tflops\n4096,4096,4096,600\n")
    notes = table.parent.parent / "README.md"
    notes.write_text("notes\n")
    before = source_digest(tmp_path)
    notes.write_text("other notes\n")  # documentation changes no result
    assert source_digest(tmp_path) == before
    table.write_text("m,n,k,tflops\n4096,4096,4096,650\n")
    assert source_digest(tmp_path) != before
