"""Fit and validate end to end: what `infersim calibrate fit` / `validate` run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.calibration.error_report import to_markdown
from hardware_models.calibration.fit import fit_profile
from hardware_models.calibration.fit_links import fit_links
from hardware_models.calibration.gemm_csv import implausible_row
from hardware_models.calibration.profile_file import (
    CalibrationProfile,
    FittedLink,
    ProfileMetadata,
)
from hardware_models.calibration.sources import Measurements, rows_for
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.validate import (
    base_link,
    plot_before_after,
    plot_error_vs_size,
    predict_all,
    validation_tables,
)
from hardware_models.efficiency import CollectiveFit
from hardware_models.errors import InfersimError

LINK_FIT_OP = "all_reduce"


def fit_measurements(
    measurements: Measurements,
    spec: AcceleratorSpec,
    holdout: float = 0.5,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    curves_only: bool = False,
) -> CalibrationProfile:
    """A profile fitted to the shapes outside the seeded held-out fraction; with
    `curves_only`, only its efficiency curves (see `fit_profile`), links left as they are."""
    rows = checked_rows(measurements, spec)
    fit_rows = rows[~holdout_mask(rows, holdout, seed)]
    if fit_rows.empty:
        raise InfersimError("no rows left to fit after the holdout split")
    efficiency = fit_profile(spec, fit_rows, seed, progress, curves_only)
    links = []
    link = base_link(spec)
    if link is not None and not curves_only:
        fitted = fit_links(fit_rows, link, LINK_FIT_OP)
        counts = fit_rows[fit_rows["op_class"] == LINK_FIT_OP].groupby("num_gpus").size()
        links = [
            FittedLink(num_gpus=p, fitted_on=LINK_FIT_OP, rows=int(counts[p]), link=fitted[p])
            for p in sorted(fitted)
        ]
        collective = {
            p: CollectiveFit(latency_us=f.latency_us, efficiency=f.efficiency)
            for p, f in fitted.items()
        }
        efficiency = efficiency.model_copy(update={"collective_by_gpus": collective})
    used = fit_rows.groupby("op_class").size()
    return CalibrationProfile(
        metadata=ProfileMetadata(
            source=measurements.source,
            gpu=spec.name,
            rows_used={str(k): int(v) for k, v in used.items()},
            holdout=holdout,
            seed=seed,
            curves_only=curves_only,
        ),
        efficiency=efficiency,
        links=links,
    )


def checked_rows(measurements: Measurements, spec: AcceleratorSpec) -> pd.DataFrame:
    """The rows measured on `spec`; a hand-made table's first impossible row is refused."""
    rows = rows_for(measurements, spec)
    problem = implausible_row(rows, spec) if measurements.hand_made else None
    if problem is not None:
        raise InfersimError(f"{measurements.source}: {problem}")
    return rows


@dataclass(frozen=True)
class Validation:
    rows: pd.DataFrame
    which_rows: str  # "held-out" or "all (transfer)"
    before: pd.Series
    after: pd.Series
    tables: dict[str, pd.DataFrame]


def validate_measurements(
    measurements: Measurements, spec: AcceleratorSpec, profile: CalibrationProfile
) -> Validation:
    """Errors before and after applying `profile` to `spec`. On the GPU the profile was
    fitted on, only the held-out shapes count; on another GPU (a transfer) no row was
    seen by the fit, so all count."""
    rows = checked_rows(measurements, spec)
    meta = profile.metadata
    transfer = spec.name != meta.gpu
    if not transfer:
        rows = rows[holdout_mask(rows, meta.holdout, meta.seed)]
        which = f"held-out ({meta.holdout:.0%} of shapes, seed {meta.seed})"
    else:
        which = f"all (transfer: profile fitted on {meta.gpu})"
    if rows.empty:
        raise InfersimError("no rows to validate on (is --holdout 0 in the profile?)")
    before = predict_all(rows, spec)
    after = predict_all(rows, spec, profile)
    tables = validation_tables(rows, before, after, transfer)
    return Validation(rows, which, before, after, tables)


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
        percent = ("mape", "target") if name == "targets" else None
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
