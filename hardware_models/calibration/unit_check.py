"""The table as a whole against the chip it is priced on: a time unit slipped, or
another GPU's measurements.

The plausibility screen (screen.py) leaves out single rows no kernel could have produced;
a table of which a large share is impossible, or whose typical row is a hundred times the
model's, was not measured in the unit its column says or not on this chip, and a profile
fitted to it would be off by that factor everywhere. The public tables show what a sound
table looks like on its own chip: no row faster than a floor (only eagerly timed,
host-bound rows left out) and a median measured / uncalibrated ratio of 1.0-1.6 per op
class (MLA modules on the A100: 6-18x), while the same tables priced on another GPU
(H100 on L40S, A100 on L40S) have 21-52% of a class's rows faster than that chip allows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration.screen import HOST_BOUND, Screened
from hardware_models.calibration.validate import predict_all

# A class with more of its rows faster than the chip allows was not measured on it (its
# own tables: none; another chip's: 21-52%).
MAX_IMPOSSIBLE_SHARE = 0.2
# A median measured / uncalibrated ratio beyond this (either way) is a unit, not a kernel:
# the public tables stay within 1.0-1.6 (A100 MLA: 18), a ms/us or s/ms slip is 1000x.
MAX_MEDIAN_RATIO = 100.0
SAMPLE_ROWS = 200  # rows per op class priced for the median: enough, and a second at most


def table_problem(
    rows: pd.DataFrame,
    screened: Screened,
    spec: AcceleratorSpec,
    node: str | Path | None,
    time_column: str,
) -> str | None:
    """Why `rows` (priceable on `spec`, collectives over `node`'s link; `screened` their
    screen) cannot be this chip's measurements in the unit `time_column` says, in one
    line, or None."""
    ratio = median_ratios(rows, spec, node)
    for op_class, value in ratio.items():
        if not 1 / MAX_MEDIAN_RATIO <= value <= MAX_MEDIAN_RATIO:
            slip = (
                "a unit 1000x finer (us for ms, ms for s)"
                if value > 1
                else "one 1000x coarser (s for ms, ms for us)"
            )
            return (
                f"the {op_class} rows take a median {_times(value)} the uncalibrated "
                f"{spec.name} model's time: is {time_column} really in that unit, not in "
                f"{slip}? (or were they measured on another GPU: pass --gpu)"
            )
    impossible = screened.excluded[screened.excluded["reason"] != HOST_BOUND]
    totals = rows["op_class"].value_counts()
    for op_class, group in impossible.groupby("op_class"):
        share = len(group) / totals[op_class]
        if share > MAX_IMPOSSIBLE_SHARE:
            return (
                f"{len(group)} of {totals[op_class]} {op_class} rows ({share:.0%}) ran faster "
                f"than the {spec.name} allows (up to {group['times_floor'].max():.2g}x): "
                f"measured on another GPU (pass --gpu for the one they ran on) or "
                f"{time_column} in another unit"
            )
    return None


def median_ratios(rows: pd.DataFrame, spec: AcceleratorSpec, node: str | Path | None) -> pd.Series:
    """Per op class, the median of measured / uncalibrated seconds over a seeded sample
    of at most SAMPLE_ROWS of its rows (classes no row of which can be priced: none)."""
    sample = pd.concat(
        [g.sample(min(len(g), SAMPLE_ROWS), random_state=0) for _c, g in rows.groupby("op_class")]
        or [rows.iloc[:0]]
    )
    ratio = sample["measured_s"] / predict_all(sample, spec, node=node)
    return ratio[np.isfinite(ratio)].groupby(sample["op_class"]).median()


def _times(value: float) -> str:
    return f"{value:.3g}x" if value >= 1 else f"1/{1 / value:.3g}"
