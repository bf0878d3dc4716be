"""Calibration: measure (harness/), import public tables (measured_tables), fit an
EfficiencyProfile by inverting the cost model (fit, fit_links), check it on held-out
shapes (validate, error_report); `workflow` ties them together for the CLI.

The names below are its Python API, what `infersim calibrate` does step by step
(docs/CALIBRATION.md, "From Python": locate and measure, load, fit, validate and report,
profiles); notebooks/05_calibration.ipynb uses them and nothing else of the package."""

from hardware_models.calibration.error_report import (
    add_errors,
    error_table,
    plot_predicted_vs_measured,
    size_bucket,
    summarise_errors,
    to_markdown,
)
from hardware_models.calibration.fit import fit_profile
from hardware_models.calibration.harness import run_harness
from hardware_models.calibration.measured_tables import (
    COLUMNS,
    GPU_FOLDERS,
    OP_CLASSES,
    big_gemm_mask,
    default_link_resolver,
    default_measured_dir,
    load_measured,
    predict,
    resolve_measured_dir,
    searched_places,
    supported_mask,
)
from hardware_models.calibration.profile_file import (
    CalibrationProfile,
    FittedLink,
    ProfileMetadata,
    read_profile,
    write_profile,
)
from hardware_models.calibration.sources import Measurements, load_measurements, resolve_spec
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.validate import base_link, plot_before_after, predict_all
from hardware_models.calibration.workflow import (
    Validation,
    fit_measurements,
    validate_measurements,
    write_report,
)

__all__ = [
    "COLUMNS",
    "GPU_FOLDERS",
    "OP_CLASSES",
    "CalibrationProfile",
    "FittedLink",
    "Measurements",
    "ProfileMetadata",
    "Validation",
    "add_errors",
    "base_link",
    "big_gemm_mask",
    "default_link_resolver",
    "default_measured_dir",
    "error_table",
    "fit_measurements",
    "fit_profile",
    "holdout_mask",
    "load_measured",
    "load_measurements",
    "plot_before_after",
    "plot_predicted_vs_measured",
    "predict",
    "predict_all",
    "read_profile",
    "resolve_measured_dir",
    "resolve_spec",
    "run_harness",
    "searched_places",
    "size_bucket",
    "summarise_errors",
    "supported_mask",
    "to_markdown",
    "validate_measurements",
    "write_profile",
    "write_report",
]
