"""Prefill attention priced in whole thread-block tiles on the warp-MMA chips (FA2's paged
split-KV kernel, FlashInfer for 8-bit caches), and the benchmark's warm L2."""

import math

import numpy as np
import pytest

from hardware_models.attention import (
    PrefillAttention,
    causal_pairs,
    prefill_many,
    tile_keys,
    uniform_prefill_args,
)
from hardware_models.presets import load_gpu

HEADS = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128}


def test_a_prompt_shorter_than_a_block_computes_the_whole_tile():
    # 16 tokens in a 64-row block read 16 keys, rounded up to one 128-key tile.
    assert tile_keys(16, 0, 0, 64, 128, math) == 128
    a100 = load_gpu("a100-80gb-sxm")
    model = PrefillAttention(a100, **HEADS)
    short = model(*uniform_prefill_args(1, 16, 16, None))
    block = model(*uniform_prefill_args(1, 64, 64, None))
    assert short[3] == pytest.approx(block[3])  # the same tiles' math


def test_a_long_prompt_pays_about_its_causal_pairs():
    q = 8192
    tiles = 64 * tile_keys(q, 0, 0, 64, 128, math)
    assert tiles == pytest.approx(causal_pairs(q, q), rel=0.02)
    assert tiles > causal_pairs(q, q)


@pytest.mark.parametrize("window", [0, 128, 1024])
@pytest.mark.parametrize(("q", "context"), [(16, 0), (300, 0), (4096, 0), (512, 3000)])
def test_plain_floats_and_arrays_give_the_same_keys(q, context, window):
    scalar = tile_keys(q, context, window, 64, 128, math)
    array = tile_keys(
        np.array([q], float), np.array([context], float), np.array([window], float), 64.0, 128.0
    )
    assert float(array[0]) == scalar


def test_an_8bit_cache_on_ada_runs_flashinfer_which_packs_the_query_heads():
    l40s = load_gpu("l40s").with_efficiency(
        load_gpu("l40s").efficiency.model_copy(update={"prefill_pack_gqa": False})
    )
    assert PrefillAttention(l40s, **HEADS, kv_dtype="fp8").pack_gqa
    assert not PrefillAttention(l40s, **HEADS, kv_dtype="bf16").pack_gqa
    h100 = load_gpu("h100-sxm")
    h100 = h100.with_efficiency(h100.efficiency.model_copy(update={"prefill_pack_gqa": False}))
    assert not PrefillAttention(h100, **HEADS, kv_dtype="fp8").pack_gqa


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
