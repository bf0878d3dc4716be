"""The calibration profile file: fitted efficiencies, fitted links and where they came from.

A scenario reads it with `hardware: {gpu: ..., calibration: profile.yaml}`; the simulator
takes the `efficiency:` block, whose `collective_by_gpus` carries the fitted links.
`links:` is the record of that fit (the collective and rows it used, per GPU count).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from hardware_models.efficiency import EfficiencyProfile
from hardware_models.errors import InfersimError
from hardware_models.node import LinkSpec
from hardware_models.yaml_io import load_yaml_mapping, validate_model

_STRICT = ConfigDict(extra="forbid", frozen=True)

HEADER = """\
# infersim calibration profile, written by `infersim calibrate fit`.
# `efficiency:` is an EfficiencyProfile: use it from a scenario with
#   hardware: {gpu: <preset>, calibration: <this file>}
# `links:` records the alpha-beta parameters fitted to all-reduce rows per GPU count;
# the same figures sit in `efficiency.collective_by_gpus`, which is what the simulator
# applies to the node's GPU-to-GPU link for a collective over that many GPUs.
"""


class FittedLink(BaseModel):
    model_config = _STRICT
    num_gpus: int = Field(ge=2)
    fitted_on: str = Field(description="the collective whose rows the fit used")
    rows: int = Field(ge=1)
    link: LinkSpec


class ProfileMetadata(BaseModel):
    model_config = _STRICT
    source: str = Field(description="the measurements the profile was fitted to")
    gpu: str = Field(description="the accelerator spec it was fitted against")
    rows_used: dict[str, int] = Field(description="fit rows per op class")
    holdout: float = Field(ge=0, lt=1, description="fraction of shapes held out")
    seed: int
    curves_only: bool = Field(
        default=False,
        description="only the efficiency curves were fitted; fixed costs, kernel choices "
        "and links are the preset's",
    )
    size_ranges: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="per op class, the smallest and largest `size` the fit saw (FLOPs; "
        "bytes for collectives): `roofline` warns when it prices an operator far outside",
    )


class CalibrationProfile(BaseModel):
    model_config = _STRICT
    metadata: ProfileMetadata
    efficiency: EfficiencyProfile
    links: list[FittedLink] = Field(default_factory=list)

    def link_for(self, num_gpus: int, base: LinkSpec) -> LinkSpec:
        """`base` (the target's own link) with the fitted latency and efficiency for
        `num_gpus`, or `base` unchanged when that GPU count was not fitted."""
        return self.efficiency.link_for(num_gpus, base)


def write_profile(profile: CalibrationProfile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False, width=100)
    path.write_text(HEADER + body, encoding="utf-8")
    return path


def read_profile(path: str | Path) -> CalibrationProfile:
    """A profile written by `write_profile`; a bare EfficiencyProfile file is refused with
    a message saying what is missing."""
    data = load_yaml_mapping(path)
    if "metadata" not in data or "efficiency" not in data:
        raise InfersimError(
            f"{path}: not a calibration profile (needs `metadata:` and `efficiency:`; "
            "write one with `infersim calibrate fit`)"
        )
    return validate_model(CalibrationProfile, data, str(path))
