"""Calibration: public measurement tables, predicted-vs-measured error reports."""

from hardware_models.calibration.error_report import (
    add_errors,
    error_table,
    plot_predicted_vs_measured,
    size_bucket,
    summarise_errors,
    to_markdown,
)
from hardware_models.calibration.measured_tables import (
    COLUMNS,
    GPU_FOLDERS,
    NODE_FOR_GPU,
    OP_CLASSES,
    big_gemm_mask,
    default_link_resolver,
    default_measured_dir,
    load_measured,
    predict,
    resolve_measured_dir,
    supported_mask,
)

__all__ = [
    "COLUMNS",
    "GPU_FOLDERS",
    "NODE_FOR_GPU",
    "OP_CLASSES",
    "add_errors",
    "big_gemm_mask",
    "default_link_resolver",
    "default_measured_dir",
    "error_table",
    "load_measured",
    "plot_predicted_vs_measured",
    "predict",
    "resolve_measured_dir",
    "size_bucket",
    "summarise_errors",
    "supported_mask",
    "to_markdown",
]
