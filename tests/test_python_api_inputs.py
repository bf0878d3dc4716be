"""The Python API as an analyst uses it in a running kernel: files edited between calls
are read again, results cannot be changed through what they hand out, and what is passed
in the wrong shape gets a one-line error naming the argument."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

import simulator as sim
from hardware_models.errors import InfersimError
from hardware_models.presets import PRESET_DIR, load_gpu, load_node
from simulator.cli.main import main
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


# ---- overrides: one string, a list, a dict ---------------------------------------------------
def test_with_overrides_takes_one_string_a_list_or_a_dict():
    scenario = sim.Scenario.from_dict(scenario_dict())
    one = scenario.with_overrides("workload.arrivals.rate_per_s=5")
    listed = scenario.with_overrides(["workload.arrivals.rate_per_s=5"])
    mapped = scenario.with_overrides({"workload.arrivals.rate_per_s": 5})
    assert one == listed == mapped and one.workload.arrivals.rate_per_s == 5
    several = scenario.with_overrides(
        {"name": "16", "serving.max_num_seqs": 8, "slo": {"ttft_ms": 500}}
    )
    assert (several.name, several.serving.max_num_seqs, several.slo.ttft_ms) == ("16", 8, 500)
    assert several.overrides == ("name='16'", "serving.max_num_seqs=8", "slo={ttft_ms: 500}")


def test_from_yaml_takes_overrides_as_with_overrides_does(tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_dict()))
    one = sim.Scenario.from_yaml(path, "serving.max_num_seqs=8")
    mapped = sim.Scenario.from_yaml(path, {"serving.max_num_seqs": 8})
    assert one.serving.max_num_seqs == mapped.serving.max_num_seqs == 8


def test_a_string_field_takes_an_override_that_reads_as_a_number():
    scenario = sim.Scenario.from_dict(scenario_dict())
    assert scenario.with_overrides(["name=16"]).name == "16"
    assert scenario.with_overrides("name=1e3").name == "1e3"  # as written, not 1000.0
    assert scenario.with_overrides("seed=16").seed == 16  # a number field stays a number


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (5, "overrides: expected 'key.path=value', a list of such strings or a dict"),
        ([("seed", 3)], "got list [('seed', 3)]"),
        ({3: 4}, "got dict {3: 4}"),
        ({"seed": object()}, "overrides['seed']: a value written as YAML is expected"),
        ("seed", "override 'seed': expected key.path=value"),
    ],
)
def test_overrides_of_another_shape_are_one_line_naming_the_argument(overrides, needle):
    scenario = sim.Scenario.from_dict(scenario_dict())
    with pytest.raises(InfersimError) as caught:
        scenario.with_overrides(overrides)
    message = str(caught.value)
    assert needle in message and "\n" not in message and "--set" not in message


def test_a_bad_override_says_set_on_the_command_line(tmp_path, capsys):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_dict()))
    assert main(["run", str(path), "--set", "seed"]) == 2
    assert "infersim: error: --set 'seed': expected key.path=value" in capsys.readouterr().err


# ---- names checked when the scenario is built ------------------------------------------------
@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        ({"hardware": {"gpu": "h10"}}, "hardware.gpu: unknown gpu 'h10'; did you mean 'h100"),
        ({"hardware": {"gpu": "h100-sxm", "node": "dgx-h10"}},
         "hardware.node: unknown node 'dgx-h10'; did you mean 'dgx-h100'"),
        ({"model": {"name": "llama-3.1-8"}},
         "model.name: unknown model 'llama-3.1-8'; did you mean 'llama-3.1-8b'"),
    ],
)  # fmt: skip
def test_from_dict_refuses_an_unknown_gpu_node_or_model_name(sections, needle):
    with pytest.raises(InfersimError, match=re.escape(f"scenario: {needle}")):
        sim.Scenario.from_dict(scenario_dict(**sections))


def test_a_variant_naming_an_unknown_gpu_is_refused_when_built():
    data = scenario_dict(variants={"ok": {}, "typo": {"hardware.gpu": "a100-80gb"}})
    with pytest.raises(InfersimError, match=re.escape("hardware.gpu: unknown gpu 'a100-80gb'")):
        sim.Scenario.from_dict(data)


def test_names_in_another_case_and_files_are_left_to_the_run(tmp_path):
    shutil.copy(PRESET_DIR / "gpus" / "l4.yaml", tmp_path / "mine.yaml")
    data = scenario_dict(hardware={"gpu": "A100-80GB-SXM"}, model={"name": "Llama-2-7B"})
    assert sim.Scenario.from_dict(data).hardware.gpu == "A100-80GB-SXM"
    mine = scenario_dict(hardware={"gpu": "mine.yaml"})
    assert sim.Scenario.from_dict({**mine, "base_dir": str(tmp_path)}).hardware.gpu == "mine.yaml"


# ---- what simulate, compare_table and plan_memory take ---------------------------------------
@pytest.fixture(scope="module")
def two_runs() -> list:
    data = scenario_dict(workload={"num_requests": 20})
    return [sim.simulate({**data, "name": name}) for name in ("a", "b")]


def test_simulate_takes_a_dict_as_a_scenario(two_runs):
    again = sim.simulate(scenario_dict(workload={"num_requests": 20}, name="a"))
    assert again.summary()["latency"] == two_runs[0].summary()["latency"]


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: sim.simulate(5), "simulate: scenario: expected a Scenario, a dict of its fields"),
        (lambda: sim.simulate(scenario_dict(), progress="yes"),
         "simulate: progress: expected True, False or None, got str 'yes'"),
        (lambda: sim.simulate(scenario_dict(), summary_warnings=None),
         "simulate: summary_warnings: expected True or False, got NoneType None"),
        (lambda: sim.compare_table(5), "compare_table: expected a dict of name -> Results"),
        (lambda: sim.compare_table({"x": {"latency": {}}}),
         "compare_table: run 'x': expected the Results simulate() returns, got a dict"),
        (lambda: sim.compare_table(["x"]), "compare_table: runs[0]: expected the Results"),
        (lambda: sim.plan_memory("llama-3.1-8b", "h100-sxm", tp="2"),
         "plan_memory: tp: expected a whole number >= 1, got str '2'"),
        (lambda: sim.plan_memory("llama-3.1-8b", "h100-sxm", max_num_seqs=0),
         "plan_memory: max_num_seqs: expected a whole number >= 1, got int 0"),
        (lambda: sim.plan_memory("llama-3.1-8", "h100-sxm"),
         "plan_memory: arch: unknown model 'llama-3.1-8'; did you mean 'llama-3.1-8b'?"),
        (lambda: sim.plan_memory(sim.load_model("llama-3.1-8b"), 80),
         "plan_memory: gpu: expected a GPU (load_gpu's result, a preset name or a YAML path)"),
    ],
)  # fmt: skip
def test_an_argument_of_the_wrong_type_is_one_line_naming_it(call, needle):
    with pytest.raises(InfersimError) as caught:
        call()
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_compare_table_takes_a_list_of_runs_named_after_their_scenarios(two_runs):
    table = sim.compare_table(two_runs)
    assert list(table.index) == ["a", "b"]
    assert table.equals(sim.compare_table({"a": two_runs[0], "b": two_runs[1]}))
    assert list(sim.compare_table(two_runs[1]).index) == ["b"]


def test_runs_sharing_a_name_are_refused_naming_it(two_runs):
    with pytest.raises(InfersimError, match=r"compare_table: runs share scenario names \('a'\)"):
        sim.compare_table([two_runs[0], two_runs[1], two_runs[0]])


def test_plan_memory_takes_names_as_load_model_and_load_gpu_do():
    by_name = sim.plan_memory("llama-3.1-8b", "H100-SXM", tp=2)
    loaded = sim.plan_memory(sim.load_model("llama-3.1-8b"), sim.load_gpu("h100-sxm"), tp=2)
    assert by_name.kv_capacity_tokens == loaded.kv_capacity_tokens > 0
    assert sim.plan_memory("llama-3.1-8b", "h100-sxm", tp=np.int64(2)) == by_name


def test_a_sizing_estimate_shows_its_units():
    from simulator.sizing import detailed_inference, detailed_training

    shown = repr(detailed_inference(load_model("llama-3.1-70b"), load_gpu("h100-sxm")))
    assert shown.startswith("InferenceEstimate(weights 141.11 GB, KV cache 0.67 GB, ")
    assert shown.endswith("usable per GPU 76.56 GB; gpus=2, tp=2)")
    trained = repr(detailed_training(load_model("llama-3.1-8b"), load_gpu("h100-sxm")))
    assert trained.startswith("TrainingEstimate(weights 16.06 GB, gradients 16.06 GB, ")
    assert "capacity per GPU 85.06 GB; dp=1, zero_stage=0, fits=False" in trained


def test_the_plots_take_a_list_of_runs_as_compare_table_does(two_runs):
    """The plot helpers read runs the way compare_table does: a list (or one Results)
    named after their scenarios, and anything else one line naming the plot."""
    from simulator.plotting import plot_latency_cdfs, plot_pareto, plot_throughput_and_cost

    for plot in (plot_latency_cdfs, plot_throughput_and_cost):
        assert plot(two_runs).get_suptitle().endswith("a, b")
    assert "a" in plot_latency_cdfs(two_runs[0]).get_suptitle()
    plot_pareto(two_runs)
    with pytest.raises(InfersimError, match=r"^plot_pareto: runs share scenario names"):
        plot_pareto([two_runs[0], two_runs[0]])
    with pytest.raises(InfersimError, match=r"^plot_throughput_and_cost: expected a dict"):
        plot_throughput_and_cost("x")
