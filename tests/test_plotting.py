"""The cross-run figures read the tables the package writes: compare tables, and sweep
and plan tables with their own column names; a missing column is a clear error."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hardware_models.errors import InfersimError
from simulator.plotting import pareto_front, plot_knee, plot_pareto
from simulator.sweep import METRICS

COST = [3.0, 2.0, 4.0, 2.5]
TTFT = [100.0, 300.0, 50.0, 400.0]  # the last is beaten on both by the second


def sweep_like() -> pd.DataFrame:
    """A sweep table's columns (simulator.sweep.METRICS), two loads x two batch caps."""
    table = pd.DataFrame({column: np.arange(4.0) for column, _, _ in METRICS})
    table["usd_per_million_output_tokens"] = COST
    table["ttft_p99_ms"] = TTFT
    table["name"] = [f"point {i}" for i in range(4)]
    table["workload.arrivals.rate_per_s"] = [1.0, 2.0, 1.0, 2.0]
    table["serving.max_num_seqs"] = [8, 8, 64, 64]
    table["overloaded"] = [False, False, False, True]
    return table


def plan_like() -> pd.DataFrame:
    """What `infersim plan` writes to plan.csv, read back."""
    return pd.DataFrame(
        {"gpu": ["h100-sxm", "h200-sxm", "a100-80gb-sxm", "l40s"], "tp": [4, 2, 8, 1],
         "replicas": [2, 3, 1, 4], "usd_per_million_output_tokens": COST,
         "ttft_p99_ms": TTFT, "tpot_p99_ms": [20.0] * 4}
    )  # fmt: skip


@pytest.mark.parametrize("table", [sweep_like(), plan_like()], ids=["sweep", "plan"])
def test_pareto_reads_sweep_and_plan_tables_by_their_own_names(table):
    assert pareto_front(table).tolist() == [True, True, True, False]
    ax = plot_pareto(table, slo_ms=500).axes[0]
    assert ax.get_xlabel() == "usd_per_million_output_tokens"
    labels = {t.get_text() for t in ax.texts}
    assert labels == ({"point 0", "point 1", "point 2"} if "name" in table else
                      {"h100-sxm tp4 x2", "h200-sxm tp2 x3", "a100-80gb-sxm tp8 x1"})  # fmt: skip


def test_knee_reads_a_sweep_table_with_its_default_metrics():
    fig = plot_knee(sweep_like(), load="workload.arrivals.rate_per_s",
                    by="serving.max_num_seqs", slo={"TTFT p99 ms": 250})  # fmt: skip
    assert [ax.get_ylabel() for ax in fig.axes] == ["ttft_p99_ms", "tpot_p99_ms"]
    assert len(fig.axes[0].get_lines()) == 3  # two configurations and the SLO


def test_a_compare_table_still_reads_by_its_names():
    table = pd.DataFrame({"$/1M out tok": COST, "TTFT p99 ms": TTFT}, index=list("abcd"))
    ax = plot_pareto(table).axes[0]
    assert ax.get_ylabel() == "TTFT p99 ms"
    assert {t.get_text() for t in ax.texts} == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda t: plot_pareto(t[["ttft_p99_ms"]]),
         "cost: no column '$/1M out tok' (nor 'usd_per_million_output_tokens') in the table; "
         "it has 'ttft_p99_ms'"),
        (lambda t: plot_knee(t, load="rate"), "load: no column 'rate' in the table; it has"),
        (lambda t: plot_knee(t, load="workload.arrivals.rate_per_s", metrics=["ttft p99"]),
         "metrics: no column 'ttft p99'"),
    ],
)  # fmt: skip
def test_a_missing_column_names_what_the_table_has(call, message):
    with pytest.raises(InfersimError) as caught:
        call(sweep_like())
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
