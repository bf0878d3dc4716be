"""What a quantised checkpoint's `quantization_config` says: the weight format, and the
modules it keeps in 16 bits.

vLLM serves a checkpoint as stored. Its quantisation configs each name the modules left
unquantised, which vLLM then builds with UnquantizedLinearMethod:
- `fp8`: per-tensor or block fp8 (weight_block_size), `ignored_layers`;
- `fbgemm_fp8` (Meta's FP8 Llama 3.1 405B): per-channel fp8 weights, per-token dynamic
  fp8 activations, `modules_to_not_convert` (FBGEMMFp8Config.get_quant_method skips a
  layer is_layer_skipped finds there);
- `compressed-tensors` (llm-compressor): `config_groups` whose `weights` give num_bits and
  type (float 8: fp8, with block_structure fp8_block; int 4: GPTQ-style int4; float 4
  in groups of 16: nvfp4), an `ignore` list of names or `re:` regular expressions
  (CompressedTensorsConfig.get_quant_method via should_ignore_layer);
- `modelopt` (NVIDIA TensorRT Model Optimizer): `quant_algo` FP8 or NVFP4 and
  `exclude_modules` as shell wildcards (ModelOptFp8Config's is_layer_excluded, fnmatch),
  flat or under `quantization` (hf_quant_config.json's layout).
A fused GEMM (q, k and v as qkv_proj; gate and up as gate_up) is unquantised when all of
its parts are, as vLLM requires the parts of a fused layer to agree.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from hardware_models.warning_scope import warn
from simulator.architecture import ModelArchitecture

# Where a decoder layer's modules sit in the published checkpoints' names: text models,
# and the language model of Llama 4's and Gemma 3's multimodal wrappers.
_LAYER_PREFIXES = ("model.layers.", "language_model.model.layers.", "model.language_model.layers.")
_MLP_PARENTS = ("mlp", "feed_forward")
_SHARED_PARENTS = ("mlp.shared_experts", "mlp.shared_expert", "feed_forward.shared_expert")


class ModuleMatcher(NamedTuple):
    """The checkpoint's unquantised module names: exact (or a parent module's), and patterns."""

    names: frozenset[str]
    patterns: tuple[re.Pattern[str], ...]

    def matches(self, module: str) -> bool:
        parts = module.split(".")
        if any(".".join(parts[:i]) in self.names for i in range(1, len(parts) + 1)):
            return True
        return any(p.match(module) for p in self.patterns)

    @classmethod
    def of(cls, entries: Iterable[Any], wildcards: bool) -> ModuleMatcher:
        """`re:` entries as regular expressions (compressed-tensors); with `wildcards`,
        entries holding * or ? as shell patterns (modelopt); the rest as names."""
        names, patterns = set(), []
        for entry in entries:
            text = str(entry)
            if text.startswith("re:"):
                patterns.append(re.compile(text[3:]))  # re.match, as should_ignore_layer
            elif wildcards and any(ch in text for ch in "*?["):
                patterns.append(re.compile(fnmatch.translate(text)))
            else:
                names.add(text)
        return cls(frozenset(names), tuple(patterns))


class CheckpointQuantization(NamedTuple):
    """A checkpoint's weight format (a checkpoint_dtype) and its unquantised modules."""

    checkpoint_dtype: str | None
    skipped: ModuleMatcher | None = None

    def unquantized(self, arch: ModelArchitecture) -> dict[str, tuple[int, ...]]:
        """ModelArchitecture.unquantized: for each GEMM, the layers whose every part is
        among the skipped modules."""
        if self.skipped is None:
            return {}
        kept: dict[str, list[int]] = {}
        for index in range(arch.num_layers):
            for gemm, parts in _layer_modules(arch, index).items():
                if all(self._skipped(index, part) for part in parts):
                    kept.setdefault(gemm, []).append(index)
        return {gemm: tuple(layers) for gemm, layers in kept.items()}

    def _skipped(self, index: int, names: tuple[str, ...]) -> bool:
        assert self.skipped is not None
        return any(
            self.skipped.matches(f"{prefix}{index}.{name}")
            for prefix in _LAYER_PREFIXES
            for name in names
        )


def _layer_modules(arch: ModelArchitecture, index: int) -> dict[str, list[tuple[str, ...]]]:
    """The checkpoint's linear modules of layer `index` (relative to the layer) behind each
    of Architecture.gemms' names, as vLLM fuses them: each part as the names it goes by."""

    def attn(*names: str) -> list[tuple[str, ...]]:
        return [(f"self_attn.{name}",) for name in names]

    if not arch.is_mla:
        modules = {"qkv_proj": attn("q_proj", "k_proj", "v_proj"), "o_proj": attn("o_proj")}
    else:
        modules = {"kv_b_proj": attn("kv_b_proj"), "o_proj": attn("o_proj")}
        if arch.q_lora_rank is None:
            modules |= {"q_proj": attn("q_proj"), "kv_a_proj": attn("kv_a_proj_with_mqa")}
        else:
            modules |= {
                "qkv_a_proj": attn("q_a_proj", "kv_a_proj_with_mqa"),
                "q_b_proj": attn("q_b_proj"),
            }
    if arch.is_moe_layer(index):
        if arch.num_shared_experts:
            up = "shared.gate_up" if arch.gated_mlp else "shared.up"
            modules |= _mlp_modules(up, "shared.down", _SHARED_PARENTS, arch.gated_mlp)
    else:
        up = "gate_up" if arch.gated_mlp else "up"
        modules |= _mlp_modules(up, "down", _MLP_PARENTS, arch.gated_mlp)
    return modules


def _mlp_modules(
    up: str, down: str, parents: tuple[str, ...], gated: bool
) -> dict[str, list[tuple[str, ...]]]:
    """An MLP's up (gate and up when gated) and down modules, each part named under any
    of the `parents` the model families put it in."""
    ups = ("gate_proj", "up_proj") if gated else ("up_proj",)

    def part(name: str) -> tuple[str, ...]:
        return tuple(f"{parent}.{name}" for parent in parents)

    return {up: [part(name) for name in ups], down: [part("down_proj")]}


def read_quantization(quant: Any, path: Path) -> CheckpointQuantization:
    """The weight format and skipped modules a config's `quantization_config` describes;
    an unknown method is said (the weights are then priced as model.weight_dtype says)."""
    if not isinstance(quant, dict):
        return CheckpointQuantization(None)
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        fmt = "fp8_block" if quant.get("weight_block_size") else "fp8"
        return CheckpointQuantization(fmt, _matcher(quant.get("ignored_layers"), False))
    if method == "fbgemm_fp8":
        return CheckpointQuantization("fp8", _matcher(quant.get("modules_to_not_convert"), False))
    if method == "mxfp4":
        return CheckpointQuantization("fp4")
    if method in ("gptq", "awq") and quant.get("bits", 4) == 4:
        return CheckpointQuantization("int4")
    if method == "compressed-tensors":
        fmt = _compressed_tensors_format(quant.get("config_groups"))
        if fmt is not None:
            return CheckpointQuantization(fmt, _matcher(quant.get("ignore"), False))
    if method == "modelopt":
        inner = quant.get("quantization") if isinstance(quant.get("quantization"), dict) else quant
        fmt = _MODELOPT_ALGOS.get(str(inner.get("quant_algo", "")).upper())
        if fmt is not None:
            return CheckpointQuantization(fmt, _matcher(inner.get("exclude_modules"), True))
    warn(
        f"{path}: quantization_config quant_method {method!r} is not understood "
        f"({_described(quant)}; understood: fp8, fbgemm_fp8, mxfp4, 4-bit gptq/awq, "
        "compressed-tensors fp8/int4/nvfp4 weights, modelopt FP8/NVFP4); the weights are "
        "priced as model.weight_dtype says",
        stacklevel=3,
    )
    return CheckpointQuantization(None)


# ModelOpt's quant_algo values whose weights the cost model has a format for.
_MODELOPT_ALGOS = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "NVFP4": "nvfp4"}


def _matcher(entries: Any, wildcards: bool) -> ModuleMatcher | None:
    if not isinstance(entries, list) or not entries:
        return None
    return ModuleMatcher.of(entries, wildcards)


def _compressed_tensors_format(groups: Any) -> str | None:
    """The one weight format of compressed-tensors' config_groups (None: none, several,
    or one the cost model has no format for)."""
    if not isinstance(groups, dict) or not groups:
        return None
    formats = {_group_format(group) for group in groups.values()}
    return formats.pop() if len(formats) == 1 else None


def _group_format(group: Any) -> str | None:
    weights = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(weights, dict):
        return None
    bits, kind = weights.get("num_bits"), str(weights.get("type", "int")).lower()
    if bits == 8 and kind == "float":
        return "fp8_block" if weights.get("block_structure") else "fp8"
    if bits == 4 and kind == "int":
        return "int4"
    if bits == 4 and kind == "float" and weights.get("group_size") == 16:
        return "nvfp4"
    return None


def _described(quant: dict[str, Any]) -> str:
    groups = quant.get("config_groups")
    if isinstance(groups, dict):
        weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)]
        return f"config_groups weights {weights}"
    return f"quant_algo {quant.get('quant_algo')!r}" if "quant_algo" in quant else "no details"
