"""Price measured rows term by term, so a fit can tell which efficiency each row informs.

For every op class the fitter calibrates, `price_terms` returns the predicted seconds, the
fixed floor included in them, and for each efficiency curve the row's size on that curve,
the time of the term the curve scales and whether that term set the row's time. A row
informs a curve only where its term binds: a compute-bound GEMM says nothing about
memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import keys_per_query
from hardware_models.block_scaling import operand_bytes, stored_bytes
from hardware_models.calibration.benchmark_loops import (
    EAGER_RUNS,
    eager_seconds,
    gemm_loop_bytes,
    timed_eagerly,
)
from hardware_models.calibration.measured_tables import decode_parts, prefill_table
from hardware_models.dtypes import bytes_per_element, parse_dtype
from hardware_models.efficiency import EfficiencyProfile, dtype_key
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_launches, gemm_parts_many, l2_hit_fraction, output_dtype
from hardware_models.pointwise import launch_overhead_seconds

# A curve's place in an EfficiencyProfile: (field, None) or (dict field, dtype key).
CurveLoc = tuple[str, str | None]


@dataclass
class CurveTerm:
    """One curve's view of the rows: where on the curve, the term's time, whether it binds."""

    size: np.ndarray
    seconds: np.ndarray
    binds: np.ndarray


@dataclass
class Terms:
    seconds: np.ndarray
    floor_s: np.ndarray
    curves: dict[CurveLoc, CurveTerm] = field(default_factory=dict)


def _unique(sub: pd.DataFrame, cols: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    codes = sub.groupby(cols, sort=False, dropna=False).ngroup().to_numpy()
    first = pd.Series(np.arange(len(sub))).groupby(codes).first().sort_index()
    return sub.iloc[first.to_numpy()][cols], codes


def gemm_terms(gpu: AcceleratorSpec, rows: pd.DataFrame, kernel: str) -> Terms:
    """GEMM rows all of one kernel dtype `kernel` (see gemm_kernel_dtype). A memory-bound
    row informs the L2 curve where its benchmark kept the operands warm, else the DRAM
    one (gemm_l2_memory_by_dtype)."""
    rows = rows.assign(loop_bytes=gemm_loop_bytes(rows, kernel))
    uniq, codes = _unique(rows, ["m", "n", "k", "loop_bytes"])
    parts = gemm_parts_many(gpu, uniq["m"], uniq["n"], uniq["k"], kernel, None, uniq["loop_bytes"])
    seconds, math_s, stream, compute, memory, fixed = (
        getattr(parts, f)[codes]
        for f in ("seconds", "math_s", "stream_s", "compute_s", "memory_s", "fixed_s")
    )
    compute_binds = compute >= memory
    # The wave latency (and a block's capped stream, where it outlasts the math) is in
    # series with the math: fixed where the compute term binds.
    floor = fixed + np.where(compute_binds, compute - math_s, 0.0)
    math_binds = compute_binds & (math_s >= stream)
    # The bytes gemm.py's memory curves read at: operands with their block scales.
    bpe, bpe_b = operand_bytes(kernel), stored_bytes(kernel)
    out_bpe = bytes_per_element(output_dtype(parse_dtype(kernel)))
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    eager = timed_eagerly(rows).to_numpy()
    if eager.any():
        # Rows timed with the host launching their kernels (benchmark_loops.eager_seconds):
        # GPU-bound, the first launch adds to the floor; host-bound, no curve binds.
        launch_s = launch_overhead_seconds(gpu, 1, cuda_graph=False)
        timed = eager_seconds(seconds, gemm_launches(gpu, m, kernel), launch_s)
        gpu_bound = timed <= seconds + launch_s / EAGER_RUNS
        host_bound = eager & ~gpu_bound
        floor = np.where(host_bound, timed, floor + eager * launch_s / EAGER_RUNS)
        seconds = np.where(eager, timed, seconds)
        compute_binds &= ~host_bound
        math_binds &= ~host_bound
        memory_binds = ~compute_binds & ~host_bound
    else:
        memory_binds = ~compute_binds
    compulsory = m * k * bpe + k * n * bpe_b + m * n * out_bpe  # gemm.py's memory-curve size
    warm = l2_hit_fraction(gpu, rows["loop_bytes"].to_numpy(dtype=float)) > 0.5
    key = dtype_key(kernel)
    return Terms(
        seconds=seconds,
        floor_s=floor,
        curves={
            ("gemm_compute_by_dtype", key): CurveTerm(2.0 * m * n * k, math_s, math_binds),
            ("gemm_memory_by_dtype", key): CurveTerm(compulsory, memory, memory_binds & ~warm),
            ("gemm_l2_memory_by_dtype", key): CurveTerm(compulsory, memory, memory_binds & warm),
        },
    )


_ATTN = ["num_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype"]


def prefill_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    uniq, codes = _unique(rows, ["batch", "q_len", "kv_len", "window", *_ATTN])
    priced = prefill_table(uniq, gpu)[codes]
    # Priced again without the per-thread-block latency, which adds to the math: the rest
    # of the compute term is what the efficiency curve scales.
    no_cta = gpu.with_efficiency(gpu.efficiency.model_copy(update={"prefill_cta_latency_us": 0}))
    math_only = prefill_table(uniq, no_cta)[codes][:, 1]
    seconds, compute, memory, dram = priced.T
    # Calls of one token per sequence are priced as decode calls: no prefill term binds.
    prefill = (rows["q_len"] > 1).to_numpy()
    binds = compute >= memory
    floor = np.where(
        prefill, gpu.efficiency.prefill_floor_us * 1e-6 + (compute - math_only), seconds
    )
    # attention.py's curve axis: mean keys attended per query (size counts pair FLOPs)
    pairs = rows["size"].to_numpy(dtype=float) / (
        4.0 * rows["num_heads"].to_numpy(dtype=float) * rows["head_dim"].to_numpy(dtype=float)
    )
    size = keys_per_query(pairs, rows["batch"].to_numpy(dtype=float) * rows["q_len"].to_numpy())
    return Terms(
        seconds,
        floor,
        {
            ("attention_prefill_compute", None): CurveTerm(size, math_only, binds & prefill),
            ("attention_prefill_memory", None): CurveTerm(
                np.maximum(dram, 1.0), memory, ~binds & prefill
            ),
        },
    )


def decode_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    """The KV-bandwidth curve scales the stream from HBM: it binds where that stream, not
    the thread-block waves, sets the time."""
    parts = decode_parts(rows, gpu)
    binds = parts.memory >= parts.fixed
    curve = CurveTerm(np.maximum(parts.kv_bytes, 1.0), parts.memory, binds)
    return Terms(parts.seconds, parts.overhead, {("attention_decode_memory", None): curve})


def copy_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    """Device-memory copies: read and write every byte, plus one kernel floor."""
    seconds, floor = copy_seconds(gpu, rows["nbytes"].to_numpy(dtype=float))
    return Terms(seconds, np.full(len(rows), floor))


def copy_seconds(gpu: AcceleratorSpec, nbytes: np.ndarray) -> tuple[np.ndarray, float]:
    eff = gpu.efficiency
    floor = eff.kernel_floor_us * 1e-6
    return 2.0 * nbytes / (gpu.memory_bandwidth * eff.memory_bandwidth) + floor, floor


def curve_at(profile: EfficiencyProfile, loc: CurveLoc):
    """The curve at `loc`; a per-dtype entry not fitted yet reads its generic field, an
    unfitted prefill memory curve the streaming bandwidth, an unfitted MLA curve the
    attention curve it defaults to, a MoE format's the curve moe_terms falls back on."""
    name, key = loc
    if name == "attention_prefill_memory":
        return profile.prefill_memory
    if name in ("mla_decode_memory", "mla_prefill_compute"):
        return getattr(profile, f"{name}_curve")
    if name == "gemm_l2_memory_by_dtype":
        return profile.gemm_l2_memory(str(key))
    if name in ("moe_compute_by_dtype", "moe_memory_by_dtype"):
        return profile.moe_terms(str(key))[0 if name == "moe_compute_by_dtype" else 1]
    if key is None:
        return getattr(profile, name)
    table = getattr(profile, name)
    if key in table:
        return table[key]
    generic = {"gemm_compute_by_dtype": "gemm_compute", "gemm_memory_by_dtype": "gemm_memory"}
    if name not in generic:
        raise InfersimError(f"no curve field {name}")
    return getattr(profile, generic[name])


def with_value(profile: EfficiencyProfile, loc: CurveLoc, value: object) -> EfficiencyProfile:
    """`profile` with the field (or dict entry) at `loc` replaced by `value`."""
    name, key = loc
    if key is None:
        return profile.model_copy(update={name: value})
    table = dict(getattr(profile, name))
    table[key] = value
    return profile.model_copy(update={name: table})
