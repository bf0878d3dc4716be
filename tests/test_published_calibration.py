"""Calibration from a CSV of GEMM timings (published figures), curves-only fits, and the
calibration profiles shipped as presets."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from hardware_models.calibration.gemm_csv import read_gemm_csv
from hardware_models.calibration.profile_file import read_profile
from hardware_models.calibration.sources import load_measurements
from hardware_models.calibration.workflow import fit_measurements, validate_measurements
from hardware_models.efficiency import EfficiencyCurve, EfficiencyProfile
from hardware_models.errors import InfersimError
from hardware_models.gemm import gemm_cost
from hardware_models.presets import PRESET_DIR, calibration_path, list_calibrations, load_gpu
from simulator.cli.main import main

PUBLISHED = PRESET_DIR / "calibrations" / "published"
MEASURED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "measured"
needs_data = pytest.mark.skipif(
    not MEASURED.is_dir(),
    reason=f"public measurement tables not found at {MEASURED} (../shared/data beside "
    "the checkout); they are not part of the repository",
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_gemm_csv_becomes_gemm_rows_of_the_long_table(tmp_path: Path) -> None:
    csv = _write(
        tmp_path / "g.csv",
        "m,n,k,dtype,tflops,source\n4096,4096,4096,bfloat16,150,paper\n1024,512,256,FP16,2,x\n",
    )
    table = read_gemm_csv(csv)
    assert list(table["op_class"]) == ["gemm", "gemm"]
    assert list(table["dtype"]) == ["bf16", "fp16"]
    assert table["size"].iloc[0] == 2.0 * 4096**3
    assert table["measured_s"].iloc[0] == pytest.approx(2.0 * 4096**3 / 150e12)
    assert list(table["source"]) == ["paper", "x"]
    seconds = _write(tmp_path / "s.csv", "m,n,k,dtype,measured_s\n8,8,8,bf16,2e-6\n")
    assert read_gemm_csv(seconds)["measured_s"].iloc[0] == 2e-6
    # Spaces after commas, a trailing comma and blank lines are what hand-typed files hold.
    loose = _write(tmp_path / "l.csv", "m, n, k, dtype, tflops\n\n64, 64, 64, BF16, 1,\n")
    assert read_gemm_csv(loose)[["m", "dtype"]].values.tolist() == [[64.0, "bf16"]]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("m,n,dtype,tflops\n1,2,bf16,3\n", "missing column 'k'"),
        ("m,n,k,dtype,tflops,measured_s\n1,2,3,bf16,3,1\n", "exactly one of the columns"),
        ("m,n,k,dtype,tflops\n1,2,3,bf16,3\n\n1,2,-3,bf16,3\n", "line 4, column k: must be"),
        ("m,n,k,dtype,tflops\n1,2,3,bf16,fast\n", "line 2, column tflops: must be"),
        ("m,n,k,dtype,tflops\n1,2,3,bf16,inf\n", "line 2, column tflops: must be a finite"),
        ("m,n,k,dtype,tflops\n1,2,3,bf16,\n", "tflops: must be a finite number > 0, got an empty"),
        ("m,n,k,dtype,tflops\n1,2.5,3,bf16,3\n", "line 2, column n: must be a whole number"),
        ("m,n,k,dtype,tflops\n1,2,3,bf17,3\n", "line 2, column dtype: unknown dtype 'bf17'"),
        ("gpu,m,n,k,dtype,tflops\n,1,2,3,bf16,3\n", "line 2, column gpu: empty"),
        ("m,n,k,dtype,tflops\n", "no rows"),
        ("m,n,k,dtype,tflops\n4096,4096,4096,bf16,1650\n", "a unit slip"),
        ("m,n,k,dtype,measured_s\n4096,4096,4096,bf16,850\n", "line 2: 4096x4096x4096"),
        ("m,n,k,dtype,measured_s\n4096,4096,4096,bf16,850\n", "measured_s in seconds"),
        (
            "gpu,m,n,k,dtype,tflops\nh100-sxm,1,2,3,bf16,3\n",
            "measured on h100-sxm, not --gpu rtx-4090",
        ),
    ],
)
def test_a_bad_gemm_csv_is_refused_naming_line_and_column(
    tmp_path: Path, capsys, body: str, message: str
) -> None:
    csv = _write(tmp_path / "bad.csv", body)
    argv = ["calibrate", "fit", str(csv), "--gpu", "rtx-4090", "-o", str(tmp_path / "p.yaml")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and message in err


def _large_squares(profile: EfficiencyProfile) -> pd.DataFrame:
    """Published-style rows: large square GEMMs only, timed under `profile` on an RTX 4090."""
    sizes = (1024, 2048, 4096, 8192)
    csv = pd.DataFrame({"m": sizes, "n": sizes, "k": sizes, "dtype": "bf16", "measured_s": 1.0})
    gpu = load_gpu("rtx-4090").with_efficiency(profile)
    csv["measured_s"] = [gemm_cost(gpu, s, s, s, "bf16").seconds for s in sizes]
    return csv


def test_curves_only_fits_the_curve_and_keeps_every_fixed_cost(tmp_path: Path) -> None:
    truth = EfficiencyProfile(gemm_compute=EfficiencyCurve.constant(0.95))
    csv = tmp_path / "squares.csv"
    _large_squares(truth).to_csv(csv, index=False)
    measurements = load_measurements(csv)
    gpu = load_gpu("rtx-4090")
    profile = fit_measurements(measurements, gpu, holdout=0.0, curves_only=True)
    fitted = profile.efficiency
    assert profile.metadata.curves_only and profile.links == []
    for size in (2.0 * 1024**3, 2.0 * 8192**3):
        assert fitted.gemm_compute.at(size) == pytest.approx(0.95, rel=0.01)
    defaults = gpu.efficiency
    assert fitted.kernel_floor_us == defaults.kernel_floor_us
    assert fitted.gemm_wave_latency_us == defaults.gemm_wave_latency_us
    assert fitted.gemm_split_k_overhead_us == defaults.gemm_split_k_overhead_us
    assert fitted.gemm_floor_us_by_dtype == {} and fitted.gemm_kernel_by_dtype == {}
    # A one-row GEMM is memory-bound, which no row of the table measured: its price stays.
    small = gemm_cost(gpu.with_efficiency(fitted), 1, 4096, 4096, "bf16").seconds
    assert small == gemm_cost(gpu, 1, 4096, 4096, "bf16").seconds


def test_the_shipped_rtx_4090_profile_is_the_fit_of_its_published_table() -> None:
    shipped = read_profile(calibration_path("rtx-4090"))
    assert shipped.metadata.curves_only and shipped.metadata.holdout == 0.0
    measurements = load_measurements(PUBLISHED / "rtx-4090-gemm.csv")
    refit = fit_measurements(measurements, load_gpu("rtx-4090"), holdout=0.0, curves_only=True)
    assert refit.efficiency == shipped.efficiency
    assert "rtx-4090" in list_calibrations()


def test_every_published_row_names_where_it_comes_from() -> None:
    for csv in PUBLISHED.glob("*.csv"):
        table = read_gemm_csv(csv)
        assert table["source"].str.startswith("https://").all(), csv.name


def test_a_scenario_names_a_shipped_calibration(make_scenario) -> None:
    from simulator.build import resolve_gpu

    scenario = make_scenario(hardware={"gpu": "rtx-4090", "calibration": "rtx-4090"})
    shipped = read_profile(calibration_path("rtx-4090")).efficiency
    assert resolve_gpu(scenario).efficiency == shipped
    wrong = make_scenario(hardware={"gpu": "rtx-4090", "calibration": "rtx-4080"})
    with pytest.raises(InfersimError, match=r"hardware.calibration: unknown calibration"):
        resolve_gpu(wrong)
    missing = make_scenario(hardware={"gpu": "rtx-4090", "calibration": "/no/such.yaml"})
    with pytest.raises(InfersimError, match=r"hardware.calibration: .*no such file"):
        resolve_gpu(missing)


def test_a_shipped_profile_by_name_applies_to_another_gpu_as_a_transfer(make_scenario) -> None:
    from simulator.build import resolve_calibration

    shipped = read_profile(calibration_path("rtx-4090")).efficiency
    other = resolve_calibration(
        make_scenario(hardware={"gpu": "h100-sxm", "calibration": "rtx-4090"})
    )
    assert other.gpu.efficiency == shipped
    assert other.note == "rtx-4090 (transfer: fitted on rtx-4090, applied to h100-sxm)"
    path = str(calibration_path("rtx-4090"))
    by_path = resolve_calibration(make_scenario(hardware={"gpu": "h100-sxm", "calibration": path}))
    assert by_path.gpu.efficiency == shipped and "transfer" in by_path.note
    # The same from Python.
    assert load_gpu("h100-sxm", calibration="rtx-4090").efficiency == shipped


def test_validate_takes_a_shipped_profile_by_name(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    csv = str(PUBLISHED / "rtx-4090-gemm.csv")
    assert main(["calibrate", "validate", csv, "--profile", "rtx-4090"]) == 2
    err = capsys.readouterr().err
    assert "no rows to validate on: the profile was fitted with --holdout 0" in err
    half = tmp_path / "half.yaml"
    assert main(["calibrate", "fit", csv, "--curves-only", "-o", str(half)]) == 0
    assert main(["calibrate", "validate", csv, "--profile", str(half)]) == 0
    assert (tmp_path / "half-validation-rtx-4090" / "report.md").is_file()


@needs_data
@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80gb-sxm", "l40s"])
def test_a_shipped_profile_is_the_fit_of_the_public_tables(gpu: str) -> None:
    """38 s for the H100, 13 s for the A100: the command in the presets' README."""
    refit = fit_measurements(load_measurements(from_shared=gpu), load_gpu(gpu))
    assert refit == read_profile(calibration_path(gpu))


@needs_data
def test_the_shipped_a100_profile_gives_the_documented_held_out_errors() -> None:
    gpu = "a100-80gb-sxm"
    profile = read_profile(calibration_path(gpu))
    result = validate_measurements(load_measurements(from_shared=gpu), load_gpu(gpu), profile)
    by_class = result.tables["by_class"]
    mape = by_class[by_class["stage"] == "calibrated"].set_index("op_class")["mape"]
    documented = {"gemm": 0.0785, "attention_prefill": 0.102, "attention_decode": 0.072}
    for op_class, value in documented.items():
        assert mape[op_class] == pytest.approx(value, abs=0.0005), op_class
    assert mape["all_reduce"] == pytest.approx(0.143, abs=0.0005)
