"""What a simulation returns: pandas tables, a summary, plots and files."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from hardware_models.errors import InfersimError
from simulator.display import summary_html
from simulator.engine.step_cost import StepBound
from simulator.metrics import summarize, summary_table, timeseries, write_run
from simulator.metrics.context import RunContext
from simulator.metrics.step_totals import StepTotals

if TYPE_CHECKING:
    from simulator.engine.replica import Replica
    from simulator.engine.requests import RequestTable
    from simulator.scenario import Scenario


def _joined(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The replicas' tables one after another (a single one as it is, not copied)."""
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


class Results:
    """Tables of one run: `requests` (one row per request), `steps` (one row per engine
    step, when the scenario keeps them: `output.step_table`), `itl` (inter-token gaps
    with weights; binned 0.1% wide without a step table) and `timeseries` (binned over
    time). `totals` are the per-replica step sums the summary is computed from."""

    def __init__(
        self,
        scenario: Scenario,
        context: RunContext,
        requests: pd.DataFrame,
        totals: StepTotals,
        itl: pd.DataFrame,
        steps: pd.DataFrame | None = None,
        memory_table: str = "",
    ) -> None:
        self.scenario = scenario
        self.context = context
        self.requests = requests
        self.totals = totals
        self.itl = itl
        self._steps = steps
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
        tables, gaps = zip(*(r.log.close(context.duration_s) for r in replicas), strict=True)
        totals = StepTotals.merge([r.log.totals for r in replicas])
        steps = None
        if scenario.output.step_table:
            steps = _joined(tables)
            # One replica logs its steps in time order: sorting would only copy them.
            if len(tables) > 1 or not steps["start"].is_monotonic_increasing:
                steps = steps.sort_values(["start", "replica"], kind="stable", ignore_index=True)
            steps["bound"] = pd.Categorical.from_codes(
                steps["bound"].astype(int), categories=[b.name.lower() for b in StepBound]
            )
        return cls(
            scenario,
            context,
            requests.frame(list(context.priority_names)),
            totals,
            _joined(gaps),
            steps,
            memory_table,
        )

    @property
    def kept_steps(self) -> pd.DataFrame | None:
        """The per-step table, or None when the scenario kept none."""
        return self._steps

    @property
    def steps(self) -> pd.DataFrame:
        if self._steps is None:
            raise InfersimError(
                f"scenario {self.scenario.name!r} kept no per-step table "
                "(output.step_table: false); its summary and time series are complete"
            )
        return self._steps

    @cached_property
    def timeseries(self) -> pd.DataFrame:
        return timeseries(self.requests, self.totals, self.context)

    def summary(self) -> dict[str, Any]:
        return self._summary

    @cached_property
    def _summary(self) -> dict[str, Any]:
        return summarize(self.requests, self.totals, self.itl, self.context)

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
            self._steps,
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
