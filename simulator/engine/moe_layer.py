"""The routed experts of one MoE layer on one GPU, tensor- or expert-parallel.

Without expert parallelism every GPU of the tp group holds a 1/tp slice of every expert
(vLLM's default: experts are tensor-parallel). With `enable_expert_parallel` the experts
are spread whole over the group's GPUs (vLLM's EP size = tp x dp; dp is 1 here), so a GPU
holds ceil(num_experts / ep) experts at full width, the most loaded rank setting the pace.
With dp = 1 the hidden states are the same on every rank, so no dispatch is needed and
the combine is the all-reduce the tensor-parallel layer already does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_cost
from hardware_models.op_cost import OpCost
from simulator.architecture import ModelArchitecture


@dataclass(frozen=True)
class ExpertLayout:
    """How one MoE layer's routed experts are split over a replica's GPUs."""

    moe_tp: int  # slices of each expert's width
    ep: int  # GPUs the experts are spread over
    experts_per_gpu: int  # on the most loaded GPU

    @classmethod
    def of(cls, arch: ModelArchitecture, tp: int, expert_parallel: bool) -> ExpertLayout:
        if not expert_parallel or tp == 1:
            return cls(moe_tp=tp, ep=1, experts_per_gpu=arch.num_experts)
        if not arch.is_moe:
            raise InfersimError(
                f"parallelism.enable_expert_parallel: {arch.name} has no experts (dense model)"
            )
        return cls(moe_tp=1, ep=tp, experts_per_gpu=math.ceil(arch.num_experts / tp))

    def expert_width(self, arch: ModelArchitecture) -> int:
        return math.ceil(arch.expert_intermediate_size / self.moe_tp)


def routed_expert_costs(
    arch: ModelArchitecture,
    gpu: AcceleratorSpec,
    tokens: int,
    layout: ExpertLayout,
    *,
    compute_dtype: Dtype,
    weight_dtype: Dtype,
) -> list[OpCost]:
    """The routed experts' GEMMs of one MoE layer on the most loaded GPU, each expert
    its own gate_up and down over ceil(tokens x top-k / experts) tokens: balanced routing,
    the best case for latency."""
    routed = math.ceil(tokens * arch.experts_per_token / arch.num_experts)
    inter = layout.expert_width(arch)
    h = arch.hidden_size
    up = 2 * inter if arch.gated_mlp else inter
    gate_up = gemm_cost(gpu, routed, up, h, compute_dtype, weight_dtype)
    down = gemm_cost(gpu, routed, h, inter, compute_dtype, weight_dtype)
    return [gate_up, down] * layout.experts_per_gpu
