"""The routed experts of one MoE layer on one GPU, tensor- or expert-parallel.

Without expert parallelism every GPU of the tp group holds a 1/tp slice of every expert
(vLLM's default: experts are tensor-parallel). With `enable_expert_parallel` the experts
are spread whole over the group's GPUs (vLLM's EP size = tp x dp), so a GPU holds
ceil(num_experts / ep) experts at full width, the most loaded rank setting the pace.
With attention data parallelism (dp > 1) the MoE group is all tp x dp GPUs either way
(without EP each expert is sliced tp x dp ways, as vLLM flattens tp across dp), and
every rank's tokens are dispatched to it and combined back (priced in step_cost). With
dp = 1 the hidden states are the same on every rank, so no dispatch is needed and the
combine is the all-reduce the tensor-parallel layer already does. The layer itself is
vLLM's fused MoE kernel (hardware_models.moe): one kernel sequence, grouped GEMMs over
the experts that receive tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.block_scaling import MXFP4, NVFP4
from hardware_models.dtypes import Dtype
from hardware_models.errors import InfersimError
from hardware_models.mxfp4_moe import Mxfp4MoeBackend, mxfp4_moe_backend
from hardware_models.op_cost import OpCost
from simulator.architecture import ModelArchitecture
from simulator.engine.weight_format import FP8_BLOCK, weight_format
from simulator.vllm_defaults import EMULATED_VLLM_VERSION

# The fused-MoE kernel that runs each weight format (simulator.engine.weight_format) by
# its name (hardware_models.efficiency.MOE_FORMATS).
_MOE_FORMAT = {
    Dtype.BF16.value: "bf16",
    Dtype.FP16.value: "bf16",  # the same kernel and bytes
    Dtype.FP8.value: "fp8",  # per-tensor scales
    FP8_BLOCK: "fp8_block",  # 128 x 128 block scales (DeepSeek-V3, Qwen3-FP8)
    Dtype.INT4.value: "int4_wo",  # Marlin, 4-bit weights with group scales
    Dtype.FP4.value: "w4a16_mxfp4",  # gpt-oss's MXFP4 experts, on Marlin (mxfp4_backend)
    MXFP4.name: "w4a16_mxfp4",
    NVFP4.name: "w4a16_nvfp4",  # Marlin with an fp8 scale per 16 weights
}


@dataclass(frozen=True)
class ExpertLayout:
    """How one MoE layer's routed experts are split over a replica's GPUs."""

    moe_tp: int  # slices of each expert's width
    ep: int  # GPUs the experts are spread over
    experts_per_gpu: int  # on the most loaded GPU

    @classmethod
    def of(
        cls, arch: ModelArchitecture, tp: int, expert_parallel: bool, dp: int = 1
    ) -> ExpertLayout:
        """The layout over a replica's MoE group: its tp x dp GPUs."""
        group = tp * dp
        if expert_parallel and not arch.is_moe:
            raise InfersimError(
                f"parallelism.enable_expert_parallel: {arch.name} has no experts (dense model)"
            )
        if arch.is_moe and not arch.gated_mlp:
            raise InfersimError(
                f"{arch.name}: gated_mlp is false, but the fused MoE kernel runs gated "
                "(gate and up) experts"
            )
        if not expert_parallel or group == 1:
            return cls(moe_tp=group, ep=1, experts_per_gpu=arch.num_experts)
        if group > arch.num_experts:
            raise InfersimError(
                f"parallelism.enable_expert_parallel: {arch.name} has {arch.num_experts} "
                f"experts, fewer than the tp x dp = {group} GPUs to spread them over"
            )
        from hardware_models.moe import local_experts  # scipy, for MoE models only

        return cls(moe_tp=1, ep=group, experts_per_gpu=local_experts(arch.num_experts, group))

    def expert_width(self, arch: ModelArchitecture) -> int:
        return math.ceil(arch.expert_intermediate_size / self.moe_tp)


def mxfp4_backend(
    weight_dtype: str | Dtype, gpu: AcceleratorSpec, use_marlin: bool = False
) -> Mxfp4MoeBackend | None:
    """The kernel the emulated vLLM runs MXFP4 experts with on `gpu` (Marlin where
    `use_marlin`: VLLM_MXFP4_USE_MARLIN=1); None for experts in another format."""
    if weight_format(weight_dtype) not in (MXFP4.name, Dtype.FP4.value):
        return None
    return mxfp4_moe_backend(gpu, EMULATED_VLLM_VERSION, use_marlin)


def moe_note(
    weight_dtype: str | Dtype, gpu: AcceleratorSpec, use_marlin: bool = False
) -> str | None:
    """What a run says of its experts' kernel, where vLLM picks it by GPU (MXFP4)."""
    backend = mxfp4_backend(weight_dtype, gpu, use_marlin)
    return None if backend is None else backend.describe(EMULATED_VLLM_VERSION)


def moe_format(
    weight_dtype: str | Dtype, gpu: AcceleratorSpec | None = None, use_marlin: bool = False
) -> str:
    """The fused-MoE kernel format for experts stored in `weight_dtype` (a weight format)
    on `gpu`: MXFP4 experts run the kernel vLLM picks for the GPU, or Marlin with
    `use_marlin` (the checkpoint's Marlin format where no GPU is named)."""
    fmt = weight_format(weight_dtype)
    if fmt not in _MOE_FORMAT:
        raise InfersimError(
            f"model.weight_dtype: MoE experts in {fmt} have no fused-MoE kernel cost; "
            f"allowed: {', '.join(_MOE_FORMAT)}"
        )
    backend = None if gpu is None else mxfp4_backend(fmt, gpu, use_marlin)
    return _MOE_FORMAT[fmt] if backend is None else backend.moe_format


def routed_experts_cost(
    arch: ModelArchitecture,
    gpu: AcceleratorSpec,
    tokens: int,
    layout: ExpertLayout,
    *,
    weight_dtype: str | Dtype,
    routing: str = "balanced",
    mxfp4_use_marlin: bool = False,
) -> OpCost:
    """One MoE layer's routed experts for `tokens` tokens on the most loaded GPU: the
    fused kernel with its top-k routing pass (the router GEMM and the shared experts are
    dense GEMMs of the layer); MXFP4 experts on Marlin where `mxfp4_use_marlin`."""
    from hardware_models.moe import moe_cost  # scipy, for MoE models only

    return moe_cost(
        gpu,
        num_tokens=tokens,
        hidden_size=arch.hidden_size,
        inter_size=arch.expert_intermediate_size,
        topk=arch.experts_per_token,
        num_experts=arch.num_experts,
        tp=layout.moe_tp,
        ep=layout.ep,
        moe_format=moe_format(weight_dtype, gpu, mxfp4_use_marlin),
        routing=routing,
    )
