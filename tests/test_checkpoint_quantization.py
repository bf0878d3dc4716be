"""Quantised checkpoints as published: the weight format and the modules each keeps in 16
bits (fbgemm_fp8's modules_to_not_convert, compressed-tensors' ignore, modelopt's
exclude_modules), priced in memory and in the step cost. Fixtures are written from the
published config.json fields, nothing is downloaded."""

import json

import pytest
from pydantic import ValidationError

from hardware_models.errors import InfersimWarning
from hardware_models.presets import load_gpu, load_node
from simulator.architecture import ModelArchitecture
from simulator.engine.step_cost import StepCostModel
from simulator.memory_planner import plan_memory
from simulator.model_catalog import load_model
from simulator.model_description import describe_model
from tests.test_moe_models import DEEPSEEK_V3, QWEN3_8B

_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
# meta-llama/Llama-3.1-405B-Instruct-FP8's config.json: the 405B shape, and fbgemm_fp8
# keeping every layer's attention, the first and last layers' MLP and the LM head in bf16.
META_405B_FP8 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16384,
    "intermediate_size": 53248, "num_attention_heads": 128, "num_key_value_heads": 8,
    "num_hidden_layers": 126, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "quantization_config": {
        "quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
        "modules_to_not_convert": [
            *(f"model.layers.{i}.self_attn.{p}" for i in range(126) for p in _PROJ),
            *(f"model.layers.{i}.mlp.{p}" for i in (0, 125) for p in _MLP),
            "lm_head",
        ],
    },
}  # fmt: skip
# RedHatAI's llm-compressor FP8-dynamic checkpoints: per-channel fp8 weights, per-token
# dynamic fp8 activations, the LM head ignored.
_CT_FP8 = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
    }},
}  # fmt: skip


def _load(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return load_model(path)


def _with(config, quant):
    return {**config, "quantization_config": quant}


def test_meta_fp8_405b_keeps_its_attention_and_end_mlps_in_bf16(tmp_path):
    """vLLM serves Meta's FP8 405B on 8 H100s (it logs 57.75 GiB of weights a GPU): fp8
    MLPs in 124 layers, bf16 attention in all 126 and bf16 MLPs in the first and last.
    Pricing every linear layer in fp8 gave 51.3 GB and a KV cache twice as large."""
    arch = _load(tmp_path, META_405B_FP8)
    assert arch.checkpoint_dtype == "fp8"
    assert arch.unquantized["qkv_proj"] == arch.unquantized["o_proj"] == tuple(range(126))
    assert arch.unquantized["gate_up"] == arch.unquantized["down"] == (0, 125)
    every = load_model("llama-3.1-405b")
    meta = plan_memory(arch, "h100-sxm", weight_dtype="fp8", tp=8)
    all_fp8 = plan_memory(every, "h100-sxm", weight_dtype="fp8", tp=8)
    assert all_fp8.weights / 1e9 == pytest.approx(51.26, abs=0.01)
    # attention: 126 x (2 x 16384^2 + 2 x 16384 x 1024) / 8 bytes more; two MLPs: 2 x 3 x
    # 16384 x 53248 / 8 more
    extra = (126 * (2 * 16384**2 + 2 * 16384 * 1024) + 2 * 3 * 16384 * 53248) / 8
    assert meta.weights - all_fp8.weights == pytest.approx(extra)
    assert 56.0 < meta.weights / 2**30 < 57.75  # vLLM: 57.75 GiB (scales, buffers aside)
    assert all_fp8.kv_capacity_bytes > 2 * meta.kv_capacity_bytes


def test_the_kept_modules_are_priced_in_16_bits_in_the_step_cost(tmp_path):
    """A decode step reads the bf16 attention weights at 2 bytes each: slower than all
    fp8, faster than all bf16."""
    gpu, node = load_gpu("h100-sxm"), load_node("dgx-h100")
    meta = _load(tmp_path, META_405B_FP8)
    every = load_model("llama-3.1-405b")
    steps = [
        StepCostModel(arch, gpu, node, weight_dtype=dtype, tp=8)
        for arch, dtype in ((every, "fp8"), (meta, "fp8"), (every, "bf16"))
    ]
    times = [sum(m._dense(8).seconds) for m in steps]
    assert times[0] < times[1] < times[2]
    split = [(name, layers, dtypes) for name, _, _, layers, dtypes in steps[1]._gemm_shapes]
    assert ("qkv_proj", 126, ("bf16", None)) in split
    assert ("gate_up", 124, steps[1].gemm_dtypes("gate_up")) in split
    assert ("gate_up", 2, ("bf16", None)) in split


@pytest.mark.parametrize(
    ("quant", "stored", "kept"),
    [
        (_CT_FP8, "fp8", {}),
        ({**_CT_FP8, "ignore": ["lm_head", "re:.*layers\\.0\\.self_attn.*"]}, "fp8",
         {"qkv_proj": (0,), "o_proj": (0,)}),
        ({**_CT_FP8, "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}},
         "fp8_block", {}),
        ({**_CT_FP8, "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}},
         "int4", {}),
        ({**_CT_FP8, "config_groups": {"g": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}},
         "nvfp4", {}),
        ({"quant_method": "modelopt", "quant_algo": "FP8",
          "exclude_modules": ["lm_head", "model.layers.35.mlp*"]},
         "fp8", {"gate_up": (35,), "down": (35,)}),
        ({"quant_method": "modelopt",
          "quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}},
         "nvfp4", {}),
        ({"quant_method": "fbgemm_fp8",
          "modules_to_not_convert": ["model.layers.1.self_attn", "lm_head"]},
         "fp8", {"qkv_proj": (1,), "o_proj": (1,)}),
    ],
)  # fmt: skip
def test_quantised_checkpoint_formats_and_kept_modules(tmp_path, quant, stored, kept):
    arch = _load(tmp_path, _with(QWEN3_8B, quant))
    assert arch.checkpoint_dtype == stored
    assert arch.unquantized == kept


def test_a_fused_gemm_is_kept_only_when_all_its_parts_are(tmp_path):
    """vLLM fuses q, k and v into qkv_proj and refuses parts that disagree; skipping only
    q_proj leaves the fused GEMM quantised (o_proj alone is kept)."""
    quant = {"quant_method": "fbgemm_fp8", "modules_to_not_convert": [
        "model.layers.2.self_attn.q_proj", "model.layers.2.self_attn.o_proj"]}  # fmt: skip
    assert _load(tmp_path, _with(QWEN3_8B, quant)).unquantized == {"o_proj": (2,)}


def test_mla_and_shared_experts_map_onto_their_gemms(tmp_path):
    """DeepSeek-V3 style: a compressed-tensors ignore list naming layer 3's attention and
    shared expert (an MoE layer) keeps MLA's fused q_a/kv_a and the shared expert."""
    quant = {
        **_CT_FP8,
        "ignore": ["lm_head", "re:model\\.layers\\.3\\.(self_attn|mlp\\.shared_experts)\\..*"],
    }
    arch = _load(tmp_path, _with(DEEPSEEK_V3, quant))
    assert arch.unquantized["qkv_a_proj"] == (3,) and arch.unquantized["kv_b_proj"] == (3,)
    assert arch.unquantized["shared.gate_up"] == arch.unquantized["shared.down"] == (3,)


def test_mixed_or_unknown_compressed_tensors_weights_are_said(tmp_path):
    groups = {
        "a": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 4, "type": "int"}},
        "b": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "float"}},
    }
    with pytest.warns(InfersimWarning, match="compressed-tensors.*not understood"):
        arch = _load(tmp_path, _with(QWEN3_8B, {**_CT_FP8, "config_groups": groups}))
    assert arch.checkpoint_dtype is None


def test_an_unquantized_gemm_must_be_the_models_and_run_in_its_layers():
    fields = load_model("llama-3.1-8b").model_dump()
    with pytest.raises(ValidationError, match=r"'shared\.down' is not a GEMM"):
        ModelArchitecture(**{**fields, "unquantized": {"shared.down": [0]}})
    with pytest.raises(ValidationError, match="do not run it"):
        ModelArchitecture(**{**fields, "unquantized": {"qkv_proj": [32]}})


def test_models_show_names_the_gemms_kept_in_16_bits(tmp_path):
    rows = dict(describe_model(_load(tmp_path, META_405B_FP8)))
    assert rows["kept in 16 bits (layers)"] == "qkv_proj x126, o_proj x126, gate_up x2, down x2"
