"""parallelism.enable_expert_parallel on a dense model: vLLM ignores it (its expert-parallel
layout applies to fused-MoE layers only), so the run says so and runs without it."""

import pytest

from hardware_models.errors import InfersimWarning
from simulator.build import build_replica
from simulator.provenance import header_lines
from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict


def _build(ep: bool):
    data = scenario_dict(
        model={"name": "llama-3.1-8b"},
        hardware={"gpu": "h100-sxm"},
        parallelism={"tp": 2, "enable_expert_parallel": ep},
    )
    return build_replica(Scenario.from_dict(data))


def test_expert_parallelism_on_a_dense_model_is_said_and_ignored():
    with pytest.warns(InfersimWarning, match="no experts .*vLLM ignores it"):
        ignored = _build(True)
    plain = _build(False)
    assert ignored.memory == plain.memory
    assert ignored.cost.step(decode_seqs=8, decode_context=8000).gpu_seconds == (
        plain.cost.step(decode_seqs=8, decode_context=8000).gpu_seconds
    )


def test_the_run_reports_expert_parallelism_as_applied():
    """The header, the HTML report and run.configuration said `ep` for the run that
    ignored it."""
    data = scenario_dict(
        model={"name": "llama-3.1-8b"},
        hardware={"gpu": "h100-sxm"},
        parallelism={"tp": 2, "enable_expert_parallel": True},
        workload={"num_requests": 4},
    )
    with pytest.warns(InfersimWarning, match="no experts"):
        summary = simulate(Scenario.from_dict(data)).summary()
    assert summary["run"]["configuration"]["pools"][0]["ep"] is False
    assert summary["provenance"]["scenario"]["parallelism"]["enable_expert_parallel"] is False
    assert "ep)" not in header_lines(summary["run"]["configuration"])[0]
