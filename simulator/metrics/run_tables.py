"""The tables of one run, made from what the engine logged: requests (with latencies
derived), steps (when kept) and inter-token gaps, as numpy columns (simulator.metrics.table).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.engine.requests import REJECT_TEXT, Outcome, RejectReason, RequestTable
from simulator.engine.step_cost import StepBound
from simulator.metrics.table import Labels, Table, from_rows

OUTCOMES = tuple(o.name.lower() for o in Outcome)
BOUNDS = tuple(b.name.lower() for b in StepBound)
_REASONS = tuple(REJECT_TEXT[reason] for reason in RejectReason)


def request_table(requests: RequestTable, priority_names: Sequence[str]) -> Table:
    """One row per request (index `request_id`): the engine's columns, outcome as a
    categorical, reason and priority class as text, then ttft, e2e, queueing and tpot
    (e2e and tpot of completed requests only; tpot needs two tokens or more)."""
    cols = requests.columns()
    table: dict[str, np.ndarray | Labels] = dict(cols)
    table["outcome"] = Labels(cols["outcome"], OUTCOMES, categorical=True)
    table["reason"] = Labels(cols["reason"], _REASONS)
    table["priority_class"] = Labels(cols["priority_class"], tuple(priority_names or ["default"]))
    arrival, finish, first = cols["arrival"], cols["finish"], cols["first_token"]
    completed = cols["outcome"] == Outcome.COMPLETED
    generated = cols["generated"]
    decode_tokens = np.where(generated > 1, generated - 1, np.nan)
    table["ttft"] = first - arrival
    table["e2e"] = np.where(completed, finish - arrival, np.nan)
    table["queueing"] = cols["first_scheduled"] - arrival
    table["tpot"] = np.where(completed, (finish - first) / decode_tokens, np.nan)
    return Table(table, index_name="request_id")


def step_table(parts: Sequence[np.ndarray]) -> Table:
    """The replicas' step rows in time order (ties by replica), bound as a categorical.
    One replica logs its steps in time order: they are not sorted (nor copied) again."""
    rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if len(parts) > 1 or np.any(rows["start"][1:] < rows["start"][:-1]):
        rows = rows[np.lexsort((rows["replica"], rows["start"]))]
    table = from_rows(rows)
    table.columns["bound"] = Labels(table["bound"], BOUNDS, categorical=True)
    return table


def gap_table(parts: Sequence[np.ndarray], *, with_end: bool = False) -> Table:
    """The replicas' inter-token gaps (seconds, weight), one replica after another; with
    `with_end`, also when each gap's token came (the API server model's client times)."""
    rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
    if not with_end and "end" in (rows.dtype.names or ()):
        rows = rows[["seconds", "weight"]]
    return from_rows(rows)
