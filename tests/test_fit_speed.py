"""The fit's shortcuts give the same answers as the plain computations they replace:
memos per object and per candidate, binned medians in one sort, the split's text, a
chip's hash over its efficiency (the profiles themselves are checked byte for byte
against the shipped ones in benchmarks/README.md, "Fit speed")."""

from __future__ import annotations

import gc

import numpy as np
import pandas as pd
import pytest

from hardware_models.calibration.fit import Scorer, _score, refit_curves
from hardware_models.calibration.isotonic import _bin_medians, binned_curve
from hardware_models.calibration.operator_terms import Terms
from hardware_models.calibration.split import _as_text
from hardware_models.dtypes import parse_dtype
from hardware_models.efficiency import EfficiencyCurve, profile_json
from hardware_models.errors import InfersimError
from hardware_models.object_memo import _MEMO, per_object
from hardware_models.presets import load_gpu
from tests.conftest import needs_shared_data


def test_per_object_builds_once_per_live_object_and_forgets_dead_ones() -> None:
    built = []

    def build(frame: pd.DataFrame) -> int:
        built.append(1)
        return len(frame)

    frame = pd.DataFrame({"a": [1, 2, 3]})
    assert per_object(frame, "n", build) == 3 and per_object(frame, "n", build) == 3
    assert len(built) == 1
    other = pd.DataFrame({"a": [1]})  # a different object: built again
    assert per_object(other, "n", build) == 1 and len(built) == 2
    slot = (id(frame), "n")
    del frame
    gc.collect()
    assert slot not in _MEMO


def test_bin_medians_are_np_medians_bin_by_bin() -> None:
    rng = np.random.default_rng(3)
    bins = rng.integers(0, 12, 500)
    values = np.round(rng.uniform(0, 1, 500), 2)  # ties, odd and even bins
    counts, (medians,) = _bin_medians(bins, values)
    for i, b in enumerate(np.unique(bins)):
        assert counts[i] == (bins == b).sum()
        assert medians[i] == np.median(values[bins == b])  # the same float


def test_binned_curve_keeps_full_bins_and_is_monotone() -> None:
    sizes = np.array([2.0, 3.0, 2.5, 64.0, 70.0, 100.0, 1e6])
    eff = np.array([0.2, 0.4, 0.3, 0.6, 0.5, 0.7, 0.9])
    curve = binned_curve(sizes, eff, min_rows=3)
    assert curve.sizes == (2.0 ** np.median(np.log2([2.0, 3.0, 2.5])), 2.0 ** np.log2(70.0))
    assert curve.values == (0.3, 0.6)
    assert binned_curve(sizes[:2], eff[:2], min_rows=3) is None


@pytest.mark.parametrize(
    "column",
    [
        pd.Series([0.0, -0.0, 1.5, np.nan, 1e20, -0.0]),
        pd.Series(["fp8", None, "fp8", "bf16"]),
        pd.Series(["a", None], dtype="str"),
        pd.Series([3, 1, 3]),
        pd.Series([], dtype=float),
    ],
)
def test_the_splits_text_is_astype_str(column: pd.Series) -> None:
    assert list(_as_text(column)) == list(column.astype(str))


def test_a_chips_hash_follows_its_efficiency_and_equal_chips_hash_equal() -> None:
    gpu = load_gpu("h100-sxm")
    curve = EfficiencyCurve(sizes=[1.0, 2.0], values=[0.5, 0.6])
    one = gpu.with_efficiency(gpu.efficiency.model_copy(update={"gemm_compute": curve}))
    same = gpu.with_efficiency(gpu.efficiency.model_copy(update={"gemm_compute": curve}))
    assert one == same and hash(one) == hash(same)
    assert one != gpu and hash(one) != hash(gpu)
    assert profile_json(one.efficiency) == one.efficiency.model_dump_json()


def test_the_scorer_prices_a_candidate_once_and_scores_as_score_does() -> None:
    gpu = load_gpu("h100-sxm")
    rows = pd.DataFrame({"measured_s": [1e-3, 2e-3, 4e-3], "size": [1.0, 2.0, 4.0]})
    calls = []

    def price(chip, frame: pd.DataFrame) -> Terms:
        calls.append(1)
        floor = chip.efficiency.kernel_floor_us * 1e-6
        return Terms(frame["size"].to_numpy() * 1e-3 + floor, np.full(len(frame), floor))

    score = Scorer(gpu, price)
    profile = gpu.efficiency.model_copy(update={"kernel_floor_us": 200.0})
    first = score(profile, rows)
    priced = len(calls)
    assert score(profile.model_copy(), rows) == first and len(calls) == priced
    assert first == _score(gpu, profile, rows, price)
    assert refit_curves(gpu, profile, rows, price) == profile  # no curve terms: unchanged


def test_parse_dtype_still_names_a_bad_value() -> None:
    assert parse_dtype("Half") == parse_dtype("fp16")
    for bad in ("bogus", ["bf16"], 8):
        with pytest.raises(InfersimError, match=r"unknown dtype .*; allowed: fp32"):
            parse_dtype(bad)


@needs_shared_data
def test_prefill_seconds_are_prefill_terms_seconds() -> None:
    from hardware_models.calibration.operator_terms import prefill_seconds, prefill_terms
    from hardware_models.calibration.sources import load_measurements

    table = load_measurements(from_shared="a100-80gb-sxm").table
    rows = table[table["op_class"] == "attention_prefill"].head(500)
    gpu = load_gpu("a100-80gb-sxm", calibration="a100-80gb-sxm")
    assert np.array_equal(prefill_seconds(gpu, rows), prefill_terms(gpu, rows).seconds)
