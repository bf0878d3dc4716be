"""Fit and validate end to end: what `infersim calibrate fit` / `validate` run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration.benchmark_loops import unknown_loop_note
from hardware_models.calibration.error_report import to_markdown
from hardware_models.calibration.fit import fit_profile
from hardware_models.calibration.fit_links import fit_links
from hardware_models.calibration.gemm_csv import implausible_row
from hardware_models.calibration.measured_tables import (
    COLLECTIVE_CLASSES,
    SHAPE_COLUMNS,
    supported_mask,
)
from hardware_models.calibration.profile_file import (
    CalibrationProfile,
    FittedLink,
    ProfileMetadata,
)
from hardware_models.calibration.screen import Screened, screen
from hardware_models.calibration.sources import Measurements, rows_for
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.unit_check import table_problem
from hardware_models.calibration.validate import (
    node_link,
    plot_before_after,
    plot_error_vs_size,
    predict_all,
    unpriced_rows,
    validation_tables,
)
from hardware_models.efficiency import CollectiveFit
from hardware_models.errors import InfersimError
from hardware_models.node import LinkSpec
from hardware_models.warning_scope import warn

LINK_FIT_OP = "all_reduce"


def fit_measurements(
    measurements: Measurements,
    spec: AcceleratorSpec,
    holdout: float = 0.5,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    curves_only: bool = False,
    node: str | Path | None = None,
) -> CalibrationProfile:
    """A profile fitted to the plausible shapes outside the seeded held-out fraction (see
    `usable_rows`); with `curves_only`, only its efficiency curves (see `fit_profile`),
    links left as they are. Collectives run over `node`'s link (default: see node_link)."""
    usable = usable_rows(measurements, spec, node)
    if progress is not None:
        for line in usable.lines():
            progress(line)
    rows = usable.rows
    fit_rows = rows[~holdout_mask(rows, holdout, seed)]
    if fit_rows.empty:
        raise InfersimError("no rows left to fit after the holdout split")
    efficiency = fit_profile(spec, fit_rows, seed, progress, curves_only)
    links = []
    link = usable.link
    if link is not None and not curves_only:
        fitted = fit_links(fit_rows, link, LINK_FIT_OP)
        counts = fit_rows[fit_rows["op_class"] == LINK_FIT_OP].groupby("num_gpus").size()
        links = [
            FittedLink(num_gpus=p, fitted_on=LINK_FIT_OP, rows=int(counts[p]), link=fitted[p])
            for p in sorted(fitted)
        ]
        collective = {
            p: CollectiveFit(
                latency_us=f.latency_us, efficiency=f.efficiency, fitted_over=link.signature()
            )
            for p, f in fitted.items()
        }
        efficiency = efficiency.model_copy(update={"collective_by_gpus": collective})
    used = fit_rows.groupby("op_class").size()
    sizes = fit_rows.groupby("op_class")["size"].agg(["min", "max"])
    for text in unconstrained_terms(fit_rows, curves_only):
        warn(text)
    return CalibrationProfile(
        metadata=ProfileMetadata(
            source=measurements.source,
            gpu=spec.name,
            rows_used={str(k): int(v) for k, v in used.items()},
            holdout=holdout,
            seed=seed,
            curves_only=curves_only,
            size_ranges={str(k): (float(r["min"]), float(r["max"])) for k, r in sizes.iterrows()},
        ),
        efficiency=efficiency,
        links=links,
    )


# A GEMM with at most this many rows is bound by the kernel's floor and its per-wave
# latency, not by its FLOPs or bytes: a fit without one cannot tell those terms apart.
SMALL_GEMM_ROWS = 64


def unconstrained_terms(fit_rows: pd.DataFrame, curves_only: bool) -> list[str]:
    """Warnings for fitted terms the rows cannot constrain: a GEMM floor and per-wave
    latency fitted without small GEMMs (a table of large shapes only) price every small
    one by extrapolation (a fit on m, n, k >= 4096 priced 16x2048x2048 at 8x its time)."""
    gemm = fit_rows[fit_rows["op_class"] == "gemm"]
    if curves_only or gemm.empty or gemm["m"].min() <= SMALL_GEMM_ROWS:
        return []
    return [
        f"no GEMM row with m <= {SMALL_GEMM_ROWS} (smallest m {gemm['m'].min():.0f}): "
        "the GEMM floor and per-wave latency are extrapolated to small GEMMs; add small "
        "shapes, or fit with --curves-only to keep the preset's"
    ]


@dataclass(frozen=True)
class UsableRows:
    """The rows a fit or a validation uses, and what it left out and why."""

    rows: pd.DataFrame  # measured on the GPU, priceable and plausible
    link: LinkSpec | None  # what the collectives ran over
    screened: Screened  # the implausible rows (screen.py)
    unpriced: pd.DataFrame  # op_class, reason, rows: rows no model here can price
    notes: tuple[str, ...] = ()  # rows priced on an assumption (benchmark_loops)

    def lines(self) -> list[str]:
        """What was left out, one terminal line per (op class, reason), and what was
        priced on an assumption."""
        out = [
            f"left out {r.rows} {r.op_class} rows: {r.reason}"
            for r in self.unpriced.itertuples(index=False)
        ]
        out += [
            f"left out {r.rows} {r.op_class} rows as implausible: {r.reason} "
            f"(up to {r.max_times_floor:.2g}x)"
            for r in self.screened.counts().itertuples(index=False)
        ]
        return out + list(self.notes)


def usable_rows(
    measurements: Measurements, spec: AcceleratorSpec, node: str | Path | None = None
) -> UsableRows:
    """The rows measured on `spec` less those that cannot be priced on it (a GEMM dtype it
    lacks, collectives with no link) and those the plausibility screen rejects; a
    hand-made table's first impossible row is refused outright (a unit slip), and any
    table whose rows as a whole are not this chip's in its time unit (unit_check)."""
    rows = rows_for(measurements, spec)
    problem = implausible_row(rows, spec) if measurements.hand_made else None
    if problem is not None:
        raise InfersimError(f"{measurements.source}: {problem}")
    link, link_problem = node_link(spec, node)
    priceable = supported_mask(rows, lambda _name: spec)
    if link is None:
        priceable &= ~rows["op_class"].isin(COLLECTIVE_CLASSES)
    marks = pd.Series(np.where(priceable, 0.0, np.nan), index=rows.index)
    unpriced = unpriced_rows(rows, marks, spec, link_problem)
    screened = screen(rows[priceable], spec, link)
    problem = table_problem(rows[priceable], screened, spec, node, measurements.time_column)
    if problem is not None:
        raise InfersimError(f"{measurements.source}: {problem}")
    note = unknown_loop_note(screened.kept, spec)
    return UsableRows(screened.kept, link, screened, unpriced, () if note is None else (note,))


@dataclass(frozen=True)
class Validation:
    rows: pd.DataFrame
    which_rows: str  # "held-out" or "all (transfer)"
    before: pd.Series
    after: pd.Series
    tables: dict[str, pd.DataFrame]
    usable: UsableRows
    transfer: bool  # the profile was fitted on another GPU


EXAMPLE_COLUMNS = [
    "op_class",
    "reason",
    "times_floor",
    "source_dtype",
    *SHAPE_COLUMNS,
    "measured_s",
]


def left_out_table(usable: UsableRows) -> pd.DataFrame:
    """Every row left out of a validation, counted by op class and reason."""
    screened = usable.screened.counts()[["op_class", "reason", "rows"]]
    screened = screened.assign(reason="implausible: " + screened["reason"])
    return pd.concat([usable.unpriced, screened], ignore_index=True)


def validate_measurements(
    measurements: Measurements,
    spec: AcceleratorSpec,
    profile: CalibrationProfile,
    node: str | Path | None = None,
) -> Validation:
    """Errors before and after applying `profile` to `spec`. On the GPU the profile was
    fitted on, only the held-out shapes count; on another GPU (a transfer) no row was
    seen by the fit, so all count."""
    usable = usable_rows(measurements, spec, node)
    rows = usable.rows
    meta = profile.metadata
    transfer = spec.name != meta.gpu
    if not transfer:
        rows = rows[holdout_mask(rows, meta.holdout, meta.seed)]
        which = f"held-out ({meta.holdout:.0%} of shapes, seed {meta.seed})"
    else:
        which = f"all (transfer: profile fitted on {meta.gpu})"
    if rows.empty and not transfer and meta.holdout == 0:
        raise InfersimError(
            "no rows to validate on: the profile was fitted with --holdout 0 on every shape "
            "of this table; validate on another table, or refit with --holdout 0.5"
        )
    if rows.empty:
        left_out = "; ".join(usable.lines())
        raise InfersimError(f"no rows to validate on ({left_out or 'none measured'})")
    before = predict_all(rows, spec, node=node)
    after = predict_all(rows, spec, profile, node=node)
    tables = validation_tables(rows, before, after, transfer)
    tables["left_out"] = left_out_table(usable)
    tables["implausible_examples"] = usable.screened.examples()[EXAMPLE_COLUMNS]
    return Validation(rows, which, before, after, tables, usable, transfer)


def write_report(validation: Validation, out_dir: str | Path, title: str) -> list[Path]:
    """CSV tables, a markdown report, every row with both predictions (Parquet, to slice
    further) and two plots into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    markdown = [f"# {title}\n\nRows: {validation.which_rows}, n = {len(validation.rows)}.\n"]
    for name, frame in validation.tables.items():
        path = out / f"{name}.csv"
        frame.to_csv(path, index=False, float_format="%.5g")
        written.append(path)
        percent = {
            "targets": ("mape", "target"),
            "worse_than_uncalibrated": ("mape_uncalibrated", "mape_calibrated"),
        }.get(name)
        body = to_markdown(frame, percent) if percent else to_markdown(frame)
        markdown += [f"\n## {name}\n\n", body]
    report = out / "report.md"
    report.write_text("".join(markdown))
    written.append(report)
    rows = validation.rows.assign(
        predicted_uncalibrated_s=validation.before, predicted_calibrated_s=validation.after
    )
    rows.to_parquet(out / "predictions.parquet")
    written.append(out / "predictions.parquet")
    written.append(
        plot_before_after(
            validation.rows, validation.before, validation.after, out / "predicted_vs_measured.png"
        )
    )
    written.append(plot_error_vs_size(validation.rows, validation.after, out / "error_vs_size.png"))
    return written
