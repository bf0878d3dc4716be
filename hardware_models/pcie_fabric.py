"""How much of its own link rate a GPU's transfer gets when a collective's flows share a
PCIe tree (switch uplinks, each socket's root complex and memory, the CPU-to-CPU link).

A collective over p GPUs runs as concurrent flows: a ring sends one flow from each GPU
to the next, an all-to-all one from each GPU to every other. Each flow loads the
resources on its route (node.PcieFabric describes them): its GPU's link out and its
peer's link in; a hop staged in host memory also the sender's switch uplink, the
receiving socket's root complex and memory twice (written in, read out), the CPU-to-CPU
link when the sockets differ, and the receiver's switch uplink. A resource splits its
rate evenly over the flows it carries, and the collective goes at the pace of its
slowest flow (a ring step, an all-to-all, ends when its last transfer does). GPUs are
placed in order (GPU i of the group on switch i // gpus_per_switch), as tensor-parallel
groups are, and the ring follows that order, as NCCL's ring search keeps switch
neighbours adjacent.

A staged hop is also slower to notice: the receiver polls a buffer in host memory, so
each of its polls is a read round trip across PCIe, where a peer-to-peer receiver polls
its own memory (`staged_hops` counts them on a collective's slowest path).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

from hardware_models.node import LinkSpec, PcieFabric

Flow = tuple[int, int]


def ring_flows(p: int, first: int = 0) -> list[Flow]:
    """One flow from each GPU to the next, around the group."""
    return [(first + i, first + (i + 1) % p) for i in range(p)]


def pair_flows(p: int, first: int = 0) -> list[Flow]:
    """A send/recv between the two halves of p GPUs placed from GPU `first` on: each GPU
    of the first half to the same rank of the second (a pipeline stage hand-off, each tp
    rank to the next stage's; p = 2: one pair)."""
    half = p // 2
    return [(first + i, first + half + i) for i in range(half)]


def all_to_all_flows(p: int, first: int = 0) -> list[Flow]:
    """One flow from each GPU to every other."""
    return [(first + i, first + j) for i in range(p) for j in range(p) if i != j]


_PATTERNS = {"ring": ring_flows, "pair": pair_flows, "all_to_all": all_to_all_flows}


def _route(fabric: PcieFabric, src: int, dst: int) -> list[tuple[str, int, int]]:
    """(resource, which one, load) of each shared resource one flow crosses besides the
    two GPUs' own links (a staged hop loads memory twice)."""
    switch_src, switch_dst = src // fabric.gpus_per_switch, dst // fabric.gpus_per_switch
    socket_src, socket_dst = src // fabric.gpus_per_socket, dst // fabric.gpus_per_socket
    if fabric.p2p and switch_src == switch_dst and fabric.gpus_per_switch > 1:
        return []  # through the switch: only the two GPUs' own links
    route = [("memory", socket_dst, 2)]
    if fabric.gpus_per_switch > 1:
        route += [("uplink_up", switch_src, 1), ("uplink_down", switch_dst, 1)]
    if socket_src != socket_dst:
        route.append(("socket", socket_src, 1))
    return route


def is_staged(fabric: PcieFabric, src: int, dst: int) -> bool:
    """Whether a hop from GPU `src` to GPU `dst` goes through host memory."""
    return bool(_route(fabric, src, dst))


def staged_hops(link: LinkSpec, path: str, num_gpus: int, hops: int, first_gpu: int = 0) -> int:
    """How many of the `hops` a collective's data takes one after another are staged in
    host memory, on its slowest path, for GPUs placed from `first_gpu` on. `path`:
    "ring" (any `hops` consecutive ring flows), "chain" (NCCL's in-node tree: down the
    chain of GPUs and back up, `hops` = 2 (p - 1)), "pair" or "all_to_all" (all flows
    at once, so one hop: at most one staged). 0 without a fabric."""
    if link.fabric is None or num_gpus < 2:
        return 0
    return _staged_hops(link.fabric, path, num_gpus, hops, first_gpu)


@lru_cache(maxsize=1024)
def _staged_hops(fabric: PcieFabric, path: str, num_gpus: int, hops: int, first_gpu: int) -> int:
    if path == "ring":
        ring = [is_staged(fabric, src, dst) for src, dst in ring_flows(num_gpus, first_gpu)]
        windows = range(num_gpus)
        return max(sum(ring[(start + k) % num_gpus] for k in range(hops)) for start in windows)
    if path == "chain":
        chain = ring_flows(num_gpus, first_gpu)[:-1]
        return 2 * sum(is_staged(fabric, src, dst) for src, dst in chain)
    flows = _PATTERNS[path](num_gpus, first_gpu)
    return int(any(is_staged(fabric, src, dst) for src, dst in flows))


def _capacity(fabric: PcieFabric, resource: str) -> float:
    if resource == "memory":
        return fabric.host_memory_gbps
    if resource == "socket":
        return fabric.inter_socket_gbps
    return fabric.switch_uplink_gbps


def flow_rate_gbps(link_gbps: float, fabric: PcieFabric, flows: Iterable[Flow]) -> float:
    """GB/s the slowest of `flows` gets when they run at once (see the module doc)."""
    load: Counter = Counter()
    for src, dst in flows:
        load["gpu_out", src] += 1
        load["gpu_in", dst] += 1
        for resource, index, weight in _route(fabric, src, dst):
            load[resource, index] += weight
    return min(
        (link_gbps if resource in ("gpu_out", "gpu_in") else _capacity(fabric, resource)) / count
        for (resource, _index), count in load.items()
    )


@lru_cache(maxsize=1024)
def _share(link_gbps: float, fabric: PcieFabric, pattern: str, p: int, first: int) -> float:
    flows = _PATTERNS[pattern](p, first)
    per_gpu = max(Counter(src for src, _ in flows).values())
    return min(1.0, flow_rate_gbps(link_gbps, fabric, flows) * per_gpu / link_gbps)


def fabric_share(link: LinkSpec, pattern: str, num_gpus: int, first_gpu: int = 0) -> float:
    """Fraction of the link rate each GPU's traffic gets in a `pattern` ("ring", "pair"
    or "all_to_all") over `num_gpus` GPUs placed from `first_gpu` on: 1 without a fabric
    or for a lone pair of switch neighbours, less where the flows share uplinks, memory
    or the CPU link."""
    if link.fabric is None or num_gpus < 2:
        return 1.0
    return _share(link.bandwidth_gbps, link.fabric, pattern, num_gpus, first_gpu)
