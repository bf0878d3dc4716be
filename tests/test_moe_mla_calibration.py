"""The MoE and MLA tables in the calibration: what the importer reads, the split, and
the held-out errors of the shipped profiles."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hardware_models.calibration import holdout_mask, load_measured, predict
from hardware_models.calibration.moe_mla_tables import EXTRA_COLUMNS, read_mla, read_moe
from hardware_models.calibration.profile_file import read_profile
from hardware_models.presets import calibration_path, load_gpu
from tests.conftest import SHARED_DATA, needs_shared_data

MEASURED = SHARED_DATA / "measured"


@needs_shared_data
def test_moe_rows_are_one_ranks_layer_in_seconds():
    raw = pd.read_parquet(MEASURED / "h100_sxm" / "moe_perf.parquet")
    rows = read_moe(MEASURED / "h100_sxm" / "moe_perf.parquet", "h100-sxm")
    assert len(rows) == len(raw)
    assert (rows["op_class"] == "moe").all()
    assert np.array_equal(rows["m"], raw["num_tokens"]) and np.array_equal(
        rows["k"], raw["inter_size"]
    )
    assert np.allclose(rows["measured_s"], raw["latency"] / 1e3)
    # The table's "balanced" deals the pairs round-robin; power-law rows keep their alpha.
    assert set(rows["routing"]) == {"round_robin", "power_law_1.01", "power_law_1.2"}
    # The int4 rows are vLLM's WNA16 kernels (the collector's fused_experts call), not
    # Marlin; the L40S's int4 rows (MarlinExperts) are Marlin.
    assert set(rows["dtype"]) == {"bf16", "fp8", "fp8_block", "int4_wna16"}
    assert (rows["source_dtype"][rows["dtype"] == "int4_wna16"] == "int4_wo").all()
    l40s = read_moe(MEASURED / "l40s" / "moe_perf.parquet", "l40s")
    assert "int4_wo" in set(l40s["dtype"]) and "int4_wna16" not in set(l40s["dtype"])
    # vLLM runs an expert either tensor- or expert-parallel, never both.
    assert ((rows["tp"] == 1) | (rows["ep"] == 1)).all()


@needs_shared_data
def test_mla_rows_distinguish_modules_from_kernels():
    module = read_mla(MEASURED / "h100_sxm" / "mla_generation_module_perf.parquet", "h100-sxm")
    kernel = read_mla(MEASURED / "a100_sxm" / "generation_mla_perf.parquet", "a100-80gb-sxm")
    assert (module["module"] == 1).all() and (kernel["module"] == 0).all()
    assert set(module["gemm_dtype"]) == {"bf16", "fp8_block"}
    assert "gemm_dtype" not in kernel or kernel["gemm_dtype"].isna().all()
    raw = pd.read_parquet(MEASURED / "a100_sxm" / "generation_mla_perf.parquet")
    assert np.array_equal(kernel["kv_len"], raw["isl"] + raw["step"])  # the cached tokens
    assert (kernel["q_len"] == 1).all()
    prefill = read_mla(MEASURED / "h100_sxm" / "mla_context_module_perf.parquet", "h100-sxm")
    assert np.array_equal(prefill["q_len"], prefill["kv_len"])  # no cached prefix


def test_adding_moe_rows_moves_no_other_row_across_the_split():
    gemm = pd.DataFrame(
        {
            "op_class": "gemm",
            "dtype": "bf16",
            "source_dtype": "bfloat16",
            "m": np.arange(1, 200, dtype=float),
            "n": 4096.0,
            "k": 4096.0,
        }
    )
    moe = pd.DataFrame(
        {
            "op_class": "moe",
            "dtype": "bf16",
            "source_dtype": "bfloat16",
            "m": np.repeat([1.0, 64.0], 100),
            "n": 7168.0,
            "k": 2048.0,
            "topk": 8.0,
            "num_experts": 256.0,
            "tp": 1.0,
            "ep": np.tile(np.arange(1.0, 101.0), 2),
            "routing": "round_robin",
        }
    )
    alone = holdout_mask(gemm, 0.5, 0)
    both = holdout_mask(pd.concat([gemm, moe], ignore_index=True), 0.5, 0)
    assert both.iloc[: len(gemm)].tolist() == alone.tolist()
    # The MoE rows differ only in their own columns (ep), and split between the halves.
    assert 0.3 < both.iloc[len(gemm) :].mean() < 0.7
    assert set(EXTRA_COLUMNS) >= {"topk", "num_experts", "tp", "ep", "routing"}


def _held_out_mape(gpu: str, op_class: str, profile_gpu: str | None = None) -> float:
    table = load_measured(gpus=[gpu], op_classes=[op_class])
    profile = read_profile(calibration_path(profile_gpu or gpu))
    if profile_gpu is None:
        table = table[holdout_mask(table, profile.metadata.holdout, profile.metadata.seed)]
    spec = load_gpu(gpu).with_efficiency(profile.efficiency)
    predicted = predict(table, gpu_resolver=lambda _name: spec)
    return float(np.mean(np.abs(predicted - table["measured_s"]) / table["measured_s"]))


@needs_shared_data
@pytest.mark.parametrize(
    ("gpu", "op_class", "profile_gpu", "documented"),
    [
        # benchmarks/README.md, "MoE and MLA": held-out errors of the shipped profiles
        # (of the issue's targets, 10% MoE and 12% MLA, both are met since the H100's
        # int4 rows are priced as the WNA16 kernels they ran; see there), and the H100
        # profile on every A100 MoE row (a transfer; target 20%, not met). Profiles
        # refitted with `infersim calibrate fit --from-shared GPU` (same section).
        ("h100-sxm", "moe", None, 0.090),
        ("h100-sxm", "mla_decode", None, 0.112),
        ("h100-sxm", "mla_prefill", None, 0.068),
        ("a100-80gb-sxm", "moe", None, 0.182),
        ("a100-80gb-sxm", "moe", "h100-sxm", 0.231),
    ],
)
def test_shipped_profiles_give_the_documented_moe_and_mla_errors(
    gpu, op_class, profile_gpu, documented
):
    assert _held_out_mape(gpu, op_class, profile_gpu) == pytest.approx(documented, abs=0.0015)


def test_the_projection_cache_keys_on_the_whole_layer_shape_and_chip():
    """The projections' memo served one layer's seconds to another of as many heads
    (DeepSeek-V3's to V2-Lite's) and one chip's to another of the same name (twice the
    bandwidth): it keys on the shape and on every field of the chip now."""
    from hardware_models.calibration import moe_mla_tables as tables
    from hardware_models.mla import MlaShape

    gpu = load_gpu("h100-sxm")
    v3 = MlaShape(num_heads=128, hidden_size=7168, kv_lora_rank=512, qk_nope_head_dim=128,
                  qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536)  # fmt: skip
    v2_lite = MlaShape(num_heads=128, hidden_size=2048, kv_lora_rank=512, qk_nope_head_dim=128,
                       qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=None)  # fmt: skip
    faster = gpu.model_copy(
        update={"memory": gpu.memory.model_copy(update={"bandwidth_gbps": 6700.0})}
    )
    new, context = np.array([1, 64, 512]), np.array([1024, 1024, 1024])

    def priced(chip, shape):
        return tables._projections(chip, shape, new, context, True, "bf16").copy()

    tables._PROJECTIONS.clear()
    cached = [priced(gpu, v3), priced(gpu, v2_lite), priced(faster, v2_lite)]
    fresh = []
    for chip, shape in ((gpu, v3), (gpu, v2_lite), (faster, v2_lite)):
        tables._PROJECTIONS.clear()
        fresh.append(priced(chip, shape))
    for got, alone in zip(cached, fresh, strict=True):
        np.testing.assert_array_equal(got, alone)
    assert not np.array_equal(fresh[0], fresh[1]) and not np.array_equal(fresh[1], fresh[2])
