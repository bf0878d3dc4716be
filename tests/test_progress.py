"""Progress shows where someone watches: a terminal or a Jupyter notebook (one line
redrawn in place, throttled), for a run, a sweep and a plan alike; never in a log or a
pipe, and never with progress=False (review 13, defect 11)."""

from __future__ import annotations

import io
import sys

import pytest

from simulator.planner import plan_capacity
from simulator.progress import NOTEBOOK_INTERVAL_S, bar_options
from simulator.scenario import Scenario
from simulator.simulation import simulate
from simulator.sweep import sweep
from tests.conftest import scenario_dict


class NotebookStream(io.StringIO):
    """What a Jupyter kernel gives as sys.stderr: no terminal, a class of ipykernel's."""


NotebookStream.__module__ = "ipykernel.iostream"


def run_all(progress: bool | None) -> None:
    """A run, a two-point sweep and a two-candidate plan, with `progress` where given."""
    flag = {} if progress is None else {"progress": progress}
    data = scenario_dict(output={"plots": False, "progress": True})  # the default
    data["workload"]["num_requests"] = 30
    simulate(Scenario.from_dict(data), **flag)
    swept = {**data, "sweep": {"grid": {"serving.max_num_seqs": [16, 32]}}}
    sweep(Scenario.from_dict(swept), workers=1, **flag)
    plan = {"gpus": ["l4"], "tp": [1, 2], "requests_per_probe": 100}
    planned = scenario_dict(slo={"ttft_ms": 1500}, model={"name": "llama-3.1-405b"}, plan=plan)
    plan_capacity(Scenario.from_dict(planned), workers=1, **flag)


def test_a_notebook_sees_a_run_a_sweep_and_a_plan_progress(monkeypatch):
    stream = NotebookStream()
    monkeypatch.setattr(sys, "stderr", stream)
    run_all(progress=None)  # each one's default
    shown = stream.getvalue()
    assert "\rtest:   0%|          | 0/30 [" in shown  # the run's requests
    assert "\rtest:   0%|          | 0/2 [00:00<?, ?point/s]" in shown  # the sweep's points
    assert "\rplan test:   0%|          | 0/2 [00:00<?, ?candidate/s]" in shown
    assert "\n" not in shown  # one line each, redrawn in place and cleared at the end


@pytest.mark.parametrize(
    ("stream", "progress"),
    [(io.StringIO(), None), (NotebookStream(), False)],
    ids=["a log or pipe", "progress=False in a notebook"],
)
def test_nothing_is_written_where_no_one_watches_or_progress_is_off(monkeypatch, stream, progress):
    monkeypatch.setattr(sys, "stderr", stream)
    run_all(progress)
    assert stream.getvalue() == ""


def test_a_notebook_redraws_at_most_twice_a_second_and_a_terminal_as_tqdm_does(monkeypatch):
    monkeypatch.setattr(sys, "stderr", NotebookStream())
    assert bar_options(True)["mininterval"] == NOTEBOOK_INTERVAL_S == 0.5
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", terminal)
    assert bar_options(True) == {"file": terminal, "leave": False}
    assert bar_options(False) is None
