"""Calibration inputs a user brings: device names matched to presets, measurements whose
GPU or time unit disagrees with what they are priced against, and malformed tables."""

from __future__ import annotations

import pytest

from hardware_models.calibration.harness.device_info import preset_for
from hardware_models.device_names import preset_for_device
from hardware_models.presets import list_gpus, load_gpu


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
