"""Find a model architecture by catalog name, or read it from a local HuggingFace config.

Nothing here touches the network: a HuggingFace model is read from a `config.json` the
user already has (or a directory holding one). Only the model types in SUPPORTED_TYPES
are read, each with the fields that shape it; a config that the importer cannot map
exactly (an unknown model_type, a layer pattern it cannot express) is an error naming
the field, never a silent dense approximation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hardware_models.errors import InfersimError
from hardware_models.file_memo import per_file_version
from hardware_models.yaml_io import (
    load_json_object,
    load_yaml_mapping,
    unknown_name_error,
    validate_model,
)
from simulator.architecture import ModelArchitecture
from simulator.checkpoint_quantization import read_quantization

CATALOG_DIR = Path(__file__).parent / "catalog"

SUPPORTED_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2",
    "deepseek_v3", "gpt_oss", "gemma2", "gemma3_text", "llama4",
)  # fmt: skip
# Multimodal wrappers whose language model is the text_config, and that part's own type.
_TEXT_CONFIG_TYPES = {"llama4": "llama4_text", "gemma3": "gemma3_text"}
_TEXT_TYPES = {*SUPPORTED_TYPES, "llama4_text"}
# transformers' default for tie_word_embeddings where the config may omit it.
_TIED_BY_DEFAULT = {"gemma2", "gemma3_text"}
_QKV_BIAS_TYPES = {"qwen2"}  # Qwen2 always puts a bias on Q, K, V; its config has no key
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3_text"}
_SANDWICH_NORM_TYPES = {"gemma2", "gemma3_text"}  # norms before and after attention and MLP
_DEEPSEEK_TYPES = {"deepseek_v2", "deepseek_v3"}
_LAYERNORM_KEYS = ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")
# transformers' defaults for the keys a real config may leave out: Gemma 3's multimodal
# checkpoints (gemma-3-27b-it) give a text_config without vocab_size, max_position_embeddings
# or rms_norm_eps (transformers' Gemma3TextConfig.__init__).
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262_208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-6,
        "sliding_window": 4096,
    }
}
_SHOWN_VALUE_CHARS = 60  # of a refused value in an error message
# Window patterns as transformers defines them where the config gives no layer_types.
_DEFAULT_FULL_INTERVAL = {"gemma2": 2, "gemma3_text": 6, "gpt_oss": 2, "llama4_text": 4}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def list_models() -> list[str]:
    return sorted(p.stem for p in CATALOG_DIR.glob("*.yaml"))


def load_model(name_or_path: str | Path) -> ModelArchitecture:
    """A catalog name (`llama-3.1-8b`, in any case: `Llama-3.1-8B`, unless a file or folder
    of that name is there), a catalog-format YAML file, or a HF config.json (the file, or
    the model directory holding it)."""
    text = str(name_or_path)
    if (CATALOG_DIR / f"{text}.yaml").is_file() and "/" not in text:
        return _load_yaml(CATALOG_DIR / f"{text}.yaml")
    path = Path(text)
    if text.endswith((".yaml", ".yml")):
        return _load_yaml(path.resolve())
    if path.is_dir():
        path = path / "config.json"
    # A missing file's name (mymodel/config.json) is a mistyped path, not a hub id.
    if not path.exists() and _HUB_ID.match(text) and not text.endswith(".json"):
        raise InfersimError(
            f"model {text!r} looks like a HuggingFace hub id; infersim does not download: "
            f"give the path of a local config.json (or its directory), or a catalog name "
            f"({', '.join(list_models())})"
        )
    if text.endswith(".json") or "/" in text or path.exists():
        return _load_hf_config(path.resolve())
    return load_catalog_model(text)


def catalog_name(text: str) -> str | None:
    """The catalog model `text` names, in any case (as GPU names: `Qwen3-30B-A3B` is
    qwen3-30b-a3b, when no other name differs only in case), or None."""
    if "/" in text:
        return None
    if (CATALOG_DIR / f"{text}.yaml").is_file():
        return text
    same = [name for name in list_models() if name.casefold() == text.casefold()]
    return same[0] if len(same) == 1 else None


def load_catalog_model(name: str) -> ModelArchitecture:
    """A catalog model by name, never a file: what a scenario's bare model.name that is no
    folder next to the scenario must be (the working folder is not the scenario's)."""
    found = catalog_name(name)
    if found is None:
        raise unknown_name_error("model", name, list_models())
    return _load_yaml(CATALOG_DIR / f"{found}.yaml")


@per_file_version
def _load_yaml(path: Path) -> ModelArchitecture:
    shipped = path.resolve().is_relative_to(CATALOG_DIR.resolve())  # read with libyaml
    return validate_model(ModelArchitecture, load_yaml_mapping(path, shipped=shipped), str(path))


@per_file_version
def _load_hf_config(path: Path) -> ModelArchitecture:
    if not path.is_file():
        raise InfersimError(f"{path}: no such file")
    config = load_json_object(path)
    return validate_model(ModelArchitecture, hf_config_to_fields(config, path), str(path))


class _Config:
    """A config.json's keys, read with the file named in every error."""

    def __init__(self, config: dict[str, Any], path: Path, prefix: str = "") -> None:
        self.config, self.path, self.prefix = config, path, prefix

    def need(self, key: str) -> Any:
        if key not in self.config:
            raise InfersimError(f"{self.path}: missing key {self.prefix + key!r}")
        return self.config[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value

    def refuse(self, key: str, why: str) -> InfersimError:
        shown = repr(self.config.get(key))
        if len(shown) > _SHOWN_VALUE_CHARS:  # a 94-entry layer list is no one-line error
            shown = shown[: _SHOWN_VALUE_CHARS - 3] + "..."
        return InfersimError(f"{self.path}: {self.prefix + key!r} ({shown}): {why}")


def hf_config_to_fields(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """Map HuggingFace config keys onto ModelArchitecture fields (not yet validated)."""
    outer = _Config(config, path)
    model_type = str(outer.need("model_type"))
    c = outer
    if model_type in _TEXT_CONFIG_TYPES:
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise InfersimError(f"{path}: model_type {model_type!r} needs a 'text_config' object")
        model_type = str(text.get("model_type") or _TEXT_CONFIG_TYPES[model_type])
        c = _Config(text, path, "text_config.")
    if model_type in _TYPE_DEFAULTS:  # keys a real config leaves to transformers' defaults
        c = _Config({**_TYPE_DEFAULTS[model_type], **c.config}, path, c.prefix)
    if model_type not in _TEXT_TYPES:
        raise InfersimError(
            f"{path}: model_type {model_type!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_TYPES)} (or describe the model in the catalog's YAML form)"
        )
    heads = c.need("num_attention_heads")
    stem = path.parent.name or "custom"
    fields: dict[str, Any] = {
        "name": re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._") or "custom",
        "display_name": stem,
        "family": "llama4" if model_type == "llama4_text" else model_type,
        "num_layers": c.need("num_hidden_layers"),
        "hidden_size": c.need("hidden_size"),
        "intermediate_size": c.need("intermediate_size"),
        "num_attention_heads": heads,
        "num_kv_heads": c.get("num_key_value_heads", heads),
        "head_dim": c.get("head_dim"),
        "vocab_size": c.need("vocab_size"),
        "max_position_embeddings": c.need("max_position_embeddings"),
        "tie_word_embeddings": _tied(config, c, model_type),
        "gated_mlp": True,  # every supported type: SwiGLU, or GeGLU for Gemma
        "mlp_bias": bool(c.get("mlp_bias", model_type == "gpt_oss")),
        "norm": _norm_kind(c),
        "attention_bias": bool(c.get("attention_bias", model_type in _QKV_BIAS_TYPES)),
        "qk_norm": model_type in _QK_NORM_TYPES,
        "norms_per_layer": 4 if model_type in _SANDWICH_NORM_TYPES else 2,
        "attention_sinks": model_type == "gpt_oss",
        "source": str(path),
    }
    fields.update(_experts(c, model_type))
    quant = read_quantization(
        c.config.get("quantization_config") or config.get("quantization_config"), path
    )
    if quant.checkpoint_dtype is not None:
        fields["checkpoint_dtype"] = quant.checkpoint_dtype
    fields.update(_window(c, model_type, fields["num_layers"]))
    if model_type in _DEEPSEEK_TYPES:
        fields.update(_mla(c))
    if quant.skipped is not None:  # which layers' GEMMs it names needs the validated shape
        shape = validate_model(ModelArchitecture, fields, str(path))
        fields["unquantized"] = quant.unquantized(shape)
    return fields


def _tied(config: dict[str, Any], c: _Config, model_type: str) -> bool:
    for source in (c.config, config):  # Llama 4 keeps it at the top level
        if source.get("tie_word_embeddings") is not None:
            return bool(source["tie_word_embeddings"])
    return model_type in _TIED_BY_DEFAULT


def _experts(c: _Config, model_type: str) -> dict[str, Any]:
    """Routed and shared experts and which layers have them."""
    if model_type in _DEEPSEEK_TYPES:
        experts = c.get("n_routed_experts", 1)
        if c.get("moe_layer_freq", 1) != 1:
            raise c.refuse("moe_layer_freq", "only 1 (every layer after the first dense ones)")
        return {
            "num_experts": experts,
            "experts_per_token": c.need("num_experts_per_tok") if experts > 1 else 1,
            "moe_intermediate_size": c.need("moe_intermediate_size") if experts > 1 else None,
            "num_shared_experts": c.get("n_shared_experts", 0) if experts > 1 else 0,
            "first_dense_layers": c.get("first_k_dense_replace", 0) if experts > 1 else 0,
        }
    if model_type == "qwen3_moe":
        if c.get("mlp_only_layers", []):
            raise c.refuse("mlp_only_layers", "dense layers listed one by one are not supported")
        return {
            "num_experts": c.need("num_experts"),
            "experts_per_token": c.need("num_experts_per_tok"),
            "moe_intermediate_size": c.need("moe_intermediate_size"),
            "moe_layer_step": c.get("decoder_sparse_step", 1),
        }
    if model_type in ("mixtral", "gpt_oss"):
        per_token = c.get("num_experts_per_tok", c.get("experts_per_token"))
        if per_token is None:
            c.need("num_experts_per_tok")
        return {"num_experts": c.need("num_local_experts"), "experts_per_token": per_token}
    if model_type == "llama4_text":
        step = c.get("interleave_moe_layer_step", 1)
        layers = c.need("num_hidden_layers")
        listed = c.get("moe_layers")
        if listed is not None and list(listed) != list(range(step - 1, layers, step)):
            raise c.refuse(
                "moe_layers", f"must be every {step}-th layer (interleave_moe_layer_step)"
            )
        return {
            "num_experts": c.need("num_local_experts"),
            "experts_per_token": c.need("num_experts_per_tok"),
            "moe_intermediate_size": c.need("intermediate_size"),
            "intermediate_size": c.need("intermediate_size_mlp"),
            "num_shared_experts": 1,
            "moe_layer_step": step,
        }
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if c.get(key, 1) > 1:
            raise c.refuse(key, f"experts in a {model_type!r} config are not understood")
    return {}


def _window(c: _Config, model_type: str, layers: int) -> dict[str, Any]:
    """Sliding-window attention: the window and which layers attend fully."""
    if model_type == "llama4_text":
        window = c.get("attention_chunk_size")
        if window is None:
            return {}
        rope = c.get("no_rope_layers") or []
        interval = c.get("no_rope_layer_interval", _DEFAULT_FULL_INTERVAL[model_type])
        if rope:
            interval = _full_interval([bool(r) for r in rope], c, "no_rope_layers")
        return {"sliding_window": window, "full_attention_interval": interval}
    if model_type in ("qwen2", "qwen3", "qwen3_moe") and c.get("layer_types") is None:
        # transformers: layer i slides when use_sliding_window and i >= max_window_layers.
        if not c.get("use_sliding_window", False):
            return {}
        first = c.get("max_window_layers", 0)
        if first >= layers:
            return {}
        if first:
            raise c.refuse("max_window_layers", f"only 0 (every layer slides) or >= {layers}")
        return {"sliding_window": c.need("sliding_window")}
    window = c.get("sliding_window")
    if window is None:
        return {}
    types = c.get("layer_types")
    if types is not None:
        if len(types) != layers:
            raise c.refuse("layer_types", f"needs one entry per layer ({layers})")
        if "sliding_attention" not in types:  # a window no layer uses (Qwen3's configs)
            return {}
        return {
            "sliding_window": window,
            "full_attention_interval": _full_interval(
                [t == "sliding_attention" for t in types], c, "layer_types"
            ),
        }
    if model_type == "gemma3_text":
        interval = c.get("sliding_window_pattern", _DEFAULT_FULL_INTERVAL[model_type])
        return {"sliding_window": window, "full_attention_interval": interval}
    if model_type in _DEFAULT_FULL_INTERVAL:
        return {
            "sliding_window": window,
            "full_attention_interval": _DEFAULT_FULL_INTERVAL[model_type],
        }
    return {"sliding_window": window}


def _full_interval(sliding: list[bool], c: _Config, key: str) -> int | None:
    """The n with layer i full iff (i + 1) % n == 0, from a per-layer sliding flag list."""
    if all(sliding):
        return None
    n = sliding.index(False) + 1
    if n >= 2 and all(s == ((i + 1) % n != 0) for i, s in enumerate(sliding)):
        return n
    raise c.refuse(key, "only every n-th layer attending fully (n >= 2) is supported")


def _mla(c: _Config) -> dict[str, Any]:
    """DeepSeek's multi-head latent attention."""
    fields = {
        key: c.need(key)
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    }
    fields["q_lora_rank"] = c.get("q_lora_rank")
    fields["head_dim"] = fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"]
    return fields


def _norm_kind(c: _Config) -> str:
    if "rms_norm_eps" in c.config:
        return "rmsnorm"
    if any(key in c.config for key in _LAYERNORM_KEYS):
        return "layernorm"
    raise InfersimError(
        f"{c.path}: missing key {c.prefix}'rms_norm_eps' (or one of "
        f"{', '.join(_LAYERNORM_KEYS)}): cannot tell the norm type"
    )
