"""What the fitter calibrates on MoE and MLA rows: each row priced term by term (which
efficiency scales which part of its time), and the scalars and kernel choices searched.

- MoE, one fit per weight format: the grouped GEMMs' compute curve (against the mean
  rows of an activated expert) and memory curve (against their DRAM bytes), each
  informed by the rows whose GEMM time that term sets; the layer's fixed cost, and a
  thread block's fixed time and streaming cap.
- MLA decode: the latent stream's bandwidth curve, the floor, the 8-bit cache's query
  quantisation, the math rate, a thread block's fixed time and streaming cap, and the
  kernel's layout (heads per block that re-read the latent; fixed or SM-filling KV
  splits), chosen as the data says.
- MLA prefill: its own flash-attention compute curve and floor, and which vLLM backends
  run (which chunks they send through the decode kernel).

Module rows (H100) carry the projections, priced with the GEMM fit that runs first.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import keys_per_query
from hardware_models.calibration.moe_mla_tables import (
    MLA_SHAPE,
    MOE_CLASS,
    mla_parts,
    moe_table_parts,
)
from hardware_models.calibration.operator_terms import CurveLoc, CurveTerm, Terms
from hardware_models.efficiency import MOE_FORMATS
from hardware_models.moe import wna16_block_m

# vLLM's MLA backends on Hopper: prefill chunks of up to this many tokens a sequence
# run the decode kernel (FlashAttention MLA with a 16-bit cache, FlashMLA with fp8).
HOPPER_MLA_THRESHOLDS = {"bf16": 512, "fp8": 128}

# (name, rows, pricer, scalars as (field location, low, high), discrete choices, passes)
FitSpec = tuple[str, pd.DataFrame, object, list[tuple[CurveLoc, float, float]], tuple, int]
# The MoE scalars and curves trade off (a stream cap against the compute curve): a second
# search from the first one's result took the H100's fp8 held-out error from 15% to 10.6%.
MOE_PASSES = 2


def moe_terms(gpu: AcceleratorSpec, rows: pd.DataFrame, key: str) -> Terms:
    """MoE rows all of one weight format `key`."""
    p = moe_table_parts(rows, gpu)
    # A curve informs the rows whose GEMM time its term sets (neither, where the thread
    # blocks' panel streams do).
    compute_binds = p.compute_s > p.memory_s + p.l2_s
    memory_binds = p.memory_s > p.compute_s + p.l2_s
    return Terms(
        seconds=p.seconds,
        floor_s=p.seconds - p.compute_s - p.memory_s,
        curves={
            ("moe_compute_by_dtype", key): CurveTerm(
                np.maximum(p.rows_per_expert, 1.0), p.compute_s, compute_binds
            ),
            ("moe_memory_by_dtype", key): CurveTerm(p.gemm_bytes, p.memory_s, memory_binds),
        },
    )


def mla_decode_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    p = mla_parts(rows, gpu)
    binds = p["memory_s"] >= np.maximum(p["compute_s"], p["fixed_s"])
    curve = CurveTerm(np.maximum(p["dram"], 1.0), p["memory_s"], binds)
    return Terms(p["seconds"], p["seconds"] - p["memory_s"], {("mla_decode_memory", None): curve})


def mla_prefill_terms(gpu: AcceleratorSpec, rows: pd.DataFrame) -> Terms:
    """The compute curve scales the key loops; each thread block's fixed latency (priced
    again at zero to take it out) is in series with them."""
    p = mla_parts(rows, gpu)
    no_cta = gpu.with_efficiency(gpu.efficiency.model_copy(update={"prefill_cta_latency_us": 0}))
    math_s = mla_parts(rows, no_cta)["compute_s"]
    binds = (p["compute_s"] >= p["memory_s"]) & ~p["absorbed"]  # the flash kernel's rows
    new = rows["batch"].to_numpy(dtype=float) * rows["q_len"].to_numpy(dtype=float)
    # read_mla's size is the attention FLOPs, 4 x heads x head_dim per query-key pair.
    per_pair = 4.0 * rows["num_heads"].to_numpy(dtype=float) * MLA_SHAPE.prefill_head_dim()
    size = keys_per_query(rows["size"].to_numpy(dtype=float) / per_pair, new)
    curve = CurveTerm(size, math_s, binds)
    return Terms(p["seconds"], p["seconds"] - math_s, {("mla_prefill_compute", None): curve})


def _low_us(rows: pd.DataFrame) -> float:
    return float(np.quantile(rows["measured_s"], 0.02) * 1e6)


def _stream_bound(key: str) -> float:
    """The largest us per MB a thread block of `key`'s grouped GEMMs is searched at."""
    fmt = MOE_FORMATS[key]
    return 1000.0 if fmt.wna16 else 400.0 if fmt.marlin else 4.0


def moe_mla_fits(table: pd.DataFrame) -> list[FitSpec]:
    """The MoE and MLA fits `table` supports, in the order they must run."""
    fits: list[FitSpec] = []
    moe = table[table["op_class"] == MOE_CLASS]
    for key, rows in sorted(moe.groupby("dtype")):
        top = _low_us(rows)
        wna16 = MOE_FORMATS[key].wna16 and bool(
            wna16_block_m(rows["m"], rows["topk"], -(-rows["num_experts"] // rows["ep"]))[0].any()
        )
        fits.append(
            (
                f"moe/{key}",
                rows,
                lambda gpu, r, key=key: moe_terms(gpu, r, key),
                [
                    (("moe_floor_us_by_dtype", key), 0.0, 3.0 * top),
                    (("moe_cta_latency_us_by_dtype", key), 0.0, 0.5 * top),
                    # us per MB a thread block streams: for Triton at most 4 (250 GB/s,
                    # a few blocks' loads in flight, which binds where few experts
                    # leave SMs idle), so that large batches inform the compute curve,
                    # a fraction of peak that carries to other chips (the H100's fit
                    # on A100 rows: 35% error with 0-80 us/MB, 27% with 0-4, the H100's
                    # own the same); for Marlin's 4-bit tiles, dequantised on the CUDA
                    # cores, up to 400 per k tile streamed (moe.marlin_stream_s, where
                    # the thread block's fixed time is one step of a slice's reduction);
                    # for the WNA16 kernels, which dequantise per m block, up to 1000
                    # (the H100's ~280 us per MB of 4-bit weights an SM dequantises)
                    (("moe_cta_us_per_mb_by_dtype", key), 0.0, _stream_bound(key)),
                    # the CUDA WNA16 kernel's own rate, where its rows run it
                    *([(("moe_wna16_cuda_us_per_mb", None), 1.0, 1000.0)] if wna16 else []),
                ],
                (),
                MOE_PASSES,
            )
        )
    decode = table[table["op_class"] == "mla_decode"]
    if len(decode):
        top = _low_us(decode)
        # An 8-bit cache's extra fixed time, searched only where rows have one.
        fp8_kv = (decode["kv_dtype"].astype(str) == "fp8").any()
        fp8_scalar = [(("mla_fp8_kv_us", None), 0.0, top)] if fp8_kv else []
        fits.append(
            (
                "mla_decode",
                decode,
                mla_decode_terms,
                [
                    (("mla_decode_floor_us", None), 0.0, 2.0 * top),
                    (("mla_decode_compute", None), 0.05, 1.0),
                    (("mla_decode_cta_latency_us", None), 0.0, 0.5 * top),
                    (("mla_decode_cta_us_per_mb", None), 0.0, 20.0),
                    *fp8_scalar,
                ],
                (
                    (("mla_decode_head_block", None), (0, 16)),
                    (("mla_decode_kv_splits", None), (0, 4)),
                ),
                1,
            )
        )
    prefill = table[table["op_class"] == "mla_prefill"]
    if len(prefill):
        top = _low_us(prefill)
        fits.append(
            (
                "mla_prefill",
                prefill,
                mla_prefill_terms,
                [(("mla_prefill_floor_us", None), 0.0, 2.0 * top)],
                # Which chunks the decode kernel takes, by the backends vLLM pairs:
                # Triton MLA (one token a sequence), or on Hopper FlashAttention MLA
                # for a 16-bit cache and FlashMLA for an 8-bit one (their
                # reorder_batch_threshold), told apart by the rows.
                ((("mla_decode_query_threshold_by_kv", None), ({}, HOPPER_MLA_THRESHOLDS)),),
                1,
            )
        )
    return fits
