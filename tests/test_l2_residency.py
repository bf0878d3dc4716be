"""Operands a benchmark loop keeps warm in L2: priced at the L2's rate where the loop fits
a single (unpartitioned) L2, the DRAM's beyond it and on partitioned L2s; a serving
engine's GEMMs (no loop given) are priced cold, exactly as before."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hardware_models.calibration.benchmark_loops import (
    AICONFIGURATOR_DEFAULT_LAYERS,
    AICONFIGURATOR_GEMM_FILE,
    gemm_loop_bytes,
)
from hardware_models.calibration.sources import load_measurements
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.validate import predict_all
from hardware_models.calibration.workflow import usable_rows
from hardware_models.gemm import (
    L2_HIT_RAMP,
    gemm_cost,
    gemm_parts,
    gemm_parts_many,
    l2_hit_fraction,
    warm_l2_bytes,
)
from hardware_models.presets import load_gpu
from tests.conftest import SHARED_DATA, needs_shared_data

MIB = 2**20


def test_a_single_l2_keeps_a_loop_warm_a_partitioned_one_does_not() -> None:
    assert warm_l2_bytes(load_gpu("l40s")) == 96 * MIB
    assert warm_l2_bytes(load_gpu("rtx-4090")) == 72 * MIB
    for partitioned in ("h100-sxm", "a100-80gb-sxm", "b200"):
        gpu = load_gpu(partitioned)
        assert gpu.l2.partitions == 2 and warm_l2_bytes(gpu) == 0.0
        assert l2_hit_fraction(gpu, np.array([1e6])).tolist() == [0.0]
        assert gemm_parts(gpu, 4, 4096, 1024, loop_bytes=1e6) == gemm_parts(gpu, 4, 4096, 1024)


def test_hits_ramp_down_around_the_warm_capacity() -> None:
    gpu = load_gpu("l40s")
    cap = warm_l2_bytes(gpu)
    below, at, above = cap * (1 - L2_HIT_RAMP), cap, cap * (1 + L2_HIT_RAMP)
    hits = l2_hit_fraction(gpu, np.array([1e6, below, at, above, 10 * cap, np.nan]))
    assert hits.tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0, 0.0, 0.0])


def test_a_warm_skinny_gemm_streams_at_the_l2_rate_and_a_cold_one_as_before() -> None:
    gpu = load_gpu("l40s")
    m, n, k = 4, 4096, 1024  # 8 MiB of weights: 6 copies fit the L40S's 96 MiB
    cold = gemm_parts(gpu, m, n, k)
    assert gemm_parts(gpu, m, n, k, loop_bytes=None) == cold
    assert gemm_parts(gpu, m, n, k, loop_bytes=2 * warm_l2_bytes(gpu)) == cold
    warm = gemm_parts(gpu, m, n, k, loop_bytes=6 * n * k * 2)
    assert warm.memory_s < cold.memory_s / 3  # 5 TB/s against 864 GB/s
    operands = (m * k + k * n) * 2
    assert warm.memory_s > operands / gpu.l2_bandwidth
    assert gemm_cost(gpu, m, n, k, loop_bytes=6 * n * k * 2).seconds == warm.seconds


def test_a_warm_loop_rewrites_its_outputs_in_l2() -> None:
    m, n, k = 4096, 2048, 32  # output-bound: 16 MiB written, 0.4 MiB read
    loop = (m * k + n * k + m * n) * 2
    gpu = load_gpu("l40s")
    warm, cold = gemm_parts(gpu, m, n, k, loop_bytes=loop), gemm_parts(gpu, m, n, k)
    assert warm.epilogue_s < cold.epilogue_s / 3 and warm.seconds < cold.seconds / 2


def test_a_warm_loop_keeps_the_quantisers_activations_in_l2() -> None:
    # The collector quantises one activation tensor before each of its layers: bf16 in,
    # the fp8 copy out, both in the loop (32 MiB and 16 MiB at m = 4096, k = 4096).
    gpu = load_gpu("l40s")
    m, n, k = 4096, 256, 4096
    loop = 6 * n * k + m * k * 3 + m * n * 2
    warm, cold = gemm_parts(gpu, m, n, k, "fp8", loop_bytes=loop), gemm_parts(gpu, m, n, k, "fp8")
    quant_bytes = m * k * 3.0  # read bf16, write fp8
    assert cold.fixed_s - warm.fixed_s > 0.5 * quant_bytes / gpu.memory_bandwidth
    assert warm.fixed_s > quant_bytes / gpu.l2_bandwidth
    # A loop past the L2 quantises from DRAM, as a serving engine's forward pass does.
    assert gemm_parts(gpu, m, n, k, "fp8", loop_bytes=2 * warm_l2_bytes(gpu)) == cold
    many = gemm_parts_many(gpu, np.array([m]), np.array([n]), np.array([k]), "fp8", None, [loop])
    assert many.seconds[0] == pytest.approx(warm.seconds, rel=1e-12)


def test_the_array_path_prices_warm_loops_as_the_scalar_one() -> None:
    gpu = load_gpu("l40s")
    m = np.array([1.0, 8.0, 300.0, 4096.0])
    n = np.array([8192.0, 1536.0, 4096.0, 2048.0])
    k = np.array([1024.0, 4096.0, 512.0, 32.0])
    loop = np.array([50e6, 90e6, np.nan, 20e6])
    many = gemm_parts_many(gpu, m, n, k, "bf16", None, loop)
    for i in range(len(m)):
        lb = None if np.isnan(loop[i]) else float(loop[i])
        one = gemm_parts(gpu, int(m[i]), int(n[i]), int(k[i]), "bf16", None, lb)
        assert many.seconds[i] == pytest.approx(one.seconds, rel=1e-12)


def test_the_loop_each_benchmark_ran() -> None:
    table = f"/data/l40s/{AICONFIGURATOR_GEMM_FILE}"
    rows = pd.DataFrame(
        {
            "m": [4.0, 4.0, 4.0, 4.0],
            "n": [1024.0] * 4,
            "k": [512.0] * 4,
            "source": [table, table, "harness:gemm", "my.csv"],
            "dtype": ["bf16", "fp8", "bf16", "bf16"],
            "source_dtype": ["bfloat16", "fp8_block", "bfloat16", "bf16"],
        }
    )
    loop = gemm_loop_bytes(rows, pd.Series(["bf16", "fp8_block", "bf16", "bf16"]))
    out = 4 * 1024 * 2
    weights = 1024 * 512
    assert loop[0] == AICONFIGURATOR_DEFAULT_LAYERS * weights * 2 + 4 * 512 * 2 + out
    assert loop[1] == weights + 4 * 512 * (2 + 1) + out  # one layer; bf16 x and its fp8 copy
    assert loop[2] == (4 + 1024) * 512 * 2 + out
    assert np.isnan(loop[3])


@needs_shared_data
@pytest.mark.shared_data
def test_the_l40s_bf16_gemms_meet_the_uncalibrated_target() -> None:
    """Held-out half, seed 0: 33.1% when every operand was charged GDDR6's rate."""
    spec = load_gpu("l40s")
    rows = usable_rows(load_measurements(from_shared="l40s", shared_data=SHARED_DATA), spec).rows
    rows = rows[(rows["op_class"] == "gemm") & (rows["source_dtype"] == "bfloat16")]
    held = rows[holdout_mask(rows, 0.5, 0)]
    error = (predict_all(held, spec) - held["measured_s"]).abs() / held["measured_s"]
    assert error.mean() <= 0.20


def test_rows_of_unknown_origin_are_priced_cold_and_the_fit_says_so(tmp_path) -> None:
    path = tmp_path / "gemms.csv"
    path.write_text("m,n,k,dtype,measured_s\n4,4096,1024,bf16,2e-5\n4096,4096,4096,bf16,5e-4\n")
    measurements = load_measurements(path)
    l40s = usable_rows(measurements, load_gpu("l40s"))
    assert l40s.lines() == [
        "priced 2 gemm rows cold: their benchmark's loop is not known (neither "
        "aiconfigurator's nor the harness's); on the l40s's single L2, shapes re-run in a "
        "loop that fits it run from L2, faster than its DRAM allows"
    ]
    assert usable_rows(measurements, load_gpu("h100-sxm")).lines() == []
