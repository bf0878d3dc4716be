"""Where one decode step of a scenario's replica goes, part by part: each GEMM, the routed
experts, the pointwise chains, the all-reduces, attention by kind of layer, the LM head
and the kernel launches, per layer and per step, against the step the engine prices
(StepCostModel.step). For comparing a model's step with a published measurement.

    python benchmarks/decode_step_parts.py SCENARIO.yaml --seqs 128 --context 1536
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

from hardware_models.dtypes import bytes_per_element
from hardware_models.gemm import gemm_cost
from hardware_models.pointwise import elementwise_cost, embedding_cost
from simulator.build import build_replica
from simulator.engine.step_cost import window_sums
from simulator.scenario import Scenario


def parts(path: str, seqs: int, context: int) -> tuple[list[tuple[str, float, int, int]], object]:
    """(name, seconds of one call, calls a step, kernels of one call) of every part of a
    decode step of `seqs` sequences at `context` keys each, and the engine's step price."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost = build_replica(Scenario.from_yaml(path)).cost
    arch, gpu = cost.arch, cost.gpu
    rows = []
    for name, m, n, k, layers in arch.gemms(seqs, cost.tp):
        op = gemm_cost(gpu, m, n, k, *cost.gemm_dtypes(name))
        rows.append((f"gemm {name} ({n} x {k})", op.seconds, layers, op.kernels))
    if arch.is_moe:
        experts = cost._routed_experts(seqs)
        rows.append(("routed experts", experts.seconds, arch.num_moe_layers, experts.kernels))
    for chain, per_token, layers in cost._chains:
        op = elementwise_cost(gpu, chain, seqs * per_token, cost.act_dtype, fused=True)
        names = "+".join(getattr(c, "name", str(c)) for c in chain)
        rows.append((f"pointwise {names}", op.seconds, layers, op.kernels))
    act_bytes = seqs * arch.hidden_size * bytes_per_element(cost.act_dtype)
    for plan, layers in cost.stage_all_reduces:
        op = plan.cost(act_bytes)
        rows.append((f"all-reduce {act_bytes / 1024:.0f} KiB", op.seconds, 2 * layers, op.kernels))
    for layers, _, decode, slides in cost._attention_kinds:
        keys = seqs * (min(context, arch.sliding_window) if slides else context)
        seconds, _, _ = decode.one_step(seqs, keys)
        rows.append((f"attention, {'sliding' if slides else 'full'}", seconds, layers, 1))
    embed = embedding_cost(gpu, seqs, arch.hidden_size, cost.act_dtype)
    rows.append(("embedding", embed.seconds, 1, embed.kernels))
    head = cost._lm_head(seqs)
    rows.append(("LM head + logits gather", sum(head.seconds), 1, head.kernels))
    kernels = sum(calls * n for _, _, calls, n in rows)
    rows.append(("kernel launches", cost._per_kernel_us * 1e-6, kernels, 0))
    window = window_sums(arch.sliding_window, np.full(seqs, context), [])
    step = cost.step(decode_seqs=seqs, decode_context=seqs * context, window=window)
    return rows, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--seqs", type=int, required=True, help="decoding sequences")
    parser.add_argument("--context", type=int, required=True, help="keys of each sequence")
    args = parser.parse_args()
    rows, step = parts(args.scenario, args.seqs, args.context)
    print(f"{'part':40s} {'us a call':>10s} {'calls':>6s} {'ms a step':>10s} {'share':>6s}")
    total = 0.0
    for name, seconds, calls, _ in rows:
        total += seconds * calls
        print(
            f"{name:40s} {seconds * 1e6:10.2f} {calls:6d} {seconds * calls * 1e3:10.3f} "
            f"{seconds * calls / step.gpu_seconds:6.1%}"
        )
    print(f"{'sum of the parts':40s} {'':10s} {'':6s} {total * 1e3:10.3f}")
    print(f"{'the step as the engine prices it':40s} {'':10s} {'':6s} {step.seconds * 1e3:10.3f}")


if __name__ == "__main__":
    main()
