"""Every run's summary lists the warnings that limited it: also those raised reading a
file a cache serves (the first run in a process read it), and those raised loading the
scenario (before any run)."""

from __future__ import annotations

import json
import warnings

import pytest
import yaml

from hardware_models.errors import InfersimWarning
from hardware_models.presets import load_node
from hardware_models.warning_scope import recording
from simulator.cli.main import main
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict
from tests.test_pcie_fabric import _node_before_host_read

# A small Llama whose checkpoint is quantised in a way the cost model does not price.
BITSANDBYTES_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True},
}
NOT_UNDERSTOOD = "quant_method 'bitsandbytes' is not understood"


def _quiet_summary_warnings(scenario: Scenario) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate(scenario).summary()["warnings"]


def test_each_run_of_a_file_read_once_records_its_loading_warning(tmp_path):
    """A notebook loop: the config.json is parsed once, each run's summary says it."""
    config = tmp_path / "bnb" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(BITSANDBYTES_CONFIG))
    small = {"num_requests": 4}
    scenario = Scenario.from_dict(
        scenario_dict(model={"name": str(config)}, workload=small, base_dir=str(tmp_path))
    )
    for _ in range(2):
        seen = _quiet_summary_warnings(scenario)
        assert sum(NOT_UNDERSTOOD in text for text in seen) == 1


def test_a_cached_node_file_raises_its_warning_into_each_recording(tmp_path):
    """Inside each run (a recording) the old node file's warning is recorded, although
    the file is read once; outside any, it is shown once (test_pcie_fabric)."""
    path = str(_node_before_host_read(tmp_path))
    for _ in range(2):
        with recording() as caught:
            load_node(path)
        assert ["host_read_us is not set" in str(w.message) for w in caught] == [True]


ONE_PRICE = "cost.usd_per_gpu_hour=3 prices every GPU type alike"


def _warning_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("infersim: warning:")]


def test_a_warning_of_loading_the_scenario_is_in_its_summary_and_said_once(tmp_path, capsys):
    """One price over two GPU types' pools: said once on stderr (when loaded), and
    listed first in summary.json and in Results.summary()."""
    pools = [
        {"name": "h100", "hardware": {"gpu": "h100-sxm"}, "replicas": 1},
        {"name": "a100", "hardware": {"gpu": "a100-80gb-sxm"}, "replicas": 1},
    ]
    data = scenario_dict(pools=pools, cost={"usd_per_gpu_hour": 3}, workload={"num_requests": 8})
    del data["hardware"]
    path = tmp_path / "het.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    said = [line for line in _warning_lines(capsys.readouterr().err) if ONE_PRICE in line]
    assert len(said) == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert ONE_PRICE in summary["warnings"][0]
    with pytest.warns(InfersimWarning, match=ONE_PRICE):  # said on loading
        scenario = Scenario.from_yaml(path)
    assert ONE_PRICE in _quiet_summary_warnings(scenario)[0]


def test_each_variant_lists_the_override_of_its_own_field(tmp_path, capsys):
    data = scenario_dict(workload={"num_requests": 8})
    data["variants"] = {"a": {"serving.max_num_seqs": 4}, "b": {"seed": 5}}
    path = tmp_path / "vo.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    argv = ["run", str(path), "-o", str(out), "--quiet", "--set", "serving.max_num_seqs=16"]
    assert main(argv) == 0
    overridden = "--set serving.max_num_seqs=16 overrides variants.a.serving.max_num_seqs=4"
    said = [line for line in _warning_lines(capsys.readouterr().err) if "overrides" in line]
    assert len(said) == 1 and overridden in said[0]
    a, b = (json.loads((out / v / "summary.json").read_text())["warnings"] for v in "ab")
    assert [overridden in text for text in a] == [True] + [False] * (len(a) - 1)
    assert not any("overrides" in text for text in b)


def test_run_says_its_warnings_in_the_order_its_summary_lists_them(tmp_path, capsys):
    """Build (expert parallel on a dense model), configuration (tp across nodes) and
    summary-only (rejections) warnings: stderr and summary.json, the same order."""
    data = scenario_dict(
        hardware={"gpu": "h100-sxm"},
        model={"name": "llama-3.1-8b"},
        parallelism={"tp": 16, "nodes": 2, "enable_expert_parallel": True},
        serving={"max_model_len": 600},
        workload={"num_requests": 30},
    )
    path = tmp_path / "order.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    said = [
        line.removeprefix("infersim: warning: ") for line in _warning_lines(capsys.readouterr().err)
    ]
    listed = json.loads((tmp_path / "out" / "summary.json").read_text())["warnings"]
    assert said == listed and len(listed) == 3
    assert "enable_expert_parallel" in listed[0] and "crossing" in listed[1]


def test_sweep_prints_full_paths_and_its_point_files_name_them_from_the_scenario(tmp_path, capsys):
    """As run and compare print them (docs/METRICS.md); the point files, as summaries."""
    config = tmp_path / "bnb" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(BITSANDBYTES_CONFIG))
    data = scenario_dict(model={"name": "bnb/config.json"}, workload={"num_requests": 4})
    data["sweep"] = {"grid": {"seed": [1, 2]}}
    path = tmp_path / "sw.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["sweep", str(path), "-o", str(out), "--workers", "1", "--quiet"]) == 0
    said = [line for line in _warning_lines(capsys.readouterr().err) if NOT_UNDERSTOOD in line]
    assert [line.split(": quantization")[0] for line in said] == [
        f"infersim: warning: every point: {config}"
    ]
    for point in (out / "points").glob("*.json"):
        kept = json.loads(point.read_text())["warnings"]
        assert any(text.startswith("bnb/config.json: ") and NOT_UNDERSTOOD in text for text in kept)


def test_sweep_prints_a_warning_loading_the_file_raised_once_and_keeps_it_per_point(
    tmp_path, capsys
):
    """One price over two GPU types is said when the file loads; each point raises it
    again on loading its own copy: the terminal shows it once, each point keeps it."""
    data = scenario_dict(workload={"num_requests": 4}, cost={"usd_per_gpu_hour": 2.5})
    data.pop("hardware", None)
    data["pools"] = [
        {"name": "h", "hardware": {"gpu": "h100-sxm"}},
        {"name": "a", "hardware": {"gpu": "a100-80gb-sxm"}},
    ]
    data["sweep"] = {"grid": {"seed": [1, 2]}}
    path = tmp_path / "price.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["sweep", str(path), "-o", str(out), "--workers", "1", "--quiet"]) == 0
    said = [line for line in _warning_lines(capsys.readouterr().err) if "alike" in line]
    assert len(said) == 1 and said[0].startswith(f"infersim: warning: {path}: cost.usd_per")
    for point in (out / "points").glob("*.json"):
        kept = json.loads(point.read_text())["warnings"]
        assert any(text.startswith("sweep point: cost.usd_per_gpu_hour=2.5") for text in kept)


def test_compare_of_a_file_with_a_sweep_grid_says_it_runs_the_base_scenario(tmp_path, capsys):
    data = scenario_dict(workload={"num_requests": 8})
    data["variants"] = {"a": {}, "b": {"seed": 4}}
    data["sweep"] = {"grid": {"seed": [1, 2]}}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["compare", str(path), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    said = [line for line in _warning_lines(capsys.readouterr().err) if "sweep.grid" in line]
    assert said == [
        f"infersim: warning: {path}: sweep.grid is not run by `infersim compare`, which runs "
        f"the scenario as the file sets it; `infersim sweep {path}` runs the grid"
    ]
