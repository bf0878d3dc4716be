"""The Python API as an analyst uses it in a running kernel: files edited between calls
are read again, results cannot be changed through what they hand out, and what is passed
in the wrong shape gets a one-line error naming the argument."""

from __future__ import annotations

import json
import shutil

import simulator as sim
from hardware_models.presets import PRESET_DIR, load_gpu, load_node
from simulator.model_catalog import CATALOG_DIR, load_model
from tests.conftest import scenario_dict


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


# ---- files edited between two calls in one process ------------------------------------------
def test_an_edited_gpu_file_is_read_again_by_the_next_simulate(tmp_path):
    gpu = tmp_path / "mine.yaml"
    shutil.copy(PRESET_DIR / "gpus" / "a100-80gb-sxm.yaml", gpu)
    data = scenario_dict(hardware={"gpu": str(gpu), "calibration": "none"},
                         workload={"num_requests": 30})  # fmt: skip
    scenario = sim.Scenario.from_dict(data)
    before = sim.simulate(scenario).summary()
    _edit(gpu, "bandwidth_gbps: 2039", "bandwidth_gbps: 4078")
    _edit(gpu, "usd_per_hour: 1.79", "usd_per_hour: 5.00")
    after = sim.simulate(scenario).summary()
    assert (before["cost"]["usd_per_hour"], after["cost"]["usd_per_hour"]) == (1.79, 5.0)
    assert after["latency"]["tpot"]["p50"] < 0.7 * before["latency"]["tpot"]["p50"]
    assert load_gpu(gpu).memory_bandwidth == 4078e9


def test_an_edited_model_or_node_file_is_read_again(tmp_path):
    model = tmp_path / "model.yaml"
    shutil.copy(CATALOG_DIR / "llama-2-7b.yaml", model)
    assert load_model(model).num_layers == 32
    _edit(model, "num_layers: 32", "num_layers: 128")  # another size: seen at any clock tick
    assert load_model(model).num_layers == 128

    node = tmp_path / "node.yaml"
    shutil.copy(PRESET_DIR / "nodes" / "dgx-a100.yaml", node)
    count = load_node(node).gpus_per_node
    _edit(node, f"gpus_per_node: {count}", f"gpus_per_node: {count // 2}\n# halved")
    assert load_node(node).gpus_per_node == count // 2


def test_an_edited_hf_config_is_read_again(tmp_path):
    config = {
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert load_model(tmp_path).num_layers == 16
    path.write_text(json.dumps({**config, "num_hidden_layers": 160}))
    assert load_model(tmp_path).num_layers == 160


def test_an_unchanged_file_is_parsed_once(tmp_path):
    gpu = tmp_path / "mine.yaml"
    shutil.copy(PRESET_DIR / "gpus" / "l4.yaml", gpu)
    assert load_gpu(gpu) is load_gpu(gpu)
    assert load_gpu("h100-sxm") is load_gpu("H100-SXM")


# ---- a summary handed out is the caller's own -----------------------------------------------
def test_changing_a_handed_out_summary_leaves_the_run_as_it_was(tmp_path):
    data = scenario_dict(workload={"num_requests": 30})
    results = sim.simulate(sim.Scenario.from_dict(data))
    p99 = results.summary()["latency"]["ttft"]["p99"]
    table, shown = results.summary_table(), sim.compare_table({"run": results})

    handed = results.summary()
    handed["latency"]["ttft"]["p99"] *= 1000
    handed["warnings"].append("mine")

    assert results.summary()["latency"]["ttft"]["p99"] == p99
    assert results.summary_table() == table
    assert sim.compare_table({"run": results}).equals(shown)
    results.write(tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["latency"]["ttft"]["p99"] == p99 and "mine" not in written["warnings"]
