"""DeepSeek-V3 decode steps on 8x H200 (TP8): the step time per batch size, and what one
layer costs at batch 1, for comparing with published serving figures.

    python benchmarks/moe_decode_steps.py [--weights fp8_block] [--calibration PATH]
"""

from __future__ import annotations

import argparse

from hardware_models.gemm import gemm_cost
from hardware_models.presets import load_gpu, load_node, with_calibration
from simulator.engine.step_cost import StepCostModel
from simulator.model_catalog import load_model

BATCHES = (1, 8, 32, 256)
CONTEXT = 1024  # keys attended per sequence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="fp8_block")
    parser.add_argument("--calibration", default=None, help="a calibration profile's path")
    args = parser.parse_args()
    gpu = load_gpu("h200-sxm")
    if args.calibration:
        gpu = with_calibration(gpu, args.calibration)
    arch = load_model("deepseek-v3")
    model = StepCostModel(arch, gpu, load_node("hgx-h200"), weight_dtype=args.weights, tp=8)
    steps = [model.step(decode_seqs=b, decode_context=b * CONTEXT).seconds for b in BATCHES]
    print(
        "step ms: " + "  ".join(f"b{b} {s * 1e3:.1f}" for b, s in zip(BATCHES, steps, strict=True))
    )
    print("batch 1, one layer, us (kernels; layers):")
    for name, m, n, k, layers in arch.gemms(1, 8):
        cost = gemm_cost(gpu, m, n, k, *model.gemm_dtypes(name))
        print(f"  {name:<16}{n:>6} x {k:<6}{cost.seconds * 1e6:7.1f}  ({cost.kernels}; {layers})")
    routed = model._routed_experts(1)
    moe_layers = arch.num_moe_layers
    print(f"  {'routed experts':<30}{routed.seconds * 1e6:7.1f}  ({routed.kernels}; {moe_layers})")
    attention = model._decode_attention.one_step(1, CONTEXT)[0]
    print(f"  {'MLA decode attention':<30}{attention * 1e6:7.1f}")
    reduce = model.tp_all_reduce.cost(arch.hidden_size * 2.0).seconds  # vLLM's backend
    print(f"  {'all-reduce (2 a layer)':<30}{reduce * 1e6:7.1f}")
    launch, kernels = model.decode_steps(1).launch, model._fixed(1, 1).kernels
    print(f"  {'launches, whole step':<30}{launch * 1e6:7.1f}  ({kernels} kernels)")


if __name__ == "__main__":
    main()
