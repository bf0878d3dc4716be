"""`infersim hardware list|show`: what the presets say and what follows from them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from hardware_models.calibration.profile_file import read_profile
from hardware_models.calibration_lookup import nearest_profile
from hardware_models.dtypes import Dtype
from hardware_models.node import LinkSpec
from hardware_models.power import power_model
from hardware_models.presets import (
    calibration_path,
    list_calibrations,
    list_gpus,
    list_nodes,
    load_gpu,
    load_node,
)
from hardware_models.yaml_io import load_yaml_mapping


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    actions = parser.add_subparsers(dest="action", required=True)
    lister = actions.add_parser("list", help="all GPU, node and calibration presets")
    lister.set_defaults(handler=_list)
    show = actions.add_parser(
        "show", help="one GPU (spec, derived peaks, ridge points) or one node (its links)"
    )
    show.add_argument(
        "gpu", help="GPU or node preset name (see `hardware list`) or path to a YAML file"
    )
    show.set_defaults(handler=_show)


def gpu_table() -> pd.DataFrame:
    rows = []
    for name in list_gpus():
        gpu = load_gpu(name)
        rows.append(
            {
                "gpu": name,
                "name": gpu.display_name,
                "memory_gib": gpu.memory.capacity_gb,
                "hbm_tb_s": gpu.memory.bandwidth_gbps / 1000,
                "bf16_tflops": round(gpu.peak_flops(Dtype.BF16) / 1e12, 1)
                if gpu.supports(Dtype.BF16)
                else None,
                "tdp_w": gpu.power.tdp_w,
                "usd_per_hour": gpu.price.usd_per_hour,
                "calibration_auto": nearest_profile(gpu) or "none",
            }
        )
    return pd.DataFrame(rows)


def _list(args: argparse.Namespace) -> int:
    print("GPUs:")
    print(gpu_table().to_string(index=False))
    print("\nNodes:")
    rows = []
    for name in list_nodes():
        node = load_node(name)
        rows.append(
            {
                "node": name,
                "gpu": node.gpu,
                "gpus": node.gpus_per_node,
                "fabric": node.intra_node_fabric,
                "nics": node.nics_per_node,
                "nic_gb_s": node.nic_bandwidth_gbps,
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
    print("\nCalibrations (hardware: {gpu: ..., calibration: NAME}):")
    print(calibration_table().to_string(index=False))
    return 0


def calibration_table() -> pd.DataFrame:
    rows = []
    for name in list_calibrations():
        meta = read_profile(calibration_path(name)).metadata
        fitted = "curves only" if meta.curves_only else "all terms"
        rows.append({"calibration": name, "gpu": meta.gpu, "fitted": fitted, "on": meta.source})
    return pd.DataFrame(rows)


def _is_node(name_or_path: str) -> bool:
    """A node preset name, or a YAML file with a node's fields."""
    if name_or_path.lower() in list_nodes():
        return True
    path = Path(name_or_path)
    return path.suffix in (".yaml", ".yml") and "gpus_per_node" in load_yaml_mapping(path)


def _link_text(link: LinkSpec | None) -> str:
    if link is None:
        return "none"
    text = (
        f"{link.kind} {link.bandwidth_gbps:g} GB/s per GPU per direction, "
        f"{link.latency_us:g} us, efficiency {link.efficiency:g}"
    )
    fabric = link.fabric
    if fabric is None:
        return text
    hops = "peer to peer under a switch" if fabric.p2p else "every hop via host memory"
    return (
        f"{text}; {fabric.gpus_per_switch} GPUs per switch ({fabric.switch_uplink_gbps:g} "
        f"GB/s uplink), {fabric.gpus_per_socket} per socket, {hops}, host memory "
        f"{fabric.host_memory_gbps:g} GB/s per socket ({fabric.host_read_us:g} us a read, "
        f"added to each staged hop), CPU link {fabric.inter_socket_gbps:g} GB/s"
    )


def _show_node(name_or_path: str) -> int:
    node = load_node(name_or_path)
    print(f"{node.display_name} ({node.name}): {node.gpus_per_node} x {node.gpu}")
    print(f"  inside the node: {node.intra_node_fabric}; {_link_text(node.intra_node_link)}")
    print(f"  between nodes: {node.nics_per_node} NICs x {node.nic_bandwidth_gbps:g} GB/s; "
          f"{_link_text(node.inter_node_link)}")  # fmt: skip
    print(f"  host memory {node.host_memory_gb:g} GB (for swapped KV blocks)")
    print(f"  its GPU: `infersim hardware show {node.gpu}`")
    return 0


def _show(args: argparse.Namespace) -> int:
    if _is_node(args.gpu):
        return _show_node(args.gpu)
    gpu = load_gpu(args.gpu)
    print(f"{gpu.display_name} ({gpu.name}), {gpu.vendor} {gpu.architecture}")
    clock = gpu.tensor_clock_mhz or gpu.boost_clock_mhz
    print(
        f"  {gpu.sm_count} SMs x {gpu.tensor_cores_per_sm} tensor cores @ {clock:.0f} MHz; "
        f"boost {gpu.boost_clock_mhz:.0f} MHz"
    )
    print(
        f"  memory {gpu.memory.capacity_gb:g} GiB ({gpu.memory_bytes / 1e9:.1f} GB; CUDA "
        f"sees {gpu.memory.visible_gib:.2f} GiB) {gpu.memory.kind} at "
        f"{gpu.memory.bandwidth_gbps:g} GB/s; L2 {gpu.l2.size_mb:g} MB at "
        f"{gpu.l2.bandwidth_gbps:g} GB/s"
    )
    link = (
        f"NVLink {gpu.nvlink.generation} x{gpu.nvlink.links} "
        f"({gpu.nvlink.unidirectional_gbps:g} GB/s per direction)"
        if gpu.nvlink
        else "no NVLink"
    )
    print(
        f"  {link}; PCIe gen{gpu.pcie.generation} x{gpu.pcie.lanes} "
        f"({gpu.pcie.unidirectional_gbps:.1f} GB/s per direction)"
    )
    print(f"  power {gpu.power.idle_w:g}-{gpu.power.tdp_w:g} W; ${gpu.price.usd_per_hour}/h")
    power = power_model(gpu)
    print(
        f"    power model: idle {power.idle_w:g} W + busy {power.busy_w:g} W + tensor "
        f"{power.tensor_w:.0f} W at peak + DRAM {power.memory_w:.0f} W at full bandwidth, "
        f"capped at {power.tdp_w:g} W" + (f" ({power.note})" if power.note else "")
    )
    print(f"    ({gpu.price.source}, {gpu.price.date})")
    rows = []
    for dtype in [*gpu.tensor_flops_per_core_per_clock, Dtype.FP32]:
        key = "fp32_cuda" if dtype == Dtype.FP32 else dtype.value
        sheet = gpu.datasheet_tflops.get(key)
        derived = gpu.peak_flops(dtype) / 1e12
        rows.append(
            {
                "dtype": key,
                "derived_tflops": round(derived, 1),
                "datasheet_tflops": sheet,
                "diff_%": round(100 * (derived - sheet) / sheet, 2) if sheet else None,
                "ridge_flop_per_byte": round(gpu.ridge_point(dtype), 1),
            }
        )
    print(pd.DataFrame(rows).to_string(index=False))
    return 0
