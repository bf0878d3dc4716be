"""Multi-head latent attention (DeepSeek's MLA) behind the step cost's attention calls.

The step cost prices attention through two small interfaces (DecodeAttention's
`one_step` / `__call__` / `batch_terms`, PrefillAttention's `__call__`); these adapters
give them hardware_models.mla's absorbed decode and decompressed prefill. A prefill
chunk that vLLM's MLA backend runs through the decode kernel (up to its query threshold
a sequence) stays absorbed; a longer one also decompresses its cached prefix (kv_b_proj
over the tokens computed in earlier steps), which the step's GEMMs over its new tokens
do not cover. vLLM classifies each request by its own query length
(split_decodes_and_prefills), so a step's chunks are priced by class (`by_sequence`):
one long chunk does not send three short ones to the flash kernel, nor three short
ones absorb a long one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype
from hardware_models.gemm import gemm_cost
from hardware_models.mla import MlaDecode, MlaPrefill, MlaShape
from simulator.architecture import ModelArchitecture

_KV_B_ROWS = 64  # rows of the smallest GEMM tile
# One prefill chunk of a step: (new tokens, attended (query, key) pairs, keys).
PrefillChunk = tuple[int, float, int]


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
        """(seconds, flops, dram_bytes, compute_s, memory_s) of `num_seqs` chunks of
        equal length, `new_tokens` in all (PrefillAttention's interface)."""
        if self._model.absorbed(num_seqs, new_tokens):
            return self._absorbed(num_seqs, new_tokens, attended_pairs, context_tokens)
        return self._flash(num_seqs, new_tokens, attended_pairs, context_tokens)

    def by_sequence(
        self, chunks: Sequence[PrefillChunk], decodes: int
    ) -> tuple[float, float, float, float, float]:
        """`__call__`'s terms for a step's prefill `chunks` beside `decodes` one-token
        decodes, each chunk classed by its own length: up to the query threshold the
        decode kernel, longer the flash kernel; on a backend of uniform query lengths
        (MlaDecode.uniform_queries) the decode kernel only when every query of the step
        has one length. Chunks of one class add up to one call of that class."""
        decode = self._model.decode
        lengths = {new for new, _, _ in chunks}
        if decode.uniform_queries:
            uniform = len(lengths | ({1} if decodes else set())) == 1
            threshold = decode.query_threshold if uniform else 0
        else:
            threshold = decode.query_threshold
        absorbed = [c for c in chunks if c[0] <= threshold]
        flash = [c for c in chunks if c[0] > threshold]
        parts = [
            price(len(group), *map(sum, zip(*group, strict=True)))
            for price, group in ((self._absorbed, absorbed), (self._flash, flash))
            if group
        ]
        seconds, flops, dram, compute, memory = map(sum, zip(*parts, strict=True))
        return seconds, flops, dram, compute, memory

    def _absorbed(
        self, num_seqs: int, new_tokens: int, attended_pairs: float, context_tokens: int
    ) -> tuple[float, float, float, float, float]:
        """The decode kernel over the latent (MlaPrefill's numbers in plain floats):
        nothing to decompress."""
        seconds, compute, memory, dram, flops = self._model.decode.chunk_terms(
            num_seqs, new_tokens, attended_pairs, context_tokens
        )
        return seconds, flops, dram, compute, memory

    def _flash(
        self, num_seqs: int, new_tokens: int, attended_pairs: float, context_tokens: int
    ) -> tuple[float, float, float, float, float]:
        """The flash kernel's scalar path (MlaPrefill.many's numbers, without numpy's
        cost), plus the cached prefix's decompression."""
        call = (num_seqs, new_tokens, attended_pairs, context_tokens)
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
