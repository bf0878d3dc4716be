"""`infersim models [list] | show NAME`: the model catalog, and what one model is made of."""

from __future__ import annotations

import argparse

import pandas as pd

from hardware_models.dtypes import Dtype
from simulator.architecture import ModelArchitecture
from simulator.model_catalog import list_models, load_model

KV_DTYPES = (Dtype.BF16, Dtype.FP8)


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.set_defaults(handler=_list)
    actions = parser.add_subparsers(dest="action")
    actions.add_parser("list", help="every catalog model (the default)").set_defaults(handler=_list)
    show = actions.add_parser("show", help="one model: layers, parameters, KV bytes per token")
    show.add_argument("model", help="catalog name, catalog-format YAML, or a local config.json")
    show.set_defaults(handler=_show)


def _attention(arch: ModelArchitecture) -> str:
    if arch.is_mla:
        return f"MLA (latent {arch.kv_lora_rank} + rope {arch.qk_rope_head_dim})"
    kind = "MHA" if arch.num_kv_heads == arch.num_attention_heads else "GQA"
    return f"{kind} {arch.num_attention_heads}/{arch.num_kv_heads}"


def catalog_table() -> pd.DataFrame:
    rows = []
    for name in list_models():
        arch = load_model(name)
        rows.append(
            {
                "model": name,
                "family": arch.family,
                "layers": arch.num_layers,
                "params_b": round(arch.param_count() / 1e9, 2),
                "active_b": round(arch.active_param_count() / 1e9, 2),
                "experts": f"{arch.experts_per_token}/{arch.num_experts}" if arch.is_moe else "",
                "attention": _attention(arch),
                "kv_kb_per_token_bf16": round(arch.kv_bytes_per_token(Dtype.BF16) / 1024, 1),
            }
        )
    return pd.DataFrame(rows)


def _list(args: argparse.Namespace) -> int:
    print(catalog_table().to_string(index=False))
    print("\ninfersim models show NAME: one model in detail (NAME may be a local config.json)")
    return 0


def describe(arch: ModelArchitecture) -> list[tuple[str, str]]:
    """(item, value) rows of `models show`."""
    rows = [
        ("model", f"{arch.name} ({arch.display_name}, {arch.family})"),
        ("layers", _layers(arch)),
        ("hidden size", f"{arch.hidden_size:,}"),
        ("attention", f"{_attention(arch)}, head_dim {arch.head_dim}" + _window(arch)),
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


def _show(args: argparse.Namespace) -> int:
    rows = describe(load_model(args.model))
    width = max(len(item) for item, _ in rows)
    for item, value in rows:
        print(f"{item:<{width}}  {value}")
    return 0
