"""Runs that share a process in threads (a thread pool, a threaded Dask worker) each keep
their own warnings: in their summary, and passed on once, named by their own run
(hardware_models.warning_scope). Python's warnings.catch_warnings, which swaps the
process's filters and display, lost them or pinned them on the wrong run here."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from hardware_models.errors import InfersimWarning
from hardware_models.warning_scope import recording, warn
from simulator.scenario import Scenario
from simulator.simulation import simulate
from simulator.sweep import sweep
from tests.conftest import scenario_dict

REJECTED = "were rejected because prompt + output exceed max_model_len"


def _rejecting(name: str, max_model_len: int) -> Scenario:
    """30 requests of which those longer than `max_model_len` are rejected: a warning
    whose count tells the runs apart."""
    data = scenario_dict(serving={"max_model_len": max_model_len})
    data["workload"]["num_requests"] = 30
    return Scenario.from_dict({**data, "name": name})


def test_a_recording_sees_only_its_own_threads_warnings():
    """Two threads raise at once, each inside its own recording: each records its own
    warnings and nothing else, and the process's filters are left as they were."""
    filters = list(warnings.filters)
    both_recording = threading.Barrier(2)

    def raise_three(tag: str) -> list[str]:
        with recording() as caught:
            both_recording.wait()
            for i in range(3):
                warn(f"{tag} {i}")
                both_recording.wait()
        return [str(w.message) for w in caught]

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(raise_three, ["a", "b"])
    assert (a, b) == (["a 0", "a 1", "a 2"], ["b 0", "b 1", "b 2"])
    assert warnings.filters == filters


def test_a_recorded_warning_names_the_callers_line():
    with recording() as caught:
        warn("here")
    assert caught[0].filename == __file__
    assert caught[0].category is InfersimWarning


def test_simulations_in_threads_each_say_their_own_warnings():
    """Four runs at once in a thread pool: each summary holds its own rejections, and
    each reaches the caller once, named by its own run."""
    lengths = {"r300": 300, "r500": 500, "r700": 700, "r900": 900}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = {
            name: simulate(_rejecting(name, n), progress=False).summary()["warnings"]
            for name, n in lengths.items()
        }
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with ThreadPoolExecutor(len(lengths)) as pool:
            runs = dict(zip(lengths, pool.map(
                lambda item: simulate(_rejecting(*item), progress=False), lengths.items()
            ), strict=True))  # fmt: skip
    for name, results in runs.items():
        assert results.summary()["warnings"] == alone[name]
        assert any(REJECTED in text for text in alone[name])
    said = sorted(str(w.message) for w in seen if issubclass(w.category, InfersimWarning))
    expected = sorted(f"scenario {name}: {text}" for name in alone for text in alone[name])
    assert said == expected


@contextlib.contextmanager
def _threaded_dask_client() -> Iterator[Any]:
    """A Dask client on one in-process worker running four tasks in threads, as Dask's
    default Client does on a machine of more than four cores."""
    distributed = pytest.importorskip("distributed", reason="needs the distributed package")
    with (
        distributed.LocalCluster(
            n_workers=1, processes=False, threads_per_worker=4, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


def test_a_sweep_on_a_threaded_dask_worker_says_each_points_warnings():
    """Dask's default worker runs several tasks in threads of one process: the sweep
    says the same warnings, each naming its point, as in-process."""
    data = scenario_dict()
    data["workload"]["num_requests"] = 30
    data["sweep"] = {"grid": {"serving.max_model_len": [300, 500, 700, 900]}}
    scenario = Scenario.from_dict(data)

    def said(**where) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            sweep(scenario, progress=False, **where)
        return sorted(str(w.message) for w in seen if issubclass(w.category, InfersimWarning))

    in_process = said(workers=1)
    assert sum(REJECTED in text for text in in_process) == 4
    with _threaded_dask_client() as client:
        assert said(client=client) == in_process


@pytest.mark.slow  # ~9 s: eight candidates' probes, twice
def test_a_plan_on_a_threaded_dask_worker_says_each_candidates_warnings(make_scenario):
    """The planner's candidates, run in threads of one Dask worker, say the warnings
    they say in process, each naming its candidate (pp=2 splits max_num_seqs)."""
    from simulator.planner import plan_capacity

    scenario = make_scenario(
        slo={"ttft_ms": 1500, "tpot_ms": 60},
        workload={"arrivals": {"kind": "poisson", "rate_per_s": 6.0}},
        plan={"gpus": ["a100-80gb-sxm", "h100-sxm"], "tp": [1], "pp": [1, 2],
              "requests_per_probe": 100, "headroom": 0.1},
    )  # fmt: skip

    def said(**where) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            plan_capacity(scenario, progress=False, **where)
        return [str(w.message) for w in seen if issubclass(w.category, InfersimWarning)]

    in_process = said(workers=1)
    assert any("pp=2: serving.max_num_seqs=64 is split" in text for text in in_process)
    with _threaded_dask_client() as client:
        assert said(client=client) == in_process


def test_the_packages_raise_their_warnings_through_warning_scope():
    """A run records only what `warn` raises: a `warnings.warn` elsewhere in the packages
    would reach the caller unrecorded, missing from the run's summary (as three did when
    streams written before warning_scope were merged)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    allowed = {
        "hardware_models/warning_scope.py",  # the fallback with no recording open
        "simulator/cli/run_cmd.py",  # the CLI passing a finished run's warnings on
    }
    found = sorted(
        str(path.relative_to(root))
        for package in ("simulator", "hardware_models")
        for path in (root / package).rglob("*.py")
        if "warnings.warn(" in path.read_text() and str(path.relative_to(root)) not in allowed
    )
    assert found == []
