"""What a simulation returns: its tables, a summary, plots and files."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hardware_models.errors import InfersimError
from simulator.metrics import summarize, summary_table, write_run
from simulator.metrics.context import RunContext
from simulator.metrics.run_tables import gap_table, request_table, step_table
from simulator.metrics.step_totals import StepTotals
from simulator.metrics.table import Table
from simulator.metrics.timeseries import timeseries_table

if TYPE_CHECKING:
    import pandas as pd

    from simulator.engine.requests import RequestTable
    from simulator.engine.step_log import ClosedLog
    from simulator.scenario import Scenario


class Results:
    """Tables of one run: `requests` (one row per request), `steps` (one row per engine
    step, when the scenario keeps them: `output.step_table`), `itl` (inter-token gaps
    with weights; binned 0.1% wide without a step table) and `timeseries` (binned over
    time), as pandas DataFrames made when first read; `totals` are the per-replica step
    sums the summary is computed from. The run itself keeps them as numpy columns
    (`request_table`, `step_table`, `itl_table`, `timeseries_table`): the summary and the
    files are made from those, so a run that only writes its files never imports pandas."""

    def __init__(
        self,
        scenario: Scenario,
        context: RunContext,
        requests: Table,
        totals: StepTotals,
        itl: Table,
        steps: Table | None = None,
        memory_table: str = "",
        resampled: np.ndarray | None = None,
    ) -> None:
        """`resampled`: when each token came that a prefill sampled for a request that had
        had tokens before (recomputed after a preemption, or retried), for the time
        series' output tokens."""
        self.scenario = scenario
        self.context = context
        self.request_table = requests
        self.totals = totals
        self.itl_table = itl
        self.step_table = steps
        self.memory_table = memory_table
        self.resampled = np.empty(0) if resampled is None else resampled

    @classmethod
    def from_run(
        cls,
        scenario: Scenario,
        memory_table: str,
        context: RunContext,
        requests: RequestTable,
        totals: Sequence[StepTotals],
        logs: Sequence[ClosedLog],
    ) -> Results:
        """`totals` and `logs`: each replica's step totals and closed step log (its steps,
        its gaps, its resampled tokens' times), replicas in order."""
        steps, gaps, resampled = zip(*logs, strict=True)
        merged = StepTotals.merge(totals)
        return cls(
            scenario,
            context,
            request_table(requests, context.priority_names),
            merged,
            gap_table(gaps, with_end=scenario.frontend.modelled),
            step_table(steps) if scenario.output.step_table else None,
            memory_table,
            np.concatenate(resampled),
        )

    # ---- the tables as DataFrames ---------------------------------------------------------
    @cached_property
    def requests(self) -> pd.DataFrame:
        return self.request_table.to_pandas()

    @cached_property
    def itl(self) -> pd.DataFrame:
        return self.itl_table.to_pandas()

    @cached_property
    def _steps(self) -> pd.DataFrame | None:
        return None if self.step_table is None else self.step_table.to_pandas()

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
        return self.timeseries_table.to_pandas()

    @cached_property
    def timeseries_table(self) -> Table:
        client = self.itl_table if "end" in self.itl_table else None  # the API server on
        return timeseries_table(
            self.request_table, self.totals, self.context, tokens=client, resampled=self.resampled
        )

    def summary(self) -> dict[str, Any]:
        """The run's summary (the content of summary.json), as a copy of its own: what the
        caller changes in it (a latency scaled to ms) stays out of the run's tables, files
        and comparisons, which read the run's copy."""
        return copy.deepcopy(self._summary)

    @cached_property
    def _summary(self) -> dict[str, Any]:
        return summarize(self.request_table, self.totals, self.itl_table, self.context)

    def summary_table(self) -> str:
        return summary_table(self._summary)

    # ---- plots ---------------------------------------------------------------------------
    # Titled with the scenario and hardware (metrics.plots.run_title), as the files are.
    def plot_latency_cdfs(self):
        from simulator.metrics.plots import latency_cdfs, run_title

        slo = self.summary()["goodput"]["slo"]
        return latency_cdfs(self.requests, self.itl, title=run_title(self.summary()), slo_s=slo)

    def plot_throughput_and_queue(self):
        from simulator.metrics.plots import run_title, throughput_and_queue

        return throughput_and_queue(self.timeseries, run_title(self.summary()))

    def plot_kv_and_batch(self):
        from simulator.metrics.plots import kv_and_batch, run_title

        return kv_and_batch(self.timeseries, run_title(self.summary()))

    # ---- files ---------------------------------------------------------------------------
    def write(
        self, outdir: str | Path, *, csv: bool | None = None, plots: bool | None = None,
        overwrite: bool = False,
    ) -> list[Path]:  # fmt: skip
        out = self.scenario.output
        return write_run(
            Path(outdir),
            self._summary,
            self.request_table,
            self.step_table,
            self.timeseries_table,
            self.itl_table,
            csv=out.csv if csv is None else csv,
            plots=out.plots if plots is None else plots,
            overwrite=overwrite,
            include_wall_time=False,  # summary.json is byte-identical for the same seed
        )

    def __repr__(self) -> str:
        return self.summary_table()

    def _repr_html_(self) -> str:  # a notebook's display; the module imports html
        from simulator.display import summary_html

        return summary_html(self._summary)
