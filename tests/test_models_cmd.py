"""`infersim models`: the catalog list and one model's description."""

import json

import pytest

from hardware_models.errors import InfersimError
from simulator.cli.main import main
from simulator.model_catalog import list_models


def test_models_lists_the_catalog(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in list_models():
        assert name in out
    assert main(["models", "list"]) == 0


def test_models_show_moe_mla(capsys):
    assert main(["models", "show", "deepseek-v3"]) == 0
    out = capsys.readouterr().out
    assert "61 (3 dense, 58 MoE)" in out
    assert "8 of 256 routed per token" in out
    assert "671.03 B (published 671 B)" in out
    assert "KV bytes/token (bf16)  70,272" in out and "KV bytes/token (fp8)   35,136" in out


def test_models_show_hybrid_window(capsys):
    assert main(["models", "show", "gemma-2-9b"]) == 0
    assert "21 of 42 layers slide over 4,096 tokens" in capsys.readouterr().out


def test_models_show_reads_a_config_json(tmp_path, capsys):
    config = {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 28,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
    }  # fmt: skip  (Qwen3-0.6B)
    path = tmp_path / "Qwen3-0.6B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    assert main(["models", "show", str(path)]) == 0
    assert "0.60 B" in capsys.readouterr().out


def test_models_show_bad_names_are_one_line(capsys):
    assert main(["models", "show", "llama-3.1-8"]) == 2
    assert "did you mean" in capsys.readouterr().err
    assert main(["models", "show", "Qwen/Qwen3-8B"]) == 2
    assert "local config.json" in capsys.readouterr().err


def test_catalog_names_are_case_insensitive_as_gpu_names(tmp_path, monkeypatch):
    """`Qwen3-30B-A3B` is the catalog's qwen3-30b-a3b (as `H100-SXM` is h100-sxm); a file
    or folder of that name in the working directory still comes first."""
    from simulator.model_catalog import load_model

    assert load_model("Qwen3-30B-A3B") is load_model("qwen3-30b-a3b")
    assert load_model("LLAMA-3.1-8B").name == "llama-3.1-8b"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Llama-3.1-8B").mkdir()  # a local model folder, its config.json unfinished
    (tmp_path / "Llama-3.1-8B" / "config.json").write_text("{}")
    with pytest.raises(InfersimError, match=r"Llama-3\.1-8B/config\.json"):
        load_model("Llama-3.1-8B")
