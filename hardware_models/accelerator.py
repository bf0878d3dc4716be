"""A structural description of one accelerator: peaks are derived, not typed in.

Units are in the field names (`_mhz`, `_gbps` = GB/s, `_gb` = GB of 1e9 bytes unless
the field says GiB). Every preset figure carries its source in `sources`.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hardware_models.dtypes import Dtype
from hardware_models.efficiency import EfficiencyProfile, profile_json
from hardware_models.errors import InfersimError
from hardware_models.object_memo import per_object
from hardware_models.read_only import ReadOnlyModel

_STRICT = ConfigDict(extra="forbid", frozen=True)

# The architecture names the pricing knows (block_scaling.gemm_family, custom all-reduce,
# `auto` calibration), any case; `Other` for a chip of none of them (priced like Hopper:
# overlapped stores, no shared-memory cap on small tiles).
ARCHITECTURES = (
    "Volta",
    "Turing",
    "Ampere",
    "Ada",
    "Hopper",
    "Blackwell",
    "CDNA2",
    "CDNA3",
    "CDNA4",
    "cpu",
    "Other",
)
# A derived peak further than this from the datasheet's is a wrong figure (the shipped
# presets agree within 2%; a custom chip's datasheet may round or quote another clock).
DATASHEET_TOLERANCE = 0.10
# Plausible ranges of the figures a unit slip moves by 1000x: (field, low, high, unit,
# the unit a value below `low` was likely typed in, the one above `high`). A low of None
# is the memory kind's bandwidth floor (_BANDWIDTH_FLOOR_GBPS).
_RANGES = (
    ("boost_clock_mhz", 100.0, 10_000.0, "MHz", "GHz", "kHz"),
    ("tensor_clock_mhz", 100.0, 10_000.0, "MHz", "GHz", "kHz"),
    ("memory.bandwidth_gbps", None, 200_000.0, "GB/s", "TB/s", "MB/s"),
    ("l2.bandwidth_gbps", None, 1_000_000.0, "GB/s", "TB/s", "MB/s"),
    ("memory.capacity_gb", 0.5, 100_000.0, "GB", "TB", "MB"),
)
# The least device-memory bandwidth a chip of each memory kind has (prefix of
# memory.kind, GB/s), so that a figure typed in TB/s (an HBM3e chip's 8 for 8000) is
# caught: one HBM stack gives over 100 GB/s (HBM1: 128), the slowest GDDR5 boards ~40
# (GT 1030: 48), LPDDR4 SoCs ~20 (Jetson Nano: 25.6). L2 is faster than the memory
# behind it, so the same floor holds for l2.bandwidth_gbps. Other kinds (DDR): 5.
_BANDWIDTH_FLOOR_GBPS = {"HBM": 100.0, "GDDR": 40.0, "LPDDR": 20.0}
_DEFAULT_BANDWIDTH_FLOOR_GBPS = 5.0

# PCIe usable bandwidth per lane per direction in GB/s (after line encoding).
PCIE_GBPS_PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


# Share of the datasheet capacity CUDA does not hand out (the driver's reserve, ECC and
# row-remapping pages), for a GPU whose preset has no public `cuda_visible_gib`: the
# largest seen on its siblings with one (presets/gpus/*.yaml). HBM: A100 40GB 39.50 of
# 40 GiB (1.25%), H100 SXM 79.22 of 80 (0.98%), A100 80GB 79.25 of 80 (0.94%), H200
# 139.72 of 141 (0.91%), B200 178.36 of 180 (0.91%); GDDR: RTX 4090 23.52 of 24 (2.0%).
_CUDA_RESERVED_SHARE = {"HBM": 0.0125, "GDDR": 0.020}


class MemorySpec(BaseModel):
    model_config = _STRICT
    kind: str = Field(description="HBM2e, HBM3, HBM3e, GDDR6, GDDR6X, ...")
    capacity_gb: float = Field(
        gt=0,
        description="device memory as marketed ('80 GB'), read as GiB: what the datasheet "
        "sells, not what the board carries (an H200 has 144 GiB of HBM3e, sold as 141 GB) "
        "nor what CUDA hands out (cuda_visible_gib)",
    )
    cuda_visible_gib: float | None = Field(
        default=None,
        gt=0,
        description="device memory CUDA reports, GiB (torch.cuda.mem_get_info's total, as "
        "vLLM logs it as total_gpu_memory; nvidia-smi's total less the driver's reserve): "
        "what gpu_memory_utilization takes a share of. None: capacity_gb less the largest "
        "reserved share seen on siblings with a public figure (HBM 1.25%, GDDR 2.0%)",
    )
    bandwidth_gbps: float = Field(gt=0, description="peak device-memory bandwidth, GB/s")

    @model_validator(mode="after")
    def _visible_within_capacity(self) -> MemorySpec:
        if self.cuda_visible_gib is not None and self.cuda_visible_gib > self.capacity_gb:
            raise ValueError(
                f"memory.cuda_visible_gib {self.cuda_visible_gib} exceeds capacity_gb "
                f"{self.capacity_gb}: CUDA never sees more than the datasheet capacity"
            )
        return self

    @property
    def visible_gib(self) -> float:
        """GiB CUDA hands out: the preset's public figure, or the siblings' rule."""
        if self.cuda_visible_gib is not None:
            return self.cuda_visible_gib
        family = "GDDR" if self.kind.upper().startswith("GDDR") else "HBM"
        return self.capacity_gb * (1 - _CUDA_RESERVED_SHARE[family])


class L2Spec(BaseModel):
    model_config = _STRICT
    size_mb: float = Field(gt=0, description="L2 (last-level) cache size, MB")
    bandwidth_gbps: float = Field(gt=0, description="L2 read bandwidth, GB/s")
    partitions: int = Field(
        default=1,
        ge=1,
        le=8,
        description="parts the L2 is split into, each caching what the SMs wired to it "
        "read (A100 and H100 whitepapers: two, joined by a crossbar; B200: one per die; "
        "Ada: one). It decides whether a benchmark loop that re-runs the same GEMMs keeps "
        "them warm (gemm.warm_l2_bytes): a single L2 does, up to its size (the L40S's "
        "table); a partitioned one is priced cold (the H100's and A100's tables never "
        "beat their HBM rate)",
    )


class NVLinkSpec(BaseModel):
    model_config = _STRICT
    generation: int = Field(ge=1, le=6)
    links: int = Field(ge=1)
    per_link_bandwidth_gbps: float = Field(
        gt=0, description="per link, both directions together (NVIDIA's convention), GB/s"
    )

    @property
    def unidirectional_gbps(self) -> float:
        """Bandwidth one GPU can send at, all links together."""
        return self.links * self.per_link_bandwidth_gbps / 2


class PCIeSpec(BaseModel):
    model_config = _STRICT
    generation: Literal[3, 4, 5, 6]
    lanes: int = Field(ge=1, le=32)

    @property
    def unidirectional_gbps(self) -> float:
        return PCIE_GBPS_PER_LANE[self.generation] * self.lanes


class PowerSpec(BaseModel):
    model_config = _STRICT
    tdp_w: float = Field(gt=0, description="board power limit, W")
    idle_w: float = Field(ge=0, description="power when idle with a model loaded, W")
    busy_w: float | None = Field(
        default=None,
        ge=0,
        description="power above idle_w while any kernel runs, whatever it computes (clocks "
        "at boost, SMs powered), W. None: idle_w again (hardware_models.power.BUSY_FROM_IDLE)",
    )
    tensor_pj_per_flop: float | None = Field(
        default=None,
        gt=0,
        description="energy per dense 16-bit tensor FLOP, pJ (a lower precision's FLOP costs "
        "this x 16-bit peak / its peak). None: tdp_w / the 16-bit dense peak",
    )
    dram_pj_per_bit: float | None = Field(
        default=None,
        gt=0,
        description="device-memory energy per bit read or written, pJ. None: the memory "
        "kind's default (hardware_models.power.DRAM_PJ_PER_BIT), and the run notes it",
    )

    @model_validator(mode="after")
    def _idle_below_tdp(self) -> PowerSpec:
        if self.idle_w >= self.tdp_w:
            raise ValueError(f"idle_w ({self.idle_w}) must be below tdp_w ({self.tdp_w})")
        if self.busy_w is not None and self.idle_w + self.busy_w > self.tdp_w:
            raise ValueError(
                f"idle_w + busy_w ({self.idle_w + self.busy_w:g}) must be at most tdp_w "
                f"({self.tdp_w:g})"
            )
        return self


class PriceSpec(BaseModel):
    model_config = _STRICT
    usd_per_hour: float = Field(gt=0, description="on-demand price per GPU-hour, USD")
    source: str = Field(min_length=1)
    date: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$", description="YYYY-MM or YYYY-MM-DD")


# Compute capability majors of Blackwell chips: 10 and 11 datacenter, 12 workstation.
BLACKWELL_MAJORS = frozenset({10, 11, 12})


class AcceleratorSpec(ReadOnlyModel):
    """What one chip can do. Validated strictly: an unknown or missing field is an error."""

    model_config = _STRICT

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$", description="preset id")
    display_name: str
    vendor: Literal["nvidia", "amd", "intel", "google", "other"]
    architecture: str = Field(
        description="Ampere, Ada, Hopper, Blackwell, CDNA3, ... It prices GEMMs: on Volta, "
        "Turing, Ampere, Ada and workstation Blackwell (any case) output stores follow the k "
        "loops (GemmKernel.serial_epilogue) and each warp loads its operands from shared "
        "memory, which caps small tiles; any other name overlaps the stores and has no such "
        "cap, as Hopper's kernels do (hardware_models.block_scaling.gemm_family)"
    )
    compute_capability: str | None = Field(
        default=None,
        pattern=r"^\d{1,2}\.\d{1,2}$",
        description="CUDA compute capability (major.minor; a YAML number such as 10.0 is "
        "read as text), required for Blackwell, which is two GEMM machines: 10.x or 11.x "
        "(B200, GB200, B300: tcgen05 MMAs, tensor memory, 2-SM UMMA) and 12.x (RTX 50, RTX "
        "PRO: warp-level MMAs like Ada)",
    )
    sm_count: int = Field(gt=0, description="streaming multiprocessors (NVIDIA) or CUs (AMD)")

    @field_validator("architecture", mode="before")
    @classmethod
    def _known_architecture(cls, value: object) -> object:
        """One of ARCHITECTURES in any case, spelled as there: `ada` and `Ada` must price
        alike and find the same `auto` profile."""
        if not isinstance(value, str):
            return value
        known = {name.lower(): name for name in ARCHITECTURES}
        found = known.get(value.strip().lower())
        if found is None:
            raise ValueError(
                f"architecture {value!r} is not one of {', '.join(ARCHITECTURES)} (any case; "
                "Other for a chip of none of them)"
            )
        return found

    @field_validator("compute_capability", mode="before")
    @classmethod
    def _capability_as_text(cls, value: object) -> object:
        """YAML reads `compute_capability: 10.0` as a number: take it as "10.0"."""
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return f"{value}.0"
        if isinstance(value, float):
            return str(value)
        return value

    tensor_cores_per_sm: int = Field(gt=0)
    boost_clock_mhz: float = Field(gt=0, description="max boost clock, MHz")
    tensor_clock_mhz: float | None = Field(
        default=None,
        gt=0,
        description="clock the datasheet tensor peaks are quoted at, when it differs from "
        "boost_clock_mhz (H100 SXM: 1830 vs 1980 MHz)",
    )
    tensor_flops_per_core_per_clock: dict[Dtype, float] = Field(
        description="dense (no sparsity) FLOPs (or int ops) per tensor core per clock, by dtype"
    )
    fp32_flops_per_sm_per_clock: float = Field(
        gt=0, description="CUDA-core FP32 FLOPs per SM per clock (2 per FMA lane)"
    )
    register_file_kb_per_sm: float = Field(gt=0)
    shared_memory_kb_per_sm: float = Field(gt=0, description="max shared memory per SM, KB")
    shared_memory_bytes_per_clock_per_sm: float = Field(
        default=128.0,
        gt=0,
        allow_inf_nan=False,
        description="shared-memory bandwidth per SM per clock: 32 banks of 4 bytes on NVIDIA "
        "GPUs since Volta (CUDA C Programming Guide, shared memory). Before Hopper it caps "
        "small GEMM tiles, whose warps each load their own operand fragments from it",
    )
    l2: L2Spec
    memory: MemorySpec
    nvlink: NVLinkSpec | None = None
    pcie: PCIeSpec
    power: PowerSpec
    price: PriceSpec
    datasheet_tflops: dict[str, float] = Field(
        description="the vendor's dense peaks (TFLOPS or TOPS) by dtype, plus 'fp32_cuda' for "
        "the CUDA-core rate; used to check the structural derivation"
    )
    efficiency: EfficiencyProfile = Field(default_factory=EfficiencyProfile)
    sources: dict[str, str] = Field(
        default_factory=dict, description="field name -> where the figure comes from"
    )

    @model_validator(mode="after")
    def _check_datasheet_keys(self) -> AcceleratorSpec:
        allowed = {d.value for d in self.tensor_flops_per_core_per_clock} | {"fp32_cuda"}
        unknown = set(self.datasheet_tflops) - allowed
        if unknown:
            raise ValueError(
                f"datasheet_tflops has {sorted(unknown)} with no tensor rate; allowed: "
                f"{sorted(allowed)}"
            )
        for dtype, rate in self.tensor_flops_per_core_per_clock.items():
            if rate <= 0:
                raise ValueError(f"tensor_flops_per_core_per_clock.{dtype.value} must be > 0")
        if self.architecture.strip().lower() == "blackwell":
            self._check_blackwell_capability()
        self._check_units()
        self._check_derived_peaks()
        return self

    def _check_units(self) -> None:
        """A figure 1000x outside what any chip has is typed in another unit."""
        kind = self.memory.kind.strip().upper()
        floor = next(
            (low for prefix, low in _BANDWIDTH_FLOOR_GBPS.items() if kind.startswith(prefix)),
            _DEFAULT_BANDWIDTH_FLOOR_GBPS,
        )
        for field, low, high, unit, below, above in _RANGES:
            head, _, tail = field.partition(".")
            value = getattr(getattr(self, head), tail) if tail else getattr(self, head)
            of_kind = f" for {self.memory.kind} memory" if low is None else ""
            low = floor if low is None else low
            if value is None or low <= value <= high:
                continue
            likely = below if value < low else above
            raise ValueError(
                f"{field} {value:g} is outside {low:g}-{high:g} {unit}{of_kind}: was it "
                f"typed in {likely}? (the unit is in the field name: {unit})"
            )

    def _check_derived_peaks(self) -> None:
        """Each datasheet peak against the one derived from the structure: apart by more
        than DATASHEET_TOLERANCE, a rate, clock or count (or the figure) is wrong."""
        for key, quoted in self.datasheet_tflops.items():
            dtype = Dtype.FP32 if key == "fp32_cuda" else Dtype(key)
            derived = self.peak_flops(dtype) / 1e12
            off = derived / quoted - 1 if quoted > 0 else float("inf")
            if abs(off) <= DATASHEET_TOLERANCE:
                continue
            rate = (
                "fp32_flops_per_sm_per_clock"
                if key == "fp32_cuda"
                else f"tensor_flops_per_core_per_clock.{key}"
            )
            unit = " (TFLOPS expected, not GFLOPS)" if off < -0.99 else ""
            raise ValueError(
                f"datasheet_tflops.{key} {quoted:g}{unit} vs {derived:.4g} derived from "
                f"sm_count x tensor_cores_per_sm x {rate} x the clock: {off:+.0%}, "
                f"beyond {DATASHEET_TOLERANCE:.0%}; one of them is wrong (set tensor_clock_mhz "
                "when the vendor quotes its peaks at another clock)"
            )

    def _check_blackwell_capability(self) -> None:
        """Blackwell is two GEMM machines told apart by the major (gemm_family): a
        capability of another architecture would silently price the wrong one."""
        allowed = (
            "10.x or 11.x (datacenter: B200, GB200, B300) or 12.x (RTX 50 series, RTX PRO "
            "Blackwell), whose GEMM kernels differ"
        )
        if self.compute_capability is None:
            raise ValueError(f"compute_capability is required for a Blackwell GPU: {allowed}")
        if self.capability_major not in BLACKWELL_MAJORS:
            raise ValueError(
                f"compute_capability {self.compute_capability} is not a Blackwell one: {allowed}"
            )

    @property
    def capability_major(self) -> int | None:
        """The compute capability's major (10 of "10.0"): what tells kernel families and
        Blackwell's two GEMM machines apart. None where the preset states no capability."""
        if self.compute_capability is None:
            return None
        return int(self.compute_capability.split(".")[0])

    def __hash__(self) -> int:
        # Consistent with field equality; lets operator costs be memoised per chip. Every
        # field is part of it, the efficiency's content too: a fit prices hundreds of
        # profiles of one chip, which shared one hash, so every cache lookup compared them
        # field by field. Worked out once per object (its fields never change: read_only).
        return per_object(self, "hash", _content_hash)

    # ---- derived peaks -------------------------------------------------------------
    def supports(self, dtype: Dtype) -> bool:
        return dtype == Dtype.FP32 or dtype in self.tensor_flops_per_core_per_clock

    def peak_flops(self, dtype: Dtype) -> float:
        """Dense peak in FLOP/s for a matrix multiply in `dtype` (fp32 = CUDA cores)."""
        if dtype == Dtype.FP32:
            return self.sm_count * self.fp32_flops_per_sm_per_clock * self.boost_clock_mhz * 1e6
        rate = self.tensor_flops_per_core_per_clock.get(dtype)
        if rate is None:
            supported = ", ".join(d.value for d in self.tensor_flops_per_core_per_clock)
            raise InfersimError(
                f"{self.name} has no tensor-core support for {dtype.value}; supported: "
                f"{supported}, fp32"
            )
        clock = self.tensor_clock_mhz or self.boost_clock_mhz
        return self.sm_count * self.tensor_cores_per_sm * rate * clock * 1e6

    @property
    def shared_memory_bandwidth_per_sm(self) -> float:
        """Bytes/s one SM's shared memory serves, at the clock the tensor peaks use."""
        clock = self.tensor_clock_mhz or self.boost_clock_mhz
        return self.shared_memory_bytes_per_clock_per_sm * clock * 1e6

    def peak_vector_flops(self) -> float:
        """CUDA-core FP32 rate: softmax, norms and activations run here, not on tensor cores."""
        return self.peak_flops(Dtype.FP32)

    @property
    def memory_bandwidth(self) -> float:
        """Device-memory bandwidth, bytes/s."""
        return self.memory.bandwidth_gbps * 1e9

    @property
    def memory_bytes(self) -> float:
        """The datasheet capacity in bytes, read as GiB (see MemorySpec.capacity_gb)."""
        return self.memory.capacity_gb * 2**30

    @property
    def cuda_memory_bytes(self) -> float:
        """Device memory CUDA hands out, bytes: vLLM's gpu_memory_utilization budget is a
        share of this total (torch.cuda.mem_get_info), not of the datasheet figure."""
        return self.memory.visible_gib * 2**30

    @property
    def marketed_memory_bytes(self) -> float:
        """The datasheet figure read as decimal GB, as quick back-of-envelope sizing does."""
        return self.memory.capacity_gb * 1e9

    @property
    def l2_bytes(self) -> float:
        return self.l2.size_mb * 1e6

    @property
    def l2_bandwidth(self) -> float:
        return self.l2.bandwidth_gbps * 1e9

    def ridge_point(self, dtype: Dtype) -> float:
        """Arithmetic intensity (FLOP/byte) where compute and memory bounds meet."""
        return self.peak_flops(dtype) / self.memory_bandwidth

    def with_efficiency(self, efficiency: EfficiencyProfile) -> AcceleratorSpec:
        """The same chip with calibrated efficiencies."""
        return self.model_copy(update={"efficiency": efficiency})


def hardware_json(gpu: AcceleratorSpec) -> str:
    """Every field of `gpu` but its efficiency profile, as JSON with its keys sorted (equal
    chips give equal text, whatever order their files list rates in), read out once per
    object: what a cache of costs that no efficiency moves keys on, and part of the hash."""
    return per_object(gpu, "hardware_json", _hardware_json)


def _hardware_json(gpu: AcceleratorSpec) -> str:
    return json.dumps(gpu.model_dump(mode="json", exclude={"efficiency"}), sort_keys=True)


def _content_hash(gpu: AcceleratorSpec) -> int:
    # profile_json keeps the profile's key order (sorting it would cost a fit ~2 ms per
    # profile): equal profiles listed in another order only miss a cache, as before.
    return hash((hardware_json(gpu), profile_json(gpu.efficiency)))
