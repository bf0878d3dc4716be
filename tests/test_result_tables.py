"""A run's tables as numpy columns: the DataFrames made of them, the Parquet files written
from them without pandas, and the summary of either form."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from simulator.metrics import summarize, timeseries
from simulator.metrics.parquet import write_parquet
from simulator.metrics.table import Labels, Table
from simulator.simulation import simulate


@pytest.fixture(scope="module")
def results():
    """Two replicas, two classes, a failure, a horizon and a KV cache too small for some
    prompts: every kind of outcome and reason, NaNs in the latency columns, and steps
    of two replicas to interleave."""
    from simulator.scenario import Scenario
    from tests.conftest import scenario_dict

    workload = {
        "arrivals": {"kind": "poisson", "rate_per_s": 30.0},
        "num_requests": 400,
        "duration_s": 12.0,
        "priorities": [{"name": "chat", "weight": 3}, {"name": "batch", "priority": 1}],
    }
    scenario = scenario_dict(
        parallelism={"replicas": 2, "router": "round_robin"},
        serving={"max_model_len": 900, "scheduling_policy": "priority"},
        workload=workload,
        faults={"events": [{"replica": 1, "at_s": 6.0}], "on_failure": "fail"},
    )
    return simulate(Scenario.from_dict(scenario), progress=False)


def _tables(results):
    return {
        "requests": (results.request_table, results.requests),
        "steps": (results.step_table, results.steps),
        "timeseries": (results.timeseries_table, results.timeseries),
        "itl": (results.itl_table, results.itl),
    }


def test_the_run_has_every_outcome_and_missing_latencies(results):
    outcomes = set(results.requests["outcome"].astype(str))
    assert {"completed", "rejected", "failed", "in_flight"} <= outcomes
    assert results.requests["tpot"].isna().any() and results.requests["e2e"].isna().any()
    assert set(results.requests["priority_class"]) == {"chat", "batch"}


@pytest.mark.parametrize("name", ["requests", "steps", "timeseries", "itl"])
def test_parquet_written_without_pandas_reads_back_as_pandas_wrote_it(results, tmp_path, name):
    """The file of a Table and the file `DataFrame.to_parquet` writes of its DataFrame have
    the same Arrow types and nulls, and read back as the same frame."""
    table, frame = _tables(results)[name]
    ours, theirs = tmp_path / "ours.parquet", tmp_path / "theirs.parquet"
    write_parquet(table, ours)
    frame.to_parquet(theirs)
    read = pq.read_table(ours)
    assert read.schema.remove_metadata() == pq.read_table(theirs).schema.remove_metadata()
    for column in read.column_names:
        assert read[column].null_count == pq.read_table(theirs)[column].null_count, column
    pd.testing.assert_frame_equal(pd.read_parquet(ours), frame, check_exact=True)
    pd.testing.assert_frame_equal(pd.read_parquet(ours), pd.read_parquet(theirs))


def test_tables_go_to_pandas_and_back(results):
    for table, frame in _tables(results).values():
        back = Table.from_pandas(frame)
        assert list(back) == list(table) and back.index_name == table.index_name
        pd.testing.assert_frame_equal(back.to_pandas(), frame, check_exact=True)
    outcome = Table.from_pandas(results.requests)["outcome"]
    assert outcome.categorical and outcome.names == results.request_table["outcome"].names


def test_summary_and_series_of_dataframes_are_those_of_the_tables(results):
    ctx = results.context
    frames = summarize(results.requests, results.steps, results.itl, ctx)
    assert frames == summarize(results.request_table, results.step_table, results.itl_table, ctx)
    assert summarize(results.requests, results.totals, results.itl, ctx) == results.summary()
    pd.testing.assert_frame_equal(
        timeseries(results.requests, results.step_table, ctx), results.timeseries, rtol=1e-9
    )


def test_labels_count_and_select_by_name():
    labels = Labels(np.array([0, 2, 2, 1, 2], np.int8), ("a", "b", "a"))
    assert labels.equals("a").tolist() == [True, True, True, False, True]
    assert labels.counts() == {"a": 4, "b": 1}
    assert labels.counts(np.array([False, True, False, True, False])) == {"a": 1, "b": 1}
    assert labels.take(np.array([3])).text().tolist() == ["b"]


def test_a_table_refuses_columns_of_different_lengths():
    with pytest.raises(ValueError, match="different lengths"):
        Table({"a": np.zeros(2), "b": np.zeros(3)})


def test_empty_tables_write_as_pandas_writes_them(tmp_path):
    table = Table(
        {"x": np.empty(0), "n": np.empty(0, np.int32), "why": Labels(np.empty(0, np.int8), ("",)),
         "kind": Labels(np.empty(0, np.int8), ("a", "b"), categorical=True)},
        index_name="request_id",
    )  # fmt: skip
    write_parquet(table, tmp_path / "ours.parquet")
    table.to_pandas().to_parquet(tmp_path / "theirs.parquet")
    ours, theirs = (pd.read_parquet(tmp_path / f"{n}.parquet") for n in ("ours", "theirs"))
    pd.testing.assert_frame_equal(ours, theirs)  # (an empty dictionary keeps no categories)


def test_write_run_refuses_a_frame_whose_index_the_file_would_lose(results, tmp_path):
    from hardware_models.errors import InfersimError
    from simulator.metrics import write_run

    chat = results.requests[results.requests["priority_class"] == "chat"]
    with pytest.raises(InfersimError, match="requests table's index is not 0, 1, 2"):
        write_run(tmp_path, {}, chat, None, results.timeseries, results.itl, plots=False)
    write_run(tmp_path, {}, chat.reset_index(drop=True), None, results.timeseries,
              results.itl, plots=False, overwrite=True)  # fmt: skip
    back = pd.read_parquet(tmp_path / "requests.parquet")
    pd.testing.assert_frame_equal(back, chat.reset_index(drop=True))
