import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware_models.errors import InfersimError
from simulator.architecture import ModelArchitecture
from simulator.model_catalog import list_models, load_model

METADATA = {"name", "display_name", "source", "published_params_b"}

LLAMA_31_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def structural(arch: ModelArchitecture) -> dict:
    return arch.model_dump(exclude=METADATA)


def _llama4_vision_params() -> int:
    """Llama 4's vision encoder and projector, which Meta's 109B/400B figures include and
    the text model does not: shapes from the checkpoints' vision_config (hidden 1408, 34
    layers, MLP 5632, 14-pixel patches at 336, projector 4096 -> 4096 -> 5120)."""
    h, mlp, layers = 1408, 5632, 34
    layer = 4 * (h * h + h) + (h * mlp + mlp) + (mlp * h + h) + 4 * h
    embeddings = h + (24 * 24 + 1) * h + 3 * 14 * 14 * h + 4 * h
    adapter = 4 * h * 4096 + 4096 * 4096 + 4096 * 5120
    return embeddings + layers * layer + adapter


# Parameters a published total counts that the text model has not.
_PUBLISHED_EXTRA = {
    "llama-4-scout": _llama4_vision_params(),
    "llama-4-maverick": _llama4_vision_params(),
}


@pytest.mark.parametrize("name", list_models())
def test_param_count_matches_published(name):
    arch = load_model(name)
    assert arch.published_params_b is not None
    total = arch.param_count() + _PUBLISHED_EXTRA.get(name, 0)
    assert total / 1e9 == pytest.approx(arch.published_params_b, rel=0.01)


def test_catalog_has_the_promised_models():
    expected = {
        "llama-2-7b",
        "llama-2-13b",
        "llama-2-70b",
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "mistral-7b",
        "mixtral-8x7b",
        "qwen2.5-72b",
    }
    assert expected <= set(list_models())


def test_mixtral_active_params_are_12_9b():
    arch = load_model("mixtral-8x7b")
    assert arch.active_param_count() / 1e9 == pytest.approx(12.9, rel=0.01)
    dense = load_model("mistral-7b")
    assert dense.active_param_count() == dense.param_count()


def test_gqa_kv_bytes_per_token():
    arch = load_model("llama-3.1-8b")
    assert arch.kv_bytes_per_token("bf16") == 32 * 8 * 128 * 2 * 2 == 131072
    assert arch.kv_bytes_per_token("fp8") == 65536


@pytest.mark.parametrize("name", ["llama-2-7b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b"])
def test_a_tokens_gemms_cover_its_active_matmul_params(name):
    """The step's GEMMs for one token, its top-k experts and the LM head are every active
    weight matrix (embedding lookup and norms aside)."""
    arch = load_model(name)
    other = arch.attention_other_params + arch.norm_params_per_layer
    norms = arch.num_layers * other + arch.final_norm_params
    matmul_params = arch.active_param_count() - arch.embedding_params - norms
    per_token = sum(n * k * layers for _, _, n, k, layers in arch.gemms(1))
    experts = arch.experts_per_token * arch.mlp_matrix_params(arch.expert_intermediate_size)
    head = arch.vocab_size * arch.hidden_size
    assert per_token + arch.num_moe_layers * experts * arch.is_moe + head == matmul_params


def test_hf_config_file_matches_catalog(tmp_path):
    model_dir = tmp_path / "Llama-3.1-8B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA_31_8B_CONFIG))
    from_file = load_model(model_dir / "config.json")
    from_dir = load_model(str(model_dir))
    assert structural(from_file) == structural(load_model("llama-3.1-8b"))
    assert from_dir == from_file
    assert from_file.name == "llama-3.1-8b"


def test_hf_qwen2_gets_qkv_bias_and_no_window(tmp_path):
    config = {
        "model_type": "qwen2",
        "hidden_act": "silu",
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "max_position_embeddings": 131072,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert structural(load_model(path)) == structural(load_model("qwen2.5-72b"))


def test_hf_mixtral_experts(tmp_path):
    config = {
        "model_type": "mixtral",
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-05,
        "sliding_window": None,
        "vocab_size": 32000,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert structural(load_model(path)) == structural(load_model("mixtral-8x7b"))


def test_bad_json_names_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,')
    with pytest.raises(InfersimError, match=r"config\.json.*invalid JSON"):
        load_model(path)


def test_missing_key_names_file_and_key(tmp_path):
    config = dict(LLAMA_31_8B_CONFIG)
    del config["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InfersimError, match=r"config\.json.*num_hidden_layers"):
        load_model(path)


def test_invalid_value_names_field(tmp_path):
    config = dict(LLAMA_31_8B_CONFIG, num_key_value_heads=5)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(InfersimError, match="num_kv_heads"):
        load_model(path)


def test_unknown_name_suggests():
    with pytest.raises(InfersimError, match="did you mean 'llama-2-7b'"):
        load_model("llama-2-7")


def test_validators_explain():
    base = load_model("llama-2-7b").model_dump()
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelArchitecture(**{**base, "num_kv_heads": 5})
    with pytest.raises(ValueError, match="experts_per_token"):
        ModelArchitecture(**{**base, "num_experts": 2, "experts_per_token": 3})
    with pytest.raises(ValueError, match="head_dim"):
        ModelArchitecture(**{**base, "hidden_size": 4095, "head_dim": None})


def test_gemms_tp1_and_tp2():
    arch = load_model("llama-3.1-8b")
    assert arch.gemms(16, tp=1) == [
        ("qkv_proj", 16, 4096 + 2 * 1024, 4096, 32),
        ("o_proj", 16, 4096, 4096, 32),
        ("gate_up", 16, 2 * 14336, 4096, 32),
        ("down", 16, 4096, 14336, 32),
    ]
    assert arch.gemms(16, tp=2) == [
        ("qkv_proj", 16, 2048 + 2 * 512, 4096, 32),
        ("o_proj", 16, 4096, 2048, 32),
        ("gate_up", 16, 14336, 4096, 32),
        ("down", 16, 4096, 7168, 32),
    ]
    assert arch.lm_head_gemm(4, tp=2) == ("lm_head", 4, 64128, 4096)


def test_gemms_replicate_kv_heads_beyond_tp():
    arch = load_model("llama-3.1-70b")
    qkv = arch.gemms(1, tp=16)[0]
    assert qkv == ("qkv_proj", 1, 4 * 128 + 2 * 128, 8192, 80)


@pytest.mark.parametrize("name", list_models())
def test_gemms_and_routed_experts_hold_every_matmul_weight(name):
    """The step's GEMMs plus the routed experts and the LM head cover every weight matrix."""
    arch = load_model(name)
    gemm_params = sum(n * k * layers for _, _, n, k, layers in arch.gemms(1))
    routed = arch.num_moe_layers * arch.num_experts
    routed *= arch.mlp_matrix_params(arch.expert_intermediate_size)
    other = arch.attention_other_params + arch.norm_params_per_layer
    mlp_bias = arch.param_count() - arch.model_copy(update={"mlp_bias": False}).param_count()
    expected = (
        arch.param_count()
        - arch.embedding_params
        - arch.lm_head_params
        - arch.final_norm_params
        - arch.num_layers * other
        - mlp_bias
    )
    assert gemm_params + routed == expected


def test_moe_gemms_router_in_moe_layers_only():
    arch = load_model("llama-4-maverick")
    gemms = {g[0]: g for g in arch.gemms(100, tp=2)}
    assert gemms["router"] == ("router", 100, 128, 5120, 24)
    assert gemms["gate_up"] == ("gate_up", 100, 16384, 5120, 24)  # the dense layers
    assert gemms["shared.gate_up"] == ("shared.gate_up", 100, 8192, 5120, 24)


def test_bad_tp_is_explained():
    arch = load_model("llama-2-13b")
    with pytest.raises(InfersimError, match="not divisible by tp=3"):
        arch.gemms(1, tp=3)


@given(layers=st.integers(min_value=1, max_value=200), extra=st.integers(1, 50))
def test_param_count_grows_with_layers(layers, extra):
    base = load_model("llama-3.1-8b")
    fewer = base.model_copy(update={"num_layers": layers})
    more = base.model_copy(update={"num_layers": layers + extra})
    assert more.param_count() > fewer.param_count()
    assert more.param_count() - fewer.param_count() == extra * base.dense_layer_params
