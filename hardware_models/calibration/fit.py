"""Fit an EfficiencyProfile to measured operator times by inverting the cost model.

For a row whose time is set by a term scaled by a curve (GEMM math, GEMM memory traffic,
flash-attention math, decode KV streaming), the efficiency that makes the model match it
is the current one times predicted term / (measured - floor). Those per-row values are
binned by log size, reduced to medians and made monotone (isotonic.binned_curve); since
which term binds (and which GEMM tile wins) depends on the efficiencies, this is iterated
a few times. Scalars the curves cannot express (the fixed floors, per-thread-block
latencies) are chosen by a golden-section search on the fit rows' MAPE, refitting the
curves for each candidate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.attention import prefill_kernel, runs_flashinfer
from hardware_models.block_scaling import WARP_MMA_FAMILIES, gemm_family, serving_rule
from hardware_models.calibration.isotonic import binned_curve
from hardware_models.calibration.measured_tables import gemm_kernel_dtype
from hardware_models.calibration.moe_mla_fit import moe_mla_fits
from hardware_models.calibration.operator_terms import (
    CurveLoc,
    Terms,
    copy_terms,
    curve_at,
    decode_terms,
    gemm_terms,
    prefill_seconds,
    prefill_terms,
    with_value,
)
from hardware_models.calibration.screen import working_set_bytes
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.efficiency import EfficiencyProfile, GemmKernel, dtype_key, profile_json

CURVE_ITERATIONS = 3
MIN_ROWS_PER_BIN = 3
SEARCH_STEPS = 8
SCALAR_ROUNDS = 3
SEARCH_ROWS = 3000  # scalar searches run on a seeded sample of this many rows
FLASHINFER_KV_DTYPE = "fp8"  # the 8-bit cache dtype vLLM serves with FlashInfer
# Each attention op class's per-cache-dtype kernel table (efficiency.KV_DTYPE_KERNELS).
KV_DTYPE_TABLES = {
    "attention_decode": "decode_by_kv_dtype",
    "attention_prefill": "prefill_by_kv_dtype",
}
GOLDEN = (np.sqrt(5) - 1) / 2

Pricer = Callable[[AcceleratorSpec, pd.DataFrame], Terms]
Seconds = Callable[[AcceleratorSpec, pd.DataFrame], np.ndarray]


@dataclass(frozen=True)
class Scalar:
    """A profile scalar searched over [low, high] (microseconds), where `applies` says
    the chosen kernel uses it (a flat search would store a meaningless value)."""

    loc: CurveLoc
    low: float
    high: float
    applies: Callable[[EfficiencyProfile], bool] = lambda profile: True


@dataclass(frozen=True)
class ClassFit:
    """What to fit for one group of rows: how to price them and which scalars to search."""

    name: str
    rows: pd.DataFrame
    price: Pricer
    scalars: tuple[Scalar, ...] = ()
    # Discrete kernel properties (a profile field and its options), chosen first.
    choices: tuple[tuple[CurveLoc, tuple[object, ...]], ...] = ()
    # How many of `scalars` are searched for each option before the options are ranked.
    rank_scalars: int = 1
    # Times the scalar search and curve refit run, each from the last one's result.
    passes: int = 1
    # Attention rows of one KV-cache dtype fitted as a kernel of its own, kept in the
    # profile's decode_by_kv_dtype or prefill_by_kv_dtype (None: its own fields).
    kv_dtype: str | None = None
    # The rows' predicted seconds alone, where that is cheaper than `price` (a score
    # needs no curve terms): None to take them from `price`.
    seconds: Seconds | None = None


def mape(measured: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


def refit_curves(
    gpu: AcceleratorSpec,
    profile: EfficiencyProfile,
    rows: pd.DataFrame,
    price: Pricer,
    iterations: int = CURVE_ITERATIONS,
) -> EfficiencyProfile:
    """Fixed-point refits of every curve `price` reports, from `profile`'s curves."""
    measured = rows["measured_s"].to_numpy(dtype=float)
    for _ in range(iterations):
        terms = price(gpu.with_efficiency(profile), rows)
        if not terms.curves:
            break
        work = measured - terms.floor_s
        for loc, term in terms.curves.items():
            ok = term.binds & (work > 0.05 * measured) & (term.seconds > 0)
            if not ok.any():
                continue
            current = np.asarray(curve_at(profile, loc).at(term.size[ok]), dtype=float)
            implied = current * term.seconds[ok] / work[ok]
            # A small harness table has a row or two per octave: let each count.
            min_rows = MIN_ROWS_PER_BIN if ok.sum() >= 10 * MIN_ROWS_PER_BIN else 1
            curve = binned_curve(term.size[ok], implied, min_rows=min_rows)
            if curve is not None:
                profile = with_value(profile, loc, curve)
    return profile


def _score(
    gpu: AcceleratorSpec,
    profile: EfficiencyProfile,
    rows: pd.DataFrame,
    price: Pricer,
    seconds: Seconds | None = None,
) -> float:
    """MAPE of `profile`'s scalars once its curves are refitted around them."""
    fitted = gpu.with_efficiency(refit_curves(gpu, profile, rows, price, iterations=2))
    predicted = price(fitted, rows).seconds if seconds is None else seconds(fitted, rows)
    return mape(rows["measured_s"].to_numpy(dtype=float), predicted)


class Scorer:
    """`_score` for one class fit (its GPU and pricer), each answer kept: the searches
    come back to candidates they have scored (a later round of coordinate descent that
    finds nothing to move, an option ranked and then searched again from the same
    start), and a score depends on the candidate and the rows alone. About a third of
    an H100 fit's candidates are such repeats."""

    def __init__(self, gpu: AcceleratorSpec, price: Pricer, seconds: Seconds | None = None) -> None:
        self.gpu, self.price, self.seconds = gpu, price, seconds
        self._known: dict[tuple[str, int], tuple[pd.DataFrame, float]] = {}

    def __call__(self, profile: EfficiencyProfile, rows: pd.DataFrame) -> float:
        key = (profile_json(profile), id(rows))
        known = self._known.get(key)
        if known is None or known[0] is not rows:
            value = _score(self.gpu, profile, rows, self.price, self.seconds)
            known = self._known[key] = (rows, value)
        return known[1]


def _golden(objective: Callable[[float], float], low: float, high: float) -> float:
    """Minimise a unimodal `objective` on [low, high] in SEARCH_STEPS evaluations."""
    a, b = low, high
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = objective(c), objective(d)
    for _ in range(SEARCH_STEPS - 2):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = objective(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = objective(d)
    return c if fc <= fd else d


def fit_class(
    gpu: AcceleratorSpec, profile: EfficiencyProfile, spec: ClassFit, seed: int = 0
) -> EfficiencyProfile:
    """Search spec's scalars (on a sample), then fit its curves on all its rows; with
    discrete choices, first keep the option best on the sample with only the floor
    searched, then search every scalar for that option alone."""
    rows = spec.rows
    sample = rows.sample(SEARCH_ROWS, random_state=seed) if len(rows) > SEARCH_ROWS else rows
    score = Scorer(gpu, spec.price, spec.seconds)
    candidates = [profile]
    for loc, options in spec.choices:
        candidates = [with_value(c, loc, o) for c in candidates for o in options]
    if len(candidates) > 1:
        # Options are told apart by terms that vary with the shape, which no fixed cost
        # absorbs: searching the first `rank_scalars` (by default the floor alone) ranks
        # them as the full search does, at a fraction of its cost per option.
        ranked = spec.scalars[: spec.rank_scalars]
        trials = [_search_scalars(c, ranked, score, sample) for c in candidates]
        scores = [score(t, sample) for t in trials]
        profile = candidates[int(np.argmin(scores))]
    else:
        profile = candidates[0]
    scalars = tuple(scalar for scalar in spec.scalars if scalar.applies(profile))
    for _ in range(spec.passes):
        profile = _search_scalars(profile, scalars, score, sample)
        profile = refit_curves(gpu, profile, spec.rows, spec.price)
    return profile


def _search_scalars(
    profile: EfficiencyProfile,
    scalars: tuple[Scalar, ...],
    score: Scorer,
    sample: pd.DataFrame,
) -> EfficiencyProfile:
    """Coordinate descent over `scalars`, three times round when there are several: the
    floor, the per-wave latency and the split-K pass trade off against each other on
    skinny GEMMs, and two rounds stopped short of the synthetic truth (split-K 1.5 us
    recovered as 4.0) once split-K ran to 64 slices."""
    for _ in range(SCALAR_ROUNDS if len(scalars) > 1 else 1):
        for scalar in scalars:

            def objective(
                value: float, scalar: Scalar = scalar, base: EfficiencyProfile = profile
            ) -> float:
                return score(with_value(base, scalar.loc, float(value)), sample)

            best = _golden(objective, scalar.low, scalar.high)
            profile = with_value(profile, scalar.loc, round(float(best), 3))
    return profile


def class_fits(table: pd.DataFrame, gpu: AcceleratorSpec | None = None) -> list[ClassFit]:
    """The fits a table supports: one per GEMM kernel dtype, prefill, decode (one per
    cache dtype), then one per MoE weight format, MLA decode and MLA prefill
    (moe_mla_fit). With `gpu`, decode also searches its warm-L2 share where the rows
    show one (see warm_l2_shown), and its family's serving kernels
    (block_scaling.serving_rule) are among the GEMM choices."""
    fits: list[ClassFit] = []
    gemm = table[table["op_class"] == "gemm"]
    if len(gemm):
        kernels = gemm_kernel_dtype(gemm).map(dtype_key)
        # The split-K pass is one figure for every dtype: searched on the main one.
        main = next(k for k in ("bf16", "fp16", *sorted(set(kernels))) if k in set(kernels))
        for key, rows in sorted(gemm.groupby(kernels), key=lambda kv: kv[0] != main):
            top = _low_time_us(rows)
            serving = _serving_kernel(gpu, key)
            own = _own_kernel(gpu, key)
            own_store = _stores_in_series(gpu, own)
            scalars = [
                Scalar(("gemm_floor_us_by_dtype", key), 0.0, 3.0 * top),
                Scalar(("gemm_wave_latency_us_by_dtype", key), 0.0, top),
            ]
            if key == main:
                scalars.append(Scalar(("gemm_split_k_overhead_us", None), 0.0, 2.0 * top))
            if bytes_per_element(parse_dtype(key)) < 2:
                # us per MB one thread block streams: 0 (no cap) to 20 (50 GB/s).
                scalars.append(Scalar(("gemm_cta_us_per_mb_by_dtype", key), 0.0, 20.0))
                kernel = _kernel_of(key)
                # The padding copies' time and the quantisation pass's share of bandwidth,
                # for the kernels that pad m or quantise their activations.
                scalars += [
                    Scalar(
                        ("gemm_pad_us_by_dtype", key),
                        0.0,
                        top,
                        lambda p, kernel=kernel: kernel(p).align_m > 1,
                    ),
                    Scalar(
                        ("gemm_quant_bandwidth_by_dtype", key),
                        0.2,
                        1.0,
                        lambda p, kernel=kernel: kernel(p).quantize_activations,
                    ),
                    # The share of memory bandwidth the family's own kernel stores its
                    # output at, where it stores after its k loops. This and the next
                    # are searched for a family's own kernel (a tile table from its
                    # source) alone: the generic families keep the fits they had.
                    Scalar(
                        ("gemm_store_bandwidth_by_dtype", key),
                        0.02,
                        1.0,
                        lambda p, kernel=kernel, own=own_store: (
                            own is not None and kernel(p) == own
                        ),
                    ),
                    # ns per token of a quantiser launching a block per token: 0 to 20.
                    Scalar(
                        ("gemm_quant_row_ns_by_dtype", key),
                        0.0,
                        20.0,
                        lambda p, kernel=kernel, own=own: own is not None and kernel(p) == own,
                    ),
                ]
            fits.append(
                ClassFit(
                    f"gemm/{key}",
                    rows,
                    lambda gpu, r, key=key: gemm_terms(gpu, r, key),
                    tuple(scalars),
                    gemm_kernel_choices(key, serving),
                )
            )
    for name, price, seconds, scalars, choices in (
        (
            "attention_decode",
            decode_terms,
            None,
            (
                ("attention_decode_floor_us", 1.0),
                ("decode_cta_latency_us", 0.25),
                ("decode_split_overhead_us", 0.5),
                ("decode_gqa_copy_us", 0.5),
                # us per MB one block streams: ~10 us call times x 10 reach ~10 GB/s
                ("decode_cta_us_per_mb", 5.0),
            ),
            ((("decode_split_kv", None), ("always", "gqa")),),
        ),
        (
            "attention_prefill",
            prefill_terms,
            prefill_seconds,  # without pricing the rows a second time for the math term
            (("attention_prefill_floor_us", 1.0), ("prefill_cta_latency_us", 0.25)),
            ((("prefill_pack_gqa", None), (True, False)),),
        ),
    ):
        for label, rows, kv_dtype in _attention_groups(table, name):
            top = _low_time_us(rows)
            searched = [Scalar((f, None), 0.0, share * 2.0 * top) for f, share in scalars]
            kernel_choices = choices
            if name == "attention_prefill" and gpu is not None and prefill_kernel_known(gpu):
                # The chip's kernels fix the layout (attention.prefill_kernel): the profile
                # records FA2's, its 16-bit cache's, rather than an unused default.
                kernel_choices = ((("prefill_pack_gqa", None), (False,)),)
            if name == "attention_decode" and gpu is not None and warm_l2_shown(gpu, rows):
                # The share of L2 bandwidth a warm cache is read at (a fraction, not us).
                searched.append(Scalar(("decode_l2_bandwidth", None), 0.05, 1.0))
            fits.append(
                ClassFit(
                    label,
                    rows,
                    price,
                    tuple(searched),
                    kernel_choices,
                    # An attention layout changes which fixed costs apply (a split's
                    # combine pass, FA2's GQA copies): rank the layouts with all of them.
                    rank_scalars=len(searched),
                    kv_dtype=kv_dtype,
                    seconds=seconds,
                )
            )
    for name, rows, price, bounds, choices, passes in moe_mla_fits(table):
        scalars = tuple(Scalar(loc, low, high) for loc, low, high in bounds)
        fits.append(
            ClassFit(name, rows, price, scalars, choices, rank_scalars=len(scalars), passes=passes)
        )
    return fits


def prefill_kernel_known(gpu: AcceleratorSpec) -> bool:
    """Whether `gpu`'s prefill kernels, not the profile, decide their head packing."""
    return prefill_kernel(gpu, Dtype.BF16)[1]


def warm_l2_shown(gpu: AcceleratorSpec, rows: pd.DataFrame) -> bool:
    """Whether some rows move their bytes faster than the chip's DRAM can: only a warm
    L2 does that (4,881 of the L40S's 60,523 decode rows, up to 2.9x; none of the H100's
    or A100's). Elsewhere the L2 share is left as it is: a search over it only adds
    noise to the others (A100 decode 7.2% -> 8.2% held out)."""
    moved = working_set_bytes(rows) / rows["measured_s"].to_numpy(dtype=float)
    return bool(np.any(moved > gpu.memory_bandwidth))


def _attention_groups(table: pd.DataFrame, name: str) -> list[tuple[str, pd.DataFrame, str | None]]:
    """(label, rows, KV dtype kept apart or None) of attention op class `name`. Rows over
    caches of several dtypes are fitted one dtype at a time, as the kernels they ran
    (vLLM picks the backend by cache dtype: on Ada, FA2 for bf16, FlashInfer for fp8);
    the 16-bit (else first) dtype's fit is the profile's own fields."""
    rows = table[table["op_class"] == name]
    if rows.empty:
        return []
    kv = rows["kv_dtype"].astype(str).map(dtype_key)
    if kv.nunique() < 2:
        return [(name, rows, None)]
    keys = sorted(set(kv))
    main = next(k for k in ("bf16", "fp16", *keys) if k in keys)
    ordered = [main, *(k for k in keys if k != main)]
    return [(f"{name}/kv:{k}", rows[kv == k], None if k == main else k) for k in ordered]


def _serving_kernel(gpu: AcceleratorSpec | None, key: str) -> GemmKernel | None:
    """The kernel `gpu`'s family serves dtype `key` with, if block_scaling has a rule."""
    rule = None if gpu is None else serving_rule(gpu, key)
    return None if rule is None else rule.kernel


def _own_kernel(gpu: AcceleratorSpec | None, key: str) -> GemmKernel | None:
    """The serving kernel `gpu`'s family has a tile table of its own for (Ada's fp8,
    Blackwell's), if any: the kernels whose extra fixed costs a fit searches."""
    rule = None if gpu is None else serving_rule(gpu, key)
    return None if rule is None or rule.tiles is None else rule.kernel


def _stores_in_series(gpu: AcceleratorSpec | None, kernel: GemmKernel | None):
    """`kernel` where it stores each output tile after its k loop on `gpu`, else None."""
    if gpu is None or kernel is None:
        return None
    serial = kernel.serial_epilogue
    if serial is None:
        serial = gemm_family(gpu) in WARP_MMA_FAMILIES
    return kernel if serial else None


def gemm_kernel_choices(
    key: str, serving: GemmKernel | None = None
) -> tuple[tuple[CurveLoc, tuple[object, ...]], ...]:
    """The kernel families a GEMM may run. 16-bit ones run cuBLAS, with or without its
    matrix-vector kernel for one-row products (the A100's cuBLAS has one, the H100 table
    shows m = 1 as slow as m = 2). 8-bit ones run cuBLASLt (torch._scaled_mm, inputs
    already quantised), or a serving engine's path that first quantises the
    activations, then runs cuBLAS-style, CUTLASS-by-m or 128x128 block-scaled tiles
    (which need m padded to 4 rows); CUTLASS-by-m in single or paired thread-block
    clusters; and `serving`, the GPU family's own serving kernel where it is none of
    these (Ada's fp8: CUTLASS 2.x tiles by m and n). The fit picks the one the table
    measured."""
    if bytes_per_element(parse_dtype(key)) >= 2:
        return ((("gemm_kernel_by_dtype", key), (GemmKernel(), GemmKernel(gemv=True))),)
    options = (
        GemmKernel(),
        GemmKernel(quantize_activations=True),
        *(GemmKernel(dispatch="by_m", quantize_activations=True, cluster_m=c) for c in (1, 2)),
        GemmKernel(dispatch="fixed", quantize_activations=True, align_m=4),
    )
    if serving is not None and serving not in options:
        options += (serving,)
    return ((("gemm_kernel_by_dtype", key), options),)


def _kernel_of(key: str) -> Callable[[EfficiencyProfile], GemmKernel]:
    """The GEMM kernel family a profile gives dtype `key`."""
    return lambda profile: profile.gemm_kernel(key)[0]


def _low_time_us(rows: pd.DataFrame) -> float:
    """The 2nd percentile of measured time in us: floors and latencies lie below it."""
    return float(np.quantile(rows["measured_s"], 0.02) * 1e6)


def fit_copy_bandwidth(
    gpu: AcceleratorSpec, profile: EfficiencyProfile, rows: pd.DataFrame
) -> EfficiencyProfile:
    """memory_bandwidth from device copies large enough that the floor is noise."""
    if rows.empty:
        return profile
    terms = copy_terms(gpu.with_efficiency(profile), rows)
    measured = rows["measured_s"].to_numpy(dtype=float)
    big = measured > 20 * terms.floor_s
    if not big.any():
        return profile
    work = terms.seconds - terms.floor_s
    implied = profile.memory_bandwidth * work / (measured - terms.floor_s)
    value = float(np.clip(np.median(implied[big]), 1e-3, 1.0))
    return profile.model_copy(update={"memory_bandwidth": round(value, 4)})


def generic_from_dtypes(profile: EfficiencyProfile) -> EfficiencyProfile:
    """Copy the bf16 (else fp16, else only) GEMM fit into the dtype-independent fields, so
    GEMMs in dtypes that were not measured use calibrated curves too."""
    compute = profile.gemm_compute_by_dtype
    for key in ("bf16", "fp16", *sorted(compute)):
        if key in compute:
            update: dict[str, object] = {"gemm_compute": compute[key]}
            if key in profile.gemm_memory_by_dtype:
                update["gemm_memory"] = profile.gemm_memory_by_dtype[key]
            if key in profile.gemm_floor_us_by_dtype:
                update["kernel_floor_us"] = profile.gemm_floor_us_by_dtype[key]
            if key in profile.gemm_wave_latency_us_by_dtype:
                update["gemm_wave_latency_us"] = profile.gemm_wave_latency_us_by_dtype[key]
            return profile.model_copy(update=update)
    return profile


def _fit_spec(
    gpu: AcceleratorSpec, profile: EfficiencyProfile, spec: ClassFit, seed: int, curves_only: bool
) -> EfficiencyProfile:
    if curves_only:
        return refit_curves(gpu, profile, spec.rows, spec.price)
    return fit_class(gpu, profile, spec, seed)


def _unmeasured_flashinfer_kernels(
    gpu: AcceleratorSpec, table: pd.DataFrame, profile: EfficiencyProfile
) -> EfficiencyProfile:
    """An 8-bit cache's attention kernels where the table timed none: on the warp-MMA
    chips that cache runs FlashInfer, not the FlashAttention-2 the 16-bit rows measured
    (attention.runs_flashinfer), so the profile keeps the datasheet's fields for it
    rather than another kernel's fit (which priced the L40S's fp8 decode calls at 99%
    error under the A100's profile, against 12% uncalibrated)."""
    if not runs_flashinfer(gpu, FLASHINFER_KV_DTYPE):
        return profile
    for op_class, table_name in KV_DTYPE_TABLES.items():
        rows = table[table["op_class"] == op_class]
        kernels = getattr(profile, table_name)
        measured = {dtype_key(d) for d in rows["kv_dtype"].astype(str)}
        if rows.empty or FLASHINFER_KV_DTYPE in kernels or FLASHINFER_KV_DTYPE in measured:
            continue
        datasheet = {**kernels, FLASHINFER_KV_DTYPE: gpu.efficiency.kernel_fields(table_name)}
        profile = profile.model_copy(update={table_name: datasheet})
    return profile


def fit_profile(
    gpu: AcceleratorSpec,
    table: pd.DataFrame,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    curves_only: bool = False,
) -> EfficiencyProfile:
    """An EfficiencyProfile for `gpu` fitted to the rows of `table` (one GPU's rows),
    starting from the preset's own efficiencies for anything the table does not cover.

    `curves_only` keeps the preset's fixed costs and kernel choices and fits only the
    efficiency curves: a table of large shapes alone (published peak-throughput figures)
    cannot tell a floor or a per-wave latency from noise, and a search would still move
    them, into values that then misprice every small kernel the table never measured."""
    profile = gpu.efficiency
    for op_class, kernels in KV_DTYPE_TABLES.items():
        if (table["op_class"] == op_class).any():
            # Every cache dtype's kernel is fitted afresh (see _attention_groups).
            profile = profile.model_copy(update={kernels: {}})
    for spec in class_fits(table, gpu):
        if spec.kv_dtype is not None:
            # Fitted in the profile's fields from the main dtype's fit, then kept apart.
            kernels = KV_DTYPE_TABLES[spec.name.split("/")[0]]
            plain = profile.model_copy(update={kernels: {}})
            fitted = _fit_spec(gpu, plain, spec, seed, curves_only).kernel_fields(kernels)
            update = {**getattr(profile, kernels), spec.kv_dtype: fitted}
            profile = profile.model_copy(update={kernels: update})
        else:
            profile = _fit_spec(gpu, profile, spec, seed, curves_only)
        if progress is not None:
            progress(f"fitted {spec.name} on {len(spec.rows)} rows")
    profile = _unmeasured_flashinfer_kernels(gpu, table, profile)
    profile = fit_copy_bandwidth(gpu, profile, table[table["op_class"] == "memory_copy"])
    profile = generic_from_dtypes(profile)
    # Validate once (dict keys, value ranges) now that every field is set.
    return EfficiencyProfile.model_validate(profile.model_dump())
