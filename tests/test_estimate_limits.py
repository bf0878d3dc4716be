"""`infersim estimate` at the edges: more memory than any tensor-parallel group holds, a
sequence beyond the model's context, and a tp the GPU's node cannot place."""

import math
import re

from hardware_models.presets import load_gpu
from simulator.cli.main import main
from simulator.model_catalog import load_model
from simulator.sizing import detailed_inference, valid_tp_at_least, valid_tps

ESTIMATE = ("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_tp_stops_at_the_largest_the_heads_split_over():
    """256 x 128k tokens of KV need over 100 H100s; llama-3.1-8b's 32 heads split over 32
    at most, so the estimate keeps tp=32 (its overhead) and says tp alone cannot hold it."""
    arch = load_model("llama-3.1-8b")
    assert valid_tps(arch) == [1, 2, 4, 8, 16, 32]
    assert valid_tp_at_least(arch, 5) == 8 and valid_tp_at_least(arch, 33) is None
    est = detailed_inference(arch, load_gpu("h100-sxm"), batch=256, seq_len=131072)
    assert est.tp == 32 and est.gpus > 100 and not est.tp_holds
    # the count at tp=32's overhead, each GPU paying it once
    shardable = est.total - est.framework_overhead
    assert est.gpus == math.ceil(shardable / (est.usable_per_gpu - est.framework_overhead))
    huge = detailed_inference(arch, load_gpu("h100-sxm"), batch=10**12, seq_len=100_000)
    assert huge.tp == 32 and huge.gpus > 10**11


def test_estimate_says_when_no_tensor_parallel_size_holds_it(capsys):
    code, out, _ = run(capsys, *ESTIMATE, "--batch", "256", "--seq", "131072")
    assert code == 0
    needed = next(line for line in out.splitlines() if "GPUs needed" in line)
    assert re.search(r"GPUs needed: \d{3} by memory", needed)
    assert "largest tensor-parallel size" in needed
    assert "tp=32 (32 attention heads, 8 KV heads)" in needed and "pipeline" in needed
    assert "--batch / --seq" in needed
    assert "Serving plan at tp=32 (the largest valid tp" in out and "tp=216" not in out


def test_estimate_refuses_a_sequence_beyond_the_context(capsys):
    code, out, err = run(capsys, *ESTIMATE, "--seq", "300000")
    assert code == 2 and out == ""
    assert "--seq 300000 is above llama-3.1-8b's context of 131072 tokens" in err
    assert "at most 131072" in err
    code, _, _ = run(capsys, *ESTIMATE, "--seq", "131072")
    assert code == 0


def test_estimate_proposes_no_tp_the_node_cannot_place(capsys):
    """No node preset is built from the L4, so `run` places it alone (l4-single, no
    inter-node link) and refuses tp=64; estimate says so rather than planning it."""
    code, out, _ = run(capsys, "estimate", "--model", "llama-3.1-405b", "--gpu", "l4")
    assert code == 0
    assert "refuses that layout: tp=64 needs 64 GPUs" in out
    assert "l4-single node has 1 and no inter-node link" in out
    assert "Serving plan: none" in out and "raise --tp" not in out
    code, out, _ = run(capsys, "estimate", "--model", "llama-3.1-405b", "--gpu", "l4",
                       "--tp", "2")  # fmt: skip
    assert "Serving plan: none, `infersim run` refuses tp=2: --tp=2 needs 2 GPUs" in out
    code, out, _ = run(capsys, *ESTIMATE, "--tp", "12")
    assert "--tp=12 spans nodes of 8 GPUs unevenly" in out
