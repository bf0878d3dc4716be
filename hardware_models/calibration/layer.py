"""The one transformer layer the harness times end to end, and its predicted time.

The fitter calibrates single operators; timing a whole Llama-style layer (RMSNorm, QKV,
rotary, attention, O, SwiGLU MLP, two residual adds) checks that the calibrated operators
add up to a real layer. The harness runs it eagerly, so the host launches every kernel:
the prediction is the larger of the operators' device time and those launches.

A `transformer_layer` row of the long table stores the layer in its shape columns:
batch, q_len (new tokens per sequence), kv_len, num_heads, num_kv_heads, head_dim, and
m = tokens (batch x q_len), n = hidden size, k = MLP intermediate size.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import attention_decode_cost, attention_prefill_cost, causal_pairs
from hardware_models.gemm import gemm_cost
from hardware_models.pointwise import (
    RESIDUAL_ADD,
    RMSNORM,
    ROTARY,
    SILU_MUL,
    elementwise_cost,
    launch_overhead_seconds,
)

# ATen ops one eager forward of the harness layer runs that launch a kernel (views launch
# none), counted with torch.profiler: 9 mul, 6 to, 6 add, 4 matmul, 2 each of pow, mean,
# rsqrt, neg, cat and copy_, one scaled_dot_product_attention, one silu.
EAGER_KERNELS = 39


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def weight_flops_per_token(self) -> float:
        qkv = self.hidden * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        out = self.num_heads * self.head_dim * self.hidden
        return 2.0 * (qkv + out + 3 * self.hidden * self.intermediate)


# Llama-3-8B's layer on a GPU; a small layer of the same form for a CPU run.
GPU_LAYER = LayerShape(hidden=4096, intermediate=14336, num_heads=32, num_kv_heads=8, head_dim=128)
CPU_LAYER = LayerShape(hidden=256, intermediate=512, num_heads=4, num_kv_heads=2, head_dim=64)


def layer_flops(shape: LayerShape, batch: int, q_len: int, kv_len: int) -> float:
    """GEMM FLOPs plus attention FLOPs: the `size` of a transformer_layer row."""
    attention = 4.0 * shape.num_heads * shape.head_dim * batch * causal_pairs(q_len, kv_len)
    return batch * q_len * shape.weight_flops_per_token() + attention


def layer_seconds(
    gpu: AcceleratorSpec, shape: LayerShape, batch: int, q_len: int, kv_len: int, dtype: str
) -> float:
    """Predicted time of one eager forward of the harness layer."""
    tokens = batch * q_len
    h, kvh, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
    act = tokens * shape.hidden
    device = [
        elementwise_cost(gpu, [RMSNORM], act, dtype),
        gemm_cost(gpu, tokens, (h + 2 * kvh) * d, shape.hidden, dtype),
        elementwise_cost(gpu, [ROTARY], tokens * (h + kvh) * d, dtype),
        gemm_cost(gpu, tokens, shape.hidden, h * d, dtype),
        elementwise_cost(gpu, [RESIDUAL_ADD], act, dtype),
        elementwise_cost(gpu, [RMSNORM], act, dtype),
        gemm_cost(gpu, tokens, 2 * shape.intermediate, shape.hidden, dtype),
        elementwise_cost(gpu, [SILU_MUL], tokens * shape.intermediate, dtype),
        gemm_cost(gpu, tokens, shape.hidden, shape.intermediate, dtype),
        elementwise_cost(gpu, [RESIDUAL_ADD], act, dtype),
    ]
    heads = {"num_heads": h, "num_kv_heads": kvh, "head_dim": d, "dtype": dtype, "kv_dtype": dtype}
    if q_len == 1:
        attn = attention_decode_cost(gpu, num_seqs=batch, context_tokens=batch * kv_len, **heads)
    else:
        attn = attention_prefill_cost(
            gpu,
            num_seqs=batch,
            new_tokens=tokens,
            attended_pairs=batch * causal_pairs(q_len, kv_len),
            context_tokens=batch * kv_len,
            **heads,
        )
    device_s = sum(c.seconds for c in device) + attn.seconds
    host_s = launch_overhead_seconds(gpu, EAGER_KERNELS, cuda_graph=False)
    return max(device_s, host_s)
