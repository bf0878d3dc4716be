"""`infersim calibrate run`: time every benchmark and write the calibration folder.

The folder holds one Parquet table per benchmark family in the long format of
measured_tables.load_measured (so `calibrate fit` reads it like the public tables),
metadata.json, and for a CPU run device.yaml (the accelerator description to fit against).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

from hardware_models.calibration.harness.benches import Bench
from hardware_models.calibration.harness.collectives import all_reduce
from hardware_models.calibration.harness.device_info import CPU_SPEC_NAME, cpu_spec, metadata
from hardware_models.calibration.harness.plan import plan_for
from hardware_models.calibration.harness.torch_env import require_torch, resolve_device
from hardware_models.calibration.measured_tables import COLUMNS, NUMERIC_COLUMNS
from hardware_models.device_names import DESCRIBE_YOUR_CHIP, UNKNOWN_GPU
from hardware_models.errors import InfersimError

DEVICE_SPEC = "device.yaml"
METADATA = "metadata.json"


def run_harness(
    device: str,
    out_dir: str | Path,
    quick: bool = False,
    progress: Callable[[str], None] = print,
) -> Path:
    """Measure on `device` ('cuda' or 'cpu') and write the tables into `out_dir`."""
    torch = require_torch()
    device = resolve_device(torch, device)
    out = Path(out_dir)
    if out.exists() and any(out.glob("*.parquet")):
        raise InfersimError(f"{out}: already holds calibration tables; choose an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if device == "cpu":
        # One thread: with several, a loaded machine turns OpenMP barrier waits into
        # 10+ ms stalls on microsecond-sized ops, and the tables measure the scheduler.
        torch.set_num_threads(1)
    meta = metadata(torch, device, quick)
    label = meta["preset"] or UNKNOWN_GPU
    bench = Bench(torch, device, plan_for(device, quick), label)
    # Written first and rewritten at the end: a run cut short still says what it ran on.
    _write_metadata(out, meta)
    bench.warm_up()
    families = {
        "gemm": bench.gemm,
        "memory_copy": bench.copy,
        "attention": bench.attention,
        "collectives": lambda p: all_reduce(bench, p),
        "transformer_layer": bench.layer,
    }
    counts, errors = {}, {}
    for name, run in families.items():
        # On a borrowed GPU one family's failure (out of memory, a kernel the build
        # lacks) must not cost the others: it is recorded and the run goes on.
        try:
            rows = run(progress)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
            progress(f"{name}: failed ({errors[name]}); going on with the rest")
            rows = []
        counts[name] = len(rows)
        if rows:
            table = pd.DataFrame(rows, columns=list(COLUMNS))
            table[NUMERIC_COLUMNS] = table[NUMERIC_COLUMNS].astype(float)
            table.to_parquet(out / f"{name}.parquet")
    meta["rows"] = counts
    meta["errors"] = errors | bench.errors
    _write_metadata(out, meta)
    if device == "cpu":
        spec = cpu_spec(torch.get_num_threads())
        (out / DEVICE_SPEC).write_text(yaml.safe_dump(spec, sort_keys=False))
    elif meta["preset"] is None:
        progress(
            f"no preset is {meta['device_name']!r} (rows labelled {UNKNOWN_GPU}): "
            f"{DESCRIBE_YOUR_CHIP} to `calibrate fit` and `calibrate validate`"
        )
    progress(f"wrote {sum(counts.values())} rows to {out}")
    return out


def _write_metadata(out: Path, meta: dict) -> None:
    (out / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


__all__ = ["CPU_SPEC_NAME", "DEVICE_SPEC", "METADATA", "run_harness"]
