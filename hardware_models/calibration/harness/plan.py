"""What the harness measures: bounded grids per device, full or --quick.

The GPU grid keeps a full run well under a minute of kernel time (each shape is timed
3 + 10 times; the largest GEMM, 2 x 16384 x 14336 x 14336, is ~6.7 TFLOP, ~9 ms on an
H100). The CPU grids are small: they exist so the
whole pipeline (harness -> fit -> validate) runs without a GPU, not to characterise CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware_models.calibration.layer import CPU_LAYER, GPU_LAYER, LayerShape


@dataclass(frozen=True)
class Plan:
    gemm_m: tuple[int, ...]
    gemm_nk: tuple[int, ...]  # n and k each take every value
    gemm_dtypes: tuple[str, ...]  # torch dtype names; fp8 added on GPUs that have it
    copy_bytes: tuple[int, ...]
    attention_heads: tuple[tuple[int, int, int], ...]  # (heads, kv heads, head dim)
    prefill: tuple[tuple[int, int], ...]  # (batch, sequence length)
    decode: tuple[tuple[int, int], ...]  # (batch, cached context)
    collective_bytes: tuple[int, ...]
    layer: LayerShape
    layer_prefill: tuple[int, int]  # (batch, prompt tokens)
    layer_decode: tuple[int, int]  # (batch, cached context)
    warmup: int
    repeats: int


def _pairs(batches: tuple[int, ...], lengths: tuple[int, ...], max_tokens: int):
    return tuple((b, s) for b in batches for s in lengths if b * s <= max_tokens)


GPU_FULL = Plan(
    gemm_m=(1, 4, 16, 64, 256, 1024, 4096, 16384),
    gemm_nk=(1024, 4096, 8192, 14336),
    gemm_dtypes=("bfloat16",),
    copy_bytes=tuple(2**p for p in range(16, 32, 2)),
    attention_heads=((32, 8, 128), (64, 8, 128), (32, 32, 128)),
    prefill=_pairs((1, 4, 16, 64), (128, 512, 2048, 8192), 65536),
    decode=_pairs((1, 8, 64, 256), (128, 1024, 4096, 16384), 1 << 21),
    collective_bytes=tuple(2**p for p in range(10, 31, 2)),
    layer=GPU_LAYER,
    layer_prefill=(1, 2048),
    layer_decode=(32, 2048),
    warmup=3,
    repeats=10,
)
GPU_QUICK = Plan(
    gemm_m=(1, 256, 4096),
    gemm_nk=(1024, 4096),
    gemm_dtypes=("bfloat16",),
    copy_bytes=(2**20, 2**26),
    attention_heads=((32, 8, 128),),
    prefill=((1, 512), (4, 2048)),
    decode=((8, 1024), (64, 4096)),
    collective_bytes=(2**16, 2**24),
    layer=GPU_LAYER,
    layer_prefill=(1, 512),
    layer_decode=(8, 1024),
    warmup=2,
    repeats=5,
)
CPU_FULL = Plan(
    gemm_m=(64, 128, 256, 512),
    gemm_nk=(128, 512, 1024),
    gemm_dtypes=("float32", "bfloat16"),
    copy_bytes=tuple(2**p for p in range(16, 27, 2)),
    attention_heads=((8, 2, 64), (4, 4, 64)),
    prefill=_pairs((1, 4), (16, 64, 256), 1024),
    decode=_pairs((1, 4, 16), (64, 256, 1024), 8192),
    collective_bytes=(),
    layer=CPU_LAYER,
    layer_prefill=(1, 64),
    layer_decode=(4, 256),
    warmup=2,
    repeats=5,
)
CPU_QUICK = Plan(
    gemm_m=(64, 128, 256),
    gemm_nk=(128, 512),
    gemm_dtypes=("float32", "bfloat16"),
    copy_bytes=(2**16, 2**20, 2**22),
    attention_heads=((4, 2, 32),),
    prefill=((1, 16), (2, 64)),
    decode=((1, 64), (4, 256)),
    collective_bytes=(),
    layer=CPU_LAYER,
    layer_prefill=(1, 32),
    layer_decode=(2, 64),
    warmup=1,
    repeats=3,
)


def plan_for(device: str, quick: bool) -> Plan:
    if device == "cuda":
        return GPU_QUICK if quick else GPU_FULL
    return CPU_QUICK if quick else CPU_FULL
