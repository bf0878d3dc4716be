"""Which kernel vLLM runs an MXFP4 MoE checkpoint's experts (gpt-oss) with, per GPU family
and vLLM release: one place, read by the MoE cost (moe.MOE_FORMATS) and told by the run.

vLLM picks an MXFP4 MoE backend by the GPU (vllm/model_executor/layers/quantization/
mxfp4.py `get_mxfp4_backend`, and after a later refactor model_executor/layers/fused_moe/
oracle/mxfp4.py `select_mxfp4_moe_backend`; the revisions stored in the search corpus,
their releases not pinned). With no environment override:

- datacenter Blackwell (sm_100 family, FlashInfer installed: a default CUDA dependency
  from PR #26443, merged 2025-10-08; before, the `vllm[flashinfer]` extra and vLLM's
  Docker image, taken here for every release): FlashInfer's TRT-LLM MoE, MXFP4 weights
  with bf16 activations
  (SM100_FI_MXFP4_BF16, later FLASHINFER_TRTLLM_MXFP4_BF16). Its kernels
  (`bmm_Bfloat16_MxE2m1Bfloat16_castBfloat16_...`) widen the weights to bf16 and run a
  bf16 MMA: the fp4 tensor cores' rate needs fp4 activations, and the mxf8f6f4 MMA with
  MXFP8 activations (VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1) runs at the fp8 rate; that
  opt-in is not modelled.
- Hopper (sm_90) and sm_100-sm_10x without FlashInfer: OpenAI's triton_kernels
  (`matmul_ogs`), where the package is importable. vLLM bundles it from PR #28788
  (merged 2025-11-15; taken here from 0.12.0, the first release cut after it); before
  that it had to be installed by hand, and a plain install ran Marlin (vllm#23278, 0.10.1
  on an H100: Marlin's padded 65.97 GiB of weights; vllm#33155, 0.14.1: 64.38 GiB,
  Triton's).
- AMD CDNA3 (ROCm): triton_kernels' matmul_ogs as well.
- Ampere, Ada and workstation Blackwell (sm_120; triton_kernels' supported range is
  sm_90 to sm_10x): Marlin, W4A16 (the L40S table's `vllm_gptossmxfp4moe_marlin_marlinexperts`
  rows, vLLM 0.24, measure it).

VLLM_MXFP4_USE_MARLIN=1 forces Marlin on any NVIDIA GPU (a scenario's
model.mxfp4_use_marlin); VLLM_USE_FLASHINFER_MOE_MXFP4_BF16=1 (FlashInfer's CUTLASS kernels
on Hopper) and the MXFP8 opt-in are not modelled.
"""

from __future__ import annotations

from typing import NamedTuple

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.block_scaling import BLACKWELL_DATACENTER, HOPPER, gemm_family
from hardware_models.errors import InfersimError

# The first release whose CUDA wheels bundle triton_kernels (PR #28788).
TRITON_KERNELS_BUNDLED = (0, 12, 0)


class Mxfp4MoeBackend(NamedTuple):
    """One of vLLM's MXFP4 MoE backends: its name in vLLM, the MoE format that prices it
    (efficiency.MOE_FORMATS), the kernel in words, and how far its price is checked
    where a run should say so (benchmarks/README.md, "gpt-oss MXFP4 backends"; the
    bounds are what tests/test_mxfp4_published.py holds it to)."""

    name: str
    moe_format: str
    kernel: str
    caveat: str = ""

    def describe(self, vllm_version: tuple[int, int, int]) -> str:
        """The line a run states: which kernel, under which vLLM."""
        version = ".".join(map(str, vllm_version))
        return f"MXFP4 experts: {self.kernel} (vLLM {version}'s {self.name} backend)"


MARLIN = Mxfp4MoeBackend(
    "MARLIN", "w4a16_mxfp4", "Marlin W4A16, weights dequantised to bf16 in the GEMM"
)
TRITON = Mxfp4MoeBackend(
    "TRITON",
    "w4a16_mxfp4_triton",
    "OpenAI triton_kernels matmul_ogs, weights widened to bf16 for a bf16 MMA",
    "its widening rate comes from a B200 kernel of another library (TRT-LLM W4A16) and "
    "is checked against whole vLLM runs only, no Hopper kernel timing: within 5% of "
    "vllm#30326's 8 x H200 tp 8 output tok/s at 8 and 128 users, within 10% of "
    "vllm#27523's H100 batch of 8; prefill-sized batches unchecked",
)
FLASHINFER_TRTLLM_BF16 = Mxfp4MoeBackend(
    "FLASHINFER_TRTLLM_MXFP4_BF16",
    "w4a16_mxfp4_trtllm",
    "FlashInfer TRT-LLM MoE, bf16 activations, weights widened to bf16 for a bf16 MMA",
    "its widening rate comes from one published B200 kernel time (gpt-oss-120b's "
    "gate|up at 128 sequences, 711.8 us) and the whole layer there is within 3% of the "
    "same write-up; otherwise checked only against one SGLang run of one user (within "
    "20% of its output tok/s), no vLLM run on a B200",
)


def mxfp4_moe_backend(
    gpu: AcceleratorSpec, vllm_version: tuple[int, int, int], use_marlin: bool = False
) -> Mxfp4MoeBackend:
    """The backend vLLM `vllm_version` runs MXFP4 MoE experts with on `gpu`: its default,
    or Marlin with `use_marlin` (VLLM_MXFP4_USE_MARLIN=1; Marlin is CUDA code, so on
    another vendor's GPU vLLM finds no backend, and neither does this)."""
    if use_marlin:
        if gpu.vendor != "nvidia":
            raise InfersimError(
                f"model.mxfp4_use_marlin: {gpu.name} is not an NVIDIA GPU, and Marlin's "
                "MXFP4 kernels run on NVIDIA sm_80+ only; unset it"
            )
        return MARLIN
    family = gemm_family(gpu)
    if family == BLACKWELL_DATACENTER:
        return FLASHINFER_TRTLLM_BF16
    if family == HOPPER and vllm_version >= TRITON_KERNELS_BUNDLED:
        return TRITON
    if family == "cdna3":
        return TRITON
    return MARLIN
