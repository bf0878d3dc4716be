"""`infersim models [list] | show NAME`: the model catalog, and what one model is made of."""

from __future__ import annotations

import argparse

import pandas as pd

from hardware_models.dtypes import Dtype
from simulator.model_catalog import list_models, load_model
from simulator.model_description import attention_text, describe_model


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.set_defaults(handler=_list)
    actions = parser.add_subparsers(dest="action")
    actions.add_parser("list", help="every catalog model (the default)").set_defaults(handler=_list)
    show = actions.add_parser("show", help="one model: layers, parameters, KV bytes per token")
    show.add_argument("model", help="catalog name, catalog-format YAML, or a local config.json")
    show.set_defaults(handler=_show)


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
                "attention": attention_text(arch),
                "kv_kb_per_token_bf16": round(arch.kv_bytes_per_token(Dtype.BF16) / 1024, 1),
            }
        )
    return pd.DataFrame(rows)


def _list(args: argparse.Namespace) -> int:
    print(catalog_table().to_string(index=False))
    print("\ninfersim models show NAME: one model in detail (NAME may be a local config.json)")
    return 0


def _show(args: argparse.Namespace) -> int:
    rows = describe_model(args.model)
    width = max(len(item) for item, _ in rows)
    for item, value in rows:
        print(f"{item:<{width}}  {value}")
    return 0
