"""Roofline properties of the operator costs, checked over generated shapes."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hardware_models import (
    RESIDUAL_ADD,
    RMSNORM,
    SILU_MUL,
    Bound,
    Dtype,
    attention_decode_cost,
    attention_prefill_cost,
    causal_pairs,
    collective_cost,
    elementwise_cost,
    gemm_cost,
    launch_overhead_seconds,
    load_gpu,
    load_node,
)
from hardware_models.efficiency import EfficiencyCurve
from hardware_models.errors import InfersimError

H100 = load_gpu("h100-sxm")
A100 = load_gpu("a100-80gb-sxm")
dims = st.integers(min_value=1, max_value=65536)


@settings(max_examples=300, deadline=None)
@given(m=dims, n=dims, k=dims, gpu=st.sampled_from([H100, A100]))
def test_gemm_never_beats_its_roofline(m, n, k, gpu):
    cost = gemm_cost(gpu, m, n, k, "bf16")
    compute_floor = 2.0 * m * n * k / gpu.peak_flops(Dtype.BF16)
    memory_floor = 2.0 * (m * k + k * n + m * n) / gpu.memory_bandwidth
    assert cost.seconds >= compute_floor
    assert cost.seconds >= memory_floor * 0.999
    assert cost.flops == 2.0 * m * n * k
    assert cost.dram_bytes >= 2.0 * (m * k + k * n) * 0.999


@settings(max_examples=200, deadline=None)
@given(m=dims, n=dims, k=dims, grow=st.sampled_from(["m", "n", "k"]))
# Splitting k = 768 in three (256-long slices) where k = 384 cannot split at all was 6%
# faster while the split-K reduction kernel was priced as free.
@example(m=1, n=1, k=384, grow="k")
def test_gemm_time_is_monotone_in_each_dimension(m, n, k, grow):
    base = gemm_cost(H100, m, n, k).seconds
    bigger = {"m": (2 * m, n, k), "n": (m, 2 * n, k), "k": (m, n, 2 * k)}[grow]
    # Tile heuristics can switch shape at a boundary; never by more than a hair.
    assert gemm_cost(H100, *bigger).seconds >= base * 0.97


def test_gemm_bounds_match_intuition():
    assert gemm_cost(H100, 8192, 8192, 8192).bound == Bound.COMPUTE
    assert gemm_cost(H100, 1, 8192, 8192).bound == Bound.MEMORY
    assert gemm_cost(H100, 8, 8, 8).bound == Bound.LATENCY


def test_fp8_gemm_is_faster_than_bf16_when_compute_bound():
    bf16 = gemm_cost(H100, 8192, 8192, 8192, "bf16").seconds
    fp8 = gemm_cost(H100, 8192, 8192, 8192, "fp8").seconds
    assert fp8 < 0.6 * bf16


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(InfersimError, match="fp8"):
        gemm_cost(A100, 1024, 1024, 1024, "fp8")


def test_causal_pairs_closed_forms():
    assert causal_pairs(4, 4) == 1 + 2 + 3 + 4
    assert causal_pairs(1, 10) == 10  # one decode-like query sees every key
    assert causal_pairs(2, 6) == 5 + 6  # two new tokens after four cached
    assert causal_pairs(6, 6, window=3) == 1 + 2 + 3 + 3 + 3 + 3
    assert causal_pairs(2, 6, window=3) == 3 + 3


def _prefill(batch, q, heads=32, kv_heads=8, kv_dtype="bf16"):
    return attention_prefill_cost(
        H100,
        num_seqs=batch,
        new_tokens=batch * q,
        attended_pairs=batch * causal_pairs(q, q),
        context_tokens=batch * q,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=128,
        kv_dtype=kv_dtype,
    )


@settings(max_examples=100, deadline=None)
@given(batch=st.integers(1, 64), q=st.integers(2, 8192))
def test_prefill_attention_grows_with_length(batch, q):
    # From 2 tokens: one token a sequence runs the decode kernel, which need not be
    # faster (A100, 2 sequences: 18.4 us for 1 token each, 11.8 us for 16).
    assert _prefill(batch, 2 * q).seconds >= _prefill(batch, q).seconds
    cost = _prefill(batch, q)
    assert cost.seconds >= cost.flops / H100.peak_flops(Dtype.BF16)


def test_long_prefill_is_compute_bound_and_quadratic():
    short, long = _prefill(1, 8192), _prefill(1, 16384)
    assert long.bound == Bound.COMPUTE
    assert 3.0 < long.seconds / short.seconds < 4.5


def test_sliding_window_prefill_pays_for_the_tiles_at_both_edges_of_the_window():
    def cost(window):
        return attention_prefill_cost(
            H100,
            num_seqs=1,
            new_tokens=8192,
            attended_pairs=causal_pairs(8192, 8192, window),
            context_tokens=8192,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            window=window,
        )

    windowed, full = cost(128), cost(None)
    assert windowed.seconds < full.seconds
    # Work per query: 128 keys attended, but two 128-key blocks computed (~256 keys).
    per_pair = windowed.compute_seconds / windowed.flops * 32 * 128 * 4
    per_pair_full = full.compute_seconds / full.flops * 32 * 128 * 4
    assert per_pair / per_pair_full > 1.7


def test_prefill_efficiency_follows_keys_per_query_not_flops():
    curve = EfficiencyCurve(sizes=[16.0, 4096.0], values=[0.1, 0.7])
    gpu = H100.with_efficiency(
        H100.efficiency.model_copy(update={"attention_prefill_compute": curve})
    )

    def per_token(batch, q):
        cost = attention_prefill_cost(
            gpu,
            num_seqs=batch,
            new_tokens=batch * q,
            attended_pairs=batch * causal_pairs(q, q),
            context_tokens=batch * q,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
        )
        return cost.compute_seconds / (batch * q)

    # Same prompt length, 8x the FLOPs: the same efficiency (up to wave quantisation).
    assert per_token(64, 2048) == pytest.approx(per_token(8, 2048), rel=0.05)
    # Same FLOPs, longer prompts: each query's key loop is longer and runs faster.
    assert per_token(1, 8192) / 4 < per_token(16, 2048) * 1.0


def test_unpacked_gqa_runs_one_query_head_per_thread_block():
    def cost(pack):
        eff = H100.efficiency.model_copy(update={"prefill_pack_gqa": pack})
        return attention_prefill_cost(
            H100.with_efficiency(eff),
            num_seqs=256,
            new_tokens=256 * 16,
            attended_pairs=256 * causal_pairs(16, 16),
            context_tokens=256 * 16,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
        )

    # 256 x 8 packed blocks against 256 x 32: four times the waves of fixed block cost.
    assert cost(False).compute_seconds > cost(True).compute_seconds


def test_decode_attention_reads_the_kv_cache():
    def decode(ctx, kv_dtype="bf16"):
        return attention_decode_cost(
            H100,
            num_seqs=64,
            context_tokens=64 * ctx,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            kv_dtype=kv_dtype,
        )

    cost = decode(4096)
    kv_bytes = 2 * 64 * 4096 * 8 * 128 * 2
    assert cost.dram_bytes >= kv_bytes
    assert cost.seconds >= kv_bytes / H100.memory_bandwidth
    assert cost.bound == Bound.MEMORY
    assert decode(8192).seconds > 1.8 * decode(4096).seconds * 0.9
    assert decode(8192, "fp8").seconds < 0.6 * decode(8192).seconds


def test_decode_splits_long_caches_unless_the_kernel_cannot():
    """Few long caches: a kernel that splits them over the SMs pays the combine pass; one
    that cannot (FlashAttention-2 without GQA) streams each cache from one block."""
    import numpy as np

    from hardware_models.attention import DecodeAttention, decode_keys_read

    def model(split: str, heads: int = 8) -> DecodeAttention:
        eff = A100.efficiency.model_copy(
            update={
                "decode_split_kv": split,
                "decode_cta_us_per_mb": 45.0,
                "decode_split_overhead_us": 5.0,
            }
        )
        return DecodeAttention(
            A100.with_efficiency(eff), num_heads=heads, num_kv_heads=8, head_dim=128
        )

    long_cache = 131072
    unsplit = model("gqa").one_step(1, long_cache)[0]
    split = model("always").one_step(1, long_cache)[0]
    # 8 blocks stream 67 MB each at ~22 GB/s: 3.0 ms (measured: 3.0 ms), against 0.34 ms
    # in 13 slices a cache.
    assert unsplit == pytest.approx(3.0e-3, rel=0.05) and unsplit > 8 * split
    assert model("gqa", heads=32).one_step(1, long_cache)[0] == pytest.approx(split, rel=1e-3)
    # The combine pass only when a cache is split; short caches are one tile.
    short = model("always").parts(1, 64)
    assert short.overhead == pytest.approx(A100.efficiency.decode_floor_us * 1e-6)
    # The engine prices one step in floats and runs of steps in arrays: same numbers.
    contexts = np.array([64, 4096, 40000, long_cache])
    many = model("always")(4, contexts)[0]
    assert list(many) == [model("always").one_step(4, int(c))[0] for c in contexts]
    # A sliding window reads its keys plus the partial tile at its far edge.
    assert list(decode_keys_read(np.array([100, 4096]), 128)) == [100, 192]


def test_fusion_saves_round_trips_and_launches():
    chain = [RESIDUAL_ADD, RMSNORM]
    unfused = elementwise_cost(H100, chain, 4096 * 8192)
    fused = elementwise_cost(H100, chain, 4096 * 8192, fused=True)
    assert fused.dram_bytes < unfused.dram_bytes
    assert fused.kernels == 1 and unfused.kernels == 2
    assert fused.seconds < unfused.seconds
    assert elementwise_cost(H100, [SILU_MUL], 1e6).bound in (Bound.MEMORY, Bound.LATENCY)


def test_cuda_graphs_cut_launch_overhead():
    assert launch_overhead_seconds(H100, 500, cuda_graph=True) < launch_overhead_seconds(
        H100, 500, cuda_graph=False
    )


def test_collectives_follow_alpha_beta():
    link = load_node("dgx-h100").intra_node_link
    small = collective_cost("all_reduce", 1024, 8, link)
    large = collective_cost("all_reduce", 1 << 30, 8, link)
    assert small.bound == Bound.LATENCY
    assert large.bound == Bound.COMMUNICATION
    # Ring all-reduce moves 2 (p-1)/p of the buffer through each GPU's link.
    assert large.seconds >= 2 * 7 / 8 * (1 << 30) / (link.bandwidth_gbps * 1e9)
    gather = collective_cost("all_gather", 1 << 30, 8, link)
    assert gather.seconds < large.seconds
    assert collective_cost("all_reduce", 1 << 20, 1, link).seconds == 0.0
    assert collective_cost("send_recv", 1 << 20, 2, link).seconds > 0


def test_collective_bad_input():
    link = load_node("dgx-h100").intra_node_link
    with pytest.raises(InfersimError, match="allowed"):
        collective_cost("broadcastish", 1024, 8, link)
    with pytest.raises(InfersimError, match="num_gpus"):
        collective_cost("all_reduce", 1024, 0, link)


# ------------------------------------------------------------------ GEMM kernel families


def _with_fp8_kernel(gpu, **kernel):
    from hardware_models.efficiency import GemmKernel

    eff = gpu.efficiency.model_copy(update={"gemm_kernel_by_dtype": {"fp8": GemmKernel(**kernel)}})
    return gpu.with_efficiency(eff)


def test_cutlass_dispatch_by_m_pads_tiles_and_never_splits_k():
    # vLLM's fp8 scaled_mm at m = 256, n = 32, k = 65536 runs two 128x128 tiles over the
    # whole k loop (171 us measured): no split-K, n padded to 128.
    gpu = _with_fp8_kernel(H100, dispatch="by_m")
    eff = gpu.efficiency.gemm_compute.at(2.0 * 256 * 32 * 65536)
    tile_math = 2.0 * 128 * 128 * 65536 / (H100.peak_flops(Dtype.FP8) / H100.sm_count * eff)
    cost = gemm_cost(gpu, 256, 32, 65536, "fp8")
    assert cost.compute_seconds == pytest.approx(tile_math)
    cublas = _with_fp8_kernel(H100)  # cuBLASLt: the fastest tile, split-K allowed
    assert cost.seconds > 5 * gemm_cost(cublas, 256, 32, 65536, "fp8").seconds
    # Up to 64 rows it swaps A and B: 16 rows of m by 64 of n a tile (four of them, side
    # by side, at m = 64), a sixteenth of the padded work; 64x64 for wider n.
    small = gemm_cost(gpu, 64, 32, 65536, "fp8").compute_seconds
    assert small == pytest.approx(tile_math / 16, rel=0.01)
    wide = gemm_cost(gpu, 64, 2048, 65536, "fp8").compute_seconds  # 32 tiles: one wave
    assert wide == pytest.approx(tile_math / 4, rel=0.01)


def test_activation_quantisation_and_row_padding_passes():
    cublas = _with_fp8_kernel(H100)  # cuBLASLt, inputs already quantised
    plain = gemm_cost(cublas, 4096, 32, 16384, "fp8")
    quant = gemm_cost(_with_fp8_kernel(H100, quantize_activations=True), 4096, 32, 16384, "fp8")
    stream = H100.memory_bandwidth * H100.efficiency.memory_bandwidth
    # The pass streams 3 bytes an element, and its kernel pays one launch floor of its own.
    floor = H100.efficiency.kernel_floor_us * 1e-6
    assert quant.seconds - plain.seconds == pytest.approx(4096 * 16384 * 3 / stream + floor)
    assert quant.kernels == 2 and quant.dram_bytes > plain.dram_bytes
    aligned = _with_fp8_kernel(H100, align_m=4)
    padded = gemm_cost(aligned, 257, 4096, 4096, "fp8").seconds
    pad = padded - gemm_cost(cublas, 257, 4096, 4096, "fp8").seconds
    # Zero the padded fp8 buffer, copy the rows in: 3 bytes an element, plus the copies'
    # launches (one kernel floor unless a profile fitted gemm_pad_us_by_dtype).
    assert pad == pytest.approx(H100.efficiency.kernel_floor_us * 1e-6 + 257 * 4096 * 3 / stream)
    assert gemm_cost(aligned, 256, 4096, 4096, "fp8") == gemm_cost(cublas, 256, 4096, 4096, "fp8")
    pad = {"gemm_pad_us_by_dtype": {"fp8": 5.0}}
    fitted = aligned.with_efficiency(aligned.efficiency.model_copy(update=pad))
    extra = gemm_cost(fitted, 257, 4096, 4096, "fp8").seconds - padded
    assert extra == pytest.approx((5.0 - H100.efficiency.kernel_floor_us) * 1e-6)


def test_a_slow_quantiser_stretches_only_the_quantisation_pass():
    # The H100 table's block-scaled fp8 GEMMs at n = 256, k = 4096 take 169 us at m =
    # 16384 against 58 us in bf16: the per-token-group quantiser (column-major scales)
    # streams the activations at about half the copy rate.
    quant = _with_fp8_kernel(H100, quantize_activations=True)
    half = quant.with_efficiency(
        quant.efficiency.model_copy(update={"gemm_quant_bandwidth_by_dtype": {"fp8": 0.425}})
    )
    pass_s = 16384 * 4096 * 3 / (H100.memory_bandwidth * 0.85)
    slow = gemm_cost(half, 16384, 256, 4096, "fp8").seconds
    assert slow - gemm_cost(quant, 16384, 256, 4096, "fp8").seconds == pytest.approx(pass_s)
    assert gemm_cost(half, 16384, 256, 4096, "bf16") == gemm_cost(H100, 16384, 256, 4096, "bf16")


def test_a_cluster_launches_whole_so_tile_rows_round_up_to_it():
    # vLLM's Hopper fp8 kernel past m = 128: 128x128 tiles in 2x1 clusters. m = 257 needs
    # three tile rows and launches four, so at n = 16384 (128 tile columns) it runs four
    # waves where m = 256 runs two (measured 261 us vs 116 us at k = 16384).
    paired = _with_fp8_kernel(H100, dispatch="by_m", cluster_m=2)
    single = _with_fp8_kernel(H100, dispatch="by_m")
    from hardware_models.gemm import gemm_parts

    assert gemm_parts(paired, 257, 16384, 16384, "fp8").math_s == pytest.approx(
        2 * gemm_parts(paired, 256, 16384, 16384, "fp8").math_s
    )
    assert gemm_parts(single, 257, 16384, 16384, "fp8").math_s == pytest.approx(
        1.5 * gemm_parts(single, 256, 16384, 16384, "fp8").math_s
    )
    # The swapped buckets (m <= 64) lay m along the kernel's N: no rounding there.
    assert gemm_cost(paired, 33, 4096, 4096, "fp8") == gemm_cost(single, 33, 4096, 4096, "fp8")


def test_wave_latency_is_paid_once_per_wave_after_the_first():
    from hardware_models.gemm import gemm_parts

    eff = H100.efficiency.model_copy(update={"gemm_wave_latency_us": 2.0})
    slow = H100.with_efficiency(eff)
    parts = gemm_parts(slow, 8192, 8192, 8192)
    waves = parts.latency_s / 2e-6 + 1
    assert waves == pytest.approx(round(waves)) and waves >= 8192 * 8192 / (256 * 128 * 132)
    # The first wave fills its pipeline under the kernel's floor: a one-wave kernel
    # (A100, n = k = 32: 2.5 us measured, like an empty kernel) pays no wave latency.
    assert gemm_parts(slow, 1, 32, 32).latency_s == 0.0
    # It stretches the compute side only: the time exceeds the latency-free price.
    assert gemm_cost(slow, 8192, 8192, 8192).seconds > gemm_cost(H100, 8192, 8192, 8192).seconds


def test_one_thread_block_streams_its_panels_at_a_capped_rate():
    from hardware_models.gemm import gemm_parts

    # vLLM's fp8 kernel at m = 1, n = 32, k = 65536 runs one 16x64 tile for 33 us on an
    # H100 where its math takes 9 us at peak: one block pulls its panels at ~160 GB/s.
    gpu = _with_fp8_kernel(H100, dispatch="by_m")
    update = {"gemm_cta_us_per_mb_by_dtype": {"fp8": 6.0}}
    capped = gpu.with_efficiency(gpu.efficiency.model_copy(update=update))
    parts = gemm_parts(capped, 1, 32, 65536, "fp8")
    assert parts.stream_s == pytest.approx((16 + 64) * 65536 * 6.0e-12)
    assert parts.compute_s == pytest.approx(parts.stream_s) and parts.stream_s > parts.math_s
    # Large tiles over many waves: the math outlasts the stream, which does not show.
    big = (4096, 8192, 8192, "fp8")
    assert gemm_cost(capped, *big).seconds == gemm_cost(gpu, *big).seconds


def test_one_token_prefill_is_priced_as_the_decode_kernel():
    """A prefill call in which every sequence brings one token runs the decode kernel (the
    libraries dispatch on the longest query): on the public tables the two measure within
    1%, so the prefill model prices it as that decode call."""
    for gpu in (H100, A100):
        for batch, heads, kv_heads in ((1, 32, 8), (64, 64, 1), (256, 8, 8)):
            prefill = attention_prefill_cost(
                gpu,
                num_seqs=batch,
                new_tokens=batch,
                attended_pairs=batch,
                context_tokens=batch,
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=128,
            )
            decode = attention_decode_cost(
                gpu,
                num_seqs=batch,
                context_tokens=batch,
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=128,
            )
            assert prefill.seconds == pytest.approx(decode.seconds)
            assert prefill.overhead_seconds == decode.overhead_seconds
    # Two tokens a sequence is a prefill again.
    two = attention_decode_cost(
        H100, num_seqs=4, context_tokens=8, num_heads=32, num_kv_heads=8, head_dim=128
    )
    assert _prefill(4, 2).seconds != two.seconds


def test_fa2_gqa_decode_copies_queries_and_outputs_unless_the_swap_is_a_view():
    """FlashAttention-2's swapped GQA decode reshapes (batch, kv_heads x group) queries to
    (batch x group, kv_heads): a view for one sequence or one KV head, otherwise a copy in
    and a copy out (A100: 18.3 us against 12.4 us at 2 keys)."""
    from hardware_models.attention import DecodeAttention

    def seconds(batch: int, heads: int, kv_heads: int, split: str = "gqa") -> float:
        eff = A100.efficiency.model_copy(
            update={"decode_split_kv": split, "decode_gqa_copy_us": 6.0}
        )
        model = DecodeAttention(
            A100.with_efficiency(eff), num_heads=heads, num_kv_heads=kv_heads, head_dim=128
        )
        return model.one_step(batch, 2 * batch)[0]

    copies = seconds(4, 32, 8) - seconds(4, 32, 8, split="always")
    assert copies == pytest.approx(6.0e-6)
    for batch, heads, kv_heads in ((1, 32, 8), (4, 32, 1), (4, 8, 8)):  # views, or no swap
        assert seconds(batch, heads, kv_heads) == seconds(batch, heads, kv_heads, "always")


def test_decode_steps_of_a_calibrated_curve_price_as_the_array_path() -> None:
    """one_step (plain floats, the batch's terms worked out once per batch size) gives
    the array path's numbers to the bit, with and without the split-KV terms."""
    import numpy as np

    from hardware_models.attention import DecodeAttention
    from hardware_models.calibration.profile_file import read_profile
    from hardware_models.presets import calibration_path

    calibrated = A100.with_efficiency(read_profile(calibration_path("a100-80gb-sxm")).efficiency)
    plain = calibrated.efficiency.model_copy(
        update={"decode_cta_us_per_mb": 0.0, "decode_split_overhead_us": 0.0,
                "decode_gqa_copy_us": 0.0}
    )  # fmt: skip
    contexts = np.array([1, 64, 4096, 40000, 131072, 1_000_000])
    for gpu in (calibrated, A100.with_efficiency(plain)):
        model = DecodeAttention(gpu, num_heads=32, num_kv_heads=8, head_dim=128)
        for seqs in (1, 4, 96):
            many = model(seqs, seqs * contexts)
            for j, c in enumerate(seqs * contexts):
                assert model.one_step(seqs, int(c)) == (many[0][j], many[1][j], many[2][j])


def test_prefill_memory_curve_defaults_to_the_streaming_bandwidth():
    """Unfitted, prefill streams at memory_bandwidth; a fitted attention_prefill_memory
    slows the memory-bound calls (short prompts in large MHA batches) and only those."""
    eff = A100.efficiency
    assert eff.prefill_memory.at(1e9) == eff.memory_bandwidth
    slow = A100.with_efficiency(
        eff.model_copy(update={"attention_prefill_memory": EfficiencyCurve.constant(0.3)})
    )

    def cost(gpu, batch, q):
        return attention_prefill_cost(
            gpu,
            num_seqs=batch,
            new_tokens=batch * q,
            attended_pairs=batch * q * (q + 1) // 2,
            context_tokens=batch * q,
            num_heads=64,
            num_kv_heads=64,
            head_dim=128,
        )

    short = cost(slow, 128, 128)
    assert short.seconds > 1.5 * cost(A100, 128, 128).seconds
    assert short.memory_seconds > short.compute_seconds
    assert cost(slow, 1, 16384).seconds == cost(A100, 1, 16384).seconds


def test_before_hopper_output_stores_follow_the_k_loop():
    """Ampere's GEMM kernels store each output tile after its k loop (the A100 table pays
    store + math at short k); Hopper's store one tile while computing the next."""
    from hardware_models.efficiency import GemmKernel
    from hardware_models.gemm import gemm_parts

    m, n, k = 4096, 8192, 256
    stores = m * n * 2 / (A100.memory_bandwidth * A100.efficiency.memory_bandwidth)
    ampere = gemm_parts(A100, m, n, k, "bf16")
    assert ampere.epilogue_s == pytest.approx(stores)
    assert ampere.compute_s == pytest.approx(
        max(ampere.math_s, ampere.stream_s) + ampere.latency_s + stores
    )
    assert gemm_parts(H100, m, n, k, "bf16").epilogue_s == 0.0
    overlapped = GemmKernel(serial_epilogue=False)
    eff = A100.efficiency.model_copy(update={"gemm_kernel_by_dtype": {"bf16": overlapped}})
    plain = gemm_parts(A100.with_efficiency(eff), m, n, k, "bf16")
    assert plain.epilogue_s == 0.0 and plain.seconds < ampere.seconds
    # A user's accelerator file may spell the architecture in any case.
    spelled = A100.model_copy(update={"architecture": " ampere"})
    assert gemm_parts(spelled, m, n, k, "bf16").epilogue_s == ampere.epilogue_s


def test_before_hopper_shared_memory_caps_small_tiles():
    """Each warp of an mma.sync tile loads its own fragments from shared memory: a 64 x 64
    bf16 tile on the A100 moves 768 bytes per step of k (6 clocks at 128 bytes/clock) for
    4 clocks of tensor math. Hopper's warpgroup MMAs read shared memory directly."""
    from hardware_models.gemm import TILE_SHAPES, _setup, gemm_parts, shared_memory_share

    smem = A100.shared_memory_bandwidth_per_sm
    peak = A100.peak_flops(Dtype.BF16) / A100.sm_count
    assert shared_memory_share(64, 64, 2, 2, peak, smem) == pytest.approx(2 / 3)
    assert shared_memory_share(64, 128, 2, 2, peak, smem) == pytest.approx(8 / 9)
    assert shared_memory_share(128, 128, 2, 2, peak, smem) == 1.0
    assert set(_setup(H100, "bf16", None).tile_share.values()) == {1.0}
    # The RTX 4090 has a quarter of the A100's tensor rate per SM and clock: no cuBLAS tile
    # reaches the cap (only by-m dispatch's 16-row tile would).
    ada = _setup(load_gpu("rtx-4090"), "bf16", None).tile_share
    assert all(ada[tile] == 1.0 for tile in TILE_SHAPES)
    # Only shapes that run small tiles pay, by at most the cap.
    wide = A100.model_copy(update={"shared_memory_bytes_per_clock_per_sm": 1e6})
    slowdown = gemm_parts(A100, 512, 4096, 1024).seconds / gemm_parts(wide, 512, 4096, 1024).seconds
    assert 1.1 < slowdown <= 1.5
    big = (8192, 8192, 8192)
    assert gemm_parts(A100, *big).seconds == gemm_parts(wide, *big).seconds


def test_split_k_fills_the_sms_in_any_count(monkeypatch):
    """m = 512, n = 1024 is 32 tiles of 128 x 128 on 108 SMs: three slices each fill 96
    of them in one wave, where two leave 44 idle and four take two waves."""
    from hardware_models import gemm

    shape = (512, 1024, 10240)
    any_count = gemm.gemm_parts(A100, *shape).seconds
    monkeypatch.setattr(gemm, "SPLIT_K_FACTORS", (3,))
    assert gemm.gemm_parts(A100, *shape).seconds == any_count
    monkeypatch.setattr(gemm, "SPLIT_K_FACTORS", (1, 2, 4, 8, 16, 32, 64))
    assert gemm.gemm_parts(A100, *shape).seconds > 1.3 * any_count


@pytest.mark.parametrize("gpu", [H100, A100], ids=["h100", "a100"])
def test_scalar_and_array_gemm_pricing_give_the_same_floats(gpu):
    """The simulator (gemm_parts) and the fitter (gemm_parts_many) price GEMMs apart for
    speed; a calibrated profile is only valid for both if every term agrees exactly."""
    import numpy as np

    from hardware_models.efficiency import GemmKernel
    from hardware_models.gemm import gemm_parts, gemm_parts_many

    rng = np.random.default_rng(0)
    shapes = np.exp(rng.uniform(0, np.log(65536), size=(300, 3))).astype(int)
    shapes[:40, 0] = 1  # one-row products take the matrix-vector path where enabled
    m, n, k = shapes.T
    curve = EfficiencyCurve(sizes=[1e6, 1e12], values=[0.3, 0.85])
    dtype = "fp8" if gpu is H100 else "bf16"  # 8-bit operands and 16-bit output where it has them
    for kernel in (
        GemmKernel(),
        GemmKernel(gemv=True),
        GemmKernel(quantize_activations=True),
        GemmKernel(dispatch="by_m", quantize_activations=True),
        GemmKernel(dispatch="by_m", quantize_activations=True, cluster_m=2),
        GemmKernel(dispatch="fixed", quantize_activations=True, align_m=4),
        GemmKernel(dispatch="fixed", quantize_activations=True, align_m=4, cluster_m=2),
        GemmKernel(serial_epilogue=True),
        GemmKernel(serial_epilogue=False),
        GemmKernel(dispatch="by_m", quantize_activations=True, serial_epilogue=True),
        GemmKernel(dispatch="fixed", quantize_activations=True, align_m=4, serial_epilogue=True),
    ):
        eff = gpu.efficiency.model_copy(
            update={
                "gemm_kernel_by_dtype": {dtype: kernel},
                "gemm_compute_by_dtype": {dtype: curve},
                "gemm_floor_us_by_dtype": {dtype: 3.0},
                "gemm_wave_latency_us_by_dtype": {dtype: 0.7},
                "gemm_cta_us_per_mb_by_dtype": {dtype: 5.0},
                "gemm_split_k_overhead_us": 1.5,
                "gemm_pad_us_by_dtype": {dtype: 4.0},
                "gemm_quant_bandwidth_by_dtype": {dtype: 0.5},
            }
        )
        priced = gpu.with_efficiency(eff)
        # Narrower stored weights change the bytes, and before Hopper a small tile's cap.
        for weights in (None, "int4") if kernel == GemmKernel() else (None,):
            many = gemm_parts_many(priced, m, n, k, dtype, weights)
            for i in range(len(m)):
                one = gemm_parts(priced, int(m[i]), int(n[i]), int(k[i]), dtype, weights)
                for name in many._fields:
                    got = getattr(many, name)[i]
                    assert got == getattr(one, name), (kernel, weights, name, shapes[i])


@pytest.mark.parametrize("calibration", [None, "h100-sxm"], ids=["preset", "calibrated"])
def test_gemm_costs_of_many_row_counts_are_gemm_cost(calibration):
    """The engine prices its GEMMs for a block of token counts at once (gemm_costs_many);
    every OpCost must be gemm_cost's, field for field, or steps would change with the
    order token counts first appear in."""
    import numpy as np

    from hardware_models.gemm import gemm_cost, gemm_costs_many

    gpu = load_gpu("h100-sxm", calibration=calibration)
    rows = np.arange(1, 300)
    for dtype in ("bf16", "fp8", "fp8_block"):
        for n, k in ((12288, 4096), (4096, 14336), (2112, 7168)):
            many = gemm_costs_many(gpu, rows, n, k, dtype)
            for m, cost in zip(rows.tolist(), many, strict=True):
                assert cost == gemm_cost(gpu, m, n, k, dtype), (dtype, m, n, k)


def test_causal_pairs_in_closed_form_match_the_sum():
    import numpy as np

    from hardware_models.attention import causal_pairs, causal_pairs_many

    rng = np.random.default_rng(2)
    q = rng.integers(1, 5000, size=400)
    kv = q + rng.integers(0, 5000, size=400) * (rng.random(400) < 0.5)
    window = rng.choice([0, 1, 127, 128, 1024, 4096, 20000], size=400)
    many = causal_pairs_many(q, kv, window)
    for i in range(len(q)):
        one = causal_pairs(int(q[i]), int(kv[i]), int(window[i]) or None)
        assert many[i] == one, (q[i], kv[i], window[i])


@pytest.mark.parametrize("calibration", [None, "h100-sxm"], ids=["preset", "calibrated"])
@pytest.mark.parametrize("pack_gqa", [True, False], ids=["packed", "per-head"])
def test_scalar_and_array_prefill_pricing_give_the_same_floats(calibration, pack_gqa):
    """The simulator prices prefill one call at a time, the fitter a table at once
    (prefill_table): a profile is only valid for both if every term agrees exactly."""
    import numpy as np
    import pandas as pd

    from hardware_models.attention import uniform_prefill_cost
    from hardware_models.calibration.measured_tables import prefill_table

    gpu = load_gpu("h100-sxm", calibration=calibration)
    gpu = gpu.with_efficiency(gpu.efficiency.model_copy(update={"prefill_pack_gqa": pack_gqa}))
    rng = np.random.default_rng(3)
    size = 240
    q = np.exp(rng.uniform(0, np.log(16384), size)).astype(int)
    q[:40] = 1  # one token a sequence: the decode kernel
    heads = rng.choice([(32, 8), (64, 8), (32, 32), (48, 1)], size)
    table = pd.DataFrame(
        {
            "batch": rng.integers(1, 65, size),
            "q_len": q,
            "kv_len": q + rng.integers(0, 8192, size) * (rng.random(size) < 0.5),
            "window": rng.choice([0, 0, 1024, 4096], size),
            "num_heads": [h for h, _ in heads],
            "num_kv_heads": [kv for _, kv in heads],
            "head_dim": rng.choice([64, 128], size),
            "dtype": "bf16",
            "kv_dtype": rng.choice(["bf16", "fp8"], size),
        }
    )
    many = prefill_table(table, gpu)
    for i, row in enumerate(table.itertuples(index=False)):
        one = uniform_prefill_cost(
            gpu,
            batch=int(row.batch),
            q_len=int(row.q_len),
            kv_len=int(row.kv_len),
            window=int(row.window) or None,
            num_heads=int(row.num_heads),
            num_kv_heads=int(row.num_kv_heads),
            head_dim=int(row.head_dim),
            dtype=row.dtype,
            kv_dtype=row.kv_dtype,
        )
        expected = (one.seconds, one.compute_seconds, one.memory_seconds, one.dram_bytes)
        assert tuple(many[i]) == expected, row


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("gemm_quant_bandwidth_by_dtype", {"fp8": 1.5}, "fp8: a share of memory bandwidth"),
        ("gemm_quant_bandwidth_by_dtype", {"fp8": 0.0}, "in (0, 1]"),
        ("gemm_pad_us_by_dtype", {"fp8_block": -1.0}, "must be >= 0 us"),
        ("gemm_pad_us_by_dtype", {"fp9": 1.0}, "fp9"),
        ("gemm_store_bandwidth_by_dtype", {"fp8": 1.2}, "fp8: a share of memory bandwidth"),
        ("gemm_quant_row_ns_by_dtype", {"fp8": -1.0}, "must be >= 0"),
    ],
)
def test_bad_pass_fields_name_the_dtype_and_the_rule(field, value, words):
    from pydantic import ValidationError

    from hardware_models.efficiency import EfficiencyProfile

    with pytest.raises(ValidationError) as info:
        EfficiencyProfile.model_validate({field: value})
    assert field in str(info.value) and words in str(info.value)
