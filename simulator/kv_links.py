"""KV-cache transfers between disaggregated pools, over links they share.

A prefill replica's GPUs send each prompt's KV cache to a decode replica's GPUs, each
GPU its own shard over its own NIC. Every transfer out of one replica crosses that
replica's link, every transfer into one crosses the receiver's, so concurrent transfers
slow each other. Rates are max-min fair over both ends (progressive filling, recomputed
whenever a transfer starts or ends): what RDMA reads posted side by side get from a NIC,
which serves its queue pairs in turn. That is vLLM's NixlConnector: the decode worker
posts one NIXL read per request as soon as it is scheduled
(NixlConnectorWorker.start_load_kv, reads over UCX) and they run together. vLLM's
P2pNcclConnector behaves otherwise, FIFO per sender (P2pNcclEngine.send_async pops one
tensor at a time off its send queue); that is not modelled.

Sizes are in tokens of KV cache and a link's capacity in tokens per second (its bytes
per second over the KV bytes a token takes on one of its GPUs), so the two ends of a
transfer may shard the cache differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy


@dataclass(eq=False)
class _Transfer:
    left: float  # tokens still to cross
    links: tuple[int, int]  # (sender's, receiver's)
    done: simpy.Event
    rate: float = 0.0  # tokens per second now


class KvLinks:
    """The links of a disaggregated cluster's replicas and the transfers crossing them."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.capacity: list[float] = []  # tokens per second, by link
        self._active: list[_Transfer] = []
        self._since = 0.0  # when the transfers' `left` was last brought up to date
        self._version = 0  # of the rates; a wake-up set for older ones is stale

    def add(self, tokens_per_s: float) -> int:
        """A new link; its id."""
        self.capacity.append(tokens_per_s)
        return len(self.capacity) - 1

    def send(self, tokens: int, sender: int, receiver: int, latency_s: float) -> simpy.Event:
        """An event that fires when `tokens` of KV cache have crossed from link `sender`
        to link `receiver`: after `latency_s`, then at the rate the two links' other
        transfers leave it."""
        done = self.env.event()
        start = self.env.timeout(latency_s)
        start.callbacks.append(lambda _: self._start(_Transfer(tokens, (sender, receiver), done)))
        return done

    def _start(self, transfer: _Transfer) -> None:
        self._catch_up()
        self._active.append(transfer)
        self._reschedule()

    def _catch_up(self) -> None:
        elapsed = self.env.now - self._since
        for transfer in self._active:
            transfer.left -= transfer.rate * elapsed
        self._since = self.env.now

    def _reschedule(self) -> None:
        """Share the links anew and wake when the first transfer ends."""
        self._version += 1
        if not self._active:
            return
        fair_rates(self._active, self.capacity)
        first = min(t.left / t.rate for t in self._active)
        version = self._version
        wake = self.env.timeout(max(first, 0.0))
        wake.callbacks.append(lambda _: self._wake(version, first))

    def _wake(self, version: int, elapsed: float) -> None:
        if version != self._version:
            return  # a transfer started since: the rates changed
        # Those that were due to end now end (float error leaves them a few ulps).
        ending = [t for t in self._active if t.left / t.rate <= elapsed * (1 + 1e-9)]
        self._catch_up()
        self._active = [t for t in self._active if t not in ending]
        self._reschedule()
        for transfer in ending:
            transfer.done.succeed()


def fair_rates(transfers: list[_Transfer], capacity: list[float]) -> None:
    """Max-min fair rates (progressive filling): the most contended link splits what is
    left of it evenly among its unfixed transfers, which fixes them; repeat."""
    room = {link: capacity[link] for t in transfers for link in t.links}
    unfixed = list(transfers)
    while unfixed:
        users: dict[int, int] = {}
        for t in unfixed:
            for link in t.links:
                users[link] = users.get(link, 0) + 1
        bottleneck = min(users, key=lambda link: room[link] / users[link])
        share = room[bottleneck] / users[bottleneck]
        fixed = [t for t in unfixed if bottleneck in t.links]
        for t in fixed:
            t.rate = share
            for link in t.links:
                room[link] -= share
        unfixed = [t for t in unfixed if bottleneck not in t.links]
