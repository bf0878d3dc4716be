"""The plausibility screen: measured rows no kernel on the chip could have produced.

A row is impossible when it ran faster than the chip's floor for it: its FLOPs at the
tensor peak of its dtype (the preset's structural peak at the rated boost clock, which
GPU Boost may exceed: BOOST_HEADROOM), or the bytes
it must touch at the bandwidth of the memory level they fit in. The memory floor is the
larger of every byte once through L2 and the bytes that cannot stay resident in L2 (the
working set less the L2's capacity, counted generously in MiB) from device memory: a
benchmark that repeats one kernel keeps what fits in L2 there between calls, so a small
operator is bound by L2, not DRAM, and only the excess of a large one by DRAM.
Collectives are floored by each GPU sending (p - 1) / p of the buffer at the link's
raw rate. Such rows (a mis-timed kernel, a skipped launch, a mislabelled shape) would
pull a fit towards speeds no kernel reaches, so `fit` and `validate` leave them out and
say how many, by class, with examples.

A GEMM row timed without a CUDA graph (benchmark_loops.timed_eagerly) is also left out
when it ran far slower than both its kernels' launches and its roofline floor: the host
spent that time in the framework's Python, not launching kernels (vLLM 0.24's Triton
block-scaled fp8 path on the L40S: ~300 us a call where one launch takes ~5 us). The
simulator's launch model cannot produce such time, and fitting it into the GEMM curves
would charge it to every served GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration.benchmark_loops import timed_eagerly
from hardware_models.calibration.measured_tables import COLLECTIVE_CLASSES, gemm_kernel_dtype
from hardware_models.dtypes import bytes_per_element, parse_dtype
from hardware_models.gemm import gemm_launches
from hardware_models.node import LinkSpec
from hardware_models.pointwise import launch_overhead_seconds

OVER_PEAK = "faster than the tensor peak"
OVER_BANDWIDTH = "faster than the memory level allows"
OVER_LINK = "faster than the link's raw rate"
HOST_BOUND = "timed eagerly and slower than its kernel launches explain (host-bound)"
# How many times the slower of its launches and its roofline floor an eagerly timed row
# may take before its time is read as the host's: the public H100 table's eager fp8_block
# rows reach ~15x at their 99th percentile, the L40S's 53x at their median.
HOST_BOUND_TIMES = 20.0
EXAMPLES_PER_REASON = 3
# How far above its rated boost clock a chip may run (and its SMs and L2 with it):
# GeForce cards reach ~1.15x (the RTX 4090's published square GEMMs run at up to 1.02x
# the rated peak); device memory and links have no such boost.
BOOST_HEADROOM = 1.15


@dataclass(frozen=True)
class Screened:
    kept: pd.DataFrame
    excluded: pd.DataFrame  # the rows left out, with `reason` and `times_floor`

    def counts(self) -> pd.DataFrame:
        """Rows left out per (op class, reason), with the most impossible ratio seen."""
        grouped = self.excluded.groupby(["op_class", "reason"])
        return pd.DataFrame(
            {"rows": grouped.size(), "max_times_floor": grouped["times_floor"].max()}
        ).reset_index()

    def examples(self) -> pd.DataFrame:
        """The most impossible rows of each (op class, reason)."""
        ranked = self.excluded.sort_values("times_floor", ascending=False)
        return ranked.groupby(["op_class", "reason"]).head(EXAMPLES_PER_REASON)


def _element_bytes(dtypes: pd.Series) -> np.ndarray:
    sizes = {d: bytes_per_element(parse_dtype(d)) for d in pd.unique(dtypes.dropna())}
    return dtypes.astype(object).map(sizes).to_numpy(dtype=float)


def working_set_bytes(rows: pd.DataFrame) -> np.ndarray:
    """The fewest bytes each row must read or write (NaN where not an on-chip op)."""
    col = {c: rows[c].to_numpy(dtype=float) for c in ("m", "n", "k", "batch", "q_len")}
    kv_len, window = rows["kv_len"].to_numpy(dtype=float), rows["window"].to_numpy(dtype=float)
    heads, kv_heads = rows["num_heads"].to_numpy(float), rows["num_kv_heads"].to_numpy(float)
    head_dim = rows["head_dim"].to_numpy(dtype=float)
    op = rows["op_class"].to_numpy()
    eb = _element_bytes(rows["dtype"])
    out = np.full(len(rows), np.nan)
    gemm = op == "gemm"
    out[gemm] = ((col["m"] * col["k"] + col["k"] * col["n"] + col["m"] * col["n"]) * eb)[gemm]
    attention = (op == "attention_prefill") | (op == "attention_decode")
    if attention.any():
        kv_eb = _element_bytes(rows["kv_dtype"].where(attention, rows["dtype"]))
        # Decode reads only the window of its cache; prefill writes all its keys once.
        seen = np.where(
            (op == "attention_decode") & (window > 0), np.minimum(kv_len, window), kv_len
        )
        q_and_out = 2.0 * col["batch"] * col["q_len"] * heads * head_dim * eb
        keys_and_values = 2.0 * col["batch"] * seen * kv_heads * head_dim * kv_eb
        out[attention] = (q_and_out + keys_and_values)[attention]
    return out


SCREENED_CLASSES = frozenset({"gemm", "attention_prefill", "attention_decode", *COLLECTIVE_CLASSES})
"""Classes with a floor below: a fused MoE layer or an MLA module runs several kernels
whose working set this module does not derive, so their rows are never left out here."""


def floors(rows: pd.DataFrame, spec: AcceleratorSpec, link: LinkSpec | None) -> pd.DataFrame:
    """Per row, the compute floor and the memory (or link) floor in seconds; NaN where
    there is none (a dtype the chip lacks, a collective with no link, a class the screen
    does not cover)."""
    out = pd.DataFrame({"compute": np.nan, "memory": np.nan}, index=rows.index)
    covered = rows["op_class"].isin(SCREENED_CLASSES)
    if covered.any():
        out.loc[covered] = _floors(rows[covered], spec, link)
    return out


def _floors(rows: pd.DataFrame, spec: AcceleratorSpec, link: LinkSpec | None) -> pd.DataFrame:
    op = rows["op_class"].to_numpy()
    peak = {
        d: spec.peak_flops(parse_dtype(d)) if spec.supports(parse_dtype(d)) else np.nan
        for d in pd.unique(rows["dtype"].dropna())
    }
    on_chip = ~np.isin(op, list(COLLECTIVE_CLASSES))
    peaks = rows["dtype"].astype(object).map(peak).to_numpy(dtype=float)
    compute = np.where(on_chip, rows["size"].to_numpy(dtype=float) / peaks, np.nan)
    compute /= BOOST_HEADROOM
    ws = working_set_bytes(rows)
    l2_capacity = spec.l2.size_mb * 2**20
    l2_bandwidth = spec.l2_bandwidth * BOOST_HEADROOM
    memory = np.maximum(ws / l2_bandwidth, (ws - l2_capacity) / spec.memory_bandwidth)
    if link is not None:
        p = rows["num_gpus"].to_numpy(dtype=float)
        sent = rows["nbytes"].to_numpy(dtype=float) * (p - 1) / p
        memory = np.where(on_chip, memory, sent / (link.bandwidth_gbps * 1e9))
    return pd.DataFrame({"compute": compute, "memory": memory}, index=rows.index)


def over_launches(rows: pd.DataFrame, spec: AcceleratorSpec, floor: pd.DataFrame) -> np.ndarray:
    """Per row, how many times the slower of its eager launches and its roofline floor
    it took: NaN except for GEMM rows timed eagerly."""
    out = np.full(len(rows), np.nan)
    eager = ((rows["op_class"] == "gemm") & timed_eagerly(rows)).to_numpy()
    if not eager.any():
        return out
    sub = rows[eager]
    launch_s = launch_overhead_seconds(spec, 1, cuda_graph=False)
    kernel = gemm_kernel_dtype(sub)
    launches = np.empty(len(sub))
    for dtype, pos in pd.Series(range(len(sub))).groupby(kernel.to_numpy()).indices.items():
        launches[pos] = gemm_launches(spec, sub["m"].to_numpy()[pos], dtype)
    device = np.fmax(floor["compute"], floor["memory"]).to_numpy()[eager]
    bound = np.fmax(launches * launch_s, device)
    out[eager] = sub["measured_s"].to_numpy(dtype=float) / bound
    return out


def screen(rows: pd.DataFrame, spec: AcceleratorSpec, link: LinkSpec | None) -> Screened:
    """`rows` split into those a kernel on `spec` could have produced and those it could
    not (measured faster than a floor, or eagerly timed and host-bound: over_launches),
    the latter with the reason and by how much."""
    floor = floors(rows, spec, link)
    measured = rows["measured_s"].to_numpy(dtype=float)
    over_compute = floor["compute"].to_numpy() / measured
    over_memory = floor["memory"].to_numpy() / measured
    collective = rows["op_class"].isin(COLLECTIVE_CLASSES).to_numpy()
    memory_reason = np.where(collective, OVER_LINK, OVER_BANDWIDTH)
    worst = np.fmax(over_compute, over_memory)
    reason = np.where(
        np.nan_to_num(over_compute) >= np.nan_to_num(over_memory), OVER_PEAK, memory_reason
    )
    slow = over_launches(rows, spec, floor)
    host_bound = (slow > HOST_BOUND_TIMES) & ~(worst > 1.0)
    reason = np.where(host_bound, HOST_BOUND, reason)
    worst = np.where(host_bound, slow, worst)
    bad = worst > 1.0
    excluded = rows[bad].assign(reason=reason[bad], times_floor=worst[bad])
    return Screened(rows[~bad], excluded)
