"""Numeric formats the hardware can compute in or store, and their sizes."""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

from hardware_models.errors import InfersimError


class Dtype(StrEnum):
    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    FP4 = "fp4"


BYTES_PER_ELEMENT: dict[Dtype, float] = {
    Dtype.FP32: 4.0,
    Dtype.TF32: 4.0,  # stored as fp32, multiplied at reduced precision
    Dtype.FP16: 2.0,
    Dtype.BF16: 2.0,
    Dtype.FP8: 1.0,
    Dtype.INT8: 1.0,
    Dtype.INT4: 0.5,
    Dtype.FP4: 0.5,
}

# Spellings found in PyTorch, NCCL and measurement tables.
_ALIASES = {
    "float32": Dtype.FP32,
    "float": Dtype.FP32,
    "float16": Dtype.FP16,
    "half": Dtype.FP16,
    "bfloat16": Dtype.BF16,
    "float8": Dtype.FP8,
    "fp8_e4m3": Dtype.FP8,
    "fp8_e5m2": Dtype.FP8,
    "fp8_block": Dtype.FP8,
    "nvfp4": Dtype.FP4,
    "mxfp4": Dtype.FP4,
}


def parse_dtype(value: str | Dtype) -> Dtype:
    """Accept our names and the usual aliases; reject anything else with the allowed list."""
    if isinstance(value, Dtype):
        return value
    dtype = _dtype_named(str(value).strip().lower())
    if dtype is None:
        allowed = ", ".join(d.value for d in Dtype)
        raise InfersimError(f"unknown dtype {value!r}; allowed: {allowed}")
    return dtype


@lru_cache(maxsize=256)
def _dtype_named(text: str) -> Dtype | None:
    """The dtype a lower-case name or alias stands for, None if none. Memoised: operator
    models parse their dtypes on every construction, and a fit builds hundreds of
    thousands of them."""
    if text in _ALIASES:
        return _ALIASES[text]
    try:
        return Dtype(text)
    except ValueError:
        return None


def bytes_per_element(dtype: str | Dtype) -> float:
    return BYTES_PER_ELEMENT[parse_dtype(dtype)]
