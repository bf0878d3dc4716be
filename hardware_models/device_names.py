"""Which GPU preset a device name is: torch's `get_device_name()`, an aiconfigurator table's
`device` column, a preset's display name, or the preset name itself.

Each pattern matches a whole name (case-insensitive), never a part of one: a substring
test reads the L40 as an L4, the A100 PCIe as the SXM part and the GH200 as an H200,
each with other clocks, memory or power than the preset. A name no pattern matches is
no preset's: the caller says so and asks for a GPU YAML (README, "Describing your own
accelerator") instead of pricing on a neighbour.
"""

from __future__ import annotations

import re

from hardware_models.presets import list_gpus

UNKNOWN_GPU = "unknown-gpu"
DESCRIBE_YOUR_CHIP = (
    "describe the chip in a GPU YAML (README, 'Describing your own accelerator': copy the "
    "nearest preset from hardware_models/presets/gpus/) and pass --gpu PATH.yaml"
)

_NVIDIA = r"(nvidia )?"
# (whole-name pattern, preset), from the names torch reports on each part (and the
# presets' display names); a variant with other SMs, memory or power is left out.
DEVICE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), preset)
    for pattern, preset in (
        (_NVIDIA + r"h100 pcie( 80gb)?", "h100-pcie"),
        (_NVIDIA + r"h100( sxm5?)?( 80gb)?( hbm3)?", "h100-sxm"),
        (_NVIDIA + r"h200( sxm)?( 141gb)?", "h200-sxm"),
        (_NVIDIA + r"b200( sxm)?( 180gb)?", "b200"),
        (_NVIDIA + r"a100[- ]sxm4?[- ]40gb", "a100-40gb-sxm"),
        (_NVIDIA + r"a100([- ]sxm4?)?[- ]80gb|" + _NVIDIA + r"a100[- ]sxm4?", "a100-80gb-sxm"),
        (_NVIDIA + r"l40s( 48gb)?( pcie)?", "l40s"),
        (_NVIDIA + r"l4( 24gb)?( pcie)?", "l4"),
        (_NVIDIA + r"(geforce )?rtx 4090( 24gb)?", "rtx-4090"),
        (_NVIDIA + r"rtx pro 6000 blackwell workstation edition( 96gb)?", "rtx-pro-6000"),
        (r"(amd )?(instinct )?mi300x( vf)?( 192gb)?", "mi300x"),
    )
)


def preset_for_device(name: str) -> str | None:
    """The preset `name` is (a device name, a display name or a preset name, any case),
    or None when it is no preset's part."""
    text = " ".join(str(name).split())
    if text.lower() in list_gpus():
        return text.lower()
    return next((preset for pattern, preset in DEVICE_PATTERNS if pattern.fullmatch(text)), None)
