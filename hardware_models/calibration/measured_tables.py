"""Import public operator measurement tables into one long table, and price every row.

The tables are NVIDIA aiconfigurator's micro-benchmarks (`../shared/data/measured/<gpu>/`,
Apache-2.0): GEMMs, vLLM flash-attention prefill and decode, NCCL collectives. What each
column means was checked against the data itself:

- `gemm_perf`: one (m x k) @ (k x n) GEMM; `gemm_dtype` bfloat16, fp8 or fp8_block
  (block-scaled fp8; both fp8 spellings H100 only). FLOPs = 2 m n k.
- `context_attention_perf` (prefill): `batch_size` sequences of `isl` new tokens each,
  causal self-attention with no earlier context, so q_len = kv_len = isl. Latency grows
  as isl^2 for long sequences (8192 -> 16384 tokens: x3.8) and flattens to linear with
  `window_size` 128 (0 means no sliding window; the A100 table has no window column:
  all 0). `step` is always 0.
- `generation_attention_perf` (decode): `batch_size` sequences each decoding one token
  against a cache of isl + step tokens. `isl` is always 1 in these tables and `step`
  runs 1 .. 131071; latency is flat for short caches and then grows linearly with step
  (window 0), while with `window_size` 128 it stays flat past 128 tokens. At batch 64,
  32 heads / 8 KV heads, step 4095 the KV read is 1.07 GB and the kernel takes 0.36 ms
  (~3.0 TB/s on H100), so the cache length is isl + step, not isl.
- `nccl_perf`: `message_size` counts ELEMENTS of `nccl_dtype` (half = 2 bytes, int8 =
  1 byte): at equal bytes an int8 and a half all-gather or all-to-all take the same time
  (ratio 0.99-1.04), at equal message_size int8 takes ~0.55x. Reductions are the
  exception: int8 reduce-scatter / all-reduce run 2-7% slower than half at equal bytes,
  and on 8 H100s 15-26% slower, where the half all-reduce reaches 445 GB/s bus bandwidth
  (99% of the 450 GB/s NVLink rate; rings reach ~80%): most likely NVLink SHARP
  in-switch reduction, which does not reduce int8. The size is the full buffer each GPU
  holds (all-reduce input, all-gather output, reduce-scatter input), which is the
  convention of `collective_cost` (bus bandwidths computed that way match published
  nccl-tests figures); all GPUs sit in one NVSwitch node.
- Some shapes were measured more than once (repeats with slightly different latency);
  every measurement is kept as its own row.

The long table (COLUMNS): `gpu` (preset name), `op_class` (OP_CLASSES), `dtype` (our
Dtype name), shape columns m, n, k (GEMM), batch, q_len, kv_len, num_heads, num_kv_heads,
head_dim, kv_dtype, window (attention; window 0 = none), num_gpus, nbytes (collectives),
NaN where not applicable; `size` (FLOPs for GEMM and attention, counting only the
attended query-key pairs; bytes for collectives), `measured_s` (seconds), `source` (file;
GEMM rows add `:kernel_source`) and `source_dtype` (the table's own dtype spelling, e.g.
fp8_block, bfloat16/kv:fp8).

`load_measured()` returns the normalised long table; `predict()` prices every row with the
operator cost model, pricing each distinct shape once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import (
    DecodeAttention,
    DecodeParts,
    PrefillAttention,
    causal_pairs_many,
    decode_keys_read,
    decode_parts_many,
    prefill_many,
)
from hardware_models.calibration.benchmark_loops import (
    AICONFIGURATOR_GEMM_FILE,
    TEXT_SUFFIXES,
    eager_seconds,
    gemm_loop_bytes,
    timed_eagerly,
)
from hardware_models.calibration.moe_mla_tables import (
    EXTRA_COLUMNS,
    MLA_FILES,
    MOE_CLASS,
    MOE_FILE,
    MOE_MLA_CLASSES,
    READERS,
    predict_moe_mla,
)
from hardware_models.calibration.raw_tables import read_raw
from hardware_models.collectives import collective_cost
from hardware_models.dtypes import bytes_per_element, parse_dtype
from hardware_models.efficiency import BLOCK_SCALED_SPELLINGS
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_launches, gemm_parts_many
from hardware_models.node import LinkSpec
from hardware_models.object_memo import per_object
from hardware_models.pointwise import launch_overhead_seconds
from hardware_models.presets import list_gpus, load_gpu, load_node, nodes_with_gpu

# aiconfigurator's own folder names (`systems/data/<gpu>/`) -> accelerator preset name. A
# folder of any other name is read too: its GPU is --gpu, or the preset its name spells.
GPU_FOLDERS: dict[str, str] = {
    "h100_sxm": "h100-sxm",
    "a100_sxm": "a100-80gb-sxm",
    "l40s": "l40s",
    "h200_sxm": "h200-sxm",
    "b200_sxm": "b200",
}
SHARED_DATA_ENV = "INFERSIM_SHARED_DATA"
# How many folders above the working folder shared/data/measured is looked for (a clone's
# notebooks/ or benchmarks/ folder is two below the folder holding shared/).
SHARED_SEARCH_LEVELS = 4
PUBLIC_TABLES = (
    "NVIDIA ai-dynamo/aiconfigurator (Apache-2.0), "
    "aic-core/src/aiconfigurator_core/systems/data/<gpu>/"
)

OP_CLASSES: tuple[str, ...] = (
    "gemm",
    "attention_prefill",
    "attention_decode",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    *MOE_MLA_CLASSES,
)
COLLECTIVE_CLASSES = frozenset(("all_reduce", "all_gather", "reduce_scatter", "all_to_all"))
SHAPE_COLUMNS: tuple[str, ...] = (
    "m",
    "n",
    "k",
    "batch",
    "q_len",
    "kv_len",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "kv_dtype",
    "window",
    "num_gpus",
    "nbytes",
)
COLUMNS: tuple[str, ...] = (
    "gpu",
    "op_class",
    "dtype",
    *SHAPE_COLUMNS,
    "size",
    "measured_s",
    "source",
    "source_dtype",
)
NUMERIC_COLUMNS = [c for c in SHAPE_COLUMNS if c != "kv_dtype"]
_NCCL_OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
}


def repo_root() -> Path:
    """The checkout this package lives in (hardware_models/calibration/ -> two levels up)."""
    return Path(__file__).resolve().parents[2]


def shared_measured_candidates(start: Path | None = None) -> list[Path]:
    """Where the public tables may be, in order. $INFERSIM_SHARED_DATA (a data/ or a
    measured/ folder), when set, is the only place looked: a setting that does not hold
    the tables is an error, not silently passed over. Otherwise shared/data/measured
    in the working folder (`start`) or any of its SHARED_SEARCH_LEVELS ancestors, nearest
    first, then beside the checkout (an editable install). The upward search is what finds
    the tables for a wheel install, whose package sits in site-packages, from anywhere in
    a clone next to shared/ (a notebook's kernel starts in notebooks/)."""
    env = os.environ.get(SHARED_DATA_ENV)
    if env:
        return [Path(env) / "measured", Path(env)]
    here = (start or Path.cwd()).resolve()
    folders = [here, *here.parents][: SHARED_SEARCH_LEVELS + 1]
    candidates = [folder / "shared" / "data" / "measured" for folder in folders]
    beside_checkout = repo_root().parent / "shared" / "data" / "measured"
    if beside_checkout not in candidates:
        candidates.append(beside_checkout)
    return candidates


def default_measured_dir(start: Path | None = None) -> Path:
    """The first of `shared_measured_candidates` that exists (else the last, to name it)."""
    candidates = shared_measured_candidates(start)
    return next((c for c in candidates if c.is_dir()), candidates[-1])


def searched_places() -> str:
    """Where `default_measured_dir` looked, in words, for a message saying it found nothing."""
    env = os.environ.get(SHARED_DATA_ENV)
    if env:
        return f"{SHARED_DATA_ENV}={env} (neither it nor its measured/)"
    return (
        f"shared/data/measured (looked in {Path.cwd()}, its {SHARED_SEARCH_LEVELS} parent "
        f"folders and beside the package's folder {repo_root()})"
    )


def resolve_measured_dir(data_dir: str | Path | None = None, option: str = "--data") -> Path:
    """The measured/ directory to read, or a one-line InfersimError naming `option` (the
    caller's flag for it) and where the public tables come from."""
    path = Path(data_dir) if data_dir is not None else default_measured_dir()
    if not path.is_dir():
        where = path if data_dir is not None else searched_places()
        raise InfersimError(
            f"measured-data directory {where} not found; pass {option} DIR (or set "
            f"{SHARED_DATA_ENV}) pointing at a folder of GPU table folders; the public "
            f"tables are {PUBLIC_TABLES}"
        )
    return path


def _dtype_names(values: pd.Series) -> pd.Series:
    """Source spellings (bfloat16, half, fp8_block, ...) -> our Dtype names, once per value."""
    mapping = {v: parse_dtype(v).value for v in pd.unique(values)}
    return values.map(mapping).astype(object)


def long_rows(gpu: str, op_class: pd.Series | str, n: int, source: Path) -> pd.DataFrame:
    """`n` rows of the long table with their identity set and every shape column empty,
    for a reader to fill in."""
    out = pd.DataFrame(index=pd.RangeIndex(n))
    out["gpu"] = gpu
    out["op_class"] = op_class if isinstance(op_class, str) else op_class.to_numpy()
    for col in NUMERIC_COLUMNS:
        out[col] = np.nan
    out["kv_dtype"] = None
    out["source"] = str(source)
    return out


def read_gemm(path: Path, gpu: str) -> pd.DataFrame:
    raw = read_raw(path, ("m", "n", "k", "latency"), dtypes=("gemm_dtype",))
    out = long_rows(gpu, "gemm", len(raw), path)
    for col in ("m", "n", "k"):
        out[col] = raw[col].to_numpy(dtype=float)
    out["dtype"] = _dtype_names(raw["gemm_dtype"]).to_numpy()
    out["source_dtype"] = raw["gemm_dtype"].astype(object).to_numpy()
    out["size"] = 2.0 * out["m"] * out["n"] * out["k"]
    out["measured_s"] = raw["latency"].to_numpy(dtype=float) / 1e3
    if "kernel_source" in raw:  # which collector, so which timing (benchmark_loops)
        collector = (
            raw["framework"].astype(str) + "==" + raw["version"].astype(str)
            if {"framework", "version"} <= set(raw.columns)
            else pd.Series("", index=raw.index)
        )
        kernel_source = raw["kernel_source"].astype(str)
        out["source"] = (f"{path}:" + collector + ":" + kernel_source).to_numpy()
    return out


# The attention tables' columns (prefill and decode): sizes and latency > 0, two dtypes.
_ATTENTION_SIZES = ("batch_size", "num_heads", "num_key_value_heads", "head_dim", "latency")
_ATTENTION_DTYPES = ("attn_dtype", "kv_cache_dtype")
_WINDOW = ("window_size",)  # the A100 tables have none: no sliding window


def _attention_common(raw: pd.DataFrame, out: pd.DataFrame) -> None:
    out["batch"] = raw["batch_size"].to_numpy(dtype=float)
    out["num_heads"] = raw["num_heads"].to_numpy(dtype=float)
    out["num_kv_heads"] = raw["num_key_value_heads"].to_numpy(dtype=float)
    out["head_dim"] = raw["head_dim"].to_numpy(dtype=float)
    window = raw["window_size"] if "window_size" in raw else pd.Series(0, index=raw.index)
    out["window"] = window.to_numpy(dtype=float)  # 0 = no sliding window
    out["dtype"] = _dtype_names(raw["attn_dtype"]).to_numpy()
    out["kv_dtype"] = _dtype_names(raw["kv_cache_dtype"]).to_numpy()
    out["source_dtype"] = (
        raw["attn_dtype"].astype(str) + "/kv:" + raw["kv_cache_dtype"].astype(str)
    ).to_numpy(dtype=object)
    out["measured_s"] = raw["latency"].to_numpy(dtype=float) / 1e3


def read_context_attention(path: Path, gpu: str) -> pd.DataFrame:
    raw = read_raw(path, (*_ATTENTION_SIZES, "isl"), (), _ATTENTION_DTYPES, optional=_WINDOW)
    out = long_rows(gpu, "attention_prefill", len(raw), path)
    _attention_common(raw, out)
    isl = raw["isl"].to_numpy(dtype=float)
    out["q_len"] = isl
    out["kv_len"] = isl  # no earlier context: the isl tokens attend to themselves
    pairs = causal_pairs_many(isl, isl, out["window"].to_numpy())
    out["size"] = 4.0 * out["num_heads"] * out["head_dim"] * out["batch"] * pairs
    return out


def read_generation_attention(path: Path, gpu: str) -> pd.DataFrame:
    raw = read_raw(path, (*_ATTENTION_SIZES, "isl"), ("step",), _ATTENTION_DTYPES, optional=_WINDOW)
    out = long_rows(gpu, "attention_decode", len(raw), path)
    _attention_common(raw, out)
    out["q_len"] = 1.0
    out["kv_len"] = (raw["isl"] + raw["step"]).to_numpy(dtype=float)
    out["size"] = 4.0 * out["num_heads"] * out["head_dim"] * out["batch"] * _decode_seen(out)
    return out


def read_nccl(path: Path, gpu: str) -> pd.DataFrame:
    positive = ("num_gpus", "message_size", "latency")
    raw = read_raw(path, positive, dtypes=("nccl_dtype",), text=("op_name",))
    unknown = sorted(set(raw["op_name"]) - set(_NCCL_OPS))
    if unknown:
        raise InfersimError(f"{path}: unknown collective op_name {unknown}")
    out = long_rows(gpu, raw["op_name"].map(_NCCL_OPS), len(raw), path)
    out["dtype"] = _dtype_names(raw["nccl_dtype"]).to_numpy()
    out["source_dtype"] = raw["nccl_dtype"].astype(object).to_numpy()
    element_bytes = out["dtype"].map(bytes_per_element).to_numpy(dtype=float)
    out["num_gpus"] = raw["num_gpus"].to_numpy(dtype=float)
    # message_size counts elements, not bytes (see the module docstring).
    out["nbytes"] = raw["message_size"].to_numpy(dtype=float) * element_bytes
    out["size"] = out["nbytes"]
    out["measured_s"] = raw["latency"].to_numpy(dtype=float) / 1e3
    return out


@dataclass(frozen=True)
class MeasuredTable:
    """One table file of the aiconfigurator layout: the op classes its rows carry and the
    reader that turns it into long rows for one GPU. Another table (a MoE layer, MLA) is
    read by adding one entry to TABLES (and its op classes to OP_CLASSES and a pricer)."""

    filename: str
    op_classes: frozenset[str]
    read: Callable[[Path, str], pd.DataFrame]


TABLES: list[MeasuredTable] = [
    MeasuredTable(AICONFIGURATOR_GEMM_FILE, frozenset({"gemm"}), read_gemm),
    MeasuredTable(
        "context_attention_perf.parquet", frozenset({"attention_prefill"}), read_context_attention
    ),
    MeasuredTable(
        "generation_attention_perf.parquet",
        frozenset({"attention_decode"}),
        read_generation_attention,
    ),
    MeasuredTable("nccl_perf.parquet", COLLECTIVE_CLASSES, read_nccl),
    MeasuredTable(MOE_FILE, frozenset({MOE_CLASS}), READERS[MOE_FILE]),
    *(
        MeasuredTable(name, frozenset({op_class}), READERS[name])
        for name, (op_class, _module) in MLA_FILES.items()
    ),
]


def table_files(folder: Path) -> dict[str, Path]:
    """One GPU's table files by TABLES filename: in `folder` itself, or, as aiconfigurator
    lays them out (`<gpu>/<backend>/<version>/`, NCCL apart from the engine's), in its
    subfolders two levels down; each as Parquet or as `.txt`/`.csv` text. A table found
    in two places (two versions of one backend) is refused: which one is meant?"""
    if not folder.is_dir():
        return {}
    found: dict[str, Path] = {}
    for table in TABLES:
        stem = Path(table.filename).stem
        names = [table.filename, *(stem + suffix for suffix in TEXT_SUFFIXES)]
        here = [folder / name for name in names if (folder / name).is_file()]
        places = here or sorted(p for name in names for p in folder.glob(f"*/*/{name}"))
        if len(places) > 1:
            shown = ", ".join(str(p.relative_to(folder)) for p in places)
            raise InfersimError(
                f"{folder}: {stem} is there {len(places)} times ({shown}); point --measured "
                "at the folder of the version you mean"
            )
        if places:
            found[table.filename] = places[0]
    return found


def is_table_folder(path: Path) -> bool:
    """True when `path` holds at least one table of the aiconfigurator layout."""
    return bool(table_files(path))


def gpu_of_folder(path: Path) -> str | None:
    """The preset a folder's name spells: aiconfigurator's name (h100_sxm) or a preset name
    (l40s, h100-pcie; `_` read as `-`); None for any other name."""
    if path.name in GPU_FOLDERS:
        return GPU_FOLDERS[path.name]
    name = path.name.replace("_", "-")
    return name if name in list_gpus() else None


def read_table_folder(
    folder: Path, gpu: str, op_classes: Iterable[str] | None = None
) -> pd.DataFrame:
    """Every table in one GPU's folder as long rows labelled `gpu` (columns: COLUMNS)."""
    wanted = set(OP_CLASSES if op_classes is None else op_classes)
    bad = wanted - set(OP_CLASSES)
    if bad:
        raise InfersimError(f"unknown op class {sorted(bad)}; allowed: {', '.join(OP_CLASSES)}")
    frames = []
    files = table_files(folder)
    for table in TABLES:
        path = files.get(table.filename)
        if table.op_classes & wanted and path is not None:
            frame = table.read(path, gpu)
            frames.append(frame[frame["op_class"].isin(wanted)])
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.concat(frames, ignore_index=True)
    return table.reindex(columns=[*COLUMNS, *(c for c in EXTRA_COLUMNS if c in table)])


def gpu_folders(root: Path, gpu: str | None = None) -> dict[Path, str]:
    """The table folders under `root` with the GPU each was measured on. `root` itself when
    it holds tables: its GPU is `gpu` when given, else the preset its name spells. Else
    its subfolders that hold tables, each named by its folder name."""
    if is_table_folder(root):
        name = gpu or gpu_of_folder(root)
        if name is None:
            raise InfersimError(
                f"cannot tell which GPU the tables in {root} were measured on (the folder "
                "name is no preset's): pass --gpu PRESET_OR_YAML"
            )
        return {root: name}
    folders = sorted(p for p in root.iterdir() if is_table_folder(p))
    if not folders:
        raise InfersimError(
            f"no measurement tables found under {root} (expected a folder, or subfolders, "
            f"with any of {', '.join(t.filename for t in TABLES)}, or their .txt text, "
            "directly or in <backend>/<version>/ subfolders)"
        )
    unnamed = [p.name for p in folders if gpu_of_folder(p) is None]
    if unnamed:
        raise InfersimError(
            f"cannot tell which GPU the tables in {root}/{{{','.join(unnamed)}}} were "
            "measured on: point --measured at one GPU's folder and pass --gpu PRESET_OR_YAML"
        )
    return {p: str(gpu_of_folder(p)) for p in folders}


def table_devices(root: Path) -> list[tuple[Path, str]]:
    """(table file, device name) for every distinct name in the `device` column of one
    GPU's tables (table_files; aiconfigurator's torch device name, e.g. NVIDIA L40S);
    nothing for a folder of GPU folders, whose names say their GPUs."""
    import pyarrow.parquet as pq  # pandas' Parquet engine: loaded only when tables are read

    found = []
    for path in table_files(root).values():
        if path.suffix in TEXT_SUFFIXES:
            header = pd.read_csv(path, nrows=0).columns
            devices = (
                pd.read_csv(path, usecols=["device"])["device"] if "device" in header else None
            )
        elif "device" in pq.read_schema(path).names:
            devices = pd.read_parquet(path, columns=["device"])["device"]
        else:
            devices = None
        if devices is not None:
            found += [(path, str(name)) for name in sorted(set(devices.dropna()))]
    return found


def load_measured(
    data_dir: str | Path | None = None,
    gpus: Iterable[str] | None = None,
    op_classes: Iterable[str] | None = None,
    gpu: str | None = None,
) -> pd.DataFrame:
    """Every measured row under `data_dir` (a measured/ folder of GPU folders, or one GPU's
    folder of any name) as one long table (columns: COLUMNS).

    `gpu` labels the rows of a single folder (else each folder's name says its GPU);
    `gpus` filters by preset name (h100-sxm, l40s); `op_classes` by OP_CLASSES.
    """
    root = resolve_measured_dir(data_dir)
    folders = gpu_folders(root, gpu)
    wanted = set(gpus) if gpus is not None else set(folders.values())
    frames = [
        read_table_folder(folder, name, op_classes)
        for folder, name in folders.items()
        if name in wanted
    ]
    frames = [f for f in frames if len(f)]
    if not frames:
        raise InfersimError(
            f"no measurement tables found under {root} for GPUs {sorted(wanted)} "
            f"(it has {', '.join(sorted(set(folders.values())))})"
        )
    table = pd.concat(frames, ignore_index=True)
    return table.reindex(columns=[*COLUMNS, *(c for c in EXTRA_COLUMNS if c in table)])


def big_gemm_mask(table: pd.DataFrame, min_mnk: float = 2**30, dtype: str = "bf16") -> pd.Series:
    """GEMM rows in `dtype` with m * n * k >= `min_mnk`: the large, compute-bound GEMMs."""
    mnk = table["m"] * table["n"] * table["k"]
    return (table["op_class"] == "gemm") & (table["dtype"] == dtype) & (mnk >= min_mnk)


# ----------------------------------------------------------------------------- prediction


def default_link_resolver(gpu: str, node: str | Path | None = None) -> LinkSpec:
    """The intra-node link a GPU's NCCL rows ran over: `node`'s (a preset name or YAML)
    when given, else that of the one node preset built from the GPU (NVSwitch for the
    H100 and A100, PCIe for the L40S). A one-line InfersimError says why there is none."""
    if node is None:
        names = nodes_with_gpu(gpu)
        if len(names) != 1:
            found = f"node presets {', '.join(names)}" if names else "no node preset"
            raise InfersimError(f"{found} built from {gpu}: pass --node PRESET_OR_YAML")
        node = names[0]
    spec = load_node(node)
    if spec.intra_node_link is None:
        raise InfersimError(f"node {spec.name} has no intra-node link to run collectives over")
    return spec.intra_node_link


def _decode_seen(frame: pd.DataFrame) -> np.ndarray:
    """Keys each decoding sequence reads: its cache, capped by the sliding window."""
    kv = frame["kv_len"].to_numpy(dtype=float)
    window = frame["window"].to_numpy(dtype=float)
    return np.where(window > 0, np.minimum(kv, window), kv)


def supported_mask(
    table: pd.DataFrame, gpu_resolver: Callable[[str], AcceleratorSpec]
) -> pd.Series:
    """True where the row's GPU can run its dtype (GEMMs); attention and collectives always."""
    ok = pd.Series(True, index=table.index)
    gemm = table["op_class"] == "gemm"
    for (gpu_name, dtype), idx in table[gemm].groupby(["gpu", "dtype"]).groups.items():
        ok.loc[idx] = gpu_resolver(gpu_name).supports(parse_dtype(dtype))
    return ok


def unique_groups(sub: pd.DataFrame, cols: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """(one row per distinct shape, the distinct-shape index of every row of `sub`)."""
    codes = sub.groupby(cols, sort=False, dropna=False).ngroup().to_numpy()
    first = pd.Series(np.arange(len(sub))).groupby(codes).first().sort_index()
    return sub.iloc[first.to_numpy()][cols], codes


def gemm_kernel_dtype(table: pd.DataFrame) -> pd.Series:
    """The spelling a GEMM row is priced under: its source spelling when that names a
    block-scaled kernel (fp8_block), which a calibration profile may hold its own curves
    for; else its dtype."""
    source = table["source_dtype"].astype(str).str.lower()
    return source.where(source.isin(BLOCK_SCALED_SPELLINGS), table["dtype"].astype(str))


def _predict_gemm(sub: pd.DataFrame, gpu: AcceleratorSpec) -> np.ndarray:
    """Each row as its benchmark ran it (benchmark_loops): warm in L2 where its loop fits,
    and, where it was timed eagerly, with the host launching its kernels."""
    kernel = gemm_kernel_dtype(sub)
    sub = sub.assign(
        dtype=kernel, loop_bytes=gemm_loop_bytes(sub, kernel), eager=timed_eagerly(sub)
    )
    uniq, codes = unique_groups(sub, ["m", "n", "k", "dtype", "loop_bytes", "eager"])
    secs = np.empty(len(uniq))
    for (dtype, eager), pos in uniq.groupby(["dtype", "eager"], sort=False).indices.items():
        s = uniq.iloc[pos]
        secs[pos] = gemm_parts_many(
            gpu, s["m"], s["n"], s["k"], dtype, None, s["loop_bytes"]
        ).seconds
        if eager:
            launches = gemm_launches(gpu, s["m"].to_numpy(), dtype)
            launch_s = launch_overhead_seconds(gpu, 1, cuda_graph=False)
            secs[pos] = eager_seconds(secs[pos], launches, launch_s)
    return secs[codes]


_ATTN_COLS = ["num_heads", "num_kv_heads", "head_dim", "dtype", "kv_dtype"]


def _head_layout(key: tuple) -> dict[str, Any]:
    """The attention model's arguments for one group key of _ATTN_COLS."""
    heads, kv_heads, head_dim, dtype, kv_dtype = key
    return {
        "num_heads": int(heads),
        "num_kv_heads": int(kv_heads),
        "head_dim": int(head_dim),
        "dtype": dtype,
        "kv_dtype": kv_dtype,
    }


def _prefill_layouts(sub: pd.DataFrame) -> tuple[tuple, list[tuple], np.ndarray]:
    """What prefill_table needs of the rows alone: (batch, calls' tokens, attended pairs,
    keys read), one head layout and window per model, and each row's model."""
    batch, q_len, kv_len, window = (
        sub[c].to_numpy(dtype=float) for c in ("batch", "q_len", "kv_len", "window")
    )
    pairs = batch * causal_pairs_many(q_len, kv_len, window)
    keys, layout = _head_layouts(sub)
    return (batch, batch * q_len, pairs, batch * kv_len), keys, layout


def _head_layouts(sub: pd.DataFrame) -> tuple[list[tuple], np.ndarray]:
    """The distinct (head layout..., window) of the rows, and each row's index into them:
    one attention model per layout prices all its rows."""
    layout = np.empty(len(sub), dtype=int)
    groups = sub.groupby([*_ATTN_COLS, "window"], sort=False, dropna=False).indices
    for index, pos in enumerate(groups.values()):
        layout[pos] = index
    return list(groups), layout


def prefill_table(sub: pd.DataFrame, gpu: AcceleratorSpec) -> np.ndarray:
    """(seconds, compute s, memory s, DRAM bytes) of each prefill row as the benchmark
    ran it (uniform_prefill_cost), one attention model per head layout and window: a fit
    prices every row for each candidate it tries (the rows' part once per frame)."""
    args, keys, layout = per_object(sub, "prefill_layouts", _prefill_layouts)
    models = [
        PrefillAttention(gpu, **_head_layout(key[:-1]), window=int(key[-1]) or None) for key in keys
    ]
    # The benchmark calls the kernel again and again on the same tensors (see decode_parts).
    seconds, _, dram, compute, memory = prefill_many(models, layout, *args, warm_l2=True)
    return np.column_stack((seconds, compute, memory, dram))


def _predict_prefill(sub: pd.DataFrame, gpu: AcceleratorSpec) -> np.ndarray:
    uniq, codes = unique_groups(sub, ["batch", "q_len", "kv_len", "window", *_ATTN_COLS])
    return prefill_table(uniq, gpu)[:, 0][codes]


def _decode_layouts(sub: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, list[tuple], np.ndarray]:
    """What decode_parts needs of the rows alone: (batch, keys read, head layouts with
    their window, each row's layout)."""
    seen = decode_keys_read(sub["kv_len"], sub["window"])
    batch = sub["batch"].to_numpy(dtype=float)
    keys, layout = _head_layouts(sub)
    return batch, batch * seen, keys, layout


def decode_parts(sub: pd.DataFrame, gpu: AcceleratorSpec) -> DecodeParts:
    """Every decode row priced term by term, as the fit and the predictions need it."""
    batch, context, keys, layout = per_object(sub, "decode_layouts", _decode_layouts)
    models = [
        DecodeAttention(gpu, **_head_layout(key[:-1]), window=int(key[-1]) or None) for key in keys
    ]
    # The benchmark calls the kernel again and again on one cache: warm in L2 if it fits.
    return decode_parts_many(models, layout, batch, context, warm_l2=True)


def _predict_decode(sub: pd.DataFrame, gpu: AcceleratorSpec) -> np.ndarray:
    return decode_parts(sub, gpu).seconds


def _predict_collective(sub: pd.DataFrame, link: LinkSpec) -> np.ndarray:
    uniq, codes = unique_groups(sub, ["op_class", "nbytes", "num_gpus"])
    secs = np.array(
        [
            collective_cost(op, float(nb), int(p), link).seconds
            for op, nb, p in zip(uniq["op_class"], uniq["nbytes"], uniq["num_gpus"], strict=True)
        ]
    )
    return secs[codes]


def predict(
    table: pd.DataFrame,
    gpu_resolver: Callable[[str], AcceleratorSpec] = load_gpu,
    link_resolver: Callable[[str], LinkSpec] = default_link_resolver,
    progress: Callable[[str], None] | None = None,
) -> pd.Series:
    """Predicted seconds for every row of a `load_measured` table (same index).

    `gpu_resolver` turns the `gpu` column into an AcceleratorSpec (pass one that applies a
    calibration profile to price with fitted efficiencies); `link_resolver` gives the link
    collectives run over. Rows whose GEMM dtype the GPU lacks are NaN (see supported_mask).
    `progress`, when given, is called with one line per (GPU, op class) priced.
    """
    pred = pd.Series(np.nan, index=table.index, name="predicted_s")
    ok = supported_mask(table, gpu_resolver)
    for (gpu_name, op_class), idx in table[ok].groupby(["gpu", "op_class"]).groups.items():
        sub = table.loc[idx]
        if op_class in COLLECTIVE_CLASSES:
            values = _predict_collective(sub, link_resolver(gpu_name))
        elif op_class == "gemm":
            values = _predict_gemm(sub, gpu_resolver(gpu_name))
        elif op_class == "attention_prefill":
            values = _predict_prefill(sub, gpu_resolver(gpu_name))
        elif op_class == "attention_decode":
            values = _predict_decode(sub, gpu_resolver(gpu_name))
        elif op_class in MOE_MLA_CLASSES:
            values = predict_moe_mla(sub, gpu_resolver(gpu_name))
        else:
            raise InfersimError(f"cannot price op class {op_class!r}")
        pred.loc[idx] = values
        if progress is not None:
            progress(f"priced {len(idx):>7d} {op_class} rows on {gpu_name}")
    return pred
