"""Errors and warnings that name the way out (review 13's items)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware_models.errors import InfersimError

CUSTOM_GPU = "scenarios/hardware/hypothetical-accelerator.yaml"


@pytest.mark.parametrize("field", ["hardware.gpu", "hardware.node", "model.name"])
def test_a_working_folder_path_gets_the_absolute_path_hint(
    field: str, tmp_path: Path, monkeypatch
) -> None:
    """A relative path resolves against the scenario's folder; one that exists only from
    the working folder (the usual slip with --set) says so, as hardware.calibration does."""
    from simulator.build import build_replica
    from simulator.scenario import Scenario
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


def _summary(**sections):
    from simulator import simulate
    from simulator.scenario import Scenario
    from tests.conftest import scenario_dict

    data = scenario_dict(**sections)
    if "pools" in data:
        del data["hardware"]
    return simulate(Scenario.from_dict(data)).summary()


def test_requests_failed_for_want_of_a_healthy_replica_are_counted_and_said() -> None:
    """A retry needs a healthy replica: with the only one down, requests fail; the run
    says why (review 13 item 4), as it does for rejections."""
    summary = _summary(
        workload={"num_requests": 200, "arrivals": {"kind": "poisson", "rate_per_s": 8.0}},
        faults={"events": [{"replica": 0, "at_s": 5, "recover_at_s": 10}], "on_failure": "retry"},
    )
    counts = summary["counts"]
    assert counts["failed"] > 2
    assert counts["failed_by_reason"] == {"no_healthy_replica": counts["failed"]}
    (warning,) = [w for w in summary["warnings"] if "failed because" in w]
    assert warning.startswith(f"{counts['failed']:,} of 200 requests (")
    assert "no healthy replica" in warning and "more replicas" in warning
    assert _summary()["counts"]["failed_by_reason"] == {}


def test_kv_advice_names_num_gpu_blocks_when_it_fixes_the_block_count() -> None:
    """No memory setting moves a fixed serving.num_gpu_blocks (review 13 item 5)."""
    fixed = _summary(
        serving={"num_gpu_blocks": 150},
        workload={"num_requests": 200, "arrivals": {"kind": "poisson", "rate_per_s": 20.0}},
    )
    (warning,) = [w for w in fixed["warnings"] if "KV cache is short" in w]
    assert "raise serving.num_gpu_blocks (150" in warning
    assert "gpu_memory_utilization" not in warning


def test_pools_on_one_gpu_with_different_profiles_are_told_apart() -> None:
    """Review 13 item 6: the calibration lines name their pool where they differ."""
    from simulator.metrics.terminal import summary_table

    two = [
        {"name": "auto", "hardware": {"gpu": "h100-sxm"}},
        {"name": "plain", "hardware": {"gpu": "h100-sxm", "calibration": "none"}},
    ]
    summary = _summary(pools=two, workload={"num_requests": 20})
    assert summary["run"]["calibrations"] == [
        "[auto] h100-sxm: h100-sxm (auto: fitted on this GPU)",
        "[plain] h100-sxm: none (datasheet efficiencies)",
    ]
    assert "calibration [plain] h100-sxm: none" in summary_table(summary)
    same = [{**two[0], "name": "a"}, {**two[0], "name": "b"}]
    calibrations = _summary(pools=same, workload={"num_requests": 20})["run"]["calibrations"]
    assert calibrations == ["h100-sxm: h100-sxm (auto: fitted on this GPU)"]


def test_a_custom_gpu_run_is_headed_with_the_chip_and_keeps_its_file() -> None:
    """Review 13 item 8: the header names the chip (as the calibration line does), not
    the file; the configuration keeps the file."""
    from simulator.provenance import header_lines

    path = str(Path(__file__).resolve().parents[1] / CUSTOM_GPU)
    summary = _summary(hardware={"gpu": path}, workload={"num_requests": 10})
    (pool,) = summary["run"]["configuration"]["pools"]
    assert pool["gpu"] == "acme-x1" and pool["gpu_file"] == path
    assert (
        "on 1 replica x 1 acme-x1 (tp=1 pp=1)" in header_lines(summary["run"]["configuration"])[0]
    )
    (preset,) = _summary(workload={"num_requests": 10})["run"]["configuration"]["pools"]
    assert "gpu_file" not in preset


def test_a_sweep_says_a_warning_every_point_raises_once_and_the_rest_in_grid_order() -> None:
    """Review 13 item 9a: a build warning every point raises (swap space too small for
    one sequence) is said once; each point's own warnings (rejections) follow in grid
    order, whichever point finished first."""
    import warnings

    from hardware_models.errors import InfersimWarning
    from simulator.scenario import Scenario
    from simulator.sweep import sweep
    from tests.conftest import scenario_dict

    data = scenario_dict(
        serving={"policy": "continuous", "max_num_batched_tokens": 4096, "preemption": "swap",
                 "swap_space_gb": 0.1, "max_model_len": 600},
    )  # fmt: skip
    data["sweep"] = {"grid": {"workload.num_requests": [40, 20, 30]}}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sweep(Scenario.from_dict(data), workers=2, progress=False)
    said = [str(w.message) for w in seen if issubclass(w.category, InfersimWarning)]
    assert [text.split(":")[0] for text in said] == [
        "every point",
        "point num_requests=40",
        "point num_requests=20",
        "point num_requests=30",
    ]
    assert said[0].startswith("every point: serving.swap_space_gb holds ")
    assert all("were rejected because" in text for text in said[1:])
