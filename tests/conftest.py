"""Shared fixtures: small scenarios built in code, and the measured-data location."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason=f"measured data not found at {SHARED_DATA} (it sits beside the checkout in CI)",
)

BASE_SCENARIO: dict[str, Any] = {
    "name": "test",
    "seed": 3,
    "hardware": {"gpu": "a100-80gb-sxm"},
    "model": {"name": "llama-2-7b"},
    "serving": {"policy": "chunked_prefill", "max_num_seqs": 64, "max_num_batched_tokens": 512},
    "workload": {
        "arrivals": {"kind": "poisson", "rate_per_s": 4.0},
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 1024},
        "output_tokens": {"kind": "uniform", "low": 4, "high": 256},
        "num_requests": 300,
    },
    "output": {"plots": False, "progress": False},
}


def scenario_dict(**sections: Any) -> dict[str, Any]:
    """BASE_SCENARIO with sections merged in (`serving={"policy": "static"}`)."""
    data = copy.deepcopy(BASE_SCENARIO)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


@pytest.fixture
def make_scenario():
    from simulator.scenario import Scenario

    def make(**sections: Any) -> Scenario:
        return Scenario.from_dict(scenario_dict(**sections))

    return make
