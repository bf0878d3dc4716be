"""What a simulation returns: pandas tables, a summary, plots and files."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from simulator.display import summary_html
from simulator.engine.step_cost import StepBound
from simulator.metrics import summarize, summary_table, timeseries, write_run
from simulator.metrics.context import RunContext

if TYPE_CHECKING:
    from simulator.engine.replica import Replica
    from simulator.engine.requests import RequestTable
    from simulator.scenario import Scenario


def _clip_to_run(steps: pd.DataFrame, end: float) -> pd.DataFrame:
    """Steps as far as the run went: a padded batch logs its steps ahead, and a step in
    flight when the run stops counts only up to the stop (its work pro rata)."""
    steps = steps[steps["start"] < end].copy()
    over = steps["start"] + steps["duration"] > end
    if over.any():
        kept = (end - steps.loc[over, "start"]) / steps.loc[over, "duration"]
        for column in ("flops", "dram_bytes"):
            steps.loc[over, column] *= kept
        steps.loc[over, "duration"] = end - steps.loc[over, "start"]
    return steps


class Results:
    """Tables of one run: `requests` (one row per request), `steps` (one row per engine
    step), `itl` (inter-token gaps with weights) and `timeseries` (binned over time)."""

    def __init__(
        self,
        scenario: Scenario,
        context: RunContext,
        requests: pd.DataFrame,
        steps: pd.DataFrame,
        itl: pd.DataFrame,
        memory_table: str = "",
    ) -> None:
        self.scenario = scenario
        self.context = context
        self.requests = requests
        self.steps = steps
        self.itl = itl
        self.memory_table = memory_table

    @classmethod
    def from_run(
        cls,
        scenario: Scenario,
        memory_table: str,
        context: RunContext,
        requests: RequestTable,
        replicas: Sequence[Replica],
    ) -> Results:
        steps = pd.concat([r.log.steps.frame() for r in replicas], ignore_index=True)
        steps = _clip_to_run(steps, context.duration_s)
        steps = steps.sort_values(["start", "replica"], kind="stable", ignore_index=True)
        steps["bound"] = pd.Categorical.from_codes(
            steps["bound"].astype(int), categories=[b.name.lower() for b in StepBound]
        )
        itl = pd.concat([r.log.itl.frame() for r in replicas], ignore_index=True)
        return cls(
            scenario,
            context,
            requests.frame(list(context.priority_names)),
            steps,
            itl,
            memory_table,
        )

    @cached_property
    def timeseries(self) -> pd.DataFrame:
        return timeseries(self.requests, self.steps, self.context)

    def summary(self) -> dict[str, Any]:
        return self._summary

    @cached_property
    def _summary(self) -> dict[str, Any]:
        return summarize(self.requests, self.steps, self.itl, self.context)

    def summary_table(self) -> str:
        return summary_table(self.summary())

    # ---- plots ---------------------------------------------------------------------------
    def plot_latency_cdfs(self):
        from simulator.metrics.plots import latency_cdfs

        return latency_cdfs(self.requests, self.itl)

    def plot_throughput_and_queue(self):
        from simulator.metrics.plots import throughput_and_queue

        return throughput_and_queue(self.timeseries)

    def plot_kv_and_batch(self):
        from simulator.metrics.plots import kv_and_batch

        return kv_and_batch(self.timeseries)

    # ---- files ---------------------------------------------------------------------------
    def write(
        self, outdir: str | Path, *, csv: bool | None = None, plots: bool | None = None,
        overwrite: bool = False,
    ) -> list[Path]:  # fmt: skip
        out = self.scenario.output
        return write_run(
            Path(outdir),
            self.summary(),
            self.requests,
            self.steps,
            self.timeseries,
            self.itl,
            csv=out.csv if csv is None else csv,
            plots=out.plots if plots is None else plots,
            overwrite=overwrite,
            include_wall_time=False,  # summary.json is byte-identical for the same seed
        )

    def __repr__(self) -> str:
        return self.summary_table()

    def _repr_html_(self) -> str:
        return summary_html(self.summary())
