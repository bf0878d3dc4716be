"""Every run's summary lists the warnings that limited it: also those raised reading a
file a cache serves (the first run in a process read it), and those raised loading the
scenario (before any run)."""

from __future__ import annotations

import json
import warnings

from hardware_models.presets import load_node
from hardware_models.warning_scope import recording
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
