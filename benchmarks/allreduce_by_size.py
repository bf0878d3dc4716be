"""Where the datasheet model's all-reduce error lies by message size: the held-out
all-reduce rows of a GPU's public collective table, priced uncalibrated, their mean
absolute error and bias by size band and GPU count, the points each band adds to the
overall MAPE, every fp16 row's measured and modelled time (us) by size, the held-out
rows again with the protocol chosen as NCCL's own tuner chooses it (ring LL at 1/4 of the
bus bandwidth, src/graph/tuning.cc) but timed as the model times it, and the held-out MAPE
of each collective for other host read round trips R over a PCIe fabric (a peer-to-peer
hop taken as R / 2; R = 0 with a 1.0 us hop is the model before hops had a transport).

    python benchmarks/allreduce_by_size.py l40s [--seed 0]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from collectives_fit import collective_rows

from hardware_models.calibration.fit import mape
from hardware_models.calibration.measured_tables import COLLECTIVE_CLASSES, predict
from hardware_models.calibration.split import holdout_mask
from hardware_models.calibration.validate import base_link, predict_all
from hardware_models.collectives import Way, ways
from hardware_models.node import LinkSpec

BANDS = [0, 16 << 10, 256 << 10, 2 << 20, 1 << 40]
BAND_NAMES = ["<= 16 KiB", "32-256 KiB", "512 KiB-2 MiB", ">= 4 MiB"]
NCCL_TUNER_LL_SLOWDOWN = 2.0  # the tuner's ring LL all-reduce: 1/4 of busBw, the model's 1/2
HOST_READS_US = (0.0, 0.8, 1.0, 1.1, 1.2, 1.4)


def _seconds(way: Way, link: LinkSpec) -> float:
    return way.steps * link.latency_us * 1e-6 + way.fixed_s + way.wire_bytes / link.bytes_per_second


def _nccl_choice_seconds(nbytes: float, num_gpus: int, link: LinkSpec) -> float:
    """The model's time of the protocol NCCL's tuner picks (it rates LL lower)."""
    options = ways("all_reduce", nbytes, num_gpus, link)
    if len(options) == 1 or link.fabric is None:
        return min(_seconds(way, link) for way in options)
    low_latency, simple = options
    tuner_view = low_latency._replace(wire_bytes=low_latency.wire_bytes * NCCL_TUNER_LL_SLOWDOWN)
    chosen = low_latency if _seconds(tuner_view, link) < _seconds(simple, link) else simple
    return _seconds(chosen, link)


def _with_host_read(link: LinkSpec, host_read_us: float) -> LinkSpec:
    """`link` with a host read round trip of `host_read_us` and a peer-to-peer hop of half
    of it (0: NCCL's 1.0 us for every hop, no staged extra)."""
    fabric = link.fabric.model_copy(update={"host_read_us": host_read_us})
    hop_us = host_read_us / 2 if host_read_us else 1.0
    return link.model_copy(update={"latency_us": hop_us, "fabric": fabric})


def _host_read_sweep(table: pd.DataFrame, link: LinkSpec, seed: int) -> None:
    """Held-out MAPE (%) of each collective class for each of HOST_READS_US."""
    print("held-out MAPE (%) by host read round trip R (peer-to-peer hop R / 2):")
    for host_read_us in HOST_READS_US:
        swept = _with_host_read(link, host_read_us)
        mapes = {}
        for op in sorted(COLLECTIVE_CLASSES):  # a frozenset: its order varies by run
            rows = table[table["op_class"] == op]
            rows = rows[holdout_mask(rows, 0.5, seed)]
            priced = predict(rows, link_resolver=lambda _name, s=swept: s)
            mapes[op] = round(100 * mape(rows["measured_s"].to_numpy(), np.asarray(priced)), 1)
        print(f"  R {host_read_us:g} us: {mapes}")


def main() -> None:
    args, spec, collectives = collective_rows(__doc__.splitlines()[0])
    table = collectives[collectives["op_class"] == "all_reduce"]
    rows = table[holdout_mask(table, 0.5, args.seed)]
    error = 100 * (predict_all(rows, spec) / rows["measured_s"] - 1)
    frame = pd.DataFrame(
        {
            "gpus": rows["num_gpus"].astype(int),
            "band": pd.cut(rows["nbytes"], BANDS, labels=BAND_NAMES),
            "ape": error.abs(),
            "bias": error,
        }
    )
    summary = frame.groupby(["gpus", "band"], observed=True).agg(
        rows=("ape", "size"), mape=("ape", "mean"), bias=("bias", "mean")
    )
    summary["points_of_total"] = frame.groupby(["gpus", "band"], observed=True)["ape"].sum() / len(
        frame
    )
    print(f"{args.gpu}: held-out all-reduce, uncalibrated, seed {args.seed}, {len(frame)} rows")
    print(summary.round(2).to_string())
    print(f"MAPE {frame['ape'].mean():.1f}%")
    half = table[table["dtype"] == "fp16"]
    times = half.assign(measured=half["measured_s"] * 1e6, model=predict_all(half, spec) * 1e6)
    print("fp16, all rows (us):")
    print(
        times.pivot_table(index="nbytes", columns="num_gpus", values=["measured", "model"]).round(1)
    )
    link = base_link(spec)
    nccl = np.array(
        [
            _nccl_choice_seconds(nbytes, int(p), link)
            for nbytes, p in zip(rows["nbytes"], rows["num_gpus"], strict=True)
        ]
    )
    nccl_ape = pd.Series(100 * np.abs(nccl / rows["measured_s"].to_numpy() - 1), index=rows.index)
    by_gpus = nccl_ape.groupby(frame["gpus"]).mean().round(1).to_dict()
    print(f"protocol as NCCL's tuner picks it: MAPE {nccl_ape.mean():.1f}% (by GPUs {by_gpus})")
    if link is not None and link.fabric is not None:
        _host_read_sweep(collectives, link, args.seed)


if __name__ == "__main__":
    main()
