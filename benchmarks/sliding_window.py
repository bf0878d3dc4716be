"""What pricing sliding-window layers over their window saves: one decode step of 8
sequences at a long context, each catalog model with sliding layers against the same
model priced with every layer full (what infersim did before), on an H100 with its
shipped profile.

    python benchmarks/sliding_window.py
"""

from __future__ import annotations

import numpy as np

from hardware_models.presets import load_gpu, load_node
from simulator.engine.step_cost import StepCostModel, window_sums
from simulator.model_catalog import load_model

MODELS = ("gpt-oss-20b", "gpt-oss-120b", "gemma-2-9b", "gemma-2-27b", "mistral-7b")
SEQS = 8  # whose caches fit next to the weights on one H100 (gpt-oss-120b: TP8)


def main() -> None:
    gpu, node = load_gpu("h100-sxm", calibration="h100-sxm"), load_node("dgx-h100")
    print("model          layers (sliding)  window  context  step ms (all full)  saved")
    for name in MODELS:
        arch = load_model(name)
        full = arch.model_copy(update={"sliding_window": None, "full_attention_interval": None})
        dtype = arch.checkpoint_dtype or "bf16"
        tp = 8 if name == "gpt-oss-120b" else 1
        hybrid = StepCostModel(arch, gpu, node, weight_dtype=dtype, tp=tp)
        plain = StepCostModel(full, gpu, node, weight_dtype=dtype, tp=tp)
        context = min(32768, arch.max_position_embeddings)
        window = window_sums(arch.sliding_window, np.full(SEQS, context), [])
        cheap = hybrid.step(decode_seqs=SEQS, decode_context=SEQS * context, window=window)
        dear = plain.step(decode_seqs=SEQS, decode_context=SEQS * context)
        print(
            f"{name:<14} {arch.num_layers:>3} ({arch.num_sliding_layers:>2})"
            f"{arch.sliding_window:>13,} {context:>8,} {1e3 * cheap.seconds:>8.2f}"
            f" ({1e3 * dear.seconds:>6.2f}) {1 - cheap.seconds / dear.seconds:>10.0%}"
        )


if __name__ == "__main__":
    main()
