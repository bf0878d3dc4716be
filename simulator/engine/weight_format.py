"""How a model's weights are stored: a dtype, or a block-scaled format of one.

The dtype (hardware_models.dtypes) says what the tensor cores multiply in and how many
bytes an element takes; a block-scaled format (hardware_models.block_scaling) is that
dtype plus one scale per block of weights, which runs other kernels and stores a little
more. `fp8_block` is DeepSeek-V3's and Qwen3-FP8's checkpoint format (quantization_config
weight_block_size [128, 128]): fp8 e4m3 weights with one fp32 scale per 128 x 128 block,
activations quantised per token in groups of 128 before each GEMM. `nvfp4` (an fp8 scale
per 16 weights and one fp32 scale per tensor) and `mxfp4` (an e8m0 scale per 32) are the
4-bit formats Blackwell multiplies natively; elsewhere vLLM dequantises them in Marlin's
W4A16 kernels, or has no kernel (check_weight_support). The format keeps its spelling
(the key the GEMM and fused-MoE costs look its kernels up by); `parse_dtype` folds it into
its element dtype for the arithmetic.
"""

from __future__ import annotations

from hardware_models.block_scaling import FORMATS
from hardware_models.block_scaling import FP8_BLOCK as FP8_BLOCK_FORMAT
from hardware_models.block_scaling import check_weight_support as check_weight_support
from hardware_models.dtypes import Dtype, parse_dtype
from hardware_models.errors import InfersimError
from simulator.architecture import ModelArchitecture

FP8_BLOCK = FP8_BLOCK_FORMAT.name
# Rows and columns of one scale block: vLLM refuses a tensor-parallel shard of a
# block-quantised layer that does not cut whole blocks.
FP8_BLOCK_SIZE = FP8_BLOCK_FORMAT.block_k
BLOCK_SCALED_FORMATS = tuple(FORMATS)


def weight_format(value: str | Dtype) -> str:
    """A weight format's name: a block-scaled spelling as written, a dtype by its name."""
    text = str(value).strip().lower()
    if text in BLOCK_SCALED_FORMATS:
        return text
    return parse_dtype(value).value


def check_block_shards(
    arch: ModelArchitecture, fmt: str, tp: int, expert_tp: int, field: str = "model.weight_dtype"
) -> None:
    """Refuse what vLLM's Fp8LinearMethod and Fp8MoEMethod refuse for block-quantised
    weights: with tp > 1, an MLP or expert shard (its gate/up outputs, its down input)
    that is not a whole number of 128-wide blocks. Qwen3-30B-A3B's 768-wide experts over
    tp=8 leave 96 columns a GPU; expert parallelism keeps the experts whole instead."""
    if fmt != FP8_BLOCK:
        return
    widths = []
    if tp > 1 and arch.num_dense_layers:
        widths.append(("intermediate_size", arch.intermediate_size, tp))
    if tp > 1 and arch.num_shared_experts:
        widths.append(("shared expert intermediate size", arch.shared_intermediate_size, tp))
    if expert_tp > 1 and arch.is_moe:
        widths.append(("moe_intermediate_size", arch.expert_intermediate_size, expert_tp))
    for name, width, split in widths:
        if width % split or (width // split) % FP8_BLOCK_SIZE:
            raise InfersimError(
                f"{field}: fp8_block weights need shards of whole {FP8_BLOCK_SIZE}-wide "
                f"blocks, but {arch.name}'s {name} {width} / tp {split} = {width / split:g} "
                "(vLLM refuses it); use a smaller tp, expert parallelism, or fp8"
            )
