"""All-reduce across nodes: the measured 2-node A100 rows beside the rail model
(collectives.CrossNodeLink, as NCCL runs a group spanning nodes) and the flat ring at the
inter-node rate that infersim used before.

    python benchmarks/cross_node_allreduce.py [--min-bytes 1048576]

Data: ../shared/data/vidur_profiles/network/a100_dgx/all_reduce.csv (microsoft/vidur's
profiles of DGX A100 nodes: `num_workers` GPUs, `devices_per_node` of them a node, time
in ms; sizes in bytes). Each link is fitted where it runs alone, with the fit `calibrate
fit` uses (fit_links.fit_link): the node's own link on the rows of one node holding the
whole group (g of g), the inter-node link on the rows of one GPU a node (2 of 1, every
hop crossing). The groups spanning nodes with several GPUs a node (4 of 2, 8 of 4, 16 of
8) are then predicted, not fitted: the rail model with both links, the flat model on the
inter-node link alone. Printed: the mean absolute percentage error per group over the
message sizes at least --min-bytes, and the bus bandwidth at the largest size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from hardware_models.calibration.fit_links import fit_link
from hardware_models.collectives import collective_cost
from hardware_models.node import CrossNodeLink, LinkSpec
from hardware_models.presets import load_node

TABLE = Path("../shared/data/vidur_profiles/network/a100_dgx/all_reduce.csv")


def measured_rows(path: Path = TABLE) -> pd.DataFrame:
    """One row per (group, GPUs a node, size): the median time in seconds."""
    raw = pd.read_csv(path)
    rows = raw.groupby(["num_workers", "devices_per_node", "size"], as_index=False)[
        "time_stats.all_reduce.median"
    ].median()
    return pd.DataFrame(
        {
            "op_class": "all_reduce",
            "num_gpus": rows["num_workers"],
            "per_node": rows["devices_per_node"],
            "nbytes": rows["size"].astype(float),
            "measured_s": rows["time_stats.all_reduce.median"] / 1e3,
        }
    )


def fitted_links(rows: pd.DataFrame) -> tuple[dict[int, LinkSpec], LinkSpec]:
    """The node's link fitted per group size (its g-of-g rows) and the inter-node link
    fitted on the 2-of-1 rows, from the dgx-a100 preset's hardware figures."""
    node = load_node("dgx-a100")
    assert node.intra_node_link is not None and node.inter_node_link is not None
    inside = rows[rows["num_gpus"] == rows["per_node"]]
    intra = {
        int(g): fit_link(group, node.intra_node_link) for g, group in inside.groupby("num_gpus")
    }
    alone = rows[(rows["num_gpus"] == 2) & (rows["per_node"] == 1)]
    return intra, fit_link(alone, node.inter_node_link)


def compare(rows: pd.DataFrame, min_bytes: float) -> pd.DataFrame:
    """Per group spanning nodes with more than one GPU a node: the rail and the flat
    model's error against the rows, and the bus bandwidths at the largest message."""
    intra, inter = fitted_links(rows)
    spanning = rows[(rows["per_node"] > 1) & (rows["num_gpus"] > rows["per_node"])]
    out = []
    for (p, g), group in spanning.groupby(["num_gpus", "per_node"]):
        group = group[group["nbytes"] >= min_bytes]
        rail = CrossNodeLink(intra[int(g)], inter, int(g))
        errors: dict[str, list[float]] = {"rail": [], "flat": []}
        for nbytes, measured in zip(group["nbytes"], group["measured_s"], strict=True):
            for name, link in (("rail", rail), ("flat", inter)):
                seconds = collective_cost("all_reduce", nbytes, int(p), link).seconds
                errors[name].append(abs(seconds - measured) / measured)
        top = group.loc[group["nbytes"].idxmax()]
        moved = 2 * (p - 1) / p * top["nbytes"]
        busbw = {
            name: moved / collective_cost("all_reduce", top["nbytes"], int(p), link).seconds / 1e9
            for name, link in (("rail", rail), ("flat", inter))
        }
        out.append(
            {
                "gpus": int(p),
                "per_node": int(g),
                "sizes": len(group),
                "rail_mape_%": 100 * sum(errors["rail"]) / len(group),
                "flat_mape_%": 100 * sum(errors["flat"]) / len(group),
                "largest_MiB": top["nbytes"] / 2**20,
                "measured_busbw": moved / top["measured_s"] / 1e9,
                "rail_busbw": busbw["rail"],
                "flat_busbw": busbw["flat"],
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=float, default=2**20)
    args = parser.parse_args()
    rows = measured_rows()
    intra, inter = fitted_links(rows)
    for g, link in intra.items():
        print(f"node link, {g} GPUs: {link.latency_us} us, efficiency {link.efficiency}")
    print(f"inter-node link (2 of 1): {inter.latency_us} us, efficiency {inter.efficiency}")
    print(compare(rows, args.min_bytes).round(1).to_string(index=False))


if __name__ == "__main__":
    main()
