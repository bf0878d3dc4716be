"""What a model is made of, in words and figures (`infersim models show`, and notebooks
through `simulator.describe_model`)."""

from __future__ import annotations

from pathlib import Path

from hardware_models.dtypes import Dtype
from simulator.architecture import ModelArchitecture
from simulator.inputs import model_of

KV_DTYPES = (Dtype.BF16, Dtype.FP8)


def describe_model(model: ModelArchitecture | str | Path) -> list[tuple[str, str]]:
    """What a model is made of, as (item, value) rows: layers, attention, experts,
    parameters against the published figures, KV bytes per token, checkpoint format and
    source. `infersim models show` prints them; `dict(describe_model(...))` makes a column
    of a table. `model`: a ModelArchitecture, or what load_model takes."""
    arch = model_of(model, "model")
    rows = [
        ("model", f"{arch.name} ({arch.display_name}, {arch.family})"),
        ("layers", _layers(arch)),
        ("hidden size", f"{arch.hidden_size:,}"),
        ("attention", f"{attention_text(arch)}, head_dim {arch.head_dim}" + _window(arch)),
    ]
    if arch.is_moe:
        shared = (
            f", {arch.num_shared_experts} shared of {arch.shared_intermediate_size:,}"
            if arch.num_shared_experts
            else ""
        )
        rows.append(
            (
                "experts",
                f"{arch.experts_per_token} of {arch.num_experts} routed per token, each "
                f"{arch.expert_intermediate_size:,} wide{shared}",
            )
        )
    if arch.num_dense_layers:
        rows.append(("dense MLP", f"{arch.intermediate_size:,} wide"))
    rows.append(
        ("vocabulary", f"{arch.vocab_size:,}" + (", tied" if arch.tie_word_embeddings else ""))
    )
    rows.append(("parameters", _billions(arch.param_count(), arch.published_params_b)))
    active = arch.active_param_count()
    without = f"{(active - arch.embedding_params) / 1e9:,.2f} B without the embedding table"
    rows.append(
        (
            "active per token",
            f"{active / 1e9:,.2f} B ({without}"
            + (
                f"; published {arch.published_active_params_b:g} B)"
                if arch.published_active_params_b
                else ")"
            ),
        )
    )
    for dtype in KV_DTYPES:
        rows.append((f"KV bytes/token ({dtype.value})", f"{arch.kv_bytes_per_token(dtype):,.0f}"))
    rows.append(("checkpoint weights", arch.checkpoint_dtype or "unquantised (bf16 default)"))
    if arch.unquantized:
        kept = ", ".join(f"{name} x{len(layers)}" for name, layers in arch.unquantized.items())
        rows.append(("kept in 16 bits (layers)", kept))
    rows.append(("source", arch.source))
    return rows


def attention_text(arch: ModelArchitecture) -> str:
    """The attention kind and its heads: `GQA 64/8`, `MHA 40/40`, or MLA's latent sizes."""
    if arch.is_mla:
        return f"MLA (latent {arch.kv_lora_rank} + rope {arch.qk_rope_head_dim})"
    kind = "MHA" if arch.num_kv_heads == arch.num_attention_heads else "GQA"
    return f"{kind} {arch.num_attention_heads}/{arch.num_kv_heads}"


def _layers(arch: ModelArchitecture) -> str:
    if not arch.is_moe:
        return f"{arch.num_layers}"
    return f"{arch.num_layers} ({arch.num_dense_layers} dense, {arch.num_moe_layers} MoE)"


def _window(arch: ModelArchitecture) -> str:
    if arch.sliding_window is None:
        return ""
    sliding = arch.num_sliding_layers
    return f"; {sliding} of {arch.num_layers} layers slide over {arch.sliding_window:,} tokens"


def _billions(count: int, published: float | None) -> str:
    text = f"{count / 1e9:,.2f} B"
    return text + (f" (published {published:g} B)" if published else "")
