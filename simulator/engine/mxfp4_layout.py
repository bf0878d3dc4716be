"""How vLLM lays out an MXFP4 MoE checkpoint (gpt-oss) in memory: which matrices stay in
16 bits and how far each expert's matrices are padded for the kernel that runs them.

From vLLM's `Mxfp4Config.get_quant_method` and `Mxfp4MoEMethod.create_weights`
(vllm/model_executor/layers/quantization/mxfp4.py, 0.10-0.14):
- only the fused-MoE layers are MXFP4: every linear layer (attention's QKV and output
  projections, the LM head) gets `UnquantizedLinearMethod`, so stays in the activation
  dtype;
- each expert's gate/up rows and down columns (its intermediate width) and its hidden
  width are padded up for the backend: Marlin (GPUs without fp4 tensor cores: Ampere,
  Ada, Hopper, and workstation Blackwell sm_120, where the Triton kernels are not
  supported) needs n % 256 and k % 128, so the width is rounded to 128 and the hidden
  size to 256; FlashInfer's MXFP4 kernels on sm_100 (B200) round both to 256.
gpt-oss-120b's 2880-wide experts become 2944 x 3072 under Marlin: 9% more expert bytes,
which is why vLLM 0.10.1 reports 65.97 GiB of weights on an H100 (vllm#23278). vLLM on
Hopper runs the Triton (matmul_ogs) backend where triton_kernels is importable (bundled
from 0.12: hardware_models.mxfp4_moe, which the experts' cost follows), which pads the
width to 64 only (vllm#33155 reports 64.38 GiB): this layout does not follow it yet and
pads Hopper's experts as Marlin's.
"""

from __future__ import annotations

from typing import NamedTuple

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.block_scaling import MXFP4

_MARLIN_WIDTH, _MARLIN_HIDDEN = 128, 256
_SM100_WIDTH, _SM100_HIDDEN = 256, 256


class ExpertDims(NamedTuple):
    """One expert's matrix dimensions as stored: its hidden and intermediate widths."""

    hidden: int
    width: int


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def is_mxfp4_moe(weight_format: str, is_moe: bool) -> bool:
    """Whether vLLM loads the model with its Mxfp4Config: MXFP4 experts, 16-bit rest."""
    return is_moe and weight_format in (MXFP4.name, MXFP4.element.value)


def mxfp4_expert_dims(gpu: AcceleratorSpec | None, hidden: int, width: int) -> ExpertDims:
    """An MXFP4 expert's stored dimensions on `gpu` (unpadded without a GPU)."""
    if gpu is None:
        return ExpertDims(hidden, width)
    sm100 = gpu.capability_major == 10
    width_to, hidden_to = (
        (_SM100_WIDTH, _SM100_HIDDEN) if sm100 else (_MARLIN_WIDTH, _MARLIN_HIDDEN)
    )
    return ExpertDims(_round_up(hidden, hidden_to), _round_up(width, width_to))
