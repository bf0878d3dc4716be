"""Which calibration profile a GPU runs with: `hardware.calibration` resolved.

`auto` (the default) takes the GPU's own shipped profile; a GPU without one borrows the
profile of the nearest measured chip of the same architecture and memory family (an
H200 shares the H100's die and its HBM), since
kernels, tile shapes and memory behaviour follow the die, while the sizes (SMs, clocks,
bandwidth) come from the GPU's own spec. With no such chip, or `none`, the datasheet
efficiencies of the preset stay. A profile named or given by path applies to any GPU;
on another than its own it is a transfer and the note says so. What a profile did not
fit (an op class, a dtype, a GPU count) comes from the profile `auto` gives the chip, and
the note names it (profile_fallback); a transfer is applied as the profile has it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.presets import (
    PRESET_DIR,
    calibration_path,
    list_calibrations,
    load_gpu,
    with_calibration,
)
from hardware_models.profile_fallback import CLASS_FIELDS, covered_classes, fill_from
from hardware_models.yaml_io import load_yaml_mapping

AUTO = "auto"
NONE = "none"


@dataclass(frozen=True)
class CalibrationChoice:
    gpu: AcceleratorSpec  # with the chosen profile's efficiencies
    profile: str | None  # the profile's name or path; None: the datasheet efficiencies
    note: str  # one line for the summary and the terminal


def memory_family(spec: AcceleratorSpec) -> str:
    """HBM or GDDR (the letters before the generation): what sets memory behaviour."""
    match = re.match(r"[A-Za-z]+", spec.memory.kind)
    return match.group(0).upper() if match else spec.memory.kind


@cache
def _metadata(name: str) -> dict:
    """A shipped profile's metadata (empty for a bare efficiency profile)."""
    return load_yaml_mapping(calibration_path(name), shipped=True).get("metadata") or {}


def _fitted_on(name: str) -> str | None:
    """The GPU a shipped profile was fitted on, None for a bare profile."""
    return _metadata(name).get("gpu")


def _distance(a: AcceleratorSpec, b: AcceleratorSpec) -> float:
    """How far apart two chips are in size: SM count and memory bandwidth, in octaves."""
    sms = abs(math.log2(a.sm_count / b.sm_count))
    return sms + abs(math.log2(a.memory.bandwidth_gbps / b.memory.bandwidth_gbps))


def nearest_profile(gpu: AcceleratorSpec) -> str | None:
    """The shipped profile `auto` gives `gpu`: its own, else the nearest chip's of the same
    architecture and memory family (ties: the profile's name), else None. Only a full fit
    of measured kernels transfers: a curves-only profile (a few published peak figures)
    says nothing about another chip's small kernels, and on the L40S the RTX 4090's makes
    GEMMs worse than the datasheet model (benchmarks/README.md)."""
    own = [name for name in list_calibrations() if _fitted_on(name) == gpu.name]
    if own:
        return own[0]
    kin = []
    for name in list_calibrations():
        fitted_on = _fitted_on(name)
        if fitted_on is None or not (PRESET_DIR / "gpus" / f"{fitted_on}.yaml").is_file():
            continue
        if _metadata(name).get("curves_only"):
            continue
        other = load_gpu(fitted_on)
        if other.architecture == gpu.architecture and memory_family(other) == memory_family(gpu):
            kin.append((_distance(gpu, other), name))
    return min(kin)[1] if kin else None


# How far beyond the sizes a profile was fitted on an operator may be before roofline
# says its price is an extrapolation.
SIZE_RANGE_SLACK = 4.0


def profile_metadata(name_or_path: str | Path) -> dict:
    """A profile's metadata (shipped name or path; empty for a bare efficiency profile)."""
    text = str(name_or_path)
    if text in list_calibrations():
        return _metadata(text)
    return load_yaml_mapping(text).get("metadata") or {}


def outside_fitted_sizes(metadata: dict, op_class: str, size: float) -> str | None:
    """Why `size` of `op_class` is far outside the sizes the profile's fit saw, or None
    (no range recorded: a profile fitted before ranges were, or a class it did not fit)."""
    bounds = (metadata.get("size_ranges") or {}).get(op_class)
    if not bounds or size <= 0:
        return None
    low, high = bounds
    if low / SIZE_RANGE_SLACK <= size <= high * SIZE_RANGE_SLACK:
        return None
    return (
        f"{op_class} of size {size:.3g} is outside the {low:.3g}-{high:.3g} the profile was "
        "fitted on"
    )


def gemms_outside_fitted_sizes(
    metadata: dict, shapes: list[tuple[int, int]], max_tokens: int
) -> str | None:
    """Why the GEMMs a run prices, (n, k) `shapes` at 1 to `max_tokens` rows, reach far
    beyond the sizes the profile's GEMM fit saw (SIZE_RANGE_SLACK), or None."""
    products = [2.0 * n * k for n, k in shapes]
    if not products:
        return None
    low, high = min(products), max_tokens * max(products)
    far = [
        why
        for why in (
            outside_fitted_sizes(metadata, "gemm", low),
            outside_fitted_sizes(metadata, "gemm", high),
        )
        if why
    ]
    if not far:
        return None
    return (
        f"its GEMMs here run {low:.3g}-{high:.3g} FLOPs, and the {'; the '.join(far)}: those "
        f"beyond {SIZE_RANGE_SLACK:g}x are priced by extrapolation"
    )


def choose_calibration(gpu: AcceleratorSpec, setting: str | Path = AUTO) -> CalibrationChoice:
    """`gpu` with the profile `setting` names: auto (see the module), none, a shipped
    profile's name or a profile file's path."""
    text = str(setting)
    if text == NONE:
        return CalibrationChoice(gpu, None, "none (datasheet efficiencies)")
    if text == AUTO:
        name = nearest_profile(gpu)
        if name is None:
            family = f"{gpu.architecture} {memory_family(gpu)}"
            return CalibrationChoice(
                gpu, None, f"none (auto: no measured {family} chip; datasheet efficiencies)"
            )
        text = name
    metadata = profile_metadata(text) if text in list_calibrations() or Path(text).is_file() else {}
    fitted_on = metadata.get("gpu")
    calibrated = with_calibration(gpu, text)
    how = "auto: " if str(setting) == AUTO else ""
    if fitted_on == gpu.name:
        where = "fitted on this GPU"
    elif fitted_on is None:
        where = "an efficiency profile that names no GPU"
    else:
        where = f"transfer: fitted on {fitted_on}, applied to {gpu.name}"
    if fitted_on != gpu.name:  # a transfer is priced as the profile has it
        return CalibrationChoice(calibrated, text, f"{text} ({how}{where})")
    calibrated, taken = _partial_filled(calibrated, text, metadata)
    return CalibrationChoice(calibrated, text, f"{text} ({how}{where}{taken})")


def _partial_filled(
    gpu: AcceleratorSpec, profile: str, metadata: dict
) -> tuple[AcceleratorSpec, str]:
    """`gpu` (with `profile` applied) with what the profile did not fit taken from the
    profile `auto` gives the chip (profile_fallback), and a note naming those parts; the
    datasheet's where auto has none."""
    rows_used = metadata.get("rows_used")
    auto = nearest_profile(gpu)
    if not rows_used or auto == profile:
        return gpu, ""
    covered = covered_classes(rows_used)
    if auto is None:
        missing = sorted(set(CLASS_FIELDS) - covered)
        return gpu, f"; datasheet efficiencies for {', '.join(missing)}" if missing else ""
    auto_profile = with_calibration(gpu, auto).efficiency
    auto_covered = covered_classes(_metadata(auto).get("rows_used") or {})
    filled, taken = fill_from(gpu.efficiency, covered, auto_profile, auto_covered)
    if not taken:
        return gpu, ""
    return gpu.with_efficiency(filled), f"; {', '.join(taken)} from {auto} (auto)"
