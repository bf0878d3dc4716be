"""Decode attention as the kernels on each chip run it: a benchmark's warm L2 and a
kernel per KV-cache dtype; and the L40S decode target those give."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from hardware_models.attention import DecodeAttention, decode_parts_many
from hardware_models.calibration.fit import _attention_groups, fit_profile, warm_l2_shown
from hardware_models.calibration.split import holdout_mask
from hardware_models.efficiency import DecodeKernel, EfficiencyCurve, EfficiencyProfile
from hardware_models.presets import load_gpu
from tests.conftest import needs_shared_data

HEADS = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128}


def _parts(gpu, seqs, keys, warm):
    model = DecodeAttention(gpu, **HEADS)
    layout = np.zeros(len(seqs), dtype=int)
    return decode_parts_many(
        [model], layout, np.asarray(seqs, float), np.asarray(keys, float), warm
    )


def test_a_warm_l2_serves_caches_that_fit_and_only_in_the_tables():
    """A benchmark's repeated call reads a cache that fits in L2 from there (never slower
    than DRAM); one larger than L2 evicts itself; the engine's pricing stays cold."""
    l40s = load_gpu("l40s")  # 96 MB L2, 864 GB/s GDDR6
    # Without a fitted share (no table showed a warm L2) the tables are priced cold too.
    assert not _parts(l40s, [1], [1024], warm=True).in_l2.any()
    gpu = l40s.with_efficiency(l40s.efficiency.model_copy(update={"decode_l2_bandwidth": 0.2}))
    per_key = 2 * 8 * 128 * 2
    small, large = 32 * 1024 * 1024 // per_key, 256 * 1024 * 1024 // per_key
    cold = _parts(gpu, [1, 1], [small, large], warm=False)
    warm = _parts(gpu, [1, 1], [small, large], warm=True)
    assert list(warm.in_l2) == [True, False] and not cold.in_l2.any()
    assert warm.memory[0] < cold.memory[0] and warm.memory[1] == cold.memory[1]
    assert warm.memory[0] == pytest.approx(cold.kv_bytes[0] / gpu.l2_bandwidth / 0.2, rel=1e-3)
    # An L2 share slower than DRAM is never used.
    slow = gpu.with_efficiency(gpu.efficiency.model_copy(update={"decode_l2_bandwidth": 0.01}))
    assert _parts(slow, [1], [small], warm=True).memory[0] == cold.memory[0]


def test_each_cache_dtype_runs_its_own_decode_kernel():
    """A profile's decode_by_kv_dtype entry prices caches of that dtype; others read the
    profile's own decode fields."""
    gpu = load_gpu("l40s")
    fp8 = gpu.efficiency.kernel_fields("decode_by_kv_dtype").model_copy(
        update={"decode_cta_latency_us": 9.0, "attention_decode_floor_us": 20.0}
    )
    assert isinstance(fp8, DecodeKernel)
    profile = EfficiencyProfile(decode_by_kv_dtype={"fp8_e4m3": fp8})
    gpu = gpu.with_efficiency(profile)
    assert set(profile.decode_by_kv_dtype) == {"fp8"}  # keys spelled one way
    bf16 = DecodeAttention(gpu, **HEADS, kv_dtype="bf16")
    fp8_model = DecodeAttention(gpu, **HEADS, kv_dtype="fp8")
    assert bf16.floor == pytest.approx(profile.decode_floor_us * 1e-6)
    assert (fp8_model.floor, fp8_model.cta_seconds) == pytest.approx((20e-6, 9e-6))


def test_a_table_of_both_cache_dtypes_prices_each_with_its_kernel():
    """Rows of both cache dtypes priced in one call get the same floats as each dtype's
    rows priced alone: each reads its own kernel's curve, not the first row's."""
    from hardware_models.calibration.measured_tables import decode_parts

    gpu = load_gpu("l40s")
    fp8 = gpu.efficiency.kernel_fields("decode_by_kv_dtype").model_copy(
        update={"attention_decode_memory": EfficiencyCurve.constant(0.3)}
    )
    gpu = gpu.with_efficiency(EfficiencyProfile(decode_by_kv_dtype={"fp8": fp8}))
    rows = pd.DataFrame(
        {
            "batch": [1, 8, 64, 1, 8, 64],
            "kv_len": [4096, 512, 2048, 4096, 512, 2048],
            "window": 0,
            **HEADS,
            "dtype": "bf16",
            "kv_dtype": ["bf16", "fp8", "bf16", "fp8", "bf16", "fp8"],
        }
    )
    mixed = decode_parts(rows, gpu).seconds
    for kv in ("bf16", "fp8"):
        alone = rows["kv_dtype"] == kv
        assert np.array_equal(mixed[alone.to_numpy()], decode_parts(rows[alone], gpu).seconds)
    # The two kernels really differ: a 0.3 bandwidth share against the default 0.8.
    assert mixed[3] > mixed[0]


def test_decode_rows_are_fitted_per_cache_dtype():
    table = pd.DataFrame(
        {"op_class": "attention_decode", "kv_dtype": ["bf16", "fp8", "fp8_e4m3", "bf16"]}
    )
    groups = _attention_groups(table, "attention_decode")
    assert [(label, len(rows), kv) for label, rows, kv in groups] == [
        ("attention_decode/kv:bf16", 2, None),
        ("attention_decode/kv:fp8", 2, "fp8"),
    ]
    one = _attention_groups(table[table["kv_dtype"] == "bf16"], "attention_decode")
    assert [(label, kv) for label, _, kv in one] == [("attention_decode", None)]


@needs_shared_data
def test_only_the_l40s_table_shows_a_warm_l2():
    from hardware_models.calibration.sources import load_measurements

    for name, shown in (("l40s", True), ("a100-80gb-sxm", False)):
        table = load_measurements(from_shared=name).table
        rows = table[table["op_class"] == "attention_decode"]
        assert warm_l2_shown(load_gpu(name), rows) is shown, name


@needs_shared_data
@pytest.mark.slow
def test_l40s_decode_attention_meets_its_target_held_out():
    """Issue 15: L40S decode attention <= 15% MAPE on the held-out half, seed 0 (11.6%
    with these kernels; 29.2% before). About 2 minutes: the decode classes only."""
    from hardware_models.calibration.sources import load_measurements
    from hardware_models.calibration.validate import predict_all
    from hardware_models.calibration.workflow import usable_rows

    gpu = load_gpu("l40s")
    measured = load_measurements(from_shared="l40s")
    decode = measured.table[measured.table["op_class"] == "attention_decode"]
    rows = usable_rows(replace(measured, table=decode), gpu).rows
    held = holdout_mask(rows, 0.5, 0)
    fitted = gpu.with_efficiency(fit_profile(gpu, rows[~held], seed=0))
    test = rows[held]
    error = np.abs(predict_all(test, fitted) - test["measured_s"]) / test["measured_s"]
    assert error.mean() <= 0.15
