"""Collective communication as alpha-beta models: time = steps x latency + traffic / bandwidth.

`nbytes` is the size of the full buffer each GPU holds (the all-reduce input, the
all-gather output). Traffic terms are the standard ones for ring and tree algorithms
(Thakur, Rabenseifner and Gropp 2005; NCCL's bus-bandwidth definitions).

Over a link with a PCIe fabric (node preset `intra_node_link.fabric`) each GPU's traffic
gets the share of its link rate that the flows sharing the tree leave it
(pcie_fabric.fabric_share), a call pays the fabric's fixed latency once, and the tree is
a chain, as NCCL builds it inside one node (its tuning model counts nRanks - 1 intra-node
hops each way for the tree), so the ring wins at every size there.
"""

from __future__ import annotations

import math
from enum import StrEnum

from hardware_models.errors import InfersimError
from hardware_models.node import LinkSpec
from hardware_models.op_cost import Bound, OpCost
from hardware_models.pcie_fabric import fabric_share


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


def collective_cost(
    op: Collective | str,
    nbytes: float,
    num_gpus: int,
    link: LinkSpec,
    algorithm: Algorithm | str = Algorithm.AUTO,
) -> OpCost:
    """Time of one collective over `num_gpus` GPUs joined by `link`."""
    op = _parse(Collective, op, "collective")
    algorithm = _parse(Algorithm, algorithm, "algorithm")
    if num_gpus < 1:
        raise InfersimError(f"num_gpus must be >= 1, got {num_gpus}")
    if nbytes < 0:
        raise InfersimError(f"message size must be >= 0 bytes, got {nbytes}")
    if num_gpus == 1 and op != Collective.SEND_RECV:
        return OpCost(op.value, 0.0, 0.0, 0.0, 0.0, Bound.COMMUNICATION)
    p = max(num_gpus, 2)
    tree = _tree if link.fabric is None else _chain
    candidates = {Algorithm.RING: _ring(op, nbytes, p), Algorithm.TREE: tree(op, nbytes, p)}
    chosen = candidates if algorithm == Algorithm.AUTO else {algorithm: candidates[algorithm]}
    alpha = link.latency_us * 1e-6
    rate = link.bytes_per_second
    if link.fabric is not None:
        rate *= fabric_share(link, _pattern(op), p)
    best = min(
        (steps * alpha + sent / rate, steps * alpha, sent) for steps, sent in chosen.values()
    )
    seconds, latency, sent = best
    if link.fabric is not None:
        seconds += link.fabric.call_latency_us * 1e-6
        latency += link.fabric.call_latency_us * 1e-6
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
