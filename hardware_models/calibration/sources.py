"""Where measurements come from: a harness folder, a CSV of GEMM timings, an aiconfigurator
folder, or the shared public tables by GPU name; and which accelerator spec they are
priced against."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration.gemm_csv import read_gemm_csv
from hardware_models.calibration.harness.runner import DEVICE_SPEC, METADATA
from hardware_models.calibration.measured_tables import (
    COLUMNS,
    NUMERIC_COLUMNS,
    gpu_folders,
    load_measured,
    read_table_folder,
    resolve_measured_dir,
    table_devices,
)
from hardware_models.device_names import DESCRIBE_YOUR_CHIP, preset_for_device
from hardware_models.errors import InfersimError
from hardware_models.presets import list_gpus, load_gpu

AICONFIGURATOR_TIME = "latency (ms)"
HARNESS_TIME = "measured_s (seconds)"


@dataclass(frozen=True)
class Measurements:
    table: pd.DataFrame
    source: str  # a description for reports and the profile's metadata
    folder: Path | None  # a harness folder, when that is what was read
    hand_made: bool = False  # typed rows (a CSV): checked for unit slips once priced
    # What the measurements say they ran on: (where it is written, the device name).
    devices: tuple[tuple[str, str], ...] = ()
    time_column: str = HARNESS_TIME  # the input's time column and its unit, for errors


def read_harness_dir(path: Path) -> pd.DataFrame:
    """Every Parquet table of a `calibrate run` folder, checked for the long format."""
    files = sorted(path.glob("*.parquet"))
    if not files:
        raise InfersimError(f"{path}: no .parquet tables (write some with `calibrate run`)")
    frames = []
    for file in files:
        try:
            frame = pd.read_parquet(file)
        except (OSError, ValueError) as exc:
            raise InfersimError(f"{file}: not a readable Parquet table ({exc})") from None
        missing = [c for c in COLUMNS if c not in frame.columns]
        if missing:
            raise InfersimError(f"{file}: missing column {missing[0]!r} of the long format")
        bad = frame["measured_s"].isna() | (frame["measured_s"] <= 0)
        if bad.any():
            raise InfersimError(f"{file}: measured_s must be > 0 (row {int(bad.idxmax())})")
        frames.append(frame[list(COLUMNS)].astype({c: float for c in NUMERIC_COLUMNS}))
    return pd.concat(frames, ignore_index=True)


def load_measurements(
    folder: str | Path | None = None,
    measured: str | Path | None = None,
    from_shared: str | None = None,
    gpu: str | None = None,
    shared_data: str | Path | None = None,
) -> Measurements:
    """Exactly one of: a harness folder or a CSV of GEMM timings, a folder of tables in the
    aiconfigurator layout (one GPU's, of any name, its rows labelled `gpu`; or a measured/
    folder of several), or a GPU preset whose public tables sit in `shared_data` (default:
    see measured_tables.shared_measured_candidates)."""
    given = [x is not None for x in (folder, measured, from_shared)]
    if sum(given) != 1:
        raise InfersimError(
            "give exactly one input: a calibration folder, --measured DIR or --from-shared GPU"
        )
    if folder is not None:
        path = Path(folder)
        if path.suffix.lower() == ".csv":
            return _csv_measurements(path)
        if path.is_file():
            raise InfersimError(
                f"{path}: a GEMM table must be a .csv file (m, n, k, dtype and a time "
                "column); a `calibrate run` input is its folder"
            )
        if not path.is_dir():
            raise InfersimError(f"{path}: no such calibration folder or GEMM CSV")
        devices = _harness_devices(path)
        return Measurements(
            read_harness_dir(path), f"harness run {path.name}", path, False, devices
        )
    if measured is not None:
        path = resolve_measured_dir(Path(measured), "--measured")
        label = load_gpu(gpu).name if gpu is not None else None
        table = load_measured(path, gpu=label)
        devices = tuple(
            (f"{file.name} column device", name) for file, name in table_devices(path)
        ) or tuple((f"{path}'s folder names", name) for name in sorted(set(table["gpu"])))
        return Measurements(
            table, f"measured tables {path.name}", None, False, devices, AICONFIGURATOR_TIME
        )
    if shared_data is not None and (Path(shared_data) / "measured").is_dir():
        shared_data = Path(shared_data) / "measured"
    root = resolve_measured_dir(shared_data, "--shared-data")
    known = {name: folder for folder, name in gpu_folders(root).items()}
    if from_shared not in known:
        raise InfersimError(
            f"--from-shared {from_shared!r}: {root} has public tables for {sorted(known)}"
        )
    table = read_table_folder(known[from_shared], from_shared)
    source = f"aiconfigurator measured tables for {from_shared}"
    devices = (("--from-shared", from_shared),)
    return Measurements(table, source, None, False, devices, AICONFIGURATOR_TIME)


def _csv_measurements(path: Path) -> Measurements:
    """A GEMM CSV whose gpu column may spell its GPU as a device name (NVIDIA L40S) or a
    preset in any case: the rows are labelled with the preset where one matches."""
    table = read_gemm_csv(path)
    labels = sorted(set(table["gpu"]) - {""})
    presets = {label: preset_for_device(label) or label for label in labels}
    table["gpu"] = table["gpu"].map(lambda label: presets.get(label, label))
    devices = tuple((f"{path.name} column gpu", label) for label in labels)
    return Measurements(table, f"GEMM table {path.name}", None, True, devices)


def _harness_devices(folder: Path) -> tuple[tuple[str, str], ...]:
    """The device a `calibrate run` folder names: its device.yaml's chip, else the device
    name in metadata.json."""
    if (folder / DEVICE_SPEC).is_file():
        return ((DEVICE_SPEC, load_gpu(folder / DEVICE_SPEC).name),)
    name = harness_metadata(folder).get("device_name")
    return ((f"{METADATA} device_name", str(name)),) if name else ()


def harness_metadata(folder: Path | None) -> dict:
    if folder is None or not (folder / METADATA).is_file():
        return {}
    try:
        return json.loads((folder / METADATA).read_text())
    except json.JSONDecodeError as exc:
        raise InfersimError(f"{folder / METADATA}: not JSON ({exc.msg})") from None


def resolve_spec(
    measurements: Measurements,
    gpu: str | None,
    fallback: str | None = None,
    force_gpu: bool = False,
) -> AcceleratorSpec:
    """--gpu when given (refused where the measurements name another chip, unless
    `force_gpu`); else the harness folder's device.yaml or the preset its device name is;
    else the table's only GPU; else `fallback` (the GPU a profile was fitted on) if the
    table has it."""
    names = set(measurements.table["gpu"]) - {""}
    if gpu is not None:
        spec = load_gpu(gpu)
        if not force_gpu:
            _check_same_gpu(measurements, spec, gpu)
        return spec
    folder = measurements.folder
    if folder is not None and (folder / DEVICE_SPEC).is_file():
        return load_gpu(folder / DEVICE_SPEC)
    preset = None
    if folder is not None and measurements.devices:
        where, device = measurements.devices[0]
        preset = preset_for_device(device)
        if preset is None:
            raise InfersimError(
                f"{folder}: {where} {device!r} is no preset's GPU: {DESCRIBE_YOUR_CHIP}"
            )
    if not names:
        raise InfersimError(
            "the rows name no GPU: add a gpu column (a preset name) or pass --gpu PRESET_OR_YAML"
        )
    if preset is None and len(names) == 1:
        preset = next(iter(names))
    if preset is None and fallback in names:
        preset = fallback
    if preset is None or preset not in list_gpus():
        raise InfersimError(
            f"cannot tell which accelerator the rows ({sorted(names)}) ran on; pass --gpu "
            "PRESET_OR_YAML"
        )
    return load_gpu(preset)


def _check_same_gpu(measurements: Measurements, spec: AcceleratorSpec, gpu: str) -> None:
    """Refuse pricing measurements on a chip other than the one they name: one chip's
    kernels fitted to another's spec give a profile that is wrong everywhere (names no
    preset matches, e.g. a custom chip's, are not compared)."""
    claims = [(where, device, preset_for_device(device)) for where, device in measurements.devices]
    claimed = {preset for _where, _device, preset in claims if preset is not None}
    if not claimed or spec.name in claimed:
        return
    where, device, preset = next(c for c in claims if c[2] is not None)
    named = device if device == preset else f"{device!r} (preset {preset})"
    raise InfersimError(
        f"{measurements.source}: {where} says the rows were measured on {named}, not "
        f"--gpu {gpu} ({spec.name}): pass --gpu {preset}, or add --force-gpu to price "
        f"them on {spec.name} anyway (to apply a profile to another GPU, fit on its own "
        "rows and validate there)"
    )


def rows_for(measurements: Measurements, spec: AcceleratorSpec) -> pd.DataFrame:
    """The rows measured on `spec`: all of them for a single-device table, else those
    whose gpu column names it."""
    table = measurements.table
    if table["gpu"].nunique() == 1:
        return table
    rows = table[table["gpu"] == spec.name]
    if rows.empty:
        raise InfersimError(
            f"no rows measured on {spec.name}; the input has {sorted(set(table['gpu']))}"
        )
    return rows
