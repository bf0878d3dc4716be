"""Hardware presets: derived peaks match the datasheets, every figure is sourced, and bad
input fails with an error that names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.collectives import collective_cost
from hardware_models.dtypes import Dtype, parse_dtype
from hardware_models.errors import InfersimError
from hardware_models.presets import PRESET_DIR, list_gpus, list_nodes, load_gpu, load_node

REPO = Path(__file__).resolve().parents[1]
HYPOTHETICAL = REPO / "scenarios" / "hardware" / "hypothetical-accelerator.yaml"
GPU_DIR = PRESET_DIR / "gpus"
NODE_DIR = PRESET_DIR / "nodes"

REQUIRED_GPUS = {
    "h100-sxm",
    "a100-40gb-sxm",
    "a100-80gb-sxm",
    "h100-pcie",
    "h200-sxm",
    "b200",
    "l40s",
    "l4",
    "rtx-4090",
    "mi300x",
}
REQUIRED_NODES = {
    "dgx-a100",
    "dgx-h100",
    "hgx-h200",
    "hgx-b200",
    "l40s-8x-pcie",
    "rtx4090-workstation",
    "mi300x-8x",
}
SOURCED_FIELDS = [
    "sm_count",
    "tensor_cores_per_sm",
    "boost_clock_mhz",
    "tensor_flops_per_core_per_clock",
    "fp32_flops_per_sm_per_clock",
    "register_file_kb_per_sm",
    "shared_memory_kb_per_sm",
    "l2",
    "memory",
    "pcie",
    "power",
    "datasheet_tflops",
]
NODE_SOURCED_FIELDS = [
    "gpu",
    "gpus_per_node",
    "intra_node_fabric",
    "intra_node_link",
    "nics_per_node",
    "nic_bandwidth_gbps",
    "inter_node_link",
    "host_memory_gb",
]
TOLERANCE = 0.02


def _raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _gpu_files() -> list[Path]:
    return sorted(GPU_DIR.glob("*.yaml"))


def _all_gpu_files() -> list[Path]:
    return [*_gpu_files(), HYPOTHETICAL]


def _peak_cases() -> list:
    """(file, datasheet key) pairs, read without validation so that a broken preset fails
    its own tests instead of the collection of the whole module."""
    cases = []
    for path in _all_gpu_files():
        for key in _raw(path).get("datasheet_tflops", {}):
            cases.append(pytest.param(path, key, id=f"{path.stem}-{key}"))
    return cases


def _dtype_of(key: str) -> Dtype:
    return Dtype.FP32 if key == "fp32_cuda" else parse_dtype(key)


# ---- the preset set ----------------------------------------------------------------


def test_required_gpu_presets_exist():
    missing = REQUIRED_GPUS - set(list_gpus())
    assert not missing, f"missing GPU presets: {sorted(missing)}"


def test_required_node_presets_exist():
    missing = REQUIRED_NODES - set(list_nodes())
    assert not missing, f"missing node presets: {sorted(missing)}"


@pytest.mark.parametrize("path", _gpu_files(), ids=lambda p: p.stem)
def test_gpu_preset_name_matches_file(path: Path):
    spec = load_gpu(path.stem)
    assert spec.name == path.stem


# ---- derived peaks vs datasheet ----------------------------------------------------


@pytest.mark.parametrize(("path", "key"), _peak_cases())
def test_derived_peak_matches_datasheet(path: Path, key: str):
    spec = load_gpu(path)
    derived = spec.peak_flops(_dtype_of(key)) / 1e12
    quoted = spec.datasheet_tflops[key]
    rel = abs(derived - quoted) / quoted
    assert rel <= TOLERANCE, (
        f"{spec.name} {key}: derived {derived:.1f} vs datasheet {quoted:.1f} "
        f"({rel:.1%} off, limit {TOLERANCE:.0%})"
    )


@pytest.mark.parametrize("path", _all_gpu_files(), ids=lambda p: p.stem)
def test_every_dtype_has_a_datasheet_figure(path: Path):
    """A tensor rate with nothing to check it against would go unverified."""
    spec = load_gpu(path)
    expected = {d.value for d in spec.tensor_flops_per_core_per_clock} | {"fp32_cuda"}
    assert set(spec.datasheet_tflops) == expected


def test_peak_check_catches_a_wrong_rate():
    """The 2% check is not vacuous: a preset with a doubled tensor rate fails it."""
    spec = load_gpu("h100-sxm")
    rates = dict(spec.tensor_flops_per_core_per_clock)
    rates[Dtype.BF16] *= 2
    wrong = spec.model_copy(update={"tensor_flops_per_core_per_clock": rates})
    derived = wrong.peak_flops(Dtype.BF16) / 1e12
    assert abs(derived - spec.datasheet_tflops["bf16"]) / spec.datasheet_tflops["bf16"] > 0.5


# ---- sources -----------------------------------------------------------------------


@pytest.mark.parametrize("path", _all_gpu_files(), ids=lambda p: p.stem)
def test_every_figure_has_a_source(path: Path):
    spec = load_gpu(path)
    needed = list(SOURCED_FIELDS)
    if spec.nvlink is not None:
        needed.append("nvlink")
    if spec.tensor_clock_mhz is not None:
        needed.append("tensor_clock_mhz")
    missing = [f for f in needed if not spec.sources.get(f, "").strip()]
    assert not missing, f"{path.name}: no source for {missing}"
    unknown = set(spec.sources) - set(AcceleratorSpec.model_fields)
    assert not unknown, f"{path.name}: sources for fields that do not exist: {sorted(unknown)}"
    assert spec.price.source.strip()


@pytest.mark.parametrize("path", _gpu_files(), ids=lambda p: p.stem)
def test_price_is_dated_2026(path: Path):
    assert load_gpu(path).price.date.startswith("2026")


@pytest.mark.parametrize("name", sorted(REQUIRED_NODES))
def test_every_node_figure_has_a_source(name: str):
    node = load_node(name)
    missing = [f for f in NODE_SOURCED_FIELDS if not node.sources.get(f, "").strip()]
    assert not missing, f"{name}: no source for {missing}"


# ---- facts the presets must get right ----------------------------------------------


@pytest.mark.parametrize("name", ["l40s", "l4", "rtx-4090", "mi300x"])
def test_no_nvlink_where_there_is_none(name: str):
    assert load_gpu(name).nvlink is None


@pytest.mark.parametrize("name", ["a100-40gb-sxm", "a100-80gb-sxm"])
def test_ampere_has_no_fp8(name: str):
    spec = load_gpu(name)
    assert not spec.supports(Dtype.FP8)
    with pytest.raises(InfersimError, match="fp8"):
        spec.peak_flops(Dtype.FP8)


def test_only_blackwell_has_fp4():
    fp4 = [n for n in list_gpus() if load_gpu(n).supports(Dtype.FP4)]
    assert fp4 == ["b200", "rtx-pro-6000"]
    assert {load_gpu(n).architecture for n in fp4} == {"Blackwell"}


def test_a_blackwell_gpu_must_say_which_blackwell_it_is():
    raw = _raw(GPU_DIR / "b200.yaml")
    del raw["compute_capability"], raw["sources"]["compute_capability"]
    with pytest.raises(ValueError, match="compute_capability is required for a Blackwell"):
        AcceleratorSpec(**raw)


def test_a_yaml_number_is_read_as_the_compute_capability(tmp_path):
    """YAML reads `compute_capability: 10.0` as a float: taken as "10.0", not refused."""
    raw = _raw(GPU_DIR / "b200.yaml")
    raw["compute_capability"] = 10.0
    assert AcceleratorSpec(**raw).compute_capability == "10.0"
    raw["compute_capability"] = 12
    assert AcceleratorSpec(**raw).compute_capability == "12.0"


def test_the_capability_major_tells_the_gemm_machines_apart():
    """One parse of the major serves the Blackwell check, gemm_family, the MXFP4 layout
    and the MLA block size; a preset stating no capability has none."""
    assert load_gpu("b200").capability_major == 10
    assert load_gpu("rtx-pro-6000").capability_major == 12
    assert load_gpu("h100-sxm").compute_capability is None
    assert load_gpu("h100-sxm").capability_major is None


def test_a_blackwell_gpu_with_another_architectures_capability_is_refused(tmp_path):
    """A Blackwell entry saying 9.0 (Hopper's) was priced as sm_100 without a word."""
    raw = _raw(GPU_DIR / "rtx-pro-6000.yaml")
    raw["compute_capability"] = "9.0"
    path = tmp_path / "bw.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(InfersimError) as err:
        load_gpu(path)
    message = str(err.value)
    assert "compute_capability 9.0 is not a Blackwell one: 10.x or 11.x" in message
    assert "12.x" in message and "\n" not in message.strip()


def test_memory_figures():
    assert load_gpu("a100-40gb-sxm").memory.capacity_gb == 40
    assert load_gpu("a100-80gb-sxm").memory.capacity_gb == 80
    assert load_gpu("h200-sxm").memory.capacity_gb == 141
    assert load_gpu("mi300x").memory.capacity_gb == 192
    assert load_gpu("rtx-4090").memory.kind == "GDDR6X"
    # same chip, more and faster memory
    assert load_gpu("h200-sxm").memory_bandwidth > load_gpu("h100-sxm").memory_bandwidth


# ---- nodes -------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(NODE_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_node_loads_and_references_a_gpu_preset(path: Path):
    node = load_node(path.stem)
    assert node.name == path.stem
    assert node.gpu in list_gpus(), f"{path.name}: gpu {node.gpu!r} is not a preset"
    load_gpu(node.gpu)


@pytest.mark.parametrize("path", sorted(NODE_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_node_links_are_physically_consistent(path: Path):
    node = load_node(path.stem)
    gpu = load_gpu(node.gpu)
    link = node.intra_node_link
    if node.gpus_per_node == 1:
        assert node.intra_node_fabric == "none" and link is None
    else:
        assert link is not None and node.intra_node_fabric != "none"
        if link.kind in ("nvlink", "nvswitch"):
            assert gpu.nvlink is not None
            assert link.bandwidth_gbps <= gpu.nvlink.unidirectional_gbps * 1.001
        if link.kind == "pcie":
            assert link.bandwidth_gbps <= gpu.pcie.unidirectional_gbps * 1.001
        if node.intra_node_fabric == "nvswitch":
            assert link.kind == "nvswitch"
    if node.inter_node_link is not None:
        per_gpu_nic = node.nics_per_node * node.nic_bandwidth_gbps / node.gpus_per_node
        assert node.inter_node_link.bandwidth_gbps <= per_gpu_nic * 1.001


def test_node_fabric_ordering():
    """NVSwitch beats PCIe on bandwidth and latency; B200 doubles H100's NVLink."""
    h100 = load_node("dgx-h100").intra_node_link
    b200 = load_node("hgx-b200").intra_node_link
    pcie = load_node("l40s-8x-pcie").intra_node_link
    assert b200.bandwidth_gbps == pytest.approx(2 * h100.bandwidth_gbps)
    assert pcie.bandwidth_gbps < h100.bandwidth_gbps
    for size in (1024, 2**28):  # a small all-reduce (latency) and a large one (bandwidth)
        over = [collective_cost("all_reduce", size, 8, link).seconds for link in (pcie, h100)]
        assert over[0] > over[1]
    assert load_node("dgx-h100").host_memory_gb >= 2000
    assert load_node("mi300x-8x").intra_node_fabric == "infinity_fabric"


# ---- a user's own accelerator -------------------------------------------------------


def test_hypothetical_accelerator_loads_by_path():
    spec = load_gpu(HYPOTHETICAL)
    assert spec.name == "acme-x1"
    assert "hypothetical" in spec.display_name.lower()
    assert spec.name not in list_gpus()
    assert spec.peak_flops(Dtype.BF16) > 0


def test_hypothetical_accelerator_loads_by_relative_path(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    spec = load_gpu("scenarios/hardware/hypothetical-accelerator.yaml")
    assert spec.name == "acme-x1"


# ---- bad input ----------------------------------------------------------------------


def _write_bad(tmp_path: Path, mutate) -> Path:
    data = _raw(GPU_DIR / "h100-sxm.yaml")
    mutate(data)
    path = tmp_path / "bad-gpu.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _set(key, value):
    def mutate(d):
        d[key] = value

    return mutate


def _drop(key):
    def mutate(d):
        del d[key]

    return mutate


def _set_nested(outer, key, value):
    def mutate(d):
        d[outer][key] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(_set("sm_count", -4), "sm_count", id="negative-sm-count"),
        pytest.param(_set("frobnication_level", 3), "frobnication_level", id="unknown-field"),
        pytest.param(_drop("memory"), "memory", id="missing-memory"),
        pytest.param(
            _set_nested("memory", "bandwidth_gbps", 0), "memory.bandwidth_gbps", id="zero-bandwidth"
        ),
        pytest.param(_set_nested("power", "idle_w", 900), "idle_w", id="idle-above-tdp"),
        pytest.param(_set_nested("power", "busy_w", 690), "busy_w", id="busy-above-tdp"),
        pytest.param(
            _set_nested("power", "dram_pj_per_bit", 0), "dram_pj_per_bit", id="zero-dram-energy"
        ),
        pytest.param(
            _set_nested("datasheet_tflops", "fp4", 5000), "fp4", id="datasheet-dtype-without-rate"
        ),
        pytest.param(
            _set_nested("tensor_flops_per_core_per_clock", "fp9", 1), "fp9", id="unknown-dtype"
        ),
    ],
)
def test_bad_preset_names_file_and_field(tmp_path: Path, mutate, field: str):
    path = _write_bad(tmp_path, mutate)
    with pytest.raises(InfersimError) as info:
        load_gpu(path)
    message = str(info.value)
    assert "bad-gpu.yaml" in message
    assert field in message


def test_bad_node_names_file_and_field(tmp_path: Path):
    data = _raw(NODE_DIR / "dgx-h100.yaml")
    data["intra_node_link"]["kind"] = "carrier-pigeon"
    path = tmp_path / "bad-node.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(InfersimError, match=r"bad-node\.yaml.*intra_node_link\.kind"):
        load_node(path)


def test_missing_file_is_an_infersim_error(tmp_path: Path):
    with pytest.raises(InfersimError, match=r"no-such-chip\.yaml"):
        load_gpu(tmp_path / "no-such-chip.yaml")


def test_unknown_gpu_name_suggests_the_closest():
    with pytest.raises(InfersimError, match=r"did you mean 'h100-sxm'") as info:
        load_gpu("h100-sxn")
    assert "unknown gpu 'h100-sxn'" in str(info.value)


def test_unknown_node_name_suggests_the_closest():
    with pytest.raises(InfersimError, match=r"did you mean 'dgx-h100'"):
        load_node("dgx-h10")


def test_a_loaded_gpus_tables_refuse_changes_in_place():
    """A loaded preset is one object shared by every later load and keyed on by the
    cost caches: its tensor rates and its profile's tables refuse an edit in place
    (which served a doubled peak to every later run, and old costs from the caches)."""
    gpu = load_gpu("h100-sxm", calibration="h100-sxm")
    with pytest.raises(
        TypeError,
        match=r"AcceleratorSpec.tensor_flops_per_core_per_clock is "
        r"read-only .* model_copy\(update=\{'tensor_flops_per_core_per_clock'",
    ):
        gpu.tensor_flops_per_core_per_clock[Dtype.BF16] *= 2
    table = gpu.efficiency.gemm_compute_by_dtype
    assert table, "the shipped h100-sxm profile has per-dtype GEMM curves"
    for change in (lambda: table.update({}), table.clear, lambda: table.pop("fp8"),
                   lambda: table.__delitem__("fp8")):  # fmt: skip
        with pytest.raises(
            TypeError, match=r"EfficiencyProfile\.gemm_compute_by_dtype is read-only"
        ):
            change()
    with pytest.raises(TypeError, match="does not support item assignment"):
        gpu.efficiency.gemm_compute.values[0] = 1.0  # type: ignore[index]
    assert load_gpu("h100-sxm").peak_flops(Dtype.BF16) == gpu.peak_flops(Dtype.BF16)


def test_a_read_only_gpu_round_trips_as_before(tmp_path):
    """Its tables serialise as dicts: model_dump, JSON, a YAML file, pickling and a deep
    copy give the same chip back, still read-only."""
    import copy
    import pickle

    gpu = load_gpu("h100-sxm", calibration="h100-sxm")
    dumped = gpu.model_dump(mode="json")
    assert type(dumped["tensor_flops_per_core_per_clock"]) is dict
    path = tmp_path / "h100.yaml"
    path.write_text(yaml.safe_dump(dumped))
    copies = [
        AcceleratorSpec.model_validate(gpu.model_dump()),
        AcceleratorSpec.model_validate_json(gpu.model_dump_json()),
        load_gpu(path),
        pickle.loads(pickle.dumps(gpu)),
        copy.deepcopy(gpu),
        gpu.model_copy(deep=True),
    ]
    for other in copies:
        assert other == gpu
        if other.efficiency.model_dump_json() == gpu.efficiency.model_dump_json():
            assert hash(other) == hash(gpu)  # the YAML file lists the profile's keys sorted
        with pytest.raises(TypeError, match="read-only"):
            other.efficiency.gemm_compute_by_dtype["bf16"] = None


def test_a_copy_with_changed_tables_is_read_only_too():
    """model_copy skips validation: a copy given a new dict held it plain, so doubling a
    rate in place left the copy's memoised hash (and the costs cached on it) stale."""
    from hardware_models.gemm import gemm_cost

    gpu = load_gpu("h100-sxm")
    rates = dict(gpu.tensor_flops_per_core_per_clock)
    copy = gpu.model_copy(update={"tensor_flops_per_core_per_clock": rates})
    profile = gpu.efficiency.model_copy(update={"gemm_compute_by_dtype": {}})
    assert gemm_cost(copy, 8192, 8192, 8192).seconds == gemm_cost(gpu, 8192, 8192, 8192).seconds
    with pytest.raises(TypeError, match=r"AcceleratorSpec.tensor_flops_per_core_per_clock"):
        copy.tensor_flops_per_core_per_clock[Dtype.BF16] *= 2
    with pytest.raises(TypeError, match=r"EfficiencyProfile.gemm_compute_by_dtype"):
        profile.gemm_compute_by_dtype["bf16"] = None
    rates[Dtype.BF16] *= 2  # the caller's own dict stays theirs to change
    doubled = gpu.model_copy(update={"tensor_flops_per_core_per_clock": rates})
    assert hash(doubled) != hash(copy)
    assert gemm_cost(doubled, 8192, 8192, 8192).seconds < gemm_cost(copy, 8192, 8192, 8192).seconds


def test_a_gpus_hash_covers_its_tables():
    """Two chips apart only in a tensor rate (or any other field) hash apart, so caches
    keyed on the chip do not compare them field by field."""
    gpu = load_gpu("h100-sxm")
    data = gpu.model_dump()
    data["tensor_flops_per_core_per_clock"][Dtype.FP8] *= 1.01
    data["datasheet_tflops"]["fp8"] *= 1.01
    assert hash(AcceleratorSpec.model_validate(data)) != hash(gpu)
    faster_l2 = gpu.model_copy(update={"l2": gpu.l2.model_copy(update={"size_mb": 60.0})})
    assert hash(faster_l2) != hash(gpu)
