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
from hardware_models.attention import (
    attention_decode_seconds,
    keys_per_query,
    uniform_prefill_cost,
)
from hardware_models.dtypes import bytes_per_element, parse_dtype
from hardware_models.efficiency import EfficiencyProfile, dtype_key
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_cost, output_dtype

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
    """GEMM rows all of one kernel dtype `kernel` (see gemm_kernel_dtype)."""
    uniq, codes = _unique(rows, ["m", "n", "k"])
    # Uncached: a fit prices each shape under many candidate profiles once each.
    costs = [
        gemm_cost.__wrapped__(gpu, int(m), int(n), int(k), kernel)
        for m, n, k in zip(uniq["m"], uniq["n"], uniq["k"], strict=True)
    ]
    seconds = np.array([c.seconds for c in costs])[codes]
    compute = np.array([c.compute_seconds for c in costs])[codes]
    memory = np.array([c.memory_seconds for c in costs])[codes]
    floor = np.array([c.overhead_seconds for c in costs])[codes]  # floor + split-K pass
    dtype = parse_dtype(kernel)
    bpe, out_bpe = bytes_per_element(dtype), bytes_per_element(output_dtype(dtype))
    m, n, k = (rows[c].to_numpy(dtype=float) for c in ("m", "n", "k"))
    compulsory = (m * k + k * n) * bpe + m * n * out_bpe  # gemm.py's memory-curve size
    key = dtype_key(kernel)
    return Terms(
        seconds=seconds,
        floor_s=floor,
        curves={
            ("gemm_compute_by_dtype", key): CurveTerm(2.0 * m * n * k, compute, compute >= memory),
            ("gemm_memory_by_dtype", key): CurveTerm(compulsory, memory, memory > compute),
        },
    )


_ATTN = ["num_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype"]


def _prefill_seconds(gpu: AcceleratorSpec, uniq: pd.DataFrame) -> np.ndarray:
    out = np.empty((len(uniq), 3))
    for i, row in enumerate(uniq.itertuples(index=False)):
        cost = uniform_prefill_cost(
            gpu,
            batch=int(row.batch),
            q_len=int(row.q_len),
            kv_len=int(row.kv_len),
            window=int(row.window) or None,
            num_heads=int(row.num_heads),
            num_kv_heads=int(row.num_kv_heads),
            head_dim=int(row.head_dim),
            dtype=row.dtype,
            kv_dtype=row.kv_dtype,
        )
        out[i] = cost.seconds, cost.compute_seconds, cost.memory_seconds
    return out


def prefill_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    uniq, codes = _unique(rows, ["batch", "q_len", "kv_len", "window", *_ATTN])
    priced = _prefill_seconds(gpu, uniq)[codes]
    # Priced again without the per-thread-block latency, which adds to the math: the rest
    # of the compute term is what the efficiency curve scales.
    no_cta = gpu.with_efficiency(gpu.efficiency.model_copy(update={"prefill_cta_latency_us": 0}))
    math_only = _prefill_seconds(no_cta, uniq)[codes][:, 1]
    seconds, compute, memory = priced.T
    binds = compute >= memory
    floor = gpu.efficiency.prefill_floor_us * 1e-6 + (compute - math_only)
    # attention.py's curve axis: mean keys attended per query (size counts pair FLOPs)
    pairs = rows["size"].to_numpy(dtype=float) / (
        4.0 * rows["num_heads"].to_numpy(dtype=float) * rows["head_dim"].to_numpy(dtype=float)
    )
    size = keys_per_query(pairs, rows["batch"].to_numpy(dtype=float) * rows["q_len"].to_numpy())
    return Terms(
        seconds,
        floor,
        {("attention_prefill_compute", None): CurveTerm(size, math_only, binds)},
    )


def _decode_seen(rows: pd.DataFrame) -> np.ndarray:
    kv = rows["kv_len"].to_numpy(dtype=float)
    window = rows["window"].fillna(0).to_numpy(dtype=float)
    return np.where(window > 0, np.minimum(kv, window), kv)


def decode_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    no_cta = gpu.with_efficiency(gpu.efficiency.model_copy(update={"decode_cta_latency_us": 0}))
    seconds = np.empty(len(rows))
    memory_only = np.empty(len(rows))
    kv_bytes = np.empty(len(rows))
    seen = _decode_seen(rows)
    batch = rows["batch"].to_numpy(dtype=float)
    floor_s = gpu.efficiency.decode_floor_us * 1e-6
    for key, pos in rows.groupby(_ATTN, sort=False).indices.items():
        heads, kv_heads, head_dim, dtype, kv_dtype = key
        shape = {
            "num_heads": int(heads),
            "num_kv_heads": int(kv_heads),
            "head_dim": int(head_dim),
            "dtype": dtype,
            "kv_dtype": kv_dtype,
        }
        ctx = batch[pos] * seen[pos]
        seconds[pos] = attention_decode_seconds(
            gpu, num_seqs=batch[pos], context_tokens=ctx, **shape
        )[0]
        memory_only[pos] = attention_decode_seconds(
            no_cta, num_seqs=batch[pos], context_tokens=ctx, **shape
        )[0]
        # attention.py's curve size: the KV bytes read
        kv_bytes[pos] = ctx * 2.0 * int(kv_heads) * int(head_dim) * bytes_per_element(kv_dtype)
    binds = memory_only >= seconds * (1 - 1e-9)
    return Terms(
        seconds,
        np.full(len(rows), floor_s),
        {
            ("attention_decode_memory", None): CurveTerm(
                np.maximum(kv_bytes, 1.0), memory_only - floor_s, binds
            )
        },
    )


def copy_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    """Device-memory copies: read and write every byte, plus one kernel floor."""
    seconds, floor = copy_seconds(gpu, rows["nbytes"].to_numpy(dtype=float))
    return Terms(seconds, np.full(len(rows), floor))


def copy_seconds(gpu: AcceleratorSpec, nbytes: np.ndarray) -> tuple[np.ndarray, float]:
    eff = gpu.efficiency
    floor = eff.kernel_floor_us * 1e-6
    return 2.0 * nbytes / (gpu.memory_bandwidth * eff.memory_bandwidth) + floor, floor


def curve_at(profile: EfficiencyProfile, loc: CurveLoc):
    """The curve at `loc`; a per-dtype entry not fitted yet reads its generic field."""
    name, key = loc
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
