"""How the benchmark behind a measured GEMM row ran it: what its loop touched between two
runs, and whether the host launched each run.

A benchmark times a GEMM by running it again and again; whatever its loop touches in
between decides whether the operands are still in L2 when the next run starts
(gemm.warm_l2_bytes). A serving engine's forward pass cycles through every layer's
weights, far more than any L2, so the simulator prices GEMMs cold; a fit must know which
measured rows ran warm, or it reads an L2's rate as the DRAM's. Likewise a row timed
without a CUDA graph includes the host's kernel launches, which a CUDA-graphed engine
step does not pay (timed_eagerly).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import bytes_per_element, parse_dtype
from hardware_models.gemm import output_dtype, warm_l2_bytes

# The aiconfigurator table file GEMM rows come from (measured_tables.read_gemm).
AICONFIGURATOR_GEMM_FILE = "gemm_perf.parquet"
TEXT_SUFFIXES = (".txt", ".csv")  # aiconfigurator's tables as comma-separated text
# aiconfigurator's vLLM collector (collector/vllm/collect_gemm.py) builds this many
# linear layers of one shape, each with weights of its own, runs them in turn on one
# activation tensor and reports the time per layer: six for bf16 and per-tensor fp8
# (`outside_loop_count`), one for block-scaled fp8.
AICONFIGURATOR_GEMM_LAYERS = {"fp8_block": 1}
AICONFIGURATOR_DEFAULT_LAYERS = 6
ACTIVATION_BYTES = 2.0  # the collectors' activations are bf16, quantised per call for fp8
HARNESS_PREFIX = "harness:"  # `calibrate run` rows: one GEMM on the same tensors
# aiconfigurator's vLLM collector (collect_gemm.py) timed fp8_block GEMMs without a CUDA
# graph (`use_cuda_graph=gemm_type != "fp8_block"`) up to vLLM 0.24.x, the version that
# began naming the kernel (kernel_source) and still ran it eagerly; aiconfigurator's
# 0.25.0 collection times it in a graph and keeps 0.24.0's FP8-block rows out of reuse
# for that reason. read_gemm writes the version into each row's `source`.
EAGER_COLLECTOR = "VLLM"
GRAPHED_FROM_VERSION = (0, 25, 0)
EAGER_GEMM_DTYPES = frozenset({"fp8_block"})
# Calls the collector's eager path times between its two CUDA events (benchmark_with_power:
# num_runs = 6 without power sampling), the GPU idle at the first.
EAGER_RUNS = 6


def _table_file(source: str) -> tuple[str, str, str]:
    """(file name, collector, kernel_source) of a row's `source`: read_gemm writes
    "<path>:<framework>==<version>:<kernel_source>" where the table names its collector
    and kernels; the last two are empty for a row of any other origin."""
    name, _, rest = Path(source).name.partition(":")
    collector, _, kernel_source = rest.rpartition(":")
    # aiconfigurator ships its tables as Parquet or as CSV text: one table either way.
    if Path(name).suffix in TEXT_SUFFIXES:
        name = Path(name).with_suffix(".parquet").name
    return name, collector, kernel_source


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _collector_ran_eagerly(source: str) -> bool:
    """Whether aiconfigurator's collector named in `source` timed EAGER_GEMM_DTYPES
    without a CUDA graph: vLLM's, before GRAPHED_FROM_VERSION."""
    name, collector, _ = _table_file(source)
    framework, _, version = collector.partition("==")
    return (
        name == AICONFIGURATOR_GEMM_FILE
        and framework.upper() == EAGER_COLLECTOR
        and bool(_version(version))
        and _version(version) < GRAPHED_FROM_VERSION
    )


def gemm_loop_bytes(rows: pd.DataFrame, kernel: pd.Series | str) -> np.ndarray:
    """Bytes each GEMM row's benchmark touched between two runs of it (gemm_parts's
    `loop_bytes`): aiconfigurator's layers' weights, the activations (and their 8-bit
    copy) and the output; the harness's one GEMM's operands and output; NaN (priced cold)
    for rows of unknown origin, such as a hand-made CSV. `kernel` is each row's kernel
    dtype (measured_tables.gemm_kernel_dtype), or one for all."""
    if isinstance(kernel, str):
        kernel = pd.Series(kernel, index=rows.index)
    keys = pd.unique(kernel)
    weight_bpe = kernel.map({d: bytes_per_element(parse_dtype(d)) for d in keys})
    out_bpe = kernel.map({d: bytes_per_element(output_dtype(parse_dtype(d))) for d in keys})
    weight_bpe, out_bpe = weight_bpe.to_numpy(dtype=float), out_bpe.to_numpy(dtype=float)
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    source = rows["source"].astype(str)
    outputs = m * n * out_bpe
    layers = kernel.map(
        lambda d: AICONFIGURATOR_GEMM_LAYERS.get(str(d), AICONFIGURATOR_DEFAULT_LAYERS)
    ).to_numpy(dtype=float)
    quantised = np.where(weight_bpe < ACTIVATION_BYTES, m * k * weight_bpe, 0.0)
    aiconfigurator = layers * n * k * weight_bpe + m * k * ACTIVATION_BYTES + quantised
    harness = (m + n) * k * weight_bpe
    is_table = source.map(lambda s: _table_file(s)[0] == AICONFIGURATOR_GEMM_FILE).to_numpy()
    is_harness = source.str.startswith(HARNESS_PREFIX).to_numpy()
    loop = np.where(is_table, aiconfigurator, np.where(is_harness, harness, np.nan))
    return loop + outputs


def unknown_loop_note(rows: pd.DataFrame, spec: AcceleratorSpec) -> str | None:
    """A terminal line when GEMM rows of unknown origin are priced cold on a chip whose L2
    keeps a benchmark loop warm: their small shapes may have run from L2, which a fit
    would then read as DRAM bandwidth. None when there are none, or the L2 keeps nothing
    warm."""
    gemm = rows[rows["op_class"] == "gemm"]
    if gemm.empty or warm_l2_bytes(spec) == 0.0:
        return None
    unknown = int(np.isnan(gemm_loop_bytes(gemm, gemm["dtype"].astype(str))).sum())
    if unknown == 0:
        return None
    return (
        f"priced {unknown} gemm rows cold: their benchmark's loop is not known (neither "
        f"aiconfigurator's nor the harness's); on the {spec.name}'s single L2, shapes re-run "
        "in a loop that fits it run from L2, faster than its DRAM allows"
    )


def timed_eagerly(table: pd.DataFrame) -> pd.Series:
    """GEMM rows the aiconfigurator collector timed without a CUDA graph: those of
    EAGER_GEMM_DTYPES from a collector that ran them eagerly (_collector_ran_eagerly)."""
    eager = table["source_dtype"].isin(EAGER_GEMM_DTYPES)
    if eager.any():  # the sources, once each (a fit prices one table many times)
        ran_eagerly = {s: _collector_ran_eagerly(str(s)) for s in pd.unique(table["source"])}
        eager &= table["source"].map(ran_eagerly).astype(bool)
    return eager


def eager_seconds(device_s, launches, launch_s: float, runs: int = EAGER_RUNS):
    """Time per call of `runs` eager calls between two events, the GPU idle at the first:
    GPU-bound, each call's device time plus the first launch spread over the runs; host-
    bound, each call's launches plus the last call's device time spread over them."""
    return np.maximum(device_s + launch_s / runs, launches * launch_s + device_s / runs)
