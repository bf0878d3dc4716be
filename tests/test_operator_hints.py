"""Errors and warnings that name the way out (review 13's items)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware_models.errors import InfersimError


@pytest.mark.parametrize("field", ["hardware.gpu", "hardware.node", "model.name"])
def test_a_working_folder_path_gets_the_absolute_path_hint(
    field: str, tmp_path: Path, monkeypatch
) -> None:
    """A relative path resolves against the scenario's folder; one that exists only from
    the working folder (the usual slip with --set) says so, as hardware.calibration does."""
    from simulator.scenario import Scenario
    from simulator.simulation import build_replica
    from tests.conftest import scenario_dict

    (tmp_path / "scenario").mkdir()
    (tmp_path / "work" / "mine").mkdir(parents=True)
    (tmp_path / "work" / "mine" / "file.yaml").write_text("name: x\n")
    monkeypatch.chdir(tmp_path / "work")
    section, key = field.split(".")
    data = scenario_dict(**{section: {key: "mine/file.yaml"}})
    data["base_dir"] = str(tmp_path / "scenario")
    with pytest.raises(InfersimError, match=rf"{field}: .*give its absolute path, /"):
        build_replica(Scenario.from_dict(data))


def _custom_gpu(tmp_path: Path, section: str, field: str, value: float) -> Path:
    import yaml

    data = yaml.safe_load(Path("scenarios/hardware/hypothetical-accelerator.yaml").read_text())
    data[section][field] = value
    path = tmp_path / "acme.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("section", "value"), [("memory", 6.0), ("memory", 8.0), ("l2", 12.0)])
def test_an_hbm_bandwidth_typed_in_tb_per_s_is_refused(
    section: str, value: float, tmp_path: Path, monkeypatch
) -> None:
    """6 for an HBM3e chip's 6000 GB/s sits above any chip's floor but below any HBM's:
    it ran ~840x slower, silently (review 13 item 1)."""
    from hardware_models.presets import load_gpu

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    path = _custom_gpu(tmp_path, section, "bandwidth_gbps", value)
    with pytest.raises(
        InfersimError,
        match=rf"{section}.bandwidth_gbps {value:g} is outside 100-.* GB/s for "
        r"HBM3e memory: was it typed in TB/s\?",
    ):
        load_gpu(str(path))


def test_every_shipped_gpu_and_custom_example_passes_the_bandwidth_floors() -> None:
    from hardware_models.presets import list_gpus, load_gpu

    repo = Path(__file__).resolve().parents[1]
    for name in [*list_gpus(), *map(str, (repo / "scenarios" / "hardware").glob("*.yaml"))]:
        load_gpu(name)
