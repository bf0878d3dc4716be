"""Calibration: measure (harness/), import public tables (measured_tables), fit an
EfficiencyProfile by inverting the cost model (fit, fit_links), check it on held-out
shapes (validate, error_report); `workflow` ties them together for the CLI."""

from hardware_models.calibration.error_report import (
    add_errors,
    error_table,
    plot_predicted_vs_measured,
    size_bucket,
    summarise_errors,
    to_markdown,
)
from hardware_models.calibration.fit import fit_profile
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
    read_profile,
    write_profile,
)
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.workflow import fit_measurements, validate_measurements

__all__ = [
    "COLUMNS",
    "GPU_FOLDERS",
    "OP_CLASSES",
    "CalibrationProfile",
    "add_errors",
    "big_gemm_mask",
    "default_link_resolver",
    "default_measured_dir",
    "error_table",
    "fit_measurements",
    "fit_profile",
    "holdout_mask",
    "load_measured",
    "plot_predicted_vs_measured",
    "predict",
    "read_profile",
    "resolve_measured_dir",
    "searched_places",
    "size_bucket",
    "summarise_errors",
    "supported_mask",
    "to_markdown",
    "validate_measurements",
    "write_profile",
]
