"""Calibration inputs a user brings: device names matched to presets, measurements whose
GPU or time unit disagrees with what they are priced against, and malformed tables."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from hardware_models.calibration.benchmark_loops import gemm_loop_bytes
from hardware_models.calibration.harness.benches import Bench
from hardware_models.calibration.harness.device_info import preset_for
from hardware_models.calibration.harness.plan import plan_for
from hardware_models.calibration.harness.runner import METADATA
from hardware_models.calibration.measured_tables import COLUMNS
from hardware_models.calibration.profile_file import read_profile, write_profile
from hardware_models.calibration.sources import Measurements, load_measurements, resolve_spec
from hardware_models.calibration.validate import predict_all
from hardware_models.calibration.workflow import fit_measurements, usable_rows
from hardware_models.calibration_lookup import choose_calibration, nearest_profile
from hardware_models.collectives import collective_cost
from hardware_models.device_names import preset_for_device
from hardware_models.efficiency import EfficiencyProfile
from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.gemm import gemm_cost
from hardware_models.op_request import OperatorRequest
from hardware_models.presets import (
    PRESET_DIR,
    calibration_path,
    list_gpus,
    load_gpu,
    load_node,
)
from simulator.cli.main import main


@pytest.mark.parametrize(
    ("device", "preset"),
    [
        ("NVIDIA L40", None),  # 142 SMs at other clocks than the L40S, never the L4
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA A100-PCIE-40GB", None),
        ("NVIDIA A100 80GB PCIe", None),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", None),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", None),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI300A", None),
        ("L40S", "l40s"),
        ("Acme X1", None),
    ],
)
def test_device_names_match_whole_names_never_a_substring(device, preset) -> None:
    assert preset_for(device) == preset


@pytest.mark.parametrize("name", list_gpus())
def test_every_shipped_preset_is_found_by_its_name_and_display_name(name: str) -> None:
    assert preset_for_device(name) == name
    assert preset_for_device(name.upper()) == name
    assert preset_for_device(load_gpu(name).display_name) == name


# ------------------------------------------------------------- the GPU the rows name


def gemm_table(gpu: str = "l40s", device: str = "NVIDIA L40S", unit: float = 1e3) -> pd.DataFrame:
    """An aiconfigurator-layout GEMM table whose latency (ms, times `unit` / 1e3) is 1.3x
    the uncalibrated model's on `gpu`: what a plausible kernel takes."""
    spec = load_gpu(gpu)
    rows = [
        {
            "framework": "VLLM",
            "version": "0.24.0",
            "device": device,
            "op_name": "gemm",
            "kernel_source": "vllm_default",
            "gemm_dtype": "bfloat16",
            "m": m,
            "n": n,
            "k": k,
            "latency": 1.3 * gemm_cost(spec, m, n, k, "bf16").seconds * unit,
        }
        for m in (1, 16, 128, 1024, 4096)
        for n in (1024, 4096, 8192)
        for k in (1024, 4096)
    ]
    return pd.DataFrame(rows)


def table_folder(tmp_path: Path, frame: pd.DataFrame, name: str = "mine") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    frame.to_parquet(folder / "gemm_perf.parquet")
    return folder


def test_tables_whose_device_column_names_another_gpu_are_refused_unless_forced(
    tmp_path: Path,
) -> None:
    folder = table_folder(tmp_path, gemm_table())
    measurements = load_measurements(measured=folder, gpu="h100-sxm")
    with pytest.raises(InfersimError, match=r"'NVIDIA L40S' \(preset l40s\), not --gpu h100-sxm"):
        resolve_spec(measurements, "h100-sxm")
    assert resolve_spec(measurements, "h100-sxm", force_gpu=True).name == "h100-sxm"
    assert resolve_spec(load_measurements(measured=folder, gpu="l40s"), "l40s").name == "l40s"


def test_a_harness_folder_names_its_device_and_an_unknown_one_asks_for_a_yaml(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / METADATA).write_text(json.dumps({"device": "cuda", "device_name": "NVIDIA L40"}))
    rows = load_measurements(measured=table_folder(tmp_path, gemm_table()), gpu="l40s").table
    rows[list(COLUMNS)].to_parquet(folder / "gemm.parquet")
    measurements = load_measurements(folder)
    with pytest.raises(InfersimError, match=r"'NVIDIA L40' is no preset's GPU: describe"):
        resolve_spec(measurements, None)
    (folder / METADATA).write_text(json.dumps({"device": "cuda", "device_name": "NVIDIA L40S"}))
    assert resolve_spec(load_measurements(folder), None).name == "l40s"
    with pytest.raises(InfersimError, match=r"--force-gpu"):
        resolve_spec(load_measurements(folder), "l4")


def test_a_csv_gpu_column_may_spell_a_device_name_and_is_compared_with_gpu(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gemm.csv"
    path.write_text("m,n,k,dtype,measured_s,gpu\n4096,4096,4096,bf16,0.0009,NVIDIA L40S\n")
    measurements = load_measurements(path)
    assert resolve_spec(measurements, None).name == "l40s"
    with pytest.raises(InfersimError, match=r"column gpu says .* not --gpu h100-sxm"):
        resolve_spec(measurements, "h100-sxm")


# ------------------------------------------------------------------- unit slips


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        (
            1e6,
            r"median [\d.]+e\+03x .* latency \(ms\) really in that unit, not in a unit 1000x finer",
        ),
        (1.0, r"median 1/[\d.]+(e\+0[23])? .* not in one 1000x coarser"),
    ],
)
def test_an_aiconfigurator_table_in_another_time_unit_is_refused(
    tmp_path: Path, unit: float, message: str
) -> None:
    folder = table_folder(tmp_path, gemm_table(unit=unit))
    measurements = load_measurements(measured=folder, gpu="l40s")
    with pytest.raises(InfersimError, match=message):
        usable_rows(measurements, load_gpu("l40s"))
    sound = load_measurements(measured=table_folder(tmp_path, gemm_table(), "ok"), gpu="l40s")
    assert len(usable_rows(sound, load_gpu("l40s")).rows) == len(gemm_table())


def test_another_gpus_table_forced_onto_a_slower_chip_is_refused_as_impossible(
    tmp_path: Path,
) -> None:
    # B200 timings as an L4's: most rows faster than the L4 can run at all.
    folder = table_folder(tmp_path, gemm_table("b200", "NVIDIA B200"))
    measurements = load_measurements(measured=folder, gpu="l4")
    spec = resolve_spec(measurements, "l4", force_gpu=True)
    with pytest.raises(InfersimError, match=r"gemm rows \(\d+%\) ran faster than the l4 allows"):
        usable_rows(measurements, spec)


# -------------------------------------------------------------- malformed tables


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.drop(columns="latency"), r"missing column 'latency' \(a gemm_perf"),
        (lambda f: f.assign(latency=np.nan), r"row 0, column latency: must be a finite number > 0"),
        (lambda f: f.assign(latency=-1.0), r"column latency: must be a finite number > 0, got -1"),
        (lambda f: f.assign(m=0), r"column m: must be a finite number > 0, got 0"),
        (
            lambda f: f.assign(gemm_dtype="bogus"),
            r"column gemm_dtype: unknown dtype 'bogus'; allowed",
        ),
    ],
)
def test_a_malformed_table_is_refused_naming_file_and_column(
    tmp_path: Path, change, message: str
) -> None:
    folder = table_folder(tmp_path, change(gemm_table()))
    with pytest.raises(InfersimError, match=r"gemm_perf.parquet: .*" + message):
        load_measurements(measured=folder, gpu="l40s")


def test_an_attention_table_without_its_kv_cache_dtype_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "attn"
    folder.mkdir()
    pd.DataFrame(
        {
            "batch_size": [1],
            "isl": [128],
            "num_heads": [32],
            "num_key_value_heads": [8],
            "head_dim": [128],
            "attn_dtype": ["bfloat16"],
            "step": [0],
            "latency": [0.05],
        }
    ).to_parquet(folder / "context_attention_perf.parquet")
    with pytest.raises(InfersimError, match=r"missing column 'kv_cache_dtype'"):
        load_measurements(measured=folder, gpu="l40s")


# ------------------------------------------------------------------ partial profiles


def test_what_a_partial_profile_did_not_fit_comes_from_auto_and_the_note_says_so(
    tmp_path: Path,
) -> None:
    """A bf16 GEMM-only profile: its bf16 GEMM terms stay, while attention, MoE, the
    links and the fp8 GEMMs are the shipped l40s profile's (auto), not the datasheet's."""
    data = yaml.safe_load(calibration_path("l40s").read_text())
    defaults = EfficiencyProfile()
    efficiency = data["efficiency"]
    for field in EfficiencyProfile.model_fields:
        if not field.startswith("gemm_") and field in efficiency:
            efficiency[field] = defaults.model_dump(mode="json")[field]
        elif field.endswith("_by_dtype") and efficiency.get(field):
            efficiency[field] = {k: v for k, v in efficiency[field].items() if k == "bf16"}
    efficiency["gemm_floor_us_by_dtype"]["bf16"] = 7.5
    data["metadata"]["rows_used"] = {"gemm": 500}
    path = tmp_path / "gemm_only.yaml"
    path.write_text(yaml.safe_dump(data))

    gpu = load_gpu("l40s")
    partial, shipped = choose_calibration(gpu, path), choose_calibration(gpu, "l40s")
    assert "fitted on this GPU; gemm fp8, fp8_block, attention_prefill" in partial.note
    assert "from l40s (auto)" in partial.note
    mine, auto = partial.gpu.efficiency, shipped.gpu.efficiency
    assert mine.gemm_floor_us_by_dtype["bf16"] == 7.5
    assert mine.gemm_floor_us_by_dtype["fp8"] == auto.gemm_floor_us_by_dtype["fp8"]
    assert mine.attention_prefill_compute == auto.attention_prefill_compute
    assert mine.decode_by_kv_dtype == auto.decode_by_kv_dtype
    assert mine.collective_by_gpus == auto.collective_by_gpus
    assert gemm_cost(partial.gpu, 16, 4096, 4096, "fp8").seconds == pytest.approx(
        gemm_cost(shipped.gpu, 16, 4096, 4096, "fp8").seconds
    )


def test_roofline_prices_a_collective_over_the_profiles_fitted_link_as_the_engine_does() -> None:
    gpu = choose_calibration(load_gpu("l40s"), "l40s").gpu
    node = load_node("l40s-8x-pcie")
    request = OperatorRequest(op="all_reduce", gpus=8, bytes=2**26)
    fitted = gpu.efficiency.link_for(8, node.intra_node_link)
    assert fitted != node.intra_node_link  # the shipped profile fits 8 GPUs over PCIe
    assert (
        request.price(gpu, node).seconds == collective_cost("all_reduce", 2**26, 8, fitted).seconds
    )
    datasheet = load_gpu("l40s")
    plain = collective_cost("all_reduce", 2**26, 8, node.intra_node_link).seconds
    assert request.price(datasheet, node).seconds == plain


# --------------------------------------------------------------- custom GPU YAML


def _l40s_with(tmp_path: Path, **changes: object) -> Path:
    """The l40s preset as a user's file, with dotted fields changed."""
    data = yaml.safe_load((PRESET_DIR / "gpus" / "l40s.yaml").read_text())
    for field, value in changes.items():
        head, _, tail = field.partition("__")
        if tail:
            data[head][tail] = value
        else:
            data[head] = value
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"boost_clock_mhz": 2.52}, r"boost_clock_mhz 2.52 is outside .* typed in GHz"),
        ({"memory__bandwidth_gbps": 0.864}, r"memory.bandwidth_gbps 0.864 .* typed in TB/s"),
        ({"l2__bandwidth_gbps": 5e9}, r"l2.bandwidth_gbps 5e\+09 .* typed in MB/s"),
        (
            {
                "datasheet_tflops": {
                    "bf16": 91.6,
                    "fp16": 362.05,
                    "fp8": 733,
                    "int8": 733,
                    "fp32_cuda": 91.6,
                }
            },
            r"datasheet_tflops.bf16 91.6 vs 36\d.\d derived .*: \+300%, beyond 10%",
        ),
        ({"architecture": "Ada Lovelace"}, r"architecture 'Ada Lovelace' is not one of .*Ada"),
    ],
)
def test_a_custom_gpu_yaml_with_a_slipped_unit_or_unknown_architecture_is_refused(
    tmp_path: Path, changes: dict, message: str
) -> None:
    with pytest.raises(InfersimError, match=message):
        load_gpu(_l40s_with(tmp_path, **changes))


def test_the_architecture_is_read_in_any_case_and_finds_its_auto_profile(tmp_path: Path) -> None:
    chip = load_gpu(_l40s_with(tmp_path, name="my-ada", architecture=" ada"))
    assert chip.architecture == "Ada"
    assert nearest_profile(chip) == "l40s"


# ----------------------------------------------------------------------- harness


def test_one_gemm_dtype_failing_keeps_the_others_rows_and_is_recorded(monkeypatch) -> None:
    """As on a GPU whose fp8 kernel is missing or runs out of memory at the largest shape:
    the rows timed before the failure and every other dtype's stay."""
    bench = Bench(None, "cpu", plan_for("cpu", quick=True), "cpu-local")
    calls: list[tuple] = []

    def gemm_fn(m: int, n: int, k: int, dtype: str):
        if dtype == "bfloat16" and len([c for c in calls if c[3] == dtype]) == 2:
            raise RuntimeError("out of memory")
        calls.append((m, n, k, dtype))
        return lambda: None

    monkeypatch.setattr(bench, "_gemm_fn", gemm_fn)
    monkeypatch.setattr(bench, "time", lambda fn: 1e-3)
    rows = bench.gemm(lambda line: None)
    timed = pd.Series([r["source_dtype"] for r in rows]).value_counts()
    assert timed["float32"] == len([c for c in calls if c[3] == "float32"]) > 2
    assert timed["bfloat16"] == 2
    assert bench.errors == {"gemm bfloat16": "RuntimeError: out of memory"}


def test_fit_says_what_the_harness_run_could_not_time(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    meta = {"device": "cuda", "device_name": "NVIDIA L40S"}
    meta["errors"] = {"gemm float8_e4m3fn": "RuntimeError: no fp8"}
    (folder / METADATA).write_text(json.dumps(meta))
    rows = load_measurements(measured=table_folder(tmp_path, gemm_table()), gpu="l40s").table
    rows[list(COLUMNS)].to_parquet(folder / "gemm.parquet")
    assert main(["calibrate", "fit", str(folder), "-o", str(tmp_path / "p.yaml")]) == 0
    err = capsys.readouterr().err  # a warning, on stderr as every command says them
    assert (
        "infersim: warning: the run could not time gemm float8_e4m3fn (RuntimeError: no fp8)" in err
    )


# ---------------------------------------------------------------------- validate


def test_validate_says_worse_than_uncalibrated_on_the_profiles_own_gpu(
    tmp_path: Path, capsys
) -> None:
    data = yaml.safe_load(calibration_path("l40s").read_text())
    data["efficiency"]["gemm_floor_us_by_dtype"]["bf16"] = 500.0  # every GEMM >= 0.5 ms
    profile = tmp_path / "bad.yaml"
    profile.write_text(yaml.safe_dump(data))
    folder = table_folder(tmp_path, gemm_table())
    argv = ["calibrate", "validate", "--measured", str(folder), "--gpu", "l40s"]
    assert main([*argv, "--profile", str(profile), "-o", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert "WORSE than uncalibrated: gemm" in out
    assert "use the shipped profile (auto) or refit on more shapes" in out


# ------------------------------------------------------------- fitted size ranges


def test_a_fit_on_large_gemms_only_warns_and_roofline_flags_small_ones(
    tmp_path: Path, capsys
) -> None:
    table = gemm_table()
    folder = table_folder(tmp_path, table[table["m"] >= 1024])
    measurements = load_measurements(measured=folder, gpu="l40s")
    with pytest.warns(InfersimWarning, match=r"no GEMM row with m <= 64 \(smallest m 1024\)"):
        profile = fit_measurements(measurements, load_gpu("l40s"), holdout=0.0)
    low, high = profile.metadata.size_ranges["gemm"]
    assert (low, high) == (2.0 * 1024 * 1024 * 1024, 2.0 * 4096 * 8192 * 4096)
    path = write_profile(profile, tmp_path / "big.yaml")
    assert read_profile(path).metadata.size_ranges == profile.metadata.size_ranges

    roofline = ["roofline", "--gpu", "l40s", "--calibration", str(path), "--n", "2048"]
    assert main([*roofline, "--m", "16", "--k", "2048"]) == 0
    out, err = capsys.readouterr()  # on stderr: `2>/dev/null` leaves the table alone
    assert "infersim: warning: row 1 priced by extrapolation (gemm of size" in err
    assert "extrapolation" not in out
    assert main([*roofline, "--m", "2048", "--k", "2048"]) == 0
    assert "extrapolation" not in "".join(capsys.readouterr())


# ------------------------------------------------- aiconfigurator's download layout


def test_tables_in_aiconfigurators_nested_layout_and_as_text_are_read_alike(
    tmp_path: Path,
) -> None:
    frame = gemm_table()
    flat = load_measurements(measured=table_folder(tmp_path, frame), gpu="l40s").table
    nested = tmp_path / "dl" / "l40s" / "vllm" / "0.24.0"
    nested.mkdir(parents=True)
    frame.to_csv(nested / "gemm_perf.txt", index=False)
    measurements = load_measurements(measured=tmp_path / "dl" / "l40s", gpu="l40s")
    assert measurements.devices[0][1] == "NVIDIA L40S"
    table = measurements.table
    pd.testing.assert_frame_equal(
        table.drop(columns="source"), flat.drop(columns="source"), check_dtype=False
    )
    # Still read as aiconfigurator's benchmark loop (warm L2), not as rows of unknown origin.
    assert np.isfinite(gemm_loop_bytes(table, "bf16")).all()
    again = tmp_path / "dl" / "l40s" / "vllm" / "0.25.0"
    again.mkdir()
    frame.to_parquet(again / "gemm_perf.parquet")
    with pytest.raises(InfersimError, match=r"gemm_perf is there 2 times .* point --measured"):
        load_measurements(measured=tmp_path / "dl" / "l40s", gpu="l40s")


# ------------------------------------------------------------------ GEMM CSV


def test_a_gemm_csv_may_spell_its_columns_in_capitals_and_time_in_ms_or_us(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gemm.csv"
    path.write_text("M,N,K,dtype,latency_ms\n4096,4096,4096,bf16,0.9\n")
    assert load_measurements(path).table["measured_s"].iloc[0] == pytest.approx(0.9e-3)
    path.write_text("m,n,k,dtype,latency_us\n4096,4096,4096,bf16,900\n")
    assert load_measurements(path).table["measured_s"].iloc[0] == pytest.approx(0.9e-3)
    other = tmp_path / "gemm.json"
    other.write_text("{}")
    with pytest.raises(InfersimError, match=r"gemm.json: a GEMM table must be a .csv file"):
        load_measurements(other)


def test_roofline_decode_attention_asks_for_context_not_kv_len(capsys) -> None:
    argv = ["roofline", "--gpu", "l40s", "--op", "attention_decode", "--batch", "1"]
    assert main([*argv, "--kv-len", "4096", "--heads", "32", "--head-dim", "128"]) == 2
    assert "needs context (the tokens already cached per sequence: context, not kv_len)" in (
        capsys.readouterr().err
    )


def test_a_run_warns_when_its_gemms_reach_beyond_the_sizes_the_profile_was_fitted_on(
    tmp_path: Path, make_scenario
) -> None:
    from simulator.build import build_replica

    data = yaml.safe_load(calibration_path("l40s").read_text())
    data["metadata"]["size_ranges"] = {"gemm": [1e11, 1e13]}  # large GEMMs only
    path = tmp_path / "large_only.yaml"
    path.write_text(yaml.safe_dump(data))
    scenario = make_scenario(hardware={"gpu": "l40s", "calibration": str(path)})
    with pytest.warns(
        InfersimWarning,
        match=r"large_only.yaml: its GEMMs here run .* FLOPs, and the gemm of size \S+ is "
        r"outside the .* by extrap",
    ):
        build_replica(scenario)
    data["metadata"]["size_ranges"] = {"gemm": [1e6, 1e14]}
    path.write_text(yaml.safe_dump(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error", InfersimWarning)
        build_replica(make_scenario(hardware={"gpu": "l40s", "calibration": str(path)}))


def test_a_relative_profile_found_only_in_the_working_folder_asks_for_its_absolute_path(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text(calibration_path("l40s").read_text())
    scenario = str(Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml")
    argv = ["run", scenario, "--set", "hardware.calibration=mine.yaml", "-o", "out"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "a relative path resolves against the scenario's folder" in err
    assert str(tmp_path / "mine.yaml") in err


def test_a_links_only_profile_prices_everything_else_as_auto(tmp_path: Path) -> None:
    """NCCL timed on two GPUs only: the kernels (the GEMM floor included) and the other
    GPU counts' links are the shipped profile's, the 2-GPU link the profile's own."""
    shipped = choose_calibration(load_gpu("l40s"), "l40s").gpu.efficiency
    mine = shipped.collective_by_gpus[2].model_copy(update={"latency_us": 9.0})
    efficiency = EfficiencyProfile(collective_by_gpus={2: mine})
    data = yaml.safe_load(calibration_path("l40s").read_text())
    data["efficiency"] = efficiency.model_dump(mode="json")
    data["metadata"]["rows_used"] = {"all_reduce": 40}
    path = tmp_path / "nccl2.yaml"
    path.write_text(yaml.safe_dump(data))
    used = choose_calibration(load_gpu("l40s"), path)
    assert used.gpu.efficiency.collective_by_gpus == {**shipped.collective_by_gpus, 2: mine}
    assert used.gpu.efficiency.model_copy(update={"collective_by_gpus": {}}) == (
        shipped.model_copy(update={"collective_by_gpus": {}})
    )
    assert "gemm, attention_prefill, attention_decode, moe, collectives over 4, 8 GPUs" in (
        used.note
    )


def test_the_unit_check_prices_a_harness_runs_copies_too(tmp_path: Path) -> None:
    """A `calibrate run` table holds device copies, which only predict_all prices."""
    gemms = load_measurements(measured=table_folder(tmp_path, gemm_table()), gpu="l40s").table
    copies = gemms.iloc[:4].assign(op_class="memory_copy", dtype="int8", m=np.nan, n=np.nan)
    copies = copies.assign(k=np.nan, nbytes=[2.0**20, 2.0**24, 2.0**26, 2.0**28])
    copies = copies.assign(size=copies["nbytes"], source="harness:copy")
    spec = load_gpu("l40s")
    copies = copies.assign(measured_s=1.2 * predict_all(copies, spec))
    rows = pd.concat([gemms, copies], ignore_index=True)
    usable = usable_rows(Measurements(rows, "run", None), spec)
    assert (usable.rows["op_class"] == "memory_copy").sum() == 4
    slipped = rows.assign(
        measured_s=rows["measured_s"] * np.where(rows.index >= len(gemms), 1e3, 1)
    )
    with pytest.raises(InfersimError, match=r"the memory_copy rows take a median"):
        usable_rows(Measurements(slipped, "run", None), spec)
