"""Memory-bound operators: elementwise chains (norm, activation, rotary, residual) and
embedding lookups. Fusion is modelled explicitly: a fused chain reads its inputs and
writes its output once, in one kernel, instead of one round trip and launch per op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.op_cost import OpCost


@dataclass(frozen=True, slots=True)
class Pointwise:
    """One elementwise op: tensors it reads and writes (in units of the activation size)."""

    name: str
    reads: float
    writes: float
    flops_per_element: float


RMSNORM = Pointwise("rmsnorm", reads=1, writes=1, flops_per_element=4)
LAYERNORM = Pointwise("layernorm", reads=1, writes=1, flops_per_element=8)
RESIDUAL_ADD = Pointwise("residual_add", reads=2, writes=1, flops_per_element=1)
ROTARY = Pointwise("rotary", reads=1, writes=1, flops_per_element=6)
SILU_MUL = Pointwise("silu_mul", reads=2, writes=1, flops_per_element=6)
GELU = Pointwise("gelu", reads=1, writes=1, flops_per_element=10)


def _cost(gpu: AcceleratorSpec, name: str, flops: float, dram: float, kernels: int) -> OpCost:
    eff = gpu.efficiency
    memory = dram / (gpu.memory_bandwidth * eff.memory_bandwidth)
    compute = flops / gpu.peak_vector_flops()
    floor = kernels * eff.kernel_floor_us * 1e-6
    seconds = max(memory, compute) + floor
    return OpCost.from_terms(name, seconds, flops, dram, dram, compute, memory, floor, kernels)


def elementwise_cost(
    gpu: AcceleratorSpec,
    ops: Sequence[Pointwise],
    num_elements: float,
    dtype: str | Dtype = "bf16",
    *,
    fused: bool = False,
) -> OpCost:
    """A chain of pointwise ops over `num_elements`; fused = one kernel, one round trip.

    A fused chain still reads every extra operand (a residual, the gate half of SwiGLU)
    but the intermediate results stay in registers.
    """
    if not ops:
        raise ValueError("elementwise_cost needs at least one op")
    bpe = bytes_per_element(parse_dtype(dtype))
    flops = num_elements * sum(op.flops_per_element for op in ops)
    name = "+".join(op.name for op in ops)
    if fused:
        reads = ops[0].reads + sum(op.reads - 1 for op in ops[1:])
        dram = num_elements * bpe * (reads + ops[-1].writes)
        return _cost(gpu, f"fused({name})", flops, dram, kernels=1)
    dram = num_elements * bpe * sum(op.reads + op.writes for op in ops)
    return _cost(gpu, name, flops, dram, kernels=len(ops))


def embedding_cost(
    gpu: AcceleratorSpec, tokens: int, hidden_size: int, dtype: str | Dtype = "bf16"
) -> OpCost:
    """Gather one embedding row per token: read the rows, write the activations."""
    bpe = bytes_per_element(parse_dtype(dtype))
    dram = 2.0 * tokens * hidden_size * bpe + tokens * 8  # rows, output, token ids
    return _cost(gpu, "embedding", 0.0, dram, kernels=1)


def launch_overhead_seconds(gpu: AcceleratorSpec, kernels: int, *, cuda_graph: bool) -> float:
    """Host-side cost of issuing `kernels` launches; a CUDA graph replays them for less."""
    eff = gpu.efficiency
    per_kernel = eff.launch_overhead_graph_us if cuda_graph else eff.launch_overhead_eager_us
    return kernels * per_kernel * 1e-6
