"""Collective communication as alpha-beta models: time = steps x latency + traffic / bandwidth.

`nbytes` is the size of the full buffer each GPU holds (the all-reduce input, the
all-gather output). Traffic terms are the standard ones for ring and tree algorithms
(Thakur, Rabenseifner and Gropp 2005; NCCL's bus-bandwidth definitions).

Over a link with a PCIe fabric (node preset `intra_node_link.fabric`) each GPU's traffic
gets the share of its link rate that the flows sharing the tree leave it
(pcie_fabric.fabric_share), the ring runs with NCCL's two PCIe protocols (LL: low
latency, half the bandwidth; Simple: the full bandwidth after a longer latency) and the
faster is taken, and the tree is a chain, as NCCL builds it inside one node (its tuning
model counts nRanks - 1 intra-node hops each way), priced when asked for: `auto` runs the
ring there, as NCCL's tuner does (it rates the chain's hops as the ring's, after a higher
base and at a lower bandwidth).
An LL hop's latency is its flag's (data and flag travel in one store), so it depends on
the transport: the link's `latency_us` is a peer-to-peer hop (a posted write into the
peer's memory, which the peer polls); a hop staged in host memory adds the fabric's
`host_read_us` (its receiver polls host memory across PCIe), for each staged hop on the
call's slowest path (pcie_fabric.staged_hops). Simple's per-hop figure is a chunk's
pipeline latency, one tuned figure for every PCI hop, and stays NCCL's.

A group spanning nodes (a `CrossNodeLink`) is priced as NCCL runs it there, not as one
flat ring at the network's rate: its rings leave each node through one NIC each (one
channel per rail, so the node's NICs carry the traffic side by side) and pass the data
through the node's GPUs over their own link; its trees chain the GPUs of a node and join
the nodes in a binary tree (NCCL's src/graph/tuning.cc, ncclTopoTuneModel: a ring's
nsteps - nInterSteps hops at the intra-node latency and nInterSteps = 2 (nNodes - 1) for
an all-reduce, nNodes - 1 for an all-gather or reduce-scatter, at the network's; a
tree's 2 ((nRanks/nNodes - 1) intra + log2(nNodes) inter) hops; bus bandwidth =
channels x a channel's speed). See `_cross_node`.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from hardware_models.errors import InfersimError
from hardware_models.node import CrossNodeLink, LinkSpec, NodeSpec
from hardware_models.op_cost import Bound, OpCost
from hardware_models.pcie_fabric import fabric_share, staged_hops

if TYPE_CHECKING:
    from hardware_models.accelerator import AcceleratorSpec


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"


class Algorithm(StrEnum):
    RING = "ring"
    TREE = "tree"
    AUTO = "auto"  # the faster of the two, as NCCL's tuner picks


def _parse(enum: type[StrEnum], value: str, what: str) -> StrEnum:
    aliases = {"alltoall": "all_to_all", "allreduce": "all_reduce", "p2p": "send_recv"}
    text = aliases.get(str(value).lower(), str(value).lower())
    try:
        return enum(text)
    except ValueError:
        allowed = ", ".join(e.value for e in enum)
        raise InfersimError(f"unknown {what} {value!r}; allowed: {allowed}") from None


def _ring(op: Collective, nbytes: float, p: int) -> tuple[int, float]:
    """(latency steps, bytes each GPU sends) for the ring algorithm."""
    share = (p - 1) / p * nbytes
    if op == Collective.ALL_REDUCE:
        return 2 * (p - 1), 2 * share
    if op in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL):
        return p - 1, share
    return 1, nbytes


def _tree(op: Collective, nbytes: float, p: int) -> tuple[int, float]:
    """Double binary tree: log-depth latency, each GPU moves the buffer about twice."""
    depth = max(1, math.ceil(math.log2(p)))
    if op == Collective.ALL_REDUCE:
        return 2 * depth, 2 * nbytes
    return _ring(op, nbytes, p)  # NCCL uses trees only for all-reduce


def _chain(op: Collective, nbytes: float, p: int) -> tuple[int, float]:
    """NCCL's tree inside one node: a chain down and back up, the buffer each way."""
    if op == Collective.ALL_REDUCE:
        return 2 * (p - 1), 2 * nbytes
    return _ring(op, nbytes, p)


def _pattern(op: Collective) -> str:
    """The flows a collective runs at once (pcie_fabric's patterns)."""
    if op == Collective.ALL_TO_ALL:
        return "all_to_all"
    return "pair" if op == Collective.SEND_RECV else "ring"


class Way(NamedTuple):
    """One way to run a collective (an algorithm, over PCIe also a protocol): it takes
    steps x the link's latency + fixed_s + wire_bytes / the link's attained rate."""

    steps: float  # latency steps at the link's own per-step latency
    fixed_s: float  # seconds that do not scale with the link's latency
    wire_bytes: float  # bytes at the link's full attained rate
    sent_bytes: float  # bytes each GPU really sends


# NCCL's tuning model on PCI (src/graph/tuning.cc, NCCL 2.2x): the LL protocol pays a
# 6.6 us base and the link's per-hop latency (1.0 us there, one figure for every PCI hop;
# here the link's peer-to-peer figure, a staged LL hop adding the fabric's host read) but
# carries data in half of each line (its flags in the other); Simple moves whole lines
# after an 8.4 us base and 5.7 us per hop. The tuner runs the faster, as priced here.
LL_BASE_US, LL_DATA_FRACTION = 6.6, 0.5
SIMPLE_BASE_US, SIMPLE_HOP_US = 8.4, 5.7


def ways(
    op: Collective | str,
    nbytes: float,
    num_gpus: int,
    link: LinkSpec,
    algorithm: Algorithm | str = Algorithm.AUTO,
    first_gpu: int = 0,
) -> list[Way]:
    """Every way `collective_cost` weighs for this call (it takes the fastest)."""
    op = _parse(Collective, op, "collective")
    algorithm = _parse(Algorithm, algorithm, "algorithm")
    p = max(num_gpus, 2)
    if link.fabric is None:
        candidates = {Algorithm.RING: _ring(op, nbytes, p), Algorithm.TREE: _tree(op, nbytes, p)}
        chosen = candidates if algorithm == Algorithm.AUTO else {algorithm: candidates[algorithm]}
        return [Way(steps, 0.0, sent, sent) for steps, sent in chosen.values()]
    chain = algorithm == Algorithm.TREE
    steps, sent = (_chain if chain else _ring)(op, nbytes, p)
    wire = sent / fabric_share(link, _pattern(op), p, first_gpu)
    path = "chain" if chain else _pattern(op)
    staged_s = staged_hops(link, path, p, steps, first_gpu) * link.fabric.host_read_us * 1e-6
    return [
        Way(steps, LL_BASE_US * 1e-6 + staged_s, wire / LL_DATA_FRACTION, sent),
        Way(0.0, (SIMPLE_BASE_US + steps * SIMPLE_HOP_US) * 1e-6, wire, sent),
    ]


def group_link(
    node: NodeSpec, gpu: AcceleratorSpec, num_gpus: int
) -> LinkSpec | CrossNodeLink | None:
    """The link a collective over `num_gpus` GPUs of `node`'s kind runs on, or None
    where the node has none: inside a node, its own link with the GPU's calibration fit
    for that group size (a profile's links were fitted inside one node, per group size);
    across nodes, a CrossNodeLink of that link, fitted for a full node, and the inter-node
    link (nodes of one GPU: the inter-node link alone, every hop crossing nodes)."""
    per_node = node.gpus_per_node
    if num_gpus <= per_node:
        inside = node.intra_node_link
        return None if inside is None else gpu.efficiency.link_for(num_gpus, inside)
    if node.inter_node_link is None or node.intra_node_link is None:
        return node.inter_node_link
    intra = gpu.efficiency.link_for(per_node, node.intra_node_link)
    return CrossNodeLink(intra, node.inter_node_link, per_node)


class _Priced(NamedTuple):
    seconds: float
    latency: float
    sent: float  # bytes each GPU sends


def _cross_node(
    op: Collective, nbytes: float, p: int, link: CrossNodeLink, algorithm: Algorithm
) -> _Priced:
    """One collective over p GPUs spanning nodes, as NCCL runs it (module doc): g GPUs a
    node over n nodes, each ring or tree channel through its own NIC, so the node's g
    rails carry a step's traffic side by side. A ring step moves each GPU's chunk over
    the node's link while a chunk per channel crosses to the next node: its rate is the
    smaller of a GPU's intra-node rate and the g rails' together (NCCL's bus bandwidth:
    channels x a channel's speed). A tree moves the buffer up and down at that rate. An
    all-to-all sends each peer its share at once: the node's peers' over the node's link,
    the other nodes' over the GPU's own rail."""
    g = min(p, link.gpus_per_node)
    n = math.ceil(p / g)
    rails = p - (n - 1) * g  # the group's GPUs on its emptiest node
    a_in, a_out = link.intra.latency_us * 1e-6, link.inter.latency_us * 1e-6
    inside = link.intra.bytes_per_second * fabric_share(link.intra, _pattern(op), g)
    outside = link.inter.bytes_per_second
    rate = min(inside, rails * outside)
    steps, sent = _ring(op, nbytes, p)
    inter_steps = 2 * (n - 1) if op == Collective.ALL_REDUCE else n - 1
    latency = (steps - inter_steps) * a_in + inter_steps * a_out
    if op == Collective.ALL_TO_ALL:
        transfer = max((g - 1) / p * nbytes / inside, (p - g) / p * nbytes / outside)
        return _Priced(latency + transfer, latency, sent)
    priced = []
    if algorithm in (Algorithm.RING, Algorithm.AUTO) or op != Collective.ALL_REDUCE:
        priced.append(_Priced(latency + sent / rate, latency, sent))
    if algorithm in (Algorithm.TREE, Algorithm.AUTO) and op == Collective.ALL_REDUCE:
        depth = max(1, math.ceil(math.log2(n)))
        tree_latency = 2 * ((g - 1) * a_in + depth * a_out)
        priced.append(_Priced(tree_latency + 2 * nbytes / rate, tree_latency, 2 * nbytes))
    return min(priced)


def _flat(
    op: Collective,
    nbytes: float,
    num_gpus: int,
    link: LinkSpec,
    algorithm: Algorithm | str,
    first_gpu: int,
) -> _Priced:
    """The fastest of `ways` over one link."""
    alpha = link.latency_us * 1e-6
    rate = link.bytes_per_second
    return min(
        _Priced(
            way.steps * alpha + way.fixed_s + way.wire_bytes / rate,
            way.steps * alpha + way.fixed_s,
            way.sent_bytes,
        )
        for way in ways(op, nbytes, num_gpus, link, algorithm, first_gpu)
    )


def collective_cost(
    op: Collective | str,
    nbytes: float,
    num_gpus: int,
    link: LinkSpec | CrossNodeLink,
    algorithm: Algorithm | str = Algorithm.AUTO,
    first_gpu: int = 0,
) -> OpCost:
    """Time of one collective over `num_gpus` GPUs joined by `link`, the group's GPUs
    placed in order from the node's GPU `first_gpu` (it matters on a PCIe tree). A
    send/recv over num_gpus > 2 is a pipeline stage hand-off: each GPU of the first half
    sends `nbytes` to the same rank of the second, at once (across nodes, each over its
    own rail). A CrossNodeLink prices a group spanning nodes (module doc)."""
    op = _parse(Collective, op, "collective")
    if num_gpus < 1:
        raise InfersimError(f"num_gpus must be >= 1, got {num_gpus}")
    if nbytes < 0:
        raise InfersimError(f"message size must be >= 0 bytes, got {nbytes}")
    if num_gpus == 1 and op != Collective.SEND_RECV:
        return OpCost(op.value, 0.0, 0.0, 0.0, 0.0, Bound.COMMUNICATION)
    if not isinstance(link, CrossNodeLink):
        best = _flat(op, nbytes, num_gpus, link, algorithm, first_gpu)
    elif op == Collective.SEND_RECV:
        best = _flat(op, nbytes, num_gpus, link.inter, algorithm, 0)
    else:
        best = _cross_node(op, nbytes, num_gpus, link, _parse(Algorithm, algorithm, "algorithm"))
    seconds, latency, sent = best
    bound = Bound.LATENCY if latency >= seconds - latency else Bound.COMMUNICATION
    return OpCost(
        name=op.value,
        seconds=seconds,
        flops=nbytes if op in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER) else 0.0,
        dram_bytes=2.0 * sent,
        l2_bytes=0.0,
        bound=bound,
        memory_seconds=seconds - latency,
        overhead_seconds=latency,
    )
