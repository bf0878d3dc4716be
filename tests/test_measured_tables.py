"""Importers of the public measurement tables, their units, and the error report."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hardware_models.calibration import (
    COLUMNS,
    big_gemm_mask,
    default_measured_dir,
    error_table,
    load_measured,
    measured_tables,
    plot_predicted_vs_measured,
    predict,
    resolve_measured_dir,
    size_bucket,
    summarise_errors,
    supported_mask,
    to_markdown,
)
from hardware_models.calibration.moe_mla_tables import EXTRA_COLUMNS
from hardware_models.collectives import collective_cost
from hardware_models.errors import InfersimError
from hardware_models.presets import load_gpu, load_node

MEASURED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "measured"
needs_data = pytest.mark.skipif(
    not MEASURED.is_dir(),
    reason=f"public measurement tables not found at {MEASURED} (../shared/data beside "
    "the checkout); they are not part of the repository",
)


@pytest.fixture(scope="module")
def h100() -> pd.DataFrame:
    return load_measured(MEASURED, gpus=["h100-sxm"])


def _row(**fields) -> dict:
    base = {c: np.nan for c in COLUMNS}
    base.update(kv_dtype=None, source="synthetic", source_dtype="", measured_s=1.0, size=1.0)
    base.update(fields)
    return base


# ------------------------------------------------------------------ without the data


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InfersimError, match="not found"):
        resolve_measured_dir(tmp_path / "nowhere")
    with pytest.raises(InfersimError, match="no measurement tables"):
        load_measured(tmp_path)


@pytest.fixture
def wheel_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `pip install .` layout: the package in a venv's site-packages (nothing beside it),
    a clone next to shared/, and no $INFERSIM_SHARED_DATA."""
    monkeypatch.delenv(measured_tables.SHARED_DATA_ENV, raising=False)
    site_packages = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    monkeypatch.setattr(measured_tables, "repo_root", lambda: site_packages)
    (tmp_path / "clone" / "notebooks").mkdir(parents=True)
    return tmp_path


def test_a_wheel_install_finds_the_tables_beside_the_clone_from_its_notebooks_folder(
    wheel_install: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (wheel_install / "shared" / "data" / "measured").mkdir(parents=True)
    monkeypatch.chdir(wheel_install / "clone" / "notebooks")  # where a kernel starts
    assert default_measured_dir() == wheel_install / "shared" / "data" / "measured"
    assert resolve_measured_dir() == wheel_install / "shared" / "data" / "measured"


def test_the_upward_search_takes_the_nearest_tables_and_stops_after_its_levels(
    wheel_install: Path,
) -> None:
    top = wheel_install / "shared" / "data" / "measured"
    near = wheel_install / "clone" / "shared" / "data" / "measured"
    for folder in (top, near):
        folder.mkdir(parents=True)
    assert default_measured_dir(wheel_install / "clone" / "notebooks") == near
    deep = wheel_install.joinpath("clone", *"abcd")  # 5 levels below wheel_install
    deep.mkdir(parents=True)
    assert default_measured_dir(deep) == near
    near.rmdir()
    assert measured_tables.SHARED_SEARCH_LEVELS == 4
    assert default_measured_dir(deep) != top  # top is 5 folders up: past the bound


def test_without_the_tables_the_error_says_where_it_looked(
    wheel_install: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(wheel_install / "clone" / "notebooks")
    with pytest.raises(InfersimError, match=r"looked in .*notebooks, its 4 parent folders"):
        resolve_measured_dir()


def test_the_environment_variable_is_the_only_place_looked_when_set(
    wheel_install: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (wheel_install / "shared" / "data" / "measured").mkdir(parents=True)
    monkeypatch.chdir(wheel_install / "clone" / "notebooks")
    monkeypatch.setenv(measured_tables.SHARED_DATA_ENV, str(wheel_install / "typo"))
    with pytest.raises(InfersimError, match=r"INFERSIM_SHARED_DATA=.*typo .*not found"):
        resolve_measured_dir()
    monkeypatch.setenv(measured_tables.SHARED_DATA_ENV, str(wheel_install / "shared" / "data"))
    assert resolve_measured_dir() == wheel_install / "shared" / "data" / "measured"


def test_unsupported_dtype_is_nan_and_collectives_use_the_node_link() -> None:
    table = pd.DataFrame(
        [
            _row(gpu="a100-80gb-sxm", op_class="gemm", dtype="fp8", m=64, n=64, k=64),
            _row(gpu="a100-80gb-sxm", op_class="gemm", dtype="bf16", m=64, n=64, k=64),
            _row(gpu="h100-sxm", op_class="all_reduce", dtype="fp16", num_gpus=8, nbytes=2**24),
        ]
    )
    assert supported_mask(table, load_gpu).tolist() == [False, True, True]
    pred = predict(table)
    assert math.isnan(pred[0]) and pred[1] > 0
    link = load_node("dgx-h100").intra_node_link
    assert pred[2] == pytest.approx(collective_cost("all_reduce", 2**24, 8, link).seconds)


def test_error_summary_on_known_numbers() -> None:
    measured = [1.0, 2.0, 4.0, 10.0]
    predicted = [1.1, 1.5, 4.0, 12.0]  # errors +10%, -25%, 0%, +20%
    stats = summarise_errors(measured, predicted)
    assert stats["n"] == 4
    assert stats["mape"] == pytest.approx((0.10 + 0.25 + 0.0 + 0.20) / 4)
    assert stats["median_ape"] == pytest.approx(0.15)
    assert stats["bias"] == pytest.approx((0.10 - 0.25 + 0.0 + 0.20) / 4)
    assert stats["mean_error"] == pytest.approx((18.6 - 17.0) / 17.0)
    assert summarise_errors([1.0, 2.0], [np.nan, 3.0])["n"] == 1


def test_error_table_groups_and_buckets(tmp_path: Path) -> None:
    table = pd.DataFrame(
        {
            "gpu": ["g"] * 4,
            "op_class": ["gemm", "gemm", "gemm", "all_reduce"],
            "size": [2.0**10, 2.0**11, 2.0**20, 2.0**20],
            "measured_s": [1.0, 2.0, 4.0, 10.0],
        }
    )
    predicted = pd.Series([1.1, 1.5, np.nan, 12.0])
    out = error_table(table, predicted, by=["op_class"], bucket_width=4)
    assert list(out.columns) == ["op_class", "size_bucket", "n", "mape", "median_ape",
                                 "p90_ape", "bias", "mean_error"]  # fmt: skip
    gemm = out[out["op_class"] == "gemm"].iloc[0]
    assert gemm["size_bucket"] == "2^8-2^12" and gemm["n"] == 2  # the NaN row is not counted
    assert gemm["mape"] == pytest.approx(0.175)
    assert gemm["bias"] == pytest.approx(-0.075)
    assert list(size_bucket(pd.Series([1.0, 15.0, 16.0, 2.0**31]), 4)) == [
        "2^0-2^4", "2^0-2^4", "2^4-2^8", "2^28-2^32"
    ]  # fmt: skip
    assert "| gemm | 2^8-2^12 | 2 | 17.5% |" in to_markdown(out)
    png = plot_predicted_vs_measured(table, tmp_path / "p.png", predicted)
    assert png.stat().st_size > 1000


# --------------------------------------------------------------------- with the data


@pytest.mark.shared_data
@needs_data
def test_columns_and_units(h100: pd.DataFrame) -> None:
    # The MoE and MLA tables add their own shape columns after the common ones.
    assert list(h100.columns) == [*COLUMNS, *EXTRA_COLUMNS]
    assert set(h100["op_class"]) == {
        "gemm", "attention_prefill", "attention_decode",
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
        "moe", "mla_prefill", "mla_decode",
    }  # fmt: skip
    raw = pd.read_parquet(MEASURED / "h100_sxm" / "gemm_perf.parquet")
    first = raw.iloc[0]
    assert (first["m"], first["n"], first["k"], first["gemm_dtype"]) == (
        32768, 65536, 12288, "bfloat16"
    )  # fmt: skip
    row = h100[(h100["op_class"] == "gemm")].iloc[0]
    assert row["measured_s"] == pytest.approx(first["latency"] / 1000)
    assert row["measured_s"] == pytest.approx(0.063745294, rel=1e-6)
    assert row["dtype"] == "bf16" and row["size"] == 2.0 * 32768 * 65536 * 12288
    assert math.isnan(row["batch"]) and math.isnan(row["nbytes"])
    gemm = h100[h100["op_class"] == "gemm"]
    assert gemm[["batch", "num_gpus", "nbytes", "window"]].isna().all().all()
    assert set(gemm["dtype"]) == {"bf16", "fp8"}


@pytest.mark.shared_data
@needs_data
def test_attention_shapes(h100: pd.DataFrame) -> None:
    prefill = h100[h100["op_class"] == "attention_prefill"]
    assert (prefill["q_len"] == prefill["kv_len"]).all()
    decode = h100[h100["op_class"] == "attention_decode"]
    assert (decode["q_len"] == 1).all()
    raw = pd.read_parquet(MEASURED / "h100_sxm" / "generation_attention_perf.parquet")
    assert (raw["isl"] == 1).all()
    np.testing.assert_array_equal(decode["kv_len"], (raw["isl"] + raw["step"]).to_numpy())
    # Without a window decode time grows with the cache; with a 128 window it does not.
    sel = decode[(decode["batch"] == 64) & (decode["num_heads"] == 32)]
    sel = sel[(sel["num_kv_heads"] == 8) & (sel["head_dim"] == 128) & (sel["kv_dtype"] == "bf16")]
    full = sel[sel["window"] == 0].set_index("kv_len")["measured_s"]
    windowed = sel[sel["window"] == 128].set_index("kv_len")["measured_s"]
    assert full[4096] > 10 * full[32] and windowed[4096] < 2 * windowed[32]


@pytest.mark.shared_data
@needs_data
def test_nccl_message_size_counts_elements(h100: pd.DataFrame) -> None:
    nccl = h100[h100["nbytes"].notna()]
    raw = pd.read_parquet(MEASURED / "h100_sxm" / "nccl_perf.parquet")
    per_element = raw["nccl_dtype"].map({"half": 2.0, "int8": 1.0}).to_numpy()
    np.testing.assert_array_equal(nccl["nbytes"], raw["message_size"].to_numpy() * per_element)
    # Pure data movement: an int8 run of 2N elements takes as long as a half run of N
    # elements (same bytes). Reductions are left out: int8 reduces slower, and 8-GPU half
    # all-reduce is faster still (NVLink SHARP does not reduce int8).
    moves = nccl[(nccl["nbytes"] >= 2**26) & nccl["op_class"].isin(["all_gather", "all_to_all"])]
    times = moves.groupby(["op_class", "num_gpus", "nbytes", "dtype"])["measured_s"].mean()
    ratio = (times.xs("int8", level="dtype") / times.xs("fp16", level="dtype")).dropna()
    assert len(ratio) >= 18 and ratio.between(0.95, 1.05).all(), ratio


@pytest.mark.shared_data
@needs_data
def test_uncalibrated_big_bf16_gemm_mape_on_h100(h100: pd.DataFrame) -> None:
    big = h100[big_gemm_mask(h100, 2**30)]
    sample = big.sample(n=min(3000, len(big)), random_state=0)
    stats = summarise_errors(sample["measured_s"], predict(sample))
    assert stats["n"] == len(sample)
    assert stats["mape"] < 0.20, stats
