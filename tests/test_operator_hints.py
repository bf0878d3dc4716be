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
