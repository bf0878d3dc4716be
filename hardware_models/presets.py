"""Find accelerator and node descriptions, and shipped calibration profiles, by preset name
or by a user's YAML path."""

from __future__ import annotations

from pathlib import Path

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.efficiency import EfficiencyProfile
from hardware_models.file_memo import per_file_version
from hardware_models.node import HOST_READ_US, NodeSpec
from hardware_models.warning_scope import warn
from hardware_models.yaml_io import load_yaml_mapping, unknown_name_error, validate_model

PRESET_DIR = Path(__file__).parent / "presets"


def _preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (PRESET_DIR / kind).glob("*.yaml"))


def list_gpus() -> list[str]:
    return _preset_names("gpus")


def list_nodes() -> list[str]:
    return _preset_names("nodes")


def nodes_with_gpu(gpu_name: str) -> list[str]:
    """The node presets built from the accelerator preset `gpu_name`."""
    return [n for n in list_nodes() if load_node(n).gpu == gpu_name]


def list_calibrations() -> list[str]:
    return _preset_names("calibrations")


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        return Path(text)
    text = text.lower()  # preset names are lower case; `H100-SXM` means h100-sxm
    path = PRESET_DIR / kind / f"{text}.yaml"
    if not path.is_file():
        raise unknown_name_error(kind.rstrip("s"), text, _preset_names(kind))
    return path


def _read(path: Path) -> dict:
    """A preset or profile file's mapping; the package's own files with libyaml."""
    return load_yaml_mapping(path, shipped=path.resolve().is_relative_to(PRESET_DIR.resolve()))


@per_file_version
def _load_gpu_path(path: Path) -> AcceleratorSpec:
    return validate_model(AcceleratorSpec, _read(path), str(path))


@per_file_version
def _load_node_path(path: Path) -> NodeSpec:
    """A node file, validated; read once per version of the file, its warning (a file
    written before fabric.host_read_us, see _warn_host_read_unset) kept with it for each
    run that uses it (file_memo)."""
    node = validate_model(NodeSpec, _read(path), str(path))
    _warn_host_read_unset(node, path)
    return node


def _warn_host_read_unset(node: NodeSpec, path: Path) -> None:
    """Before fabric.host_read_us (infersim of 2026-12-01) a PCIe link's `latency_us` was
    NCCL's figure for every PCI hop; now it is a peer-to-peer hop's and each hop staged
    in host memory adds the host read, so such a file prices staged hops higher unless
    told which it means."""
    for field in node.links_without_host_read():
        latency = getattr(node, field).latency_us
        warn(
            f"{path}: {field}.fabric.host_read_us is not set: taken as {HOST_READ_US} us, "
            f"added to each hop staged in host memory; {field}.latency_us ({latency}) now "
            "prices a peer-to-peer hop only (before infersim of 2026-12-01, every PCI "
            "hop): set host_read_us: 0 to keep that meaning, or latency_us: 0.55 and "
            "host_read_us: 1.1 as the l40s-8x-pcie preset does",
            stacklevel=2,
        )


def load_gpu(name_or_path: str | Path, calibration: str | Path | None = None) -> AcceleratorSpec:
    """A preset name (`h100-sxm`) or a path to a YAML file of the same schema; with
    `calibration`, its efficiencies replaced by a profile's (see `with_calibration`)."""
    gpu = _load_gpu_path(_resolve("gpus", name_or_path).resolve())
    return gpu if calibration is None else with_calibration(gpu, calibration)


def load_node(name_or_path: str | Path) -> NodeSpec:
    return _load_node_path(_resolve("nodes", name_or_path).resolve())


def calibration_path(name_or_path: str | Path) -> Path:
    """The file of a shipped calibration profile (`rtx-4090`), or the path given."""
    return _resolve("calibrations", name_or_path)


def with_calibration(gpu: AcceleratorSpec, name_or_path: str | Path) -> AcceleratorSpec:
    """`gpu` with a calibration profile's efficiencies: a shipped profile's name or a
    file's path, applied to any GPU (on another than the one it was fitted on, a transfer:
    calibration_lookup.choose_calibration says so). A bare EfficiencyProfile file works too."""
    path = calibration_path(name_or_path)
    data = _read(path)
    profile = validate_model(EfficiencyProfile, data.get("efficiency", data), str(path))
    return gpu.with_efficiency(profile)
