"""Prefill attention priced in whole thread-block tiles on the warp-MMA chips (FA2's paged
split-KV kernel, FlashInfer for 8-bit caches), and the benchmark's warm L2."""

import numpy as np
import pytest

from hardware_models.attention import (
    PrefillAttention,
    causal_pairs,
    last_block_keys,
    prefill_many,
    runs_flashinfer,
    tile_keys,
    tile_keys_plain,
    uniform_prefill_args,
)
from hardware_models.efficiency import EfficiencyCurve
from hardware_models.presets import load_gpu

HEADS = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128}


def test_a_prompt_shorter_than_a_block_computes_the_whole_tile():
    # 16 tokens in a 64-row block read 16 keys, rounded up to one 128-key tile.
    assert tile_keys_plain(16, 0, 0, 64, 128) == (128, 128)
    a100 = load_gpu("a100-80gb-sxm")
    model = PrefillAttention(a100, **HEADS)
    short = model(*uniform_prefill_args(1, 16, 16, None))
    block = model(*uniform_prefill_args(1, 64, 64, None))
    assert short[3] == pytest.approx(block[3])  # the same tiles' math


def test_a_long_prompt_pays_about_its_causal_pairs():
    q = 8192
    tiles = 64 * tile_keys_plain(q, 0, 0, 64, 128)[0]
    assert tiles == pytest.approx(causal_pairs(q, q), rel=0.02)
    assert tiles > causal_pairs(q, q)


@pytest.mark.parametrize("window", [0, 128, 1024])
@pytest.mark.parametrize(
    ("q", "context"), [(16, 0), (300, 0), (4096, 0), (512, 3000), (357 / 2, 2356 / 2 - 357 / 2)]
)
@pytest.mark.parametrize("block_tokens", [64.0, 128 / 3, 16 / 6])
def test_plain_floats_and_arrays_give_the_same_keys(q, context, window, block_tokens):
    plain = tile_keys_plain(q, context, window, block_tokens, 128)
    arrays = [np.array([value], float) for value in (q, context, window)]
    array = (
        tile_keys(*arrays, block_tokens, 128.0)[0],
        last_block_keys(*arrays, block_tokens, 128.0)[0],
    )
    assert plain == tuple(float(keys) for keys in array)  # bit for bit


@pytest.mark.parametrize("fitted_packing", [True, False])
def test_the_chip_and_cache_dtype_pick_the_prefill_kernel_on_ada_not_the_profile(fitted_packing):
    def chip(name):
        spec = load_gpu(name)
        return spec.with_efficiency(
            spec.efficiency.model_copy(update={"prefill_pack_gqa": fitted_packing})
        )

    l40s = chip("l40s")  # FA2 for a 16-bit cache, FlashInfer (packed) for an 8-bit one
    assert PrefillAttention(l40s, **HEADS, kv_dtype="fp8").pack_gqa
    assert not PrefillAttention(l40s, **HEADS, kv_dtype="bf16").pack_gqa
    assert runs_flashinfer(l40s, "fp8") and not runs_flashinfer(l40s, "bf16")
    h100 = chip("h100-sxm")  # FA3 reads both: the profile's fitted layout
    assert PrefillAttention(h100, **HEADS, kv_dtype="fp8").pack_gqa is fitted_packing
    assert not runs_flashinfer(h100, "fp8")


def test_flashinfer_picks_its_query_tile_by_the_packed_rows():
    l40s = load_gpu("l40s")
    flat = EfficiencyCurve(sizes=[1.0], values=[0.5])
    eff = l40s.efficiency.model_copy(
        update={"attention_prefill_compute": flat, "prefill_cta_latency_us": 0.0}
    )
    model = PrefillAttention(l40s.with_efficiency(eff), **HEADS, kv_dtype="fp8")  # groups of 4
    # 4 tokens pack 16 rows: a 16-row tile; 5 to 16 tokens a 64-row one, 4x the math.
    four, five, sixteen = (model(*uniform_prefill_args(256, q, q, None))[3] for q in (4, 5, 16))
    assert five == pytest.approx(4.0 * four)
    assert sixteen == pytest.approx(five)


@pytest.mark.parametrize("gpu", ["a100-80gb-sxm", "l40s", "h100-sxm"])
def test_one_call_and_many_calls_price_alike(gpu):
    model = PrefillAttention(load_gpu(gpu), **HEADS, window=1024)
    calls = [
        uniform_prefill_args(b, q, q + c, 1024)
        for b, q, c in ((1, 16, 0), (8, 700, 2000), (2, 5000, 0))
    ]
    many = model.many(*(np.array(column, float) for column in zip(*calls, strict=True)))
    for index, call in enumerate(calls):
        assert model(*call)[0] == pytest.approx(float(many[0][index]), rel=1e-12)


def test_a_benchmark_repeating_a_call_reads_what_fits_in_a_single_l2_from_there():
    args = [np.array([a], float) for a in uniform_prefill_args(16, 64, 64, None)]
    l40s = PrefillAttention(load_gpu("l40s"), **HEADS)
    warm = prefill_many([l40s], np.zeros(1, int), *args, warm_l2=True)
    cold = prefill_many([l40s], np.zeros(1, int), *args)
    assert warm[4][0] < cold[4][0]
    a100 = PrefillAttention(load_gpu("a100-80gb-sxm"), **HEADS)  # a partitioned L2
    warm = prefill_many([a100], np.zeros(1, int), *args, warm_l2=True)
    cold = prefill_many([a100], np.zeros(1, int), *args)
    assert warm[4][0] == cold[4][0]


def test_a_fit_without_8bit_cache_rows_keeps_the_datasheet_kernel_for_them_on_ada():
    import pandas as pd

    from hardware_models.calibration.fit import _unmeasured_flashinfer_kernels

    rows = pd.DataFrame({"op_class": ["attention_decode"], "kv_dtype": ["bfloat16"]})
    for name, expected in (("a100-80gb-sxm", True), ("h100-sxm", False)):
        spec = load_gpu(name)
        fitted = spec.efficiency.model_copy(update={"decode_cta_latency_us": 9.0})
        out = _unmeasured_flashinfer_kernels(spec, rows, fitted)
        assert ("fp8" in out.decode_by_kv_dtype) is expected
        if expected:
            assert out.for_kv_dtype("fp8").decode_cta_latency_us == (
                spec.efficiency.decode_cta_latency_us
            )
            assert out.for_kv_dtype("bf16").decode_cta_latency_us == 9.0
    fp8_rows = pd.DataFrame({"op_class": ["attention_decode"], "kv_dtype": ["fp8"]})
    spec = load_gpu("l40s")
    assert _unmeasured_flashinfer_kernels(spec, fp8_rows, spec.efficiency) is spec.efficiency


def test_a_cache_dtype_with_a_prefill_kernel_of_its_own_is_priced_with_it():
    l40s = load_gpu("l40s")
    eff = l40s.efficiency
    own = eff.kernel_fields("prefill_by_kv_dtype").model_copy(
        update={"attention_prefill_floor_us": 50.0}
    )
    spec = l40s.with_efficiency(eff.model_copy(update={"prefill_by_kv_dtype": {"fp8": own}}))
    args = uniform_prefill_args(2, 300, 300, None)
    models = [PrefillAttention(spec, **HEADS, kv_dtype=kv) for kv in ("bf16", "fp8")]
    plain = [PrefillAttention(l40s, **HEADS, kv_dtype=kv) for kv in ("bf16", "fp8")]
    assert models[0](*args)[0] == plain[0](*args)[0]
    assert models[1](*args)[0] == pytest.approx(
        plain[1](*args)[0] + 50e-6 - eff.prefill_floor_us * 1e-6
    )
    # Both kernels in one array pass: each call its own kernel's price.
    columns = [np.array([a, a], float) for a in args]
    many = prefill_many(models, np.array([0, 1]), *columns)[0]
    assert list(many) == pytest.approx([models[0](*args)[0], models[1](*args)[0]], rel=1e-12)


@pytest.mark.parametrize(("gpu", "kv_dtype"), [("a100-80gb-sxm", "bf16"), ("l40s", "fp8")])
def test_a_model_that_kept_earlier_shapes_prices_each_call_as_a_fresh_one(gpu, kv_dtype):
    # The grid of a call (tokens a sequence, query block, waves) is kept by its shape,
    # (num_seqs, new_tokens): calls of one shape over other contexts, and of the same
    # tokens over other sequence counts, must each price as on a model that kept none.
    spec = load_gpu(gpu)
    shapes = [(1, 300, 0), (1, 300, 2000), (3, 100, 0), (3, 100, 700), (2, 150, 50), (1, 300, 9)]
    calls = [uniform_prefill_args(b, q, q + c, 1024) for b, q, c in shapes]
    kept = PrefillAttention(spec, **HEADS, kv_dtype=kv_dtype, window=1024)
    for call in calls:
        fresh = PrefillAttention(spec, **HEADS, kv_dtype=kv_dtype, window=1024)
        assert kept(*call) == fresh(*call)
