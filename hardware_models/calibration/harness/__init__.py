"""Micro-benchmarks on a real device (PyTorch): the measurements calibration fits to."""

from hardware_models.calibration.harness.runner import run_harness

__all__ = ["run_harness"]
