"""infersim's run-to-completion batchers (static, dynamic): the dynamic batcher's delay,
a static batch's wait for a full batch said when it inflates TTFT, and settings a
policy never reads said rather than silently ignored."""

from __future__ import annotations

import pytest

from simulator.scenario import Scenario
from simulator.simulation import simulate
from tests.conftest import scenario_dict

CLASSES = [
    {"name": "hi", "weight": 1, "priority": 0},
    {"name": "lo", "weight": 1, "priority": 1},
]


def _run(serving: dict, **workload):
    data = scenario_dict(serving=serving, workload={"num_requests": 40, **workload})
    return simulate(Scenario.from_dict(data), progress=False)


def test_dynamic_delay_runs_from_the_oldest_request_whatever_its_class():
    """Triton's max_queue_delay is the longest any request waits for a batch: on a nearly
    idle GPU no request of either class waits much longer (a low one used to wait for
    the delay counted from each newer high one)."""
    serving = {"policy": "dynamic", "max_num_seqs": 64, "max_queue_delay_ms": 1000,
               "scheduling_policy": "priority"}  # fmt: skip
    results = _run(
        serving,
        arrivals={"kind": "poisson", "rate_per_s": 3.0},
        output_tokens={"kind": "fixed", "tokens": 2},
        priorities=CLASSES,
    )
    req = results.requests
    assert set(req["priority_class"]) == {"hi", "lo"}
    waited = req["first_scheduled"] - req["arrival"]
    assert waited.max() <= 1.0 + 1e-9


def _static_fill_warnings(rate: float) -> list[str]:
    serving = {"policy": "static", "max_num_seqs": 16}
    results = _run(serving, arrivals={"kind": "poisson", "rate_per_s": rate})
    return [w for w in results.summary()["warnings"] if "waits for a full batch" in w]


def test_a_static_batch_waiting_on_an_idle_gpu_is_said_with_its_cost():
    (warning,) = _static_fill_warnings(0.2)
    assert warning.startswith(
        "serving.policy static waits for a full batch of max_num_seqs=16: the GPUs sat idle "
    )
    assert "ms to the mean TTFT of" in warning
    assert _static_fill_warnings(200.0) == []  # batches fill at once


@pytest.mark.parametrize(
    ("serving", "said"),
    [
        ({"policy": "static", "max_num_batched_tokens": 100},
         "serving.max_num_batched_tokens=100 is ignored by serving.policy static"),
        ({"policy": "dynamic", "watermark": 0.5},
         "serving.watermark=0.5 is ignored by serving.policy dynamic"),
        ({"policy": "chunked_prefill", "max_queue_delay_ms": 5000},
         "serving.max_queue_delay_ms=5000.0 is ignored by serving.policy chunked_prefill"),
    ],
)  # fmt: skip
def test_a_setting_the_policy_never_reads_is_said(serving, said):
    warnings = _run({"max_num_seqs": 8, **serving}, num_requests=8).summary()["warnings"]
    assert len([w for w in warnings if w.startswith(said)]) == 1


def test_settings_the_policy_reads_are_not_said():
    serving = {"policy": "dynamic", "max_queue_delay_ms": 50, "max_num_batched_tokens": None}
    warnings = _run(serving, num_requests=8).summary()
    assert not [w for w in warnings["warnings"] if "is ignored by" in w]
