"""What a chip and a machine can do, priced as operators. Knows nothing of transformers.

Names are imported on first use (a module-level `__getattr__`, as in `simulator`), so
importing one submodule, `hardware_models.errors` say, does not load pydantic, numpy and
every operator model with it: `infersim --help` pays for none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hardware_models.lazy import lazy_names

if TYPE_CHECKING:
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
    from hardware_models.mla import MlaShape, mla_decode_cost, mla_module_cost, mla_prefill_cost
    from hardware_models.moe import MoeLayer, MoeShape, Routing, moe_cost
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

_SOURCES: dict[str, str] = {
    "AcceleratorSpec": "hardware_models.accelerator",
    "attention_decode_cost": "hardware_models.attention",
    "attention_decode_seconds": "hardware_models.attention",
    "attention_prefill_cost": "hardware_models.attention",
    "causal_pairs": "hardware_models.attention",
    "Algorithm": "hardware_models.collectives",
    "Collective": "hardware_models.collectives",
    "collective_cost": "hardware_models.collectives",
    "Dtype": "hardware_models.dtypes",
    "bytes_per_element": "hardware_models.dtypes",
    "parse_dtype": "hardware_models.dtypes",
    "EfficiencyCurve": "hardware_models.efficiency",
    "EfficiencyProfile": "hardware_models.efficiency",
    "InfeasibleError": "hardware_models.errors",
    "InfersimError": "hardware_models.errors",
    "InfersimWarning": "hardware_models.errors",
    "gemm_cost": "hardware_models.gemm",
    "MlaShape": "hardware_models.mla",
    "mla_decode_cost": "hardware_models.mla",
    "mla_module_cost": "hardware_models.mla",
    "mla_prefill_cost": "hardware_models.mla",
    "MoeLayer": "hardware_models.moe",
    "MoeShape": "hardware_models.moe",
    "Routing": "hardware_models.moe",
    "moe_cost": "hardware_models.moe",
    "LinkSpec": "hardware_models.node",
    "NodeSpec": "hardware_models.node",
    "Bound": "hardware_models.op_cost",
    "OpCost": "hardware_models.op_cost",
    "GELU": "hardware_models.pointwise",
    "LAYERNORM": "hardware_models.pointwise",
    "Pointwise": "hardware_models.pointwise",
    "RESIDUAL_ADD": "hardware_models.pointwise",
    "RMSNORM": "hardware_models.pointwise",
    "ROTARY": "hardware_models.pointwise",
    "SILU_MUL": "hardware_models.pointwise",
    "elementwise_cost": "hardware_models.pointwise",
    "embedding_cost": "hardware_models.pointwise",
    "launch_overhead_seconds": "hardware_models.pointwise",
    "list_gpus": "hardware_models.presets",
    "list_nodes": "hardware_models.presets",
    "load_gpu": "hardware_models.presets",
    "load_node": "hardware_models.presets",
}

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
    "MlaShape",
    "MoeLayer",
    "MoeShape",
    "NodeSpec",
    "OpCost",
    "Pointwise",
    "Routing",
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
    "mla_decode_cost",
    "mla_module_cost",
    "mla_prefill_cost",
    "moe_cost",
    "parse_dtype",
]


__getattr__, __dir__ = lazy_names(__name__, _SOURCES, __all__)
