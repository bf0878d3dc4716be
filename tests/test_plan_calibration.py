"""A plan says which GPUs it prices on kernels measured on them and which on a profile
transferred from another chip or on the datasheet, per candidate and in a footnote."""

import pandas as pd

from simulator.cli.plan_cmd import _calibration_note
from simulator.planner import Candidate, calibration_source, evaluate
from simulator.scenario import Scenario
from tests.conftest import scenario_dict


def _scenario(**sections):
    plan = {"gpus": ["h100-sxm"], "tp": [1], "requests_per_probe": 100}
    return Scenario.from_dict(scenario_dict(plan=plan, slo={"ttft_ms": 1000}, **sections))


def test_each_gpu_names_its_calibration_source():
    """H100: its own fitted profile; H200: the H100's, transferred (same die); B200: no
    measured Blackwell chip, the datasheet's efficiencies; `none` forces the datasheet."""
    scenario = _scenario()
    assert calibration_source(scenario, "h100-sxm") == "fitted"
    assert calibration_source(scenario, "h200-sxm") == "from h100-sxm"
    assert calibration_source(scenario, "b200") == "datasheet"
    none = _scenario(hardware={"gpu": "h100-sxm", "calibration": "none"})
    assert calibration_source(none, "h100-sxm") == "datasheet"


def test_every_candidate_row_carries_its_calibration():
    """Also an infeasible candidate's (405B in bf16 on one H100): the column is the GPU's."""
    scenario = _scenario(model={"name": "llama-3.1-405b", "weight_dtype": "bf16"})
    (row,) = evaluate(scenario, Candidate("h200-sxm", 1, 1, "chunked_prefill"))
    assert row["status"] == "infeasible" and row["calibration"] == "from h100-sxm"


def test_the_footnote_names_what_the_ranking_compares():
    table = pd.DataFrame(
        {
            "gpu": ["h100-sxm", "h200-sxm", "b200", "a100-80gb-sxm"],
            "calibration": ["fitted", "from h100-sxm", "datasheet", "fitted"],
            "status": ["ok", "ok", "unverified", "infeasible"],
        }
    )
    note = _calibration_note(table)
    assert note.startswith("calibration: h200-sxm (from h100-sxm) and b200 (datasheet) priced")
    assert "ranked here against h100-sxm, priced on its own measured kernels" in note
    assert "a100" not in note  # not ranked
    assert _calibration_note(table[table["calibration"] == "fitted"]) == ""
