"""gpt-oss's MXFP4 experts by the kernel vLLM runs on each GPU: one MoE layer and one
step of gpt-oss-20b and -120b on one H100 (its shipped profile) and one B200, at 1 and 64
decoding sequences (1,024 keys each) and one 8,192-token prefill chunk, with the bf16
FLOP time of the layer's experts at the tensor peak for scale.

    python benchmarks/gpt_oss_mxfp4.py
"""

from __future__ import annotations

import numpy as np

from hardware_models.calibration_lookup import choose_calibration
from hardware_models.dtypes import Dtype
from hardware_models.presets import load_gpu, load_node
from simulator.engine.moe_layer import ExpertLayout, routed_experts_cost
from simulator.engine.step_cost import StepCostModel, window_sums
from simulator.model_catalog import load_model

GPUS = (("h100-sxm", "dgx-h100"), ("b200", "hgx-b200"))
TOKENS = (1, 64, 8192)
CONTEXT = 1024  # keys per decoding sequence


def main() -> None:
    print("model         gpu       tokens  moe ms/layer  bf16 floor ms  step ms  kernel")
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        arch = load_model(name)
        for gpu_name, node_name in GPUS:
            profile = choose_calibration(load_gpu(gpu_name)).profile
            gpu = load_gpu(gpu_name, calibration=profile)
            cost = StepCostModel(arch, gpu, load_node(node_name), weight_dtype="fp4")
            layout = ExpertLayout.of(arch, 1, False)
            for tokens in TOKENS:
                moe = routed_experts_cost(arch, gpu, tokens, layout, weight_dtype="fp4")
                if tokens > 64:  # one prefill chunk
                    window = window_sums(arch.sliding_window, np.empty(0), [(tokens, tokens)])
                    step = cost.step(
                        decode_seqs=0,
                        decode_context=0,
                        prefill_seqs=1,
                        prefill_tokens=tokens,
                        prefill_pairs=tokens * (tokens + 1) / 2,
                        prefill_context=tokens,
                        window=window,
                    )
                else:
                    window = window_sums(arch.sliding_window, np.full(tokens, CONTEXT), [])
                    step = cost.step(
                        decode_seqs=tokens, decode_context=tokens * CONTEXT, window=window
                    )
                floor = moe.flops / gpu.peak_flops(Dtype.BF16)
                note = cost.moe_kernel_note()
                print(
                    f"{name:13s} {gpu_name:9s} {tokens:6d} {moe.seconds * 1e3:12.3f} "
                    f"{floor * 1e3:14.3f} {step.seconds * 1e3:8.2f}  {note}"
                )


if __name__ == "__main__":
    main()
