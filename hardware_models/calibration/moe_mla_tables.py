"""Import the public MoE and MLA tables into the long table, and price their rows.

What the columns mean, checked against the data and the collector that wrote them
(aiconfigurator's collector/vllm/collect_moe.py, collect_mla_module.py):

- `moe_perf` (H100, A100, L40S): one vLLM `fused_experts` call, routing precomputed (so
  no top-k kernel is timed), under CUDA graphs. `num_tokens` is every token the rank
  sees, `inter_size` the expert's full width (each rank holds inter_size / moe_tp_size
  of it), `moe_ep_size` the ranks the experts are spread over: the rank timed holds the
  first E / ep experts and masks the rest (vLLM's expert_map), so pairs routed elsewhere
  do no GEMM work but still fill the T x top-k buffers. vLLM runs TP or EP, never both:
  every row has moe_tp_size == 1 or moe_ep_size == 1. `distribution` is `balanced` (the
  pairs dealt round-robin over the experts: our `round_robin`) or `power_law_<alpha>`
  (loads drawn from a truncated power law, the busiest EP rank moved to rank 0, which
  is the one timed; the latency is the mean of 5 such draws). `moe_dtype` is the weight
  format: bfloat16, fp8 (per-tensor scales), fp8_block (128 x 128 blocks), int4_wo
  (4-bit weights, bf16 activations), w4a16_mxfp4 (L40S only). The H100's int4 rows
  (kernel_source vllm_marlin_int4_moe) are not Marlin: the collector calls
  `fused_experts` with an int4_w4a16 configuration (group 128, no zero points, weights
  packed as uint8 and never repacked for Marlin), which runs vLLM's WNA16 kernels, read
  as int4_wna16; the L40S's (vLLM 0.24, MarlinExperts) are Marlin. `latency` in ms:
  a bf16 DeepSeek-V3 layer (256 experts, top-8) on one H100 takes 0.30 ms for one token
  and 25.6 ms for 16,384; over 256 EP ranks 16,384 tokens still take 2.2 ms, nearly all
  of it the T x top-k buffers' passes.
- MLA, DeepSeek-V3 dimensions (hidden 7168, q_lora 1536, kv_lora 512, rope 64, nope
  128, v 128), `num_heads` per rank: `isl` new tokens per sequence (prefill, `step` 0,
  no cached prefix) or one new token after `isl + step` cached ones (decode).
  H100 `mla_*_module_perf`: vLLM's whole DeepseekV2MLAAttention forward, projections
  included (the collector says so, and the data agree: at batch 64 and 2 cached tokens
  128 heads take 0.25 ms against 0.09 ms for one head, the 0.34 GB more of q_b, kv_b and
  o_proj weights at ~2.2 TB/s), `gemm_type` bfloat16 or fp8_block for the linear layers,
  `kv_cache_dtype` bfloat16 or fp8. The module runs uncompiled under a CUDA graph (the
  collector calls it directly), so vLLM's RMSNorm and rotary run their PyTorch-native
  ops through fp32 (mla.EAGER_RMSNORM): measured minus the GEMMs regresses to ~26 ns a
  token whatever the heads (1.5% error), what those ops move over 2,048 norm values a
  token. Chunks of up to 512 tokens a sequence (128 with fp8) ran the decode kernel.
  A100 `context_mla_perf` / `generation_mla_perf`: the attention kernel only (vLLM's
  Triton MLA), bf16, `tp_size` x `num_heads` = 128: its latency does not grow with the
  heads at short contexts (0.3 ms) where the projections would add their weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec, hardware_json
from hardware_models.attention import causal_pairs_many
from hardware_models.calibration.raw_tables import read_raw
from hardware_models.dtypes import parse_dtype
from hardware_models.efficiency import EfficiencyProfile, moe_format_key
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_parts_many
from hardware_models.mla import (
    DEEPSEEK_V3,
    MlaDecode,
    MlaPrefill,
    MlaShape,
    mla_pointwise_costs,
    mla_projection_gemms,
)
from hardware_models.moe import MoeParts, MoeRows, Routing, load_rows, moe_parts
from hardware_models.object_memo import per_object

MOE_CLASS = "moe"
MLA_CLASSES: tuple[str, ...] = ("mla_prefill", "mla_decode")
MOE_MLA_CLASSES: tuple[str, ...] = (MOE_CLASS, *MLA_CLASSES)
# Shape columns only these rows have (NaN elsewhere): MoE routing and parallelism, the
# MLA module's linear-layer dtype and whether the row times the whole module (1) or the
# attention kernel alone (0).
EXTRA_COLUMNS: tuple[str, ...] = (
    "topk",
    "num_experts",
    "tp",
    "ep",
    "routing",
    "gemm_dtype",
    "module",
)
MOE_FILE = "moe_perf.parquet"
# file -> (op class, whole module)
MLA_FILES: dict[str, tuple[str, bool]] = {
    "mla_context_module_perf.parquet": ("mla_prefill", True),
    "mla_generation_module_perf.parquet": ("mla_decode", True),
    "context_mla_perf.parquet": ("mla_prefill", False),
    "generation_mla_perf.parquet": ("mla_decode", False),
}
MLA_SHAPE = DEEPSEEK_V3  # the tables' model; num_heads comes from each row


def _frame(gpu: str, op_class: str, n: int, source: Path) -> pd.DataFrame:
    out = pd.DataFrame(index=pd.RangeIndex(n))
    out["gpu"] = gpu
    out["op_class"] = op_class
    out["source"] = str(source)
    return out


# kernel_source of the rows aiconfigurator's collect_moe.py times through vLLM's
# fused_experts with int4_w4a16 weights: not Marlin (whatever the label) but the WNA16
# kernels (moe.wna16_stream_s), the H100 table's int4 rows.
WNA16_SOURCES = frozenset({"vllm_marlin_int4_moe"})


_MOE_TEXT = ("distribution", "moe_dtype")


def read_moe(path: Path, gpu: str) -> pd.DataFrame:
    """`moe_perf`: m = num_tokens, n = hidden_size, k = inter_size (the expert's whole
    width), dtype = the weight format (bf16, fp8, fp8_block, int4_wo, w4a16_mxfp4),
    routing = round_robin for the table's balanced rows, else power_law_<alpha>."""
    sizes = ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts")
    raw = read_raw(path, (*sizes, "moe_tp_size", "moe_ep_size", "latency"), text=_MOE_TEXT)
    out = _frame(gpu, MOE_CLASS, len(raw), path)
    out["m"] = raw["num_tokens"].to_numpy(dtype=float)
    out["n"] = raw["hidden_size"].to_numpy(dtype=float)
    out["k"] = raw["inter_size"].to_numpy(dtype=float)
    out["topk"] = raw["topk"].to_numpy(dtype=float)
    out["num_experts"] = raw["num_experts"].to_numpy(dtype=float)
    out["tp"] = raw["moe_tp_size"].to_numpy(dtype=float)
    out["ep"] = raw["moe_ep_size"].to_numpy(dtype=float)
    routing = raw["distribution"].astype(str)
    out["routing"] = routing.where(routing != "balanced", "round_robin").to_numpy(dtype=object)
    formats = {v: moe_format_key(v) for v in pd.unique(raw["moe_dtype"])}
    dtype = raw["moe_dtype"].map(formats)
    # aiconfigurator's collector labels its int4 rows Marlin but calls fused_experts
    # with an int4_w4a16 configuration: vLLM's WNA16 kernels ran (WNA16_SOURCES).
    wna16 = raw.get("kernel_source", pd.Series("", index=raw.index)).isin(WNA16_SOURCES)
    out["dtype"] = dtype.where(~(wna16 & (dtype == "int4_wo")), "int4_wna16").to_numpy(dtype=object)
    out["source_dtype"] = raw["moe_dtype"].astype(object).to_numpy()
    # FLOPs of the rank's mean share of the pairs through both grouped GEMMs.
    pairs = out["m"] * out["topk"] / out["ep"]
    out["size"] = 2.0 * pairs * 3.0 * out["n"] * out["k"] / out["tp"]
    out["measured_s"] = raw["latency"].to_numpy(dtype=float) / 1e3
    return out


def read_mla(path: Path, gpu: str) -> pd.DataFrame:
    """An MLA table (MLA_FILES): batch, q_len, kv_len, num_heads, kv_dtype; gemm_dtype and
    module = 1 for the H100 module tables; size = the attention's FLOPs."""
    op_class, module = MLA_FILES[path.with_suffix(".parquet").name]  # or its .txt
    dtypes = ("mla_dtype", "kv_cache_dtype")
    raw = read_raw(path, ("batch_size", "isl", "num_heads", "latency"), ("step",), dtypes)
    out = _frame(gpu, op_class, len(raw), path)
    out["batch"] = raw["batch_size"].to_numpy(dtype=float)
    isl, step = raw["isl"].to_numpy(dtype=float), raw["step"].to_numpy(dtype=float)
    decode = op_class == "mla_decode"
    out["q_len"] = 1.0 if decode else isl
    out["kv_len"] = isl + step
    out["num_heads"] = raw["num_heads"].to_numpy(dtype=float)
    out["dtype"] = raw["mla_dtype"].map(lambda v: parse_dtype(v).value).to_numpy(dtype=object)
    kv = raw["kv_cache_dtype"].map(lambda v: parse_dtype(v).value)
    out["kv_dtype"] = kv.to_numpy(dtype=object)
    out["module"] = 1.0 if module else 0.0
    source = "kv:" + raw["kv_cache_dtype"].astype(str)
    if module:
        gemm = raw["gemm_type"].astype(str)
        out["gemm_dtype"] = gemm.map(lambda v: "fp8_block" if v == "fp8_block" else "bf16")
        source = gemm + "/" + source
    out["source_dtype"] = source.to_numpy(dtype=object)
    heads = out["num_heads"].to_numpy()
    if decode:
        flops = heads * (MLA_SHAPE.decode_flops_per_key() / MLA_SHAPE.num_heads) * out["kv_len"]
    else:
        pairs = causal_pairs_many(out["q_len"], out["kv_len"], np.zeros(len(raw)))
        flops = 4.0 * heads * MLA_SHAPE.prefill_head_dim() * pairs
    out["size"] = np.maximum(out["batch"].to_numpy() * np.asarray(flops, dtype=float), 1.0)
    out["measured_s"] = raw["latency"].to_numpy(dtype=float) / 1e3
    return out


READERS = {MOE_FILE: read_moe, **{name: read_mla for name in MLA_FILES}}


# ----------------------------------------------------------------------------- prediction


def _moe_loads(sub: pd.DataFrame) -> list[tuple[str, np.ndarray, MoeRows]]:
    """(weight format, its rows' positions, their expert loads): the rows' part of
    moe_table_parts, which depends on no efficiency."""
    routings = {v: Routing.parse(v) for v in pd.unique(sub["routing"])}
    out = []
    for fmt, pos in sub.groupby("dtype", sort=False).indices.items():
        part = sub.iloc[pos]
        rows = load_rows(
            *(part[c].to_numpy() for c in ("m", "n", "k", "topk", "num_experts", "tp", "ep")),
            [routings[v] for v in part["routing"]],
        )
        out.append((fmt, pos, rows))
    return out


def moe_table_parts(sub: pd.DataFrame, gpu: AcceleratorSpec) -> MoeParts:
    """Every MoE row priced term by term (MoeParts, one value per row), all rows of a
    weight format at once, without the top-k kernel the tables did not time (the
    expert loads once per frame: a fit prices the same rows for every candidate)."""
    fields = {name: np.zeros(len(sub)) for name in MoeParts._fields}
    for fmt, pos, rows in per_object(sub, "moe_loads", _moe_loads):
        for name, value in zip(MoeParts._fields, moe_parts(gpu, fmt, rows, False), strict=True):
            fields[name][pos] = value
    return MoeParts(**fields)


def _mla_shape(heads: float) -> MlaShape:
    return MlaShape(**{**MLA_SHAPE.__dict__, "num_heads": int(heads)})


def _mla_groups(sub: pd.DataFrame) -> tuple[tuple[np.ndarray, ...], list[tuple]]:
    """The rows' part of mla_parts: (batch, new tokens, keys read, attended pairs), and
    (op class, heads, KV dtype, GEMM dtype, positions) per kernel configuration."""
    batch, q_len, kv_len = (sub[c].to_numpy(dtype=float) for c in ("batch", "q_len", "kv_len"))
    pairs = batch * causal_pairs_many(q_len, kv_len, np.zeros(len(sub)))
    # Kernel-only rows (and tables) have no linear layers: "" for them.
    gemm_dtype = sub["gemm_dtype"] if "gemm_dtype" in sub else pd.Series(None, index=sub.index)
    keys = pd.DataFrame(
        {
            "op_class": sub["op_class"].to_numpy(),
            "heads": sub["num_heads"].to_numpy(),
            "kv": sub["kv_dtype"].astype(str).to_numpy(),
            "gemm": gemm_dtype.astype(object).where(gemm_dtype.notna(), "").to_numpy(),
        }
    )
    groups = keys.groupby(["op_class", "heads", "kv", "gemm"], sort=False).indices
    return (batch, batch * q_len, batch * kv_len, pairs), [(*k, pos) for k, pos in groups.items()]


def mla_parts(sub: pd.DataFrame, gpu: AcceleratorSpec) -> dict[str, np.ndarray]:
    """Every MLA row priced: 'seconds', 'attention_s', 'compute_s', 'memory_s',
    'fixed_s' (thread-block waves), 'floor_s' (the attention call's floor), 'dram'
    (the attention's DRAM bytes), 'projections_s' (the module's GEMMs, norms and rotary;
    0 for kernel-only rows), 'absorbed' (the row runs the decode kernel)."""
    n = len(sub)
    out = {k: np.zeros(n) for k in ("seconds", "attention_s", "compute_s", "memory_s")}
    out.update({k: np.zeros(n) for k in ("fixed_s", "floor_s", "projections_s", "dram")})
    out["absorbed"] = np.zeros(n, dtype=bool)
    (batch, new, context, all_pairs), groups = per_object(sub, "mla_groups", _mla_groups)
    for op_class, heads, kv, gemm, pos in groups:
        shape = _mla_shape(heads)
        decode = MlaDecode(gpu, shape, kv)
        if op_class == "mla_decode":
            d = decode.parts(batch[pos], context[pos])
            seconds, compute, memory, fixed = d.seconds, d.compute, d.memory, d.fixed
            floor, dram = np.full(len(pos), d.floor), d.dram_bytes
            absorbed = np.ones(len(pos), dtype=bool)
        else:
            prefill = MlaPrefill(gpu, shape, kv)
            seconds, _, dram, compute, memory = prefill.many(
                batch[pos], new[pos], all_pairs[pos], context[pos]
            )
            absorbed = prefill.absorbed(batch[pos], new[pos])
            floor = np.where(absorbed, decode.floor, prefill.flash.floor)
            fixed = np.zeros(len(pos))
        out["attention_s"][pos] = seconds
        out["compute_s"][pos], out["memory_s"][pos] = compute, memory
        out["fixed_s"][pos], out["floor_s"][pos], out["dram"][pos] = fixed, floor, dram
        out["absorbed"][pos] = absorbed
        for flag in (True, False) if gemm else ():
            rows = pos[absorbed == flag]
            if len(rows):
                out["projections_s"][rows] = _projections(
                    gpu, shape, new[rows], context[rows], flag, gemm
                )
    out["seconds"] = out["attention_s"] + out["projections_s"]
    return out


def _projections(
    gpu: AcceleratorSpec,
    shape: MlaShape,
    new: np.ndarray,
    context: np.ndarray,
    decode: bool,
    gemm_dtype: str,
) -> np.ndarray:
    """Seconds of the module's GEMMs, latent norms and rotary per row: mla_module_cost's
    GEMMs (priced as arrays), but its norms and rotary as the tables timed them,
    uncompiled PyTorch ops (mla_pointwise_costs(eager=True)), where mla_module_cost
    prices a served step's vLLM fused kernels. They depend on the chip, the layer's
    shape and the GEMM and streaming fields only, which an MLA fit does not move: each is
    priced once per such profile."""
    key = (
        hardware_json(gpu),
        per_object(gpu.efficiency, "projection_fields", _projection_fields),
        shape,
        decode,
        gemm_dtype,
        new.tobytes(),
        context.tobytes(),
    )
    if key not in _PROJECTIONS:
        if len(_PROJECTIONS) >= 256:
            _PROJECTIONS.clear()
        _PROJECTIONS[key] = _price_projections(gpu, shape, new, context, decode, gemm_dtype)
    return _PROJECTIONS[key]


_PROJECTIONS: dict[tuple, np.ndarray] = {}


def _projection_fields(efficiency: EfficiencyProfile) -> str:
    """The fields the projections read, as JSON (once per profile: every MLA group of a
    pricing keys on them)."""
    return efficiency.model_dump_json(exclude=_NOT_PROJECTION_FIELDS)


_NOT_PROJECTION_FIELDS = {
    name
    for name in EfficiencyProfile.model_fields
    if name.startswith(("mla_", "moe_", "attention_", "decode_", "prefill_", "collective_"))
}


def _price_projections(
    gpu: AcceleratorSpec,
    shape: MlaShape,
    new: np.ndarray,
    context: np.ndarray,
    decode: bool,
    gemm_dtype: str,
) -> np.ndarray:
    seconds = np.zeros(len(new))
    for _, cached, n, k, quantised in mla_projection_gemms(shape, decode):
        rows = np.maximum(context if cached else new, 1)
        dtype = gemm_dtype if quantised else "bf16"
        ones = np.ones(len(rows))
        seconds += gemm_parts_many(gpu, rows, ones * n, ones * k, dtype).seconds
    uniq, codes = np.unique(new, return_inverse=True)
    # The tables time the module uncompiled: its norms and rotary run PyTorch's ops.
    pointwise = [
        sum(c.seconds for c in mla_pointwise_costs(gpu, shape, int(t), eager=True)) for t in uniq
    ]
    return seconds + np.asarray(pointwise)[codes]


def predict_moe_mla(sub: pd.DataFrame, gpu: AcceleratorSpec) -> np.ndarray:
    """Predicted seconds of MoE or MLA rows (one op class at a time)."""
    classes = set(sub["op_class"])
    if classes <= {MOE_CLASS}:
        return moe_table_parts(sub, gpu).seconds
    if classes <= set(MLA_CLASSES):
        return mla_parts(sub, gpu)["seconds"]
    raise InfersimError(f"cannot price op class {sorted(classes)[0]!r} as MoE or MLA rows")
