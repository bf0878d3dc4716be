"""Price measured rows term by term, so a fit can tell which efficiency each row informs.

For every op class the fitter calibrates, `price_terms` returns the predicted seconds, the
fixed floor included in them, and for each efficiency curve the row's size on that curve,
the time of the term the curve scales and whether that term set the row's time. A row
informs a curve only where its term binds: a compute-bound GEMM says nothing about
memory bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

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
from hardware_models.calibration.measured_tables import (
    decode_parts,
    prefill_table,
    unique_groups,
)
from hardware_models.dtypes import bytes_per_element, parse_dtype
from hardware_models.efficiency import EfficiencyProfile, dtype_key
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_launches, gemm_parts_many, l2_hit_fraction, output_dtype
from hardware_models.object_memo import per_object
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
    """unique_groups, once per frame (the fit prices the same rows for every candidate)."""
    return per_object(sub, "unique:" + ",".join(cols), lambda frame: unique_groups(frame, cols))


class _GemmRows(NamedTuple):
    """What gemm_terms needs of the rows alone (computed once per frame, object_memo)."""

    shapes: pd.DataFrame  # the distinct (m, n, k, loop_bytes)
    codes: np.ndarray  # each row's shape
    loop_bytes: np.ndarray  # what its benchmark's loop touched (benchmark_loops)
    eager: np.ndarray  # timed without a CUDA graph
    m: np.ndarray
    flops: np.ndarray  # its place on the compute curve
    compulsory: np.ndarray  # and on the memory curves (gemm.py's memory-curve size)


def _gemm_rows(rows: pd.DataFrame, kernel: str) -> _GemmRows:
    loop_bytes = gemm_loop_bytes(rows, kernel)
    shapes, codes = unique_groups(rows.assign(loop_bytes=loop_bytes), ["m", "n", "k", "loop_bytes"])
    # The bytes gemm.py's memory curves read at: operands with their block scales.
    bpe, bpe_b = operand_bytes(kernel), stored_bytes(kernel)
    out_bpe = bytes_per_element(output_dtype(parse_dtype(kernel)))
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    compulsory = m * k * bpe + k * n * bpe_b + m * n * out_bpe
    eager = timed_eagerly(rows).to_numpy()
    return _GemmRows(shapes, codes, loop_bytes, eager, m, 2.0 * m * n * k, compulsory)


def gemm_terms(gpu: AcceleratorSpec, rows: pd.DataFrame, kernel: str) -> Terms:
    """GEMM rows all of one kernel dtype `kernel` (see gemm_kernel_dtype). A memory-bound
    row informs the L2 curve where its benchmark kept the operands warm, else the DRAM
    one (gemm_l2_memory_by_dtype)."""
    r = per_object(rows, "gemm_rows:" + kernel, lambda frame: _gemm_rows(frame, kernel))
    u = r.shapes
    parts = gemm_parts_many(gpu, u["m"], u["n"], u["k"], kernel, None, u["loop_bytes"])
    seconds, math_s, stream, compute, memory, fixed, work = (
        getattr(parts, f)[r.codes]
        for f in ("seconds", "math_s", "stream_s", "compute_s", "memory_s", "fixed_s", "work_flops")
    )
    compute_binds = compute >= memory
    # The wave latency (and a block's capped stream, where it outlasts the math) is in
    # series with the math: fixed where the compute term binds.
    floor = fixed + np.where(compute_binds, compute - math_s, 0.0)
    math_binds = compute_binds & (math_s >= stream)
    if r.eager.any():
        # Rows timed with the host launching their kernels (benchmark_loops.eager_seconds):
        # GPU-bound, the first launch adds to the floor; host-bound, no curve binds.
        launch_s = launch_overhead_seconds(gpu, 1, cuda_graph=False)
        timed = eager_seconds(seconds, gemm_launches(gpu, r.m, kernel), launch_s)
        gpu_bound = timed <= seconds + launch_s / EAGER_RUNS
        host_bound = r.eager & ~gpu_bound
        floor = np.where(host_bound, timed, floor + r.eager * launch_s / EAGER_RUNS)
        seconds = np.where(r.eager, timed, seconds)
        compute_binds &= ~host_bound
        math_binds &= ~host_bound
        memory_binds = ~compute_binds & ~host_bound
    else:
        memory_binds = ~compute_binds
    warm = l2_hit_fraction(gpu, r.loop_bytes) > 0.5
    key = dtype_key(kernel)
    return Terms(
        seconds=seconds,
        floor_s=floor,
        curves={
            ("gemm_compute_by_dtype", key): CurveTerm(work, math_s, math_binds),
            ("gemm_memory_by_dtype", key): CurveTerm(r.compulsory, memory, memory_binds & ~warm),
            ("gemm_l2_memory_by_dtype", key): CurveTerm(r.compulsory, memory, memory_binds & warm),
        },
    )


_ATTN = ["num_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype"]


_PREFILL_SHAPE = ["batch", "q_len", "kv_len", "window", *_ATTN]


def prefill_seconds(gpu: AcceleratorSpec, rows: pd.DataFrame) -> np.ndarray:
    """prefill_terms' seconds alone (one pricing of the rows, not two)."""
    uniq, codes = _unique(rows, _PREFILL_SHAPE)
    return prefill_table(uniq, gpu)[codes][:, 0]


def prefill_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    uniq, codes = _unique(rows, _PREFILL_SHAPE)
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
            # The DRAM curve, from rows whose bytes did not stay in L2 between calls.
            ("attention_prefill_memory", None): CurveTerm(
                np.maximum(dram, 1.0),
                memory,
                ~binds & prefill & (l2_hit_fraction(gpu, dram) <= 0.5),
            ),
        },
    )


def decode_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    """The KV-bandwidth curve scales the stream from DRAM: it binds where that stream, not
    the thread-block waves or a warm L2, sets the time."""
    parts = decode_parts(rows, gpu)
    binds = (parts.memory >= parts.fixed) & ~parts.in_l2
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
