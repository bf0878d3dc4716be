"""Calibration for any GPU: tables in a folder of any name, collectives on every GPU with a
node preset (PCIe included), rows that cannot be priced reported, the plausibility
screen, the public tables found from any install, and `hardware.calibration: auto`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from hardware_models.calibration.measured_tables import (
    COLUMNS,
    TABLES,
    default_link_resolver,
    gpu_folders,
    load_measured,
)
from hardware_models.calibration.profile_file import read_profile
from hardware_models.calibration.screen import (
    BOOST_HEADROOM,
    HOST_BOUND,
    OVER_BANDWIDTH,
    OVER_LINK,
    OVER_PEAK,
    screen,
)
from hardware_models.calibration.sources import Measurements, load_measurements
from hardware_models.calibration.validate import predict_all
from hardware_models.calibration.workflow import usable_rows
from hardware_models.calibration_lookup import choose_calibration, nearest_profile
from hardware_models.collectives import collective_cost
from hardware_models.dtypes import parse_dtype
from hardware_models.errors import InfersimError, InfersimWarning
from hardware_models.presets import calibration_path, load_gpu, load_node
from simulator.cli.main import main
from tests.conftest import SHARED_DATA, needs_shared_data

CALIBRATIONS = Path(__file__).resolve().parents[1] / "hardware_models" / "presets" / "calibrations"


def _row(**fields) -> dict:
    base = {c: np.nan for c in COLUMNS}
    base.update(kv_dtype=None, source="synthetic", source_dtype="", measured_s=1.0, size=1.0)
    base.update(fields)
    return base


def _gemm(gpu: str, m: int, n: int, k: int, seconds: float, dtype: str = "bf16") -> dict:
    return _row(
        gpu=gpu, op_class="gemm", dtype=dtype, source_dtype=dtype, m=m, n=n, k=k,
        size=2.0 * m * n * k, measured_s=seconds,
    )  # fmt: skip


def _nccl_folder(folder: Path) -> Path:
    """A one-table folder in the aiconfigurator layout: half all-reduces on 2 GPUs."""
    folder.mkdir(parents=True)
    sizes = np.array([2**16, 2**20, 2**24])
    pd.DataFrame(
        {
            "op_name": "all_reduce",
            "nccl_dtype": "half",
            "num_gpus": 2,
            "message_size": sizes,
            "latency": 0.05 + sizes * 2 / 20e9 * 1e3,
        }
    ).to_parquet(folder / "nccl_perf.parquet")
    return folder


# ------------------------------------------------------------------ any folder, any GPU


def test_a_folder_of_any_name_is_read_as_the_gpu_given(tmp_path: Path) -> None:
    folder = _nccl_folder(tmp_path / "my runs (rack 3)")
    table = load_measurements(measured=folder, gpu="l40s").table
    assert set(table["gpu"]) == {"l40s"} and len(table) == 3
    with pytest.raises(InfersimError, match=r"cannot tell which GPU .* pass --gpu"):
        load_measured(folder)
    # A folder named like a preset needs no --gpu; a parent folder names each by its name.
    named = _nccl_folder(tmp_path / "root" / "h100_pcie")
    assert gpu_folders(named.parent) == {named: "h100-pcie"}


def test_the_table_registry_names_every_reader() -> None:
    files = [t.filename for t in TABLES]
    assert len(files) == len(set(files)) and "nccl_perf.parquet" in files


def test_collectives_are_priced_over_pcie_on_an_l40s_and_unpriced_rows_are_reported(
    tmp_path: Path,
) -> None:
    folder = _nccl_folder(tmp_path / "pcie")
    rows = load_measurements(measured=folder, gpu="l40s").table
    pcie = load_node("l40s-8x-pcie").intra_node_link
    assert default_link_resolver("l40s") == pcie and pcie.kind == "pcie"
    predicted = predict_all(rows, load_gpu("l40s"))
    want = [collective_cost("all_reduce", b, 2, pcie).seconds for b in rows["nbytes"]]
    assert predicted.tolist() == pytest.approx(want)
    # An A100 40GB is in no node preset: its collectives are left out with the reason.
    usable = usable_rows(
        Measurements(rows.assign(gpu="a100-40gb-sxm"), "t", None), load_gpu("a100-40gb-sxm")
    )
    assert usable.rows.empty and usable.link is None
    (line,) = usable.lines()
    assert line.startswith("left out 3 all_reduce rows: no GPU-to-GPU link") and "--node" in line
    # --node names the link.
    assert usable_rows(Measurements(rows, "t", None), load_gpu("l40s"), "l40s-8x-pcie").link == pcie


def test_fit_over_pcie_and_a_bad_node_through_the_cli(tmp_path: Path, capsys) -> None:
    folder = _nccl_folder(tmp_path / "x")
    profile = tmp_path / "p.yaml"
    args = ["--measured", str(folder), "--gpu", "l40s"]
    assert main(["calibrate", "fit", *args, "--holdout", "0", "-o", str(profile)]) == 0
    assert read_profile(profile).links[0].num_gpus == 2  # fitted over PCIe
    # The fabric's optional host read is written out: the profile says what it assumed.
    written = yaml.safe_load(profile.read_text())["links"][0]["link"]["fabric"]
    assert written["host_read_us"] == 1.1
    out = tmp_path / "report"
    report = ["--profile", str(profile), "-o", str(out)]
    assert main(["calibrate", "validate", *args, "--node", "/no/such-node.yaml", *report]) == 2
    assert "such-node.yaml" in capsys.readouterr().err
    # On a GPU in no node preset the collectives are left out, counted and explained.
    capsys.readouterr()
    a100 = ["--measured", str(folder), "--gpu", "a100-40gb-sxm"]
    assert main(["calibrate", "validate", *a100, *report]) == 2  # nothing left to validate
    assert "left out 3 all_reduce rows: no GPU-to-GPU link" in capsys.readouterr().err


# ------------------------------------------------------------------ the screen


def test_the_screen_leaves_out_rows_faster_than_the_chip_and_says_why() -> None:
    spec = load_gpu("h100-sxm")
    link = default_link_resolver("h100-sxm")
    big = 8192
    peak_s = 2.0 * big**3 / spec.peak_flops(parse_dtype("bf16"))
    rows = pd.DataFrame(
        [
            _gemm("h100-sxm", big, big, big, 1.5 * peak_s),  # plausible
            _gemm("h100-sxm", big, big, big, peak_s / 3 / BOOST_HEADROOM),  # 3x over the peak
            # 1 x 65536 x 8192: 1 GiB of weights in 50 us is 21 TB/s, over HBM's 3.35.
            _gemm("h100-sxm", 1, 65536, 8192, 50e-6),
            _row(
                gpu="h100-sxm",
                op_class="all_reduce",
                dtype="fp16",
                num_gpus=8,
                nbytes=2**30,
                measured_s=1e-4,
                size=2**30,
            ),
        ]
    )
    result = screen(rows, spec, link)
    assert result.kept.index.tolist() == [0]
    assert result.excluded["reason"].tolist() == [OVER_PEAK, OVER_BANDWIDTH, OVER_LINK]
    assert result.excluded["times_floor"].iloc[0] == pytest.approx(3.0)
    counts = result.counts().set_index(["op_class", "reason"])["rows"].to_dict()
    assert counts == {
        ("all_reduce", OVER_LINK): 1,
        ("gemm", OVER_BANDWIDTH): 1,
        ("gemm", OVER_PEAK): 1,
    }


def test_the_screen_leaves_out_eager_rows_the_host_not_the_launches_held_up() -> None:
    """The L40S table's vLLM 0.24 fp8_block GEMMs ran eagerly: 4 x 1024 x 1024 took
    287.9 us, where its one launch takes ~5 us and its weights read in ~1 us. That time is
    vLLM's Python, which no GEMM or launch term may absorb; a row a few launches slow, or
    a graph-timed row, stays."""
    spec = load_gpu("l40s")
    source = "/x/l40s/gemm_perf.parquet:VLLM==0.24.0:TritonFp8BlockScaledMMKernel"
    block = {"dtype": "fp8", "source_dtype": "fp8_block", "source": source}
    rows = pd.DataFrame(
        [
            {**_gemm("l40s", 4, 1024, 1024, 287.9e-6), **block},
            {**_gemm("l40s", 4, 1024, 1024, 12e-6), **block},  # a few launches' worth
            {**_gemm("l40s", 4, 1024, 1024, 287.9e-6, "fp8"), "source": source},  # graphed
            {**_gemm("l40s", 4, 1024, 1024, 287.9e-6), **block, "source": "mine.csv"},
        ]
    )
    result = screen(rows, spec, None)
    assert result.kept.index.tolist() == [1, 2, 3]
    assert result.excluded["reason"].tolist() == [HOST_BOUND]
    assert result.excluded["times_floor"].iloc[0] > 50


def test_an_operand_set_that_fits_in_l2_may_beat_device_memory() -> None:
    spec = load_gpu("l40s")
    # 16 MiB of operands at 2 TB/s: over GDDR6's 864 GB/s, under the L2's 5 TB/s; and a
    # GeForce card's published GEMMs 2% over its rated peak (its boost clock runs higher).
    m, n, k = 1, 8192, 1024
    seconds = (m * k + k * n + m * n) * 2 / 2e12
    assert screen(pd.DataFrame([_gemm("l40s", m, n, k, seconds)]), spec, None).excluded.empty
    published = load_measurements(CALIBRATIONS / "published" / "rtx-4090-gemm.csv").table
    assert screen(published, load_gpu("rtx-4090"), None).excluded.empty


@needs_shared_data
@pytest.mark.shared_data
def test_the_public_l40s_tables_pass_the_screen_but_host_bound_rows_and_every_row_is_priced() -> (
    None
):
    measurements = load_measurements(from_shared="l40s", shared_data=SHARED_DATA)
    spec = load_gpu("l40s")
    usable = usable_rows(measurements, spec)
    # vLLM 0.24's eager fp8_block GEMMs, host-bound at ~300 us a call, are left out.
    assert usable.unpriced.empty
    counts = usable.screened.counts().set_index(["op_class", "reason"])["rows"].to_dict()
    assert counts == {("gemm", HOST_BOUND): 22_268}
    assert set(usable.screened.excluded["source_dtype"]) == {"fp8_block"}
    assert len(usable.rows) + 22_268 == len(measurements.table) == 266_568
    classes = usable.rows["op_class"].value_counts()
    assert classes["moe"] == 48_317  # the fused-MoE table is read on any GPU's folder too
    nccl = usable.rows[usable.rows["num_gpus"] > 1]
    assert set(nccl["num_gpus"]) == {2, 4, 8} and usable.link.kind == "pcie"
    assert predict_all(nccl, spec).notna().all()


# ------------------------------------------------------------------ --from-shared


def test_from_shared_names_its_option_and_the_source_when_absent(tmp_path: Path) -> None:
    with pytest.raises(
        InfersimError, match=r"--shared-data DIR .*INFERSIM_SHARED_DATA.*aiconfigurator"
    ):
        load_measurements(from_shared="l40s", shared_data=tmp_path / "nowhere")


def test_from_shared_follows_the_environment_variable(tmp_path: Path, monkeypatch) -> None:
    _nccl_folder(tmp_path / "data" / "measured" / "l40s")
    monkeypatch.setenv("INFERSIM_SHARED_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    table = load_measurements(from_shared="l40s").table
    assert set(table["gpu"]) == {"l40s"} and len(table) == 3
    with pytest.raises(InfersimError, match=r"public tables for \['l40s'\]"):
        load_measurements(from_shared="h100-sxm")


# ------------------------------------------------------------------ calibration: auto


def test_auto_takes_the_gpus_own_profile_or_its_nearest_kins() -> None:
    assert nearest_profile(load_gpu("h100-sxm")) == "h100-sxm"
    h200 = choose_calibration(load_gpu("h200-sxm"))
    assert h200.profile == "h100-sxm"
    assert h200.note == "h100-sxm (auto: transfer: fitted on h100-sxm, applied to h200-sxm)"
    shipped = read_profile(calibration_path("h100-sxm")).efficiency
    assert h200.gpu.efficiency == shipped and h200.gpu.sm_count == load_gpu("h200-sxm").sm_count
    # The L40S's full fit transfers to the L4 (Ada, GDDR); the RTX 4090 keeps its own
    # curves-only profile, which transfers to no other chip.
    assert nearest_profile(load_gpu("rtx-4090")) == "rtx-4090"
    assert nearest_profile(load_gpu("l40s")) == "l40s"
    l4 = choose_calibration(load_gpu("l4"))
    assert l4.profile == "l40s" and "transfer: fitted on l40s, applied to l4" in l4.note
    # No measured Blackwell or CDNA3 chip: the datasheet efficiencies, said so.
    for name in ("b200", "mi300x"):
        choice = choose_calibration(load_gpu(name))
        assert choice.profile is None and "no measured" in choice.note
        assert choice.gpu == load_gpu(name)
    off = choose_calibration(load_gpu("h100-sxm"), "none")
    assert off.profile is None and off.gpu == load_gpu("h100-sxm")


def test_a_run_says_which_profile_it_used(make_scenario) -> None:
    from simulator.simulation import simulate

    summary = simulate(make_scenario(hardware={"gpu": "h200-sxm"})).summary()
    assert summary["run"]["calibrations"] == [
        "h200-sxm: h100-sxm (auto: transfer: fitted on h100-sxm, applied to h200-sxm)"
    ]
    off = simulate(make_scenario(hardware={"gpu": "h200-sxm", "calibration": "none"})).summary()
    assert off["run"]["calibrations"] == ["h200-sxm: none (datasheet efficiencies)"]


def test_a_curve_read_at_one_size_gives_numpys_interpolation_exactly() -> None:
    """The engine's scalar path (plain floats) and the array path must give one number."""
    from hardware_models.efficiency import EfficiencyCurve

    rng = np.random.default_rng(0)
    profiles = [read_profile(calibration_path(n)).efficiency for n in ("h100-sxm", "a100-80gb-sxm")]
    curves = [c for p in profiles for c in p.gemm_memory_by_dtype.values()]
    curves += [p.attention_decode_memory for p in profiles] + [EfficiencyCurve.constant(0.7)]
    for curve in curves:
        low, high = np.log(curve.sizes[0]) - 2, np.log(curve.sizes[-1]) + 2
        sizes = np.concatenate([np.exp(rng.uniform(low, high, 2000)), curve.sizes])
        assert [curve.at(float(s)) for s in sizes] == curve.at(sizes).tolist()
        at_one = curve.scalar_at()  # what the attention models read on every step
        assert [at_one(float(s)) for s in sizes] == curve.at(sizes).tolist()


def test_collective_fits_apply_only_over_the_link_they_were_fitted_over(make_scenario) -> None:
    """The L40S profile's all-reduce fits (0.15 of the link at 8 GPUs, on top of its PCIe
    tree's share) would price a node without that tree ~2.6x slow: over another link
    the datasheet link model prices collectives, and the run says so."""
    l40s = load_gpu("l40s", calibration="l40s")
    tree = load_node("l40s-8x-pcie").intra_node_link
    assert l40s.efficiency.link_for(8, tree).efficiency == pytest.approx(
        l40s.efficiency.collective_by_gpus[8].efficiency
    )
    bare = tree.model_copy(update={"fabric": None})
    assert l40s.efficiency.link_for(8, bare) == bare
    assert l40s.efficiency.links_fitted_elsewhere(bare) == [2, 4, 8]
    assert l40s.efficiency.links_fitted_elsewhere(tree) == []
    node = load_node("l40s-8x-pcie").model_copy(
        update={"name": "bare-pcie", "intra_node_link": bare}
    )
    from simulator.build import _warn_links_fitted_elsewhere

    with pytest.warns(InfersimWarning, match=r"collective fits \(2, 4, 8 GPUs\).*bare-pcie"):
        _warn_links_fitted_elsewhere(l40s, node, "l40s")
