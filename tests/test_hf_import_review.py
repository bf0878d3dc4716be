"""HuggingFace configs as they are published: Gemma 3's sparse text_config, layer_types
with a window no layer uses, and errors that stay one short line."""

import json

import pytest

from hardware_models.errors import InfersimError, InfersimWarning
from simulator.build import build_replica
from simulator.model_catalog import load_model
from simulator.model_description import describe_model
from simulator.scenario import Scenario
from tests.conftest import scenario_dict
from tests.test_moe_models import DEEPSEEK_V3, GPT_OSS_120B, QWEN3_8B

# google/gemma-3-27b-it's config.json (vision_config and token ids left out): its
# text_config gives no vocab_size, max_position_embeddings or rms_norm_eps.
GEMMA3_27B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {},
}


def _load(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return load_model(path)


def test_gemma3_27b_takes_transformers_defaults(tmp_path):
    """vocab 262,208, 128k positions, RMSNorm (Gemma3TextConfig's defaults); every 6th
    layer attends fully. Google's 27B counts ~27B with its ~0.4B vision encoder."""
    arch = _load(tmp_path, GEMMA3_27B_IT)
    assert arch.vocab_size == 262_208 and arch.max_position_embeddings == 131_072
    assert arch.norm == "rmsnorm" and arch.sliding_window == 1024
    assert arch.full_attention_interval == 6 and arch.num_layers == 62
    assert 26.5e9 < arch.param_count() < 27.5e9


def test_layer_types_all_full_with_a_window_means_no_window(tmp_path):
    config = dict(QWEN3_8B, sliding_window=4096, layer_types=["full_attention"] * 36)
    arch = _load(tmp_path, config)
    assert arch.sliding_window is None and arch.num_sliding_layers == 0


def test_a_refused_long_value_is_shortened(tmp_path):
    types = ["sliding_attention", "full_attention", "full_attention"] * 12
    with pytest.raises(InfersimError) as exc:
        _load(tmp_path, dict(QWEN3_8B, sliding_window=4096, layer_types=types))
    message = str(exc.value)
    assert "layer_types" in message and "...)" in message and len(message) < 300


@pytest.mark.parametrize(
    ("config", "stored"),
    [(DEEPSEEK_V3, "fp8_block"), (GPT_OSS_120B, "fp4"),
     ({**QWEN3_8B, "quantization_config": {"quant_method": "fp8"}}, "fp8"),
     ({**QWEN3_8B, "quantization_config": {"quant_method": "awq", "bits": 4}}, "int4"),
     (QWEN3_8B, None)],
)  # fmt: skip
def test_the_checkpoint_format_is_read_from_quantization_config(tmp_path, config, stored):
    assert _load(tmp_path, config).checkpoint_dtype == stored


def test_an_unknown_quantization_method_is_said(tmp_path):
    config = {**QWEN3_8B, "quantization_config": {"quant_method": "bitsandbytes"}}
    with pytest.warns(InfersimWarning, match="quant_method 'bitsandbytes' is not understood"):
        assert _load(tmp_path, config).checkpoint_dtype is None


def test_the_weights_default_to_the_checkpoints_format():
    """vLLM serves gpt-oss-120b's MXFP4 experts as stored (~65 GB), not the 234 GB a bf16
    copy would take; asking for another format is priced as asked, and said."""
    data = scenario_dict(hardware={"gpu": "h200-sxm"}, model={"name": "gpt-oss-120b"})
    plan = build_replica(Scenario.from_dict(data)).memory
    assert plan.weight_dtype == "fp4" and 55e9 < plan.weights < 75e9
    bf16 = scenario_dict(
        hardware={"gpu": "h200-sxm"}, model={"name": "gpt-oss-120b", "weight_dtype": "bf16"},
        parallelism={"tp": 2},
    )  # fmt: skip
    with pytest.warns(InfersimWarning, match="checkpoint is stored in fp4; priced as bf16"):
        assert build_replica(Scenario.from_dict(bf16)).memory.weight_dtype == "bf16"
    dense = build_replica(Scenario.from_dict(scenario_dict(model={"name": "llama-3.1-8b"})))
    assert dense.memory.weight_dtype == "bf16"


def test_models_show_names_the_checkpoint_format():
    assert ("checkpoint weights", "fp8_block") in describe_model(load_model("deepseek-v3"))
