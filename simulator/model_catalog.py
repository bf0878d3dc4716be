"""Find a model architecture by catalog name, or read it from a local HuggingFace config.

Nothing here touches the network: a HuggingFace model is read from a `config.json` the
user already has (or a directory holding one).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from hardware_models.errors import InfersimError
from hardware_models.yaml_io import (
    load_json_object,
    load_yaml_mapping,
    unknown_name_error,
    validate_model,
)
from simulator.architecture import ModelArchitecture

CATALOG_DIR = Path(__file__).parent / "catalog"

# HF config classes that use a SwiGLU MLP and default tie_word_embeddings to False; other
# model types fall back to `hidden_act` (silu = gated) and PretrainedConfig's default (True).
_LLAMA_LIKE = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe"}
# Qwen2 always puts a bias on Q, K, V; its config has no attention_bias key.
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe"}
_LAYERNORM_KEYS = ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")
_SHARED_EXPERT_KEYS = ("shared_expert_intermediate_size", "n_shared_experts")


def list_models() -> list[str]:
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


def load_model(name_or_path: str | Path) -> ModelArchitecture:
    """A catalog name (`llama-3.1-8b`), a catalog-format YAML file, or a HF config.json
    (the file, or the model directory holding it)."""
    text = str(name_or_path)
    if (CATALOG_DIR / f"{text}.yaml").is_file() and "/" not in text:
        return _load_yaml(CATALOG_DIR / f"{text}.yaml")
    path = Path(text)
    if text.endswith((".yaml", ".yml")):
        return _load_yaml(path.resolve())
    if path.is_dir():
        path = path / "config.json"
    if text.endswith(".json") or "/" in text or path.exists():
        return _load_hf_config(path.resolve())
    raise unknown_name_error("model", text, list_models())


@cache
def _load_yaml(path: Path) -> ModelArchitecture:
    return validate_model(ModelArchitecture, load_yaml_mapping(path), str(path))


@cache
def _load_hf_config(path: Path) -> ModelArchitecture:
    if not path.is_file():
        raise InfersimError(f"{path}: no such file")
    config = load_json_object(path)
    return validate_model(ModelArchitecture, hf_config_to_fields(config, path), str(path))


def hf_config_to_fields(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """Map HuggingFace config keys onto ModelArchitecture fields (not yet validated)."""

    def need(key: str) -> Any:
        if key not in config:
            raise InfersimError(f"{path}: missing key {key!r}")
        return config[key]

    model_type = str(need("model_type"))
    for key in _SHARED_EXPERT_KEYS:
        if config.get(key):
            raise InfersimError(f"{path}: {key!r}: shared MoE experts are not supported")
    heads = need("num_attention_heads")
    num_experts = config.get("num_local_experts") or config.get("num_experts") or 1
    is_moe = isinstance(num_experts, int) and num_experts > 1
    intermediate = need("intermediate_size")
    if is_moe and "moe_intermediate_size" in config:
        intermediate = config["moe_intermediate_size"]
    use_window = config.get("use_sliding_window", True)
    stem = path.parent.name or "custom"
    return {
        "name": re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._") or "custom",
        "display_name": stem,
        "family": model_type,
        "num_layers": need("num_hidden_layers"),
        "hidden_size": need("hidden_size"),
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim"),
        "vocab_size": need("vocab_size"),
        "max_position_embeddings": need("max_position_embeddings"),
        "tie_word_embeddings": config.get("tie_word_embeddings", model_type not in _LLAMA_LIKE),
        "gated_mlp": model_type in _LLAMA_LIKE or config.get("hidden_act") == "silu",
        "num_experts": num_experts,
        "experts_per_token": config.get("num_experts_per_tok", 1) if is_moe else 1,
        "sliding_window": config.get("sliding_window") if use_window else None,
        "norm": _norm_kind(config, path),
        "attention_bias": config.get("attention_bias", model_type in _QKV_BIAS_TYPES),
        "source": str(path),
    }


def _norm_kind(config: dict[str, Any], path: Path) -> str:
    if "rms_norm_eps" in config:
        return "rmsnorm"
    if any(key in config for key in _LAYERNORM_KEYS):
        return "layernorm"
    raise InfersimError(
        f"{path}: missing key 'rms_norm_eps' (or one of {', '.join(_LAYERNORM_KEYS)}): "
        "cannot tell the norm type"
    )
