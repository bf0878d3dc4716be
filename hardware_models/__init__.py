"""What a chip and a machine can do, priced as operators. Knows nothing of transformers."""

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import (
    attention_decode_cost,
    attention_decode_seconds,
    attention_prefill_cost,
    causal_pairs,
)
from hardware_models.collectives import Algorithm, Collective, collective_cost
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.efficiency import EfficiencyCurve, EfficiencyProfile
from hardware_models.errors import InfeasibleError, InfersimError, InfersimWarning
from hardware_models.gemm import gemm_cost
from hardware_models.node import LinkSpec, NodeSpec
from hardware_models.op_cost import Bound, OpCost
from hardware_models.pointwise import (
    GELU,
    LAYERNORM,
    RESIDUAL_ADD,
    RMSNORM,
    ROTARY,
    SILU_MUL,
    Pointwise,
    elementwise_cost,
    embedding_cost,
    launch_overhead_seconds,
)
from hardware_models.presets import list_gpus, list_nodes, load_gpu, load_node

__all__ = [
    "GELU",
    "LAYERNORM",
    "RESIDUAL_ADD",
    "RMSNORM",
    "ROTARY",
    "SILU_MUL",
    "AcceleratorSpec",
    "Algorithm",
    "Bound",
    "Collective",
    "Dtype",
    "EfficiencyCurve",
    "EfficiencyProfile",
    "InfeasibleError",
    "InfersimError",
    "InfersimWarning",
    "LinkSpec",
    "NodeSpec",
    "OpCost",
    "Pointwise",
    "attention_decode_cost",
    "attention_decode_seconds",
    "attention_prefill_cost",
    "bytes_per_element",
    "causal_pairs",
    "collective_cost",
    "elementwise_cost",
    "embedding_cost",
    "gemm_cost",
    "launch_overhead_seconds",
    "list_gpus",
    "list_nodes",
    "load_gpu",
    "load_node",
    "parse_dtype",
]
