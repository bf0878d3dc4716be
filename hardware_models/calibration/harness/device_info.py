"""What was measured on: device, memory, driver, versions, clocks (never the hostname).

For a CPU run it also writes an accelerator description of the machine (`device.yaml`),
so the fit and validation have a roofline to invert. Its rates are nominal (AVX2-class
FMA throughput, a typical DRAM bandwidth): it exists to exercise the pipeline end to end
without a GPU, not to model CPUs.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path
from types import ModuleType

from hardware_models.device_names import preset_for_device

CPU_SPEC_NAME = "cpu-local"
# Nominal CPU rates: 2 FMA units x 16 fp32 lanes x 2 FLOPs per core per clock (AVX-512
# class); 50 GB/s per core, what one core streams from its caches, since the CPU grids
# are small enough to stay cache-resident.
CPU_FLOPS_PER_CORE_PER_CLOCK = 64
# bf16 dot-product instructions (AVX512-BF16, AMX) run 2-16x the fp32 rate: 4x nominal.
CPU_BF16_FLOPS_PER_CORE_PER_CLOCK = 256
CPU_GBPS_PER_CORE = 50.0
CPU_MAX_GBPS = 400.0


def preset_for(device_name: str) -> str | None:
    """The preset torch's device name is (whole-name patterns: hardware_models.device_names)."""
    return preset_for_device(device_name)


def _nvidia_smi() -> dict[str, str]:
    fields = "driver_version,clocks.max.sm,clocks.max.mem,power.limit,pstate"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    first = out.strip().splitlines()[0] if out.strip() else ""
    return dict(zip(fields.split(","), (v.strip() for v in first.split(",")), strict=False))


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor() or "unknown CPU"


def _cpu_mhz() -> float:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return 2500.0
    found = [float(x) for x in re.findall(r"^cpu MHz\s*:\s*([\d.]+)$", text, re.MULTILINE)]
    return max(found) if found else 2500.0


def _cache_mb() -> float:
    """The last-level cache, as /proc/cpuinfo gives it (`cache size`), 32 MB where it does
    not: the screen (calibration/screen.py) floors a row whose working set fits in it by
    the cache's bandwidth, not DRAM's, so a cache larger than the spec says (this
    project's CI host has 480 MB) made cache-resident GEMMs look faster than possible."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return 32.0
    found = re.findall(r"^cache size\s*:\s*(\d+)\s*KB$", text, re.MULTILINE)
    return max(int(x) for x in found) / 1024 if found else 32.0


def _memory_gb() -> float:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return 16.0
    match = re.search(r"^MemTotal:\s*(\d+) kB", text, re.MULTILINE)
    return round(int(match.group(1)) / 2**20, 1) if match else 16.0


def metadata(torch: ModuleType, device: str, quick: bool) -> dict:
    """metadata.json's content: enough to tell two runs' hardware and software apart."""
    info: dict = {
        "device": device,
        "quick": quick,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info |= {
            "device_name": props.name,
            "device_count": torch.cuda.device_count(),
            "memory_gib": round(props.total_memory / 2**30, 1),
            "sm_count": props.multi_processor_count,
            "l2_cache_bytes": getattr(props, "L2_cache_size", None),
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda_version": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version(),
            "preset": preset_for(props.name),
            "nvidia_smi": _nvidia_smi(),
        }
    else:
        info |= {
            "device_name": _cpu_model(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "memory_gib": _memory_gb(),
            "preset": CPU_SPEC_NAME,
        }
    return info


def cpu_spec(threads: int) -> dict:
    """An AcceleratorSpec mapping for this CPU with `threads` cores in use (nominal rates)."""
    mhz = _cpu_mhz()
    gbps = min(CPU_MAX_GBPS, CPU_GBPS_PER_CORE * threads)
    peak = threads * CPU_FLOPS_PER_CORE_PER_CLOCK * mhz * 1e6 / 1e12
    bf16_peak = peak * CPU_BF16_FLOPS_PER_CORE_PER_CLOCK / CPU_FLOPS_PER_CORE_PER_CLOCK
    nominal = "nominal, written by `infersim calibrate run --device cpu` to exercise the pipeline"
    return {
        "name": CPU_SPEC_NAME,
        "display_name": f"{_cpu_model()} ({threads} threads)",
        "vendor": "other",
        "architecture": "cpu",
        "sm_count": threads,
        "tensor_cores_per_sm": 1,
        "boost_clock_mhz": mhz,
        "tensor_flops_per_core_per_clock": {"bf16": CPU_BF16_FLOPS_PER_CORE_PER_CLOCK},
        "fp32_flops_per_sm_per_clock": CPU_FLOPS_PER_CORE_PER_CLOCK,
        "register_file_kb_per_sm": 1,
        "shared_memory_kb_per_sm": 48,
        "l2": {"size_mb": _cache_mb(), "bandwidth_gbps": 4 * gbps},
        "memory": {"kind": "DDR", "capacity_gb": _memory_gb(), "bandwidth_gbps": gbps},
        "pcie": {"generation": 4, "lanes": 16},
        # DDR has no default energy per bit (hardware_models.power): a nominal DDR4-class one
        "power": {"tdp_w": 100, "idle_w": 20, "dram_pj_per_bit": 15.0},
        "price": {"usd_per_hour": 0.05, "source": nominal, "date": "2026-01"},
        "datasheet_tflops": {"bf16": round(bf16_peak, 4), "fp32_cuda": round(peak, 4)},
        "sources": {"all": nominal},
    }
