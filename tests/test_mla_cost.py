"""MLA attention: the latent KV cache, absorbed decode, decompressed prefill, the module."""

from __future__ import annotations

import dataclasses

import pytest

from hardware_models import InfersimError, load_gpu
from hardware_models.attention import causal_pairs
from hardware_models.mla import (
    DEEPSEEK_V3,
    EAGER_RMSNORM,
    MlaDecode,
    MlaPrefill,
    MlaShape,
    mla_decode_cost,
    mla_module_cost,
    mla_pointwise_costs,
    mla_prefill_cost,
    mla_projection_gemms,
)

H100 = load_gpu("h100-sxm")


def test_latent_kv_bytes_per_token():
    """(kv_lora_rank + qk_rope_head_dim) values per token and layer, whatever the heads."""
    assert DEEPSEEK_V3.kv_bytes_per_token("bf16") == (512 + 64) * 2
    assert DEEPSEEK_V3.kv_bytes_per_token("fp8") == 576
    eight = dataclasses.replace(DEEPSEEK_V3, num_heads=16)
    assert eight.kv_bytes_per_token() == DEEPSEEK_V3.kv_bytes_per_token()


def test_decode_reads_the_latent_once_and_absorbs_the_up_projections():
    cost = mla_decode_cost(H100, DEEPSEEK_V3, num_seqs=64, context_tokens=64 * 4096)
    keys = 64 * 4096
    # Every head scores the 576-wide latent and sums the 512-wide values over each key.
    assert cost.flops == 2 * 128 * (576 + 512) * keys
    queries_and_outputs = 64 * 128 * (576 + 512) * 2  # absorbed, latent wide, bf16
    assert cost.dram_bytes == keys * 1152 + queries_and_outputs
    fp8 = mla_decode_cost(H100, DEEPSEEK_V3, num_seqs=64, context_tokens=keys, kv_dtype="fp8")
    assert fp8.dram_bytes == keys * 576 + queries_and_outputs


def test_triton_head_blocks_reread_the_latent():
    """A kernel whose blocks serve 16 heads reads 128 heads' latent 8 times."""
    eff = H100.efficiency.model_copy(update={"mla_decode_head_block": 16})
    triton = MlaDecode(H100.with_efficiency(eff), DEEPSEEK_V3).parts(8, 8 * 8192)
    flash = MlaDecode(H100, DEEPSEEK_V3).parts(8, 8 * 8192)
    latent = 8 * 8192 * 1152
    assert float(triton.dram_bytes - flash.dram_bytes) == pytest.approx(7 * latent)


def test_many_heads_over_long_caches_are_compute_bound():
    one = dataclasses.replace(DEEPSEEK_V3, num_heads=1)
    parts_1 = MlaDecode(H100, one).parts(64, 64 * 131072)
    parts_128 = MlaDecode(H100, DEEPSEEK_V3).parts(64, 64 * 131072)
    assert parts_1.memory > parts_1.compute
    assert parts_128.compute > parts_128.memory


def test_prefill_has_the_decompressed_attention_flops():
    pairs = causal_pairs(2048, 2048)
    cost = mla_prefill_cost(
        H100, DEEPSEEK_V3, num_seqs=1, new_tokens=2048, attended_pairs=pairs, context_tokens=2048
    )
    assert cost.flops == pytest.approx(2 * 128 * pairs * (192 + 128))


def test_module_prices_absorbed_gemms_for_decode_and_kv_b_for_prefill():
    decode = {g[0] for g in mla_projection_gemms(DEEPSEEK_V3, decode=True)}
    prefill = {g[0] for g in mla_projection_gemms(DEEPSEEK_V3, decode=False)}
    assert decode == {"qkv_a", "q_b", "w_uk", "w_uv", "o"}
    assert prefill == {"qkv_a", "q_b", "kv_b", "o"}
    args = {"num_seqs": 4, "new_tokens": 4, "attended_pairs": 4 * 1000, "context_tokens": 4000}
    module = mla_module_cost(H100, DEEPSEEK_V3, **args)
    attention = mla_decode_cost(H100, DEEPSEEK_V3, num_seqs=4, context_tokens=4000)
    assert module.seconds > attention.seconds
    assert module.flops > attention.flops


def test_bad_shape_is_one_line_error():
    with pytest.raises(InfersimError, match="kv_lora_rank must be >= 1"):
        MlaShape(
            num_heads=8,
            hidden_size=1024,
            kv_lora_rank=0,
            qk_nope_head_dim=64,
            qk_rope_head_dim=32,
            v_head_dim=64,
        )


@pytest.mark.parametrize(
    "update",
    [
        {},
        {"mla_decode_kv_splits": 4, "mla_decode_cta_us_per_mb": 0.5},
        {"mla_decode_head_block": 16},
    ],
)
def test_decode_one_step_is_parts_in_plain_floats(update):
    """The engine's per-step path gives parts' numbers exactly (bit for bit)."""
    gpu = H100.with_efficiency(H100.efficiency.model_copy(update=update))
    for heads, kv in ((1, "bf16"), (16, "fp8"), (128, "bf16")):
        model = MlaDecode(gpu, dataclasses.replace(DEEPSEEK_V3, num_heads=heads), kv)
        for seqs in (1, 3, 64, 500):
            for keys in (1, 17, 4096, 70_001):
                parts = model.parts(seqs, seqs * keys)
                expected = (float(parts.seconds), float(parts.flops), float(parts.dram_bytes))
                assert model.one_step_for(seqs)(seqs * keys) == expected


def test_prefill_calls_of_one_token_per_sequence_run_the_decode_kernel():
    """Mixed arrays price each call as it would be priced alone."""
    model = MlaPrefill(H100, DEEPSEEK_V3)
    seqs, new, context = [4, 4, 1], [4, 4096, 512], [4000, 4096 * 4, 512]
    pairs = [4000.0, 4 * causal_pairs(1024, 1024), causal_pairs(512, 512)]
    together = model.many(seqs, new, pairs, context)
    for i in range(3):
        alone = model.many(seqs[i], new[i], pairs[i], context[i])
        assert [a[i] for a in together] == [a[0] for a in alone]
    decode = MlaDecode(H100, DEEPSEEK_V3).parts(4, 4000)
    assert together[0][0] == float(decode.seconds)


def test_heads_fill_whole_64_row_tiles():
    """FlashMLA / FlashAttention MLA compute 64 query rows a thread block: 1 to 64 heads
    cost one tile's math per key (and are memory-bound unless the cache is 8-bit)."""
    one, full = (dataclasses.replace(DEEPSEEK_V3, num_heads=h) for h in (1, 64))
    p1, p64 = (MlaDecode(H100, s).parts(64, 64 * 8192) for s in (one, full))
    assert float(p1.compute) == pytest.approx(float(p64.compute))
    assert float(p64.flops) == 64 * float(p1.flops)  # the useful FLOPs are the heads'


def test_an_8bit_cache_pays_the_query_quantisation():
    eff = H100.efficiency.model_copy(update={"mla_fp8_kv_us": 20.0})
    gpu = H100.with_efficiency(eff)
    bf16, fp8 = (MlaDecode(gpu, DEEPSEEK_V3, kv) for kv in ("bf16", "fp8"))
    assert fp8.floor - bf16.floor == pytest.approx(20e-6)


def test_short_chunks_run_the_decode_kernel_as_vllm_dispatches_them():
    """FlashAttention MLA takes chunks of up to 512 tokens a sequence through the
    absorbed kernel (nothing decompressed); longer ones, or any with no threshold
    (Triton MLA), run flash attention over decompressed K and V."""
    eff = H100.efficiency.model_copy(update={"mla_decode_query_threshold_by_kv": {"bf16": 512}})
    model = MlaPrefill(H100.with_efficiency(eff), DEEPSEEK_V3)
    pairs = 4 * causal_pairs(512, 512)
    short = model.many(4, 4 * 512, pairs, 4 * 512)
    decode = model.decode.parts(4, 4 * 512, 4 * 512, pairs)
    assert short[0][0] == float(decode.seconds)
    assert short[1][0] == pairs * DEEPSEEK_V3.decode_flops_per_key()
    long = model.many(4, 4 * 1024, 4 * causal_pairs(1024, 1024), 4 * 1024)
    assert long[1][0] == pytest.approx(2 * 128 * 4 * causal_pairs(1024, 1024) * (192 + 128))
    assert not MlaPrefill(H100, DEEPSEEK_V3).absorbed(4, 8)  # Triton MLA: one token only
    assert {g[0] for g in mla_projection_gemms(DEEPSEEK_V3, decode=True)} >= {"w_uk", "w_uv"}


def test_query_threshold_is_checked_by_cache_dtype():
    with pytest.raises(ValueError, match="query threshold must be >= 1"):
        H100.efficiency.model_validate({"mla_decode_query_threshold_by_kv": {"bf16": 0}})
    eff = H100.efficiency.model_validate({"mla_decode_query_threshold_by_kv": {"fp8_e4m3": 128}})
    assert eff.mla_decode_query_threshold("fp8") == 128
    assert eff.mla_decode_query_threshold("bf16") == 1


def test_the_engine_decompresses_the_prefix_only_outside_the_decode_kernel():
    from hardware_models.dtypes import Dtype
    from simulator.engine.latent_attention import MlaPrefillAttention

    eff = H100.efficiency.model_copy(update={"mla_decode_query_threshold_by_kv": {"bf16": 512}})
    dtypes = {"dtype": Dtype.BF16, "kv_dtype": Dtype.BF16, "weight_dtype": Dtype.BF16}
    engine = MlaPrefillAttention(
        H100.with_efficiency(eff), DEEPSEEK_V3, compute_dtype="bf16", **dtypes
    )
    triton = MlaPrefillAttention(H100, DEEPSEEK_V3, compute_dtype="bf16", **dtypes)
    # A 512-token chunk after 3,584 cached tokens: absorbed, or decompressed with kv_b.
    call = (1, 512, 512 * 3584 + causal_pairs(512, 512), 4096)
    absorbed, flash = engine(*call), triton(*call)
    assert absorbed[:3] == tuple(float(a[0]) for a in engine._model.many(*call)[:3])
    attention_flops = 2 * 128 * call[2] * (192 + 128)
    kv_b_flops = 2 * 3584 * 128 * (128 + 128) * 512  # the cached prefix, decompressed
    assert flash[1] - attention_flops == pytest.approx(kv_b_flops)


def _engine_prefill(kv: str):
    """The engine's MLA prefill on the H100 with FlashAttention MLA's and FlashMLA's
    query thresholds (512 with a 16-bit cache, 128 with an 8-bit one)."""
    from hardware_models.dtypes import Dtype
    from simulator.engine.latent_attention import MlaPrefillAttention

    thresholds = {"bf16": 512, "fp8": 128}
    eff = H100.efficiency.model_copy(update={"mla_decode_query_threshold_by_kv": thresholds})
    return MlaPrefillAttention(
        H100.with_efficiency(eff), DEEPSEEK_V3, dtype=Dtype.BF16, kv_dtype=Dtype(kv),
        compute_dtype="bf16", weight_dtype=Dtype.BF16,
    )  # fmt: skip


LONG = (1500, causal_pairs(1500, 1500), 1500)  # a 1,500-token chunk from empty
SHORT = (10, causal_pairs(10, 2010), 2010)  # 10 tokens after 2,000 cached


def test_a_steps_chunks_are_classed_by_their_own_length():
    """vLLM sends each request down the decode or the prefill path by its own query
    length: one long chunk and three short ones are two calls, not one flash call over
    1,530 tokens (which also decompressed the short ones' 6,000 cached tokens)."""
    engine = _engine_prefill("bf16")
    long, short = engine(1, *LONG), engine(3, 30, 3 * SHORT[1], 3 * SHORT[2])
    mixed = engine.by_sequence([LONG, SHORT, SHORT, SHORT], decodes=4)
    assert mixed == tuple(a + b for a, b in zip(short, long, strict=True))
    one_call = engine(4, 1530, LONG[1] + 3 * SHORT[1], 1500 + 3 * 2010)
    assert mixed[0] < 0.8 * one_call[0]
    # Chunks of one class are the call they always were.
    assert engine.by_sequence([SHORT] * 3, decodes=0) == short


def test_flashmla_absorbs_only_a_step_of_uniform_query_lengths():
    """FlashMLA (8-bit caches) takes uniform query lengths: short chunks beside one-token
    decodes, or beside chunks of another length, go down the prefill path."""
    engine = _engine_prefill("fp8")
    alone = engine.by_sequence([SHORT] * 3, decodes=0)
    assert alone == engine(3, 30, 3 * SHORT[1], 3 * SHORT[2])  # absorbed
    flash = engine._flash(3, 30, 3 * SHORT[1], 3 * SHORT[2])
    assert engine.by_sequence([SHORT] * 3, decodes=4) == flash
    other = (20, causal_pairs(20, 2020), 2020)
    assert engine.by_sequence([SHORT, other], decodes=0) == engine._flash(
        2, 30, SHORT[1] + other[1], SHORT[2] + other[2]
    )
    # FlashAttention MLA (16-bit caches) takes any mix.
    bf16 = _engine_prefill("bf16")
    assert bf16.by_sequence([SHORT] * 3, decodes=4) == bf16.by_sequence([SHORT] * 3, decodes=0)


def test_chunk_terms_are_parts_in_plain_floats():
    """The engine's scalar path for calls the decode kernel runs equals MlaPrefill.many."""
    eff = H100.efficiency.model_copy(update={"mla_decode_query_threshold_by_kv": {"bf16": 512}})
    for heads in (1, 16, 128):
        model = MlaPrefill(
            H100.with_efficiency(eff), dataclasses.replace(DEEPSEEK_V3, num_heads=heads)
        )
        for seqs, new, cached in ((3, 3, 9000), (4, 4 * 37, 4 * 700), (2, 2 * 512, 0)):
            pairs = seqs * (cached / seqs * new / seqs + causal_pairs(new // seqs, new // seqs))
            context = cached + new
            seconds, flops, dram, compute, memory = (
                float(a[0]) for a in model.many(seqs, new, pairs, context)
            )
            terms = model.decode.chunk_terms(seqs, new, pairs, context)
            assert terms == (seconds, compute, memory, dram, flops)


def test_the_uncompiled_module_runs_pytorch_native_norms_and_rotary():
    """The public module tables time vLLM's module without torch.compile: its RMSNorms
    run as PyTorch ops through fp32 (36 bytes moved per bf16 element, not 4)."""
    fused = mla_pointwise_costs(H100, DEEPSEEK_V3, 1024)
    eager = mla_pointwise_costs(H100, DEEPSEEK_V3, 1024, eager=True)
    norm_elements = 1024 * (1536 + 512)
    assert fused[0].dram_bytes == norm_elements * 2 * 2
    assert eager[0].dram_bytes + eager[1].dram_bytes == norm_elements * 36
    assert eager[0].kernels == len(EAGER_RMSNORM)
    assert sum(c.seconds for c in eager) > sum(c.seconds for c in fused)


def test_the_step_prices_mla_prefill_by_sequence():
    """StepCostModel.step takes each chunk's (new, pairs, keys) from the replica and
    prices an MLA model's prefill attention by class: per layer the saving of two calls
    over one aggregated flash call."""
    from hardware_models.calibration_lookup import choose_calibration
    from hardware_models.presets import load_node
    from simulator.engine.step_cost import StepCostModel
    from simulator.model_catalog import load_model

    arch = load_model("deepseek-v3")
    gpu = choose_calibration(load_gpu("h200-sxm")).gpu
    model = StepCostModel(arch, gpu, load_node("hgx-h200"), weight_dtype="fp8_block", tp=8)
    chunks = [LONG, SHORT, SHORT, SHORT]
    step = {
        "decode_seqs": 0,
        "decode_context": 0,
        "prefill_seqs": 4,
        "prefill_tokens": 1530,
        "prefill_pairs": LONG[1] + 3 * SHORT[1],
        "prefill_context": LONG[2] + 3 * SHORT[2],
    }
    by_sequence = model.step(**step, prefill_chunks=chunks)
    aggregated = model.step(**step)
    attention = model._prefill_attention
    saved = attention(*list(step.values())[2:])[0] - attention.by_sequence(chunks, 0)[0]
    assert saved > 0
    assert aggregated.seconds - by_sequence.seconds == pytest.approx(saved * arch.num_layers)
