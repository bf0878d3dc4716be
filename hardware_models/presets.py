"""Find accelerator and node descriptions, and shipped calibration profiles, by preset name
or by a user's YAML path."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.node import NodeSpec
from hardware_models.yaml_io import load_yaml_mapping, unknown_name_error, validate_model

PRESET_DIR = Path(__file__).parent / "presets"


def _preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (PRESET_DIR / kind).glob("*.yaml"))


def list_gpus() -> list[str]:
    return _preset_names("gpus")


def list_nodes() -> list[str]:
    return _preset_names("nodes")


def list_calibrations() -> list[str]:
    return _preset_names("calibrations")


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        return Path(text)
    path = PRESET_DIR / kind / f"{text}.yaml"
    if not path.is_file():
        raise unknown_name_error(kind.rstrip("s"), text, _preset_names(kind))
    return path


@cache
def _load_gpu_path(path: Path) -> AcceleratorSpec:
    return validate_model(AcceleratorSpec, load_yaml_mapping(path), str(path))


@cache
def _load_node_path(path: Path) -> NodeSpec:
    return validate_model(NodeSpec, load_yaml_mapping(path), str(path))


def load_gpu(name_or_path: str | Path) -> AcceleratorSpec:
    """A preset name (`h100-sxm`) or a path to a YAML file of the same schema."""
    return _load_gpu_path(_resolve("gpus", name_or_path).resolve())


def load_node(name_or_path: str | Path) -> NodeSpec:
    return _load_node_path(_resolve("nodes", name_or_path).resolve())


def calibration_path(name_or_path: str | Path) -> Path:
    """The file of a shipped calibration profile (`rtx-4090`), or the path given."""
    return _resolve("calibrations", name_or_path)
