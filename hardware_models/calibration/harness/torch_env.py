"""Import PyTorch lazily: only the harness needs it, and it is an optional extra."""

from __future__ import annotations

from types import ModuleType

from hardware_models.errors import InfersimError


def require_torch() -> ModuleType:
    try:
        import torch
    except ImportError:
        raise InfersimError(
            "the calibration harness needs PyTorch: pip install 'infersim[calibrate]'"
        ) from None
    return torch


def resolve_device(torch: ModuleType, device: str) -> str:
    """'cuda' or 'cpu', refusing a CUDA run on a machine without a visible GPU."""
    if device not in ("cuda", "cpu"):
        raise InfersimError(f"--device must be cuda or cpu, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InfersimError("--device cuda: PyTorch sees no CUDA GPU here; use --device cpu")
    return device
