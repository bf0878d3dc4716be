"""Multi-head latent attention (DeepSeek's MLA) behind the step cost's attention calls.

The step cost prices attention through two small interfaces (DecodeAttention's
`one_step` / `__call__` / `batch_terms`, PrefillAttention's `__call__`); these adapters
give them hardware_models.mla's absorbed decode and decompressed prefill. A prefill
chunk that vLLM's MLA backend runs through the decode kernel (up to its query threshold
a sequence) stays absorbed; a longer one also decompresses its cached prefix (kv_b_proj
over the tokens computed in earlier steps), which the step's GEMMs over its new tokens
do not cover.
"""

from __future__ import annotations

from collections.abc import Callable

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype
from hardware_models.gemm import gemm_cost
from hardware_models.mla import MlaDecode, MlaPrefill, MlaShape
from simulator.architecture import ModelArchitecture

_KV_B_ROWS = 64  # rows of the smallest GEMM tile


def mla_shape(arch: ModelArchitecture, tp: int) -> MlaShape:
    """One TP rank's MLA layer: the heads split over tp, the latent whole."""
    arch.check_tp(tp)
    return MlaShape(
        num_heads=arch.num_attention_heads // tp,
        hidden_size=arch.hidden_size,
        kv_lora_rank=arch.kv_lora_rank,
        qk_nope_head_dim=arch.qk_nope_head_dim,
        qk_rope_head_dim=arch.qk_rope_head_dim,
        v_head_dim=arch.v_head_dim,
        q_lora_rank=arch.q_lora_rank,
    )


class MlaDecodeAttention:
    """Absorbed MLA decode with DecodeAttention's interface."""

    def __init__(self, gpu: AcceleratorSpec, shape: MlaShape, *, dtype: Dtype, kv_dtype: Dtype):
        self._model = MlaDecode(gpu, shape, kv_dtype, dtype)

    def batch_terms(self, num_seqs: int) -> None:
        """No context-free shortcut: the kernel may turn compute-bound with the context."""
        return None

    def __call__(self, num_seqs, context_tokens):
        p = self._model.parts(num_seqs, context_tokens)
        return p.seconds, p.flops, p.dram_bytes

    def one_step(self, num_seqs: int, context_tokens: int) -> tuple[float, float, float]:
        """`__call__` for one step in plain floats (the same numbers)."""
        return self._model.one_step_for(num_seqs)(context_tokens)

    def one_step_for(self, num_seqs: int) -> Callable[[int], tuple[float, float, float]]:
        """one_step for `num_seqs` decodes as a function of the context, as
        DecodeAttention offers it."""
        return self._model.one_step_for(num_seqs)


class MlaPrefillAttention:
    """MLA prefill with PrefillAttention's interface, plus the cached prefix's
    decompression (kv_b_proj over the keys computed in earlier steps)."""

    def __init__(
        self,
        gpu: AcceleratorSpec,
        shape: MlaShape,
        *,
        dtype: Dtype,
        kv_dtype: Dtype,
        compute_dtype: str | Dtype,  # the GEMM kernels' key (fp8_block as spelled)
        weight_dtype: str | Dtype,  # the weights' format (block-scaled spellings kept)
    ) -> None:
        self._model = MlaPrefill(gpu, shape, kv_dtype, dtype)
        self._gpu, self._compute, self._weight = gpu, compute_dtype, weight_dtype
        self._kv_b = (
            shape.num_heads * (shape.qk_nope_head_dim + shape.v_head_dim),
            shape.kv_lora_rank,
        )

    def __call__(
        self, num_seqs: int, new_tokens: int, attended_pairs: float, context_tokens: int
    ) -> tuple[float, float, float, float, float]:
        call = (num_seqs, new_tokens, attended_pairs, context_tokens)
        if self._model.absorbed(num_seqs, new_tokens):
            # The decode kernel over the latent (MlaPrefill's numbers in plain floats):
            # nothing to decompress.
            seconds, compute, memory, dram, flops = self._model.decode.chunk_terms(*call)
            return seconds, flops, dram, compute, memory
        # The flash kernel's scalar path: MlaPrefill.many's numbers, without numpy's cost.
        seconds, flops, dram, compute, memory = self._model.flash(*call)
        cached = context_tokens - new_tokens
        if cached > 0:
            n, k = self._kv_b
            # Whole 64-row tiles: the kernel computes them anyway, and the GEMM's price is
            # looked up for a few hundred prefix lengths rather than for every one.
            rows = -(-cached // _KV_B_ROWS) * _KV_B_ROWS
            kv_b = gemm_cost(self._gpu, rows, n, k, self._compute, self._weight)
            seconds += kv_b.seconds
            flops += kv_b.flops
            dram += kv_b.dram_bytes
            compute += kv_b.compute_seconds
            memory += kv_b.memory_seconds
        return seconds, flops, dram, compute, memory
