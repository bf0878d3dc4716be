"""Block-scaled low-precision formats, and the GEMM kernels each GPU family runs them with.

A block-scaled format stores a narrow element (fp8 e4m3, fp4 e2m1) plus one scale per block
of elements along k, so every operand moves its scales with it and a kernel must apply
them. Three formats are priced apart from their plain dtype:

- `fp8_block`: DeepSeek-V3's checkpoint format; weights get one fp32 scale per 128 x 128
  block, activations one per 1 x 128 group, quantised per token before each GEMM.
- `nvfp4`: NVIDIA's 4-bit format; one fp8 e4m3 scale per 16 elements of weights and of
  activations, times one fp32 scale per tensor (a checkpoint constant, applied once in the
  epilogue: 4 bytes a matrix, nothing per element).
- `mxfp4`: the OCP microscaling format; one e8m0 (power-of-two) scale per 32 elements. A
  plain `fp4` is read as MXFP4: no 4-bit GEMM runs without block scales.

Where the scales are applied differs by GPU family, and so do tiles and epilogues, which
is why the family is the key (see `gemm_family`):

- Hopper (sm_90): warpgroup MMAs (wgmma) with fp32 accumulators in registers have no block
  scales: block-scaled fp8 kernels (CUTLASS's FP8BlockScaledAccum, DeepGEMM) rescale the
  accumulators on the CUDA cores after every 128-deep block of k. Their cooperative
  schedule runs both math warpgroups on one tile and stores it after its k loop, so the
  stores add to the math. No fp4 tensor cores: 4-bit weights are dequantised (Marlin).
- Datacenter Blackwell (sm_100, B200/GB200): tcgen05 MMAs accumulate in tensor memory,
  issued by one thread, and scale blocks in hardware (`kind::mxf8f6f4`, `kind::mxf4nvf4`
  with `.block_scale`, scale factors in tensor memory). Accumulators are double-buffered
  in tensor memory, so epilogue warps drain one tile while the next one's MMAs run; two
  SMs can share one 256-row UMMA (a 2-SM cluster). vLLM's CUTLASS nvfp4 GEMM
  (nvfp4_scaled_mm_kernels.cu): 128 x 128 per SM up to m = 16, then 2-SM 256 x 128 up to
  m = 256, then 2-SM 256 x 256 (128 x 256 per SM). fp8 and fp8_block take vLLM's fp8
  tiles (scaled_mm_sm100_fp8_dispatch.cuh: A and B swapped up to m = 64, 2-SM past it);
  fp8_block's 128-blocks are applied in hardware too (DeepGEMM converts their scales to
  e8m0 for the block-scaled MMA) or under the next tile's MMAs (CUTLASS).
- Workstation Blackwell (sm_120, RTX 50 / RTX PRO): no tcgen05 and no tensor memory; warp
  MMAs (`mma.sync`, as on Ampere and Ada) with accumulators in registers, 1-SM clusters.
  The MX/NV block scales are applied by the `mma.sync ... .block_scale` instructions;
  vLLM's nvfp4 GEMM there (nvfp4_scaled_mm_sm120_kernels.cu) is one 128 x 128 x 128 tile,
  cluster 1 x 1. fp8_block's fp32 scales are no hardware format: rescaled in registers as
  on Hopper (scaled_mm_blockwise_sm120_fp8_dispatch.cuh: 128 x 128 x 128, cluster 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import Dtype, bytes_per_element, parse_dtype
from hardware_models.efficiency import GemmKernel
from hardware_models.errors import InfersimError


@dataclass(frozen=True)
class ScaledFormat:
    """A block-scaled storage format: its element, its block and its scale."""

    name: str
    element: Dtype  # what the tensor cores multiply
    block_k: int  # elements along k sharing one scale
    weight_block_rows: int  # weight rows (n) sharing it: 128 for fp8_block, 1 for MX/NV
    scale_bytes: float  # 4 (fp32), 1 (fp8 e4m3 or e8m0); nvfp4's per-tensor fp32 scale,
    # 4 bytes a matrix, is left out
    hardware_format: bool  # an MX/NV format Blackwell's tensor cores scale themselves

    @property
    def weight_bytes(self) -> float:
        """Bytes one weight takes with its share of the block scale."""
        return bytes_per_element(self.element) + self.scale_bytes / (
            self.block_k * self.weight_block_rows
        )

    @property
    def activation_bytes(self) -> float:
        """Bytes one quantised activation takes with its group's scale (1 x block_k)."""
        return bytes_per_element(self.element) + self.scale_bytes / self.block_k


FP8_BLOCK = ScaledFormat("fp8_block", Dtype.FP8, 128, 128, 4.0, False)
NVFP4 = ScaledFormat("nvfp4", Dtype.FP4, 16, 1, 1.0, True)
MXFP4 = ScaledFormat("mxfp4", Dtype.FP4, 32, 1, 1.0, True)
FORMATS: dict[str, ScaledFormat] = {f.name: f for f in (FP8_BLOCK, NVFP4, MXFP4)}
# A plain fp4 GEMM is an MXFP4 one (the OCP standard the planner stores fp4 weights as).
_PLAIN_AS = {Dtype.FP4.value: MXFP4}


def scaled_format(dtype: object) -> ScaledFormat | None:
    """The block-scaled format a dtype spelling names (fp8_block, nvfp4, mxfp4, and fp4
    read as mxfp4), or None for a plain dtype."""
    text = str(dtype).strip().lower()
    return FORMATS.get(text) or _PLAIN_AS.get(text)


def operand_bytes(dtype: object) -> float:
    """Bytes per element of an operand in `dtype`, block scales included (activations'
    1 x block_k groups; a weight's share is smaller where its blocks span rows)."""
    fmt = scaled_format(dtype)
    return bytes_per_element(parse_dtype(str(dtype))) if fmt is None else fmt.activation_bytes


def stored_bytes(dtype: object) -> float:
    """Bytes per stored weight in `dtype`, its share of the block scale included."""
    fmt = scaled_format(dtype)
    return bytes_per_element(parse_dtype(str(dtype))) if fmt is None else fmt.weight_bytes


def quantisation_pass_bytes(dtype: object) -> float:
    """Bytes the activation-quantisation kernel moves per element: read the 16-bit
    activation, write the element and its share of the group scale (plain fp8: 3)."""
    return 2.0 + operand_bytes(dtype)


# ---- GPU families ------------------------------------------------------------------

HOPPER = "hopper"
BLACKWELL_DATACENTER = "blackwell_sm100"
BLACKWELL_WORKSTATION = "blackwell_sm120"


def gemm_family(gpu: AcceleratorSpec) -> str:
    """The GEMM machine a chip is: its architecture in lower case, except Blackwell, which
    is two (compute capability 10.x: tcgen05, tensor memory, 2-SM UMMA; 12.x: warp MMAs
    like Ada). AcceleratorSpec requires the compute capability of a Blackwell chip."""
    arch = gpu.architecture.strip().lower()
    if arch != "blackwell":
        return arch
    major = gpu.capability_major
    assert major is not None  # AcceleratorSpec requires it of a Blackwell chip
    return BLACKWELL_WORKSTATION if major >= 12 else BLACKWELL_DATACENTER


# Families whose GEMMs run warp-level mma.sync: each thread block stores its output tile
# after its k loop, and each warp loads its own A and B fragments from shared memory.
# Hopper's and datacenter Blackwell's kernels store one tile while computing the next and
# feed their MMAs from shared memory directly; other vendors' are not measured here, so
# they keep that pricing.
WARP_MMA_FAMILIES = frozenset({"volta", "turing", "ampere", "ada", BLACKWELL_WORKSTATION})


class TileBucket(NamedTuple):
    """One bucket of a kernel's tile dispatch by m (and, where the kernel also looks at
    it, by n): the first bucket whose bounds hold both serves the shape."""

    up_to_m: float  # the largest m the bucket serves
    tile: tuple[int, int]  # per-SM tile: (rows of m, columns of n)
    cluster_m: int  # SMs a cluster stacks along m (a 2-SM UMMA: 2)
    up_to_n: float = float("inf")  # the largest n the bucket serves
    warp: tuple[int, int] | None = None  # a warp's part of the tile, where the kernel
    # names it (CUTLASS 2.x warp-MMA configs); None: gemm.warp_tile's rule of thumb


class KernelRule(NamedTuple):
    """What a serving engine runs for one dtype on one family where no profile names a
    kernel: the kernel family, and for `fixed` dispatch the tile by m (None: 128 x 128 in
    the kernel's clusters)."""

    kernel: GemmKernel
    tiles: tuple[TileBucket, ...] | None = None


_INF = float("inf")
# vLLM's CUTLASS nvfp4 GEMM on sm_100 (and the same MMA shapes for mxfp4).
_SM100_FP4_TILES = (
    TileBucket(16, (128, 128), 1),
    TileBucket(256, (128, 128), 2),
    TileBucket(_INF, (128, 256), 2),
)
_ONE_SM_128 = (TileBucket(_INF, (128, 128), 1),)
# vLLM's CUTLASS fp8 GEMMs (per-tensor or per-token scales): scaled_mm_sm100_fp8_dispatch
# (A and B swapped up to m = 64, a 2-SM cluster past it) and scaled_mm_sm120_fp8_dispatch
# (1 x 1 clusters only).
_SM100_FP8_TILES = (
    TileBucket(16, (32, 128), 1),
    TileBucket(64, (64, 128), 1),
    TileBucket(_INF, (128, 128), 2),
)
_SM120_FP8_TILES = (
    TileBucket(16, (16, 64), 1),
    TileBucket(32, (32, 64), 1),
    TileBucket(256, (64, 64), 1),
    TileBucket(_INF, (128, 128), 1),
)
# vLLM's CUTLASS 2.x fp8 GEMM on Ada (scaled_mm_c2x_sm89_fp8_dispatch.cuh): buckets of
# max(16, next_pow_2(m)), and within each bucket a tile by next_pow_2(n), here as bounds
# on n itself (the source's `np2 <= 8196` is n <= 8192, `np2 <= 24576` n <= 16384);
# warp tiles as the configs name them, one thread block per tile, no split-K. One
# stored revision clamps m to 32, leaving its m <= 16 configs unused; the L40S table
# (vLLM 0.24) steps from m = 16 to 17 at every n (4.3 to 7.1 us at n = 1,024, k = 128),
# so there they run. Every config fits the sm_89's 99 KiB of shared memory: the
# fallback kernel (64 x 128) never launches.
_SM89_FP8_TILES = (
    TileBucket(16, (16, 64), 1, 8192, (16, 64)),
    TileBucket(16, (16, 128), 1, 16384, (16, 64)),
    TileBucket(16, (32, 64), 1, _INF, (16, 64)),
    TileBucket(32, (32, 64), 1, 8192, (16, 64)),
    TileBucket(32, (32, 128), 1, 16384, (32, 64)),
    TileBucket(32, (32, 64), 1, _INF, (16, 64)),
    TileBucket(64, (64, 64), 1, 8192, (32, 64)),
    TileBucket(64, (64, 128), 1, 16384, (64, 64)),
    TileBucket(64, (64, 64), 1, _INF, (32, 64)),
    TileBucket(128, (64, 128), 1, 8192, (64, 64)),
    TileBucket(128, (128, 128), 1, 16384, (64, 64)),
    TileBucket(128, (128, 64), 1, _INF, (64, 64)),
    TileBucket(256, (64, 128), 1, 4096, (64, 64)),
    TileBucket(256, (128, 128), 1, _INF, (64, 64)),
    TileBucket(_INF, (128, 128), 1, 4096, (64, 64)),
    TileBucket(_INF, (256, 128), 1, 8192, (64, 64)),
    TileBucket(_INF, (128, 128), 1, _INF, (64, 64)),
)
_QUANTISED = GemmKernel(dispatch="fixed", quantize_activations=True)

# The GEMM kernels a serving engine runs for low-precision dtypes where no profile names
# one, per family, from vLLM's source. Hopper: `cutlass_scaled_mm` quantises activations
# per token in a kernel of its own, then runs CUTLASS tiles chosen by m in 2x1 clusters
# past m = 64; block-scaled fp8 quantises per 128-wide group, then runs 128 x 128 tiles
# (cooperative: stored after the k loop) over rows padded to a multiple of 4 for its
# scales' TMA loads. Ada: the activations quantised, then CUTLASS 2.x warp-MMA tiles by m
# and n (above). Blackwell: a quantisation kernel writes the fp8 or 4-bit activations
# (and their swizzled scales), then the tiles above. Other families keep cuBLAS's fastest
# tile until measured.
SERVING_GEMM_KERNELS: dict[str, dict[str, KernelRule]] = {
    HOPPER: {
        "fp8": KernelRule(GemmKernel(dispatch="by_m", quantize_activations=True, cluster_m=2)),
        "fp8_block": KernelRule(
            GemmKernel(dispatch="fixed", quantize_activations=True, align_m=4, serial_epilogue=True)
        ),
    },
    "ada": {"fp8": KernelRule(_QUANTISED, _SM89_FP8_TILES)},
    BLACKWELL_DATACENTER: {
        "fp8": KernelRule(_QUANTISED, _SM100_FP8_TILES),
        "nvfp4": KernelRule(_QUANTISED, _SM100_FP4_TILES),
        "mxfp4": KernelRule(_QUANTISED, _SM100_FP4_TILES),
        "fp8_block": KernelRule(
            GemmKernel(dispatch="fixed", quantize_activations=True, align_m=4), _SM100_FP8_TILES
        ),
    },
    BLACKWELL_WORKSTATION: {
        "fp8": KernelRule(_QUANTISED, _SM120_FP8_TILES),
        "nvfp4": KernelRule(_QUANTISED, _ONE_SM_128),
        "mxfp4": KernelRule(_QUANTISED, _ONE_SM_128),
        "fp8_block": KernelRule(
            GemmKernel(dispatch="fixed", quantize_activations=True, align_m=4), _ONE_SM_128
        ),
    },
}


def serving_rule(gpu: AcceleratorSpec, key: str) -> KernelRule | None:
    """The family's serving kernel for the dtype key `key` (efficiency.dtype_key), if any."""
    return SERVING_GEMM_KERNELS.get(gemm_family(gpu), {}).get(key)


def scales_on_cuda_cores(gpu: AcceleratorSpec, dtype: object) -> bool:
    """True where a block-scaled GEMM rescales its accumulators on the CUDA cores after
    every block of k, in series with the tensor math: fp8_block everywhere but datacenter
    Blackwell (DeepGEMM there turns the 128-blocks' scales into e8m0 for the hardware
    block-scaled MMA), and never an MX/NV format, whose blocks only Blackwell multiplies."""
    fmt = scaled_format(dtype)
    if fmt is None or fmt.hardware_format:
        return False
    return gemm_family(gpu) != BLACKWELL_DATACENTER


# ---- which GPUs run which weight format --------------------------------------------

# Where vLLM runs 4-bit block-scaled weights without fp4 tensor cores: dequantised to the
# activation dtype inside the GEMM (W4A16). Marlin's fp4 kernels need sm_80+ (NVIDIA
# Ampere, Ada, Hopper); MXFP4 also runs on AMD CDNA3 (gpt-oss on MI300X: Triton kernels
# that upcast the weights). NVFP4 has no ROCm kernels.
_DEQUANTISED = {
    "nvfp4": frozenset({"ampere", "ada", HOPPER}),
    "mxfp4": frozenset({"ampere", "ada", HOPPER, "cdna3"}),
}


def weight_support(gpu: AcceleratorSpec, fmt: str) -> str | None:
    """How `gpu` runs weights in the 4-bit format `fmt`: 'native' (fp4 tensor cores),
    'dequantised' (W4A16), or None where vLLM has no kernel for it."""
    if gpu.supports(Dtype.FP4):
        return "native"
    if gemm_family(gpu) in _DEQUANTISED.get(fmt, frozenset()):
        return "dequantised"
    return None


def check_weight_support(gpu: AcceleratorSpec, fmt: str, field: str) -> None:
    """Refuse 4-bit block-scaled weights on a GPU that vLLM has no kernel for, naming the
    GPU and the formats it can run. Plain fp4 is checked as the format it is stored as
    (scaled_format: mxfp4)."""
    scaled = scaled_format(fmt)
    name = scaled.name if scaled is not None else str(fmt).strip().lower()
    if name not in _DEQUANTISED or weight_support(gpu, name) is not None:
        return
    runs = [other for other in _DEQUANTISED if weight_support(gpu, other) is not None]
    read_as = f" (read as {name})" if name != str(fmt).strip().lower() else ""
    raise InfersimError(
        f"{field}: {gpu.name} ({gpu.architecture}) has no kernels for {fmt}{read_as} "
        f"weights (vLLM: fp4 tensor cores on Blackwell, Marlin W4A16 on NVIDIA sm_80+"
        f"{', Triton on CDNA3 for mxfp4' if name == 'mxfp4' else ''}); "
        f"4-bit formats it runs: {', '.join(runs) or 'none'}"
    )
