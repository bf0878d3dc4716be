"""The tensor-parallel all-reduce as vLLM runs it: NCCL only where nothing faster applies.

vLLM's CUDA communicator (vllm/distributed/device_communicators/cuda_communicator.py,
`all_reduce`) tries its backends in order and the first that accepts the tensor runs it:

1. vLLM's custom all-reduce (custom_all_reduce.py, csrc/custom_all_reduce.cuh), off with
   `--disable-custom-all-reduce`. It starts only inside one node, for 2, 4, 6 or 8 GPUs
   (`_SUPPORTED_WORLD_SIZES`), on more than two GPUs only when they are fully connected
   (NVLink/NVSwitch, xGMI), and on two PCIe GPUs only with working peer access, which
   vLLM tests at start-up (`_can_p2p`). The simulator cannot run that test: it reads
   peer access from the node (`_peer_access`): a PCIe link allows it only where its
   `fabric` says so (`p2p`, GPUs under one switch); a PCIe link without a `fabric`, or
   a network link (ethernet, InfiniBand) inside a node, gets NCCL. It takes a
   tensor of a multiple of 16 bytes below `max_size`: 8 MiB, or on Hopper and Blackwell,
   when torch symmetric memory is up, the smaller per-world-size limit of
   `CUSTOM_ALL_REDUCE_MAX_SIZES` (all_reduce_utils.py; 256 KiB for 8 H100s). Its kernel
   is one-shot (`cross_device_reduce_1stage`: every rank reads every peer's whole buffer)
   for two GPUs, and below 512 KiB (up to 4 GPUs) or 256 KiB (up to 8); otherwise two-shot
   (`cross_device_reduce_2stage`: reduce-scatter then all-gather, both as peer loads).
   Both run min(36, ceil(vectors / 512)) blocks of 512 threads, 16 bytes a load, and
   synchronise the ranks with flags written into each peer's memory and polled (one peer
   write each, "Latency = 1 p2p write" in the source); the two-shot kernel's middle barrier
   adds a system-scope fence. Under CUDA-graph capture the input buffers are registered
   (no copy); eagerly the input is first copied into a registered buffer. A run with
   `cuda_graphs` on prices every step as captured: vLLM runs a step above its largest
   capture size (`max_cudagraph_capture_size`) eagerly, with that copy, but the
   simulator does not model the capture sizes, so those steps miss one device copy of
   the tensor per all-reduce (and are priced at graph launch cost too).
2. torch symmetric memory (symm_mem.py), `VLLM_ALLREDUCE_USE_SYMM_MEM`. Its default has
   moved: the backend arrived in 0.10.2 off (vllm-project/vllm#20759; #24111 turned it
   on and #24696 off again before that release), #25070 turned it on for 0.11.0 (which
   #26525 reports), and #26925 (October 2025, before 0.11.1) turned it off again; it
   is on again by 0.18.0 (#38550 reports it) and on vLLM's main branch, from a release
   in between that was not found. `parallelism.allreduce_use_symm_mem` (default on, as
   main) sets it; a replay picks it by the run's vLLM version and says where that is a
   guess (simulator.vllm_defaults.symm_mem_default). CUDA only, compute
   capability 9.0, 10.0 or 10.3, a bf16 tensor up to `SYMM_MEM_ALL_REDUCE_MAX_SIZES`
   (64 MiB for 8 H100s; "up to" as vLLM compares since vllm-project/vllm#42993, May
   2026; releases before it compare with `<`, which sends a tensor of exactly the limit
   to NCCL: one token count per group, not switched by version), and only where the GPUs
   support multicast (NVSwitch; `multicast_ptr == 0` disables it).
   It copies the input into its buffer, runs `multimem_all_reduce_` (NVSwitch reduces
   with multimem loads and multicast stores) or `two_shot_all_reduce_` by world size, and
   copies the result out.
3. NCCL (pynccl), priced by collectives.collective_cost with the profile's NCCL fit.

Not modelled, all off by default in the vLLM source read (commit 00d618a): NCCL's own
symmetric-memory all-reduce (`VLLM_USE_NCCL_SYMM_MEM`), FlashInfer's all-reduce
(`VLLM_ALLREDUCE_USE_FLASHINFER`), ROCm's quick reduce. Newer vLLM at optimisation level
O2 also fuses small all-reduces with the following RMSNorm through FlashInfer on Hopper
and Blackwell (`pass_config.fuse_allreduce_rms`); that fused kernel is not modelled, and
the run's all-reduce line says so on those chips (`FUSION_NOT_MODELLED`).

The custom and symmetric-memory kernels move data as peer loads and stores over the
node's own link, so they are priced from its hardware figures (the node preset's
bandwidth and efficiency), never from a profile's NCCL fit, which applies to NCCL calls
only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.collectives import collective_cost
from hardware_models.dtypes import Dtype
from hardware_models.errors import InfeasibleError
from hardware_models.node import LinkSpec, NodeSpec
from hardware_models.op_cost import Bound, OpCost
from hardware_models.pointwise import Pointwise, elementwise_cost

KiB, MiB = 1024, 1024 * 1024


class AllReducePath(StrEnum):
    CUSTOM_ONE_SHOT = "custom_one_shot"
    CUSTOM_TWO_SHOT = "custom_two_shot"
    SYMM_MEM_MULTIMEM = "symm_mem_multimem"
    SYMM_MEM_TWO_SHOT = "symm_mem_two_shot"
    NCCL = "nccl"


# vLLM's figures (custom_all_reduce.py, all_reduce_utils.py, symm_mem.py, commit 00d618a).
CUSTOM_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_MAX_BYTES = 8 * MiB  # CustomAllreduce(max_size=8192 * 1024); a tensor must be smaller
CUSTOM_MAX_WITH_SYMM_MEM = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: MiB, 8: MiB},
    "10.3": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
}
SYMM_MEM_MAX = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
    "10.3": {2: 4 * MiB, 4: 32 * MiB, 6: 32 * MiB, 8: 64 * MiB},
}
SYMM_MEM_MULTIMEM_SIZES = {"9.0": (4, 6, 8), "10.0": (6, 8), "10.3": (6, 8)}
# csrc/custom_all_reduce.cuh: allreduce(threads = 512, block_limit = 36), 16-byte packed
# loads, and the one-shot limits of its REDUCE_CASE dispatch.
THREADS_PER_BLOCK, BLOCK_LIMIT, VECTOR_BYTES = 512, 36, 16
ONE_SHOT_BELOW = ((4, 512 * KiB), (8, 256 * KiB))  # (up to this many GPUs, below bytes)

# One flag written into a peer's memory and seen by its poller: the kernel's barriers
# (start_sync, end_sync) store a byte into each peer's signal through its peer pointer and
# spin on their own signal in local memory. NCCL's tuning model gives the same mechanism
# (its LL protocol: data and flag in one store, polled by the reader) a per-hop latency of
# 0.6 us over NVLink (hwLat, src/graph/tuning.cc, NCCL 2.2x); no vendor figure exists for
# xGMI in that table, NVLink's is used. Over PCIe the kernel runs only between switch
# neighbours with peer access, so a flag is a peer-to-peer hop ("Latency = 1 p2p write",
# start_sync in vLLM's csrc/custom_all_reduce.cuh, commit 036bb68): the node's PCIe link's
# `latency_us`, which is that hop (node.PCIE_P2P_HOP_US in the l40s-8x-pcie preset), so
# NCCL's LL hops and the flags between the same GPUs move together. A peer load is a
# round trip: two hops.
FLAG_HOP_US = {"nvlink": 0.6, "nvswitch": 0.6, "infinity_fabric": 0.6}
# vLLM's two-shot kernel's extra cost over the one-shot's structure: its middle barrier's
# __threadfence_system, which makes the reduce-scatter's results visible system-wide
# before the all-gather reads them (torch's two-shot kernel synchronises without one and
# shows no such cost). No microbenchmark of that fence was found; this is fitted to the
# two-shot rows of vLLM's published H100 tables (benchmarks/custom_all_reduce.py: the
# median residual of the 12 rows of vllm-project/vllm#24532 TP4 and #24111 TP6).
TWO_SHOT_FENCE_US = 10.9

# What the run's all-reduce line adds on the chips where newer vLLM fuses the all-reduce
# with the next RMSNorm (compute capabilities of SYMM_MEM_MAX: Hopper and Blackwell).
FUSION_NOT_MODELLED = "newer vLLM's all-reduce + RMSNorm fusion (FlashInfer, -O2) not modelled"

_COPY = Pointwise("copy", reads=1, writes=1, flops_per_element=0)
_FULLY_CONNECTED = ("nvlink", "nvswitch", "infinity_fabric")


def _flag_hop_us(link: LinkSpec, path: AllReducePath) -> float:
    """One flag's hop over `link`, us: a PCIe link's own peer-to-peer hop (`latency_us`),
    NCCL's NVLink figure over fully connected links; no peer access over a network link."""
    if link.kind == "pcie":
        return link.latency_us
    if link.kind not in FLAG_HOP_US:
        raise InfeasibleError(
            f"all_reduce[{path.value}] runs on peer access, which a {link.kind} "
            "link has not: only NCCL runs over it"
        )
    return FLAG_HOP_US[link.kind]


def capability(gpu: AcceleratorSpec) -> str | None:
    """The GPU's CUDA compute capability as vLLM's tables key it (Hopper presets leave it
    unstated: every Hopper part is 9.0)."""
    if gpu.vendor != "nvidia":
        return None
    if gpu.compute_capability is not None:
        return gpu.compute_capability
    return "9.0" if gpu.architecture.strip().lower() == "hopper" else None


def _peer_access(link: LinkSpec, num_gpus: int, first_gpu: int) -> bool:
    """Whether every GPU of the group can load from every other's memory, as vLLM's
    start-up P2P test (`_can_p2p`) would find: NVLink, NVSwitch and xGMI always; on a
    PCIe tree only GPUs under one switch whose description allows peer access
    (`fabric.p2p`); never over a network link. A PCIe link with no `fabric` description
    says nothing about peer access, so none is assumed: NCCL runs, as on consumer cards
    whose driver disables P2P (the RTX 4090). This rule stands in for vLLM's runtime
    test, which the simulator cannot run."""
    if link.kind in _FULLY_CONNECTED:
        return True
    fabric = link.fabric
    if link.kind != "pcie" or fabric is None:
        return False
    last = first_gpu + num_gpus - 1
    same_switch = first_gpu // fabric.gpus_per_switch == last // fabric.gpus_per_switch
    return fabric.p2p and same_switch


def _no_peer_access(link: LinkSpec) -> str:
    """The off reason of a group without peer access, naming what the node lacks."""
    if link.kind != "pcie":
        return f"custom all-reduce needs peer access, which the node's {link.kind} link has not"
    if link.fabric is None:
        return (
            "custom all-reduce needs peer access: the node's PCIe link does not describe it "
            "(intra_node_link.fabric.p2p)"
        )
    return "custom all-reduce needs peer access between the GPUs"


@dataclass(frozen=True, slots=True)
class TpAllReduce:
    """How one tensor-parallel group's all-reduces run, and what each costs (see the
    module doc). Made by `plan`; `path` and `cost` take the tensor's bytes."""

    gpu: AcceleratorSpec
    link: LinkSpec  # the node's own GPU-to-GPU link: the peer kernels' figures
    nccl_link: LinkSpec  # the link NCCL is priced over (a profile's fit applied)
    num_gpus: int
    custom_below: int  # bytes; 0: the custom all-reduce is off
    symm_mem_up_to: int  # bytes; 0: symmetric memory is off
    symm_mem_multimem: bool
    registered: bool  # CUDA graphs: the custom kernel reads the input where it lies
    off_reasons: tuple[str, ...] = ()
    fusable: bool = False  # a chip where newer vLLM fuses all-reduce + RMSNorm

    @classmethod
    def plan(
        cls,
        gpu: AcceleratorSpec,
        node: NodeSpec,
        num_gpus: int,
        nccl_link: LinkSpec,
        *,
        activation_dtype: Dtype = Dtype.BF16,
        custom: bool = True,
        symm_mem: bool = True,
        cuda_graphs: bool = True,
        first_gpu: int = 0,
    ) -> TpAllReduce:
        """The backends vLLM starts for a tp group of `num_gpus` on `node` (its GPUs from
        `first_gpu` on), as CustomAllreduce and SymmMemCommunicator decide at start-up."""
        link = node.intra_node_link
        reasons: list[str] = []
        symm_up_to, multimem = 0, False
        cc = capability(gpu)
        within = link is not None and num_gpus <= node.gpus_per_node
        if not within:
            reasons.append("the group spans nodes")
        elif gpu.vendor != "nvidia":
            pass  # a CUDA-only backend: nothing to say on ROCm
        elif not symm_mem:
            reasons.append("symmetric memory off")
        elif cc not in SYMM_MEM_MAX or link.kind != "nvswitch":
            reasons.append("symmetric memory: needs Hopper/Blackwell with NVSwitch")
        elif num_gpus not in SYMM_MEM_MAX[cc]:
            reasons.append(f"symmetric memory takes 2, 4, 6 or 8 GPUs, not {num_gpus}")
        else:
            symm_up_to = SYMM_MEM_MAX[cc][num_gpus]
            multimem = num_gpus in SYMM_MEM_MULTIMEM_SIZES[cc]
        symm_started = symm_up_to > 0  # it lowers the custom kernel's limit even so
        if symm_started and activation_dtype != Dtype.BF16:
            reasons.append("symmetric memory takes bf16 tensors only")
            symm_up_to = 0
        below = 0
        if not within:
            pass
        elif not custom:
            reasons.append("custom all-reduce disabled")
        elif gpu.vendor not in ("nvidia", "amd"):
            reasons.append(f"no custom all-reduce on {gpu.vendor}")
        elif num_gpus not in CUSTOM_WORLD_SIZES:
            reasons.append(f"custom all-reduce takes 2, 4, 6 or 8 GPUs, not {num_gpus}")
        elif num_gpus > 2 and link.kind not in _FULLY_CONNECTED:
            reasons.append(f"custom all-reduce needs NVLink for {num_gpus} {link.kind} GPUs")
        elif not _peer_access(link, num_gpus, first_gpu):
            reasons.append(_no_peer_access(link))
        else:
            below = CUSTOM_MAX_BYTES
            if symm_started:
                below = min(CUSTOM_MAX_WITH_SYMM_MEM[cc][num_gpus], below)
        return cls(
            gpu,
            link if link is not None else nccl_link,
            nccl_link,
            num_gpus,
            below,
            symm_up_to,
            multimem,
            cuda_graphs,
            tuple(reasons),
            within and cc in SYMM_MEM_MAX,
        )

    def path(self, nbytes: float) -> AllReducePath:
        """The backend vLLM's dispatch gives a tensor of `nbytes`."""
        if self.custom_below and nbytes % VECTOR_BYTES == 0 and nbytes < self.custom_below:
            if self._one_shot(nbytes):
                return AllReducePath.CUSTOM_ONE_SHOT
            return AllReducePath.CUSTOM_TWO_SHOT
        if self.symm_mem_up_to and nbytes % 4 == 0 and nbytes <= self.symm_mem_up_to:
            if self.symm_mem_multimem:
                return AllReducePath.SYMM_MEM_MULTIMEM
            return AllReducePath.SYMM_MEM_TWO_SHOT
        return AllReducePath.NCCL

    def _one_shot(self, nbytes: float) -> bool:
        p = self.num_gpus
        return p == 2 or any(p <= most and nbytes < limit for most, limit in ONE_SHOT_BELOW)

    def cost(self, nbytes: float, path: AllReducePath | None = None) -> OpCost:
        """One all-reduce of `nbytes` on the backend `path` gives it (or on `path`, as a
        benchmark forcing one kernel runs it)."""
        path = path or self.path(nbytes)
        if path == AllReducePath.NCCL:
            return collective_cost("all_reduce", nbytes, self.num_gpus, self.nccl_link)
        p, hop = self.num_gpus, _flag_hop_us(self.link, path) * 1e-6
        rate = self.link.bytes_per_second
        fixed = self.gpu.efficiency.kernel_floor_us * 1e-6 + 2 * hop  # start, end barriers
        if path == AllReducePath.SYMM_MEM_MULTIMEM:
            # Each rank reduces 1/p of the tensor with multimem loads and stores it to
            # all by multicast: its link carries its whole buffer out to the others'
            # loads and every rank's stores in, plus its own slice: n (1 + 1/p) a way.
            moved = nbytes * (1 + 1 / p)
            data = moved / rate
        else:
            blocks = min(BLOCK_LIMIT, math.ceil(nbytes / VECTOR_BYTES / THREADS_PER_BLOCK))
            per_pass = max(blocks, 1) * THREADS_PER_BLOCK * VECTOR_BYTES
            if path == AllReducePath.CUSTOM_ONE_SHOT:  # every peer's whole buffer
                moved, data = (p - 1) * nbytes, self._stage(nbytes, per_pass, hop, rate)
            else:  # reduce-scatter, then all-gather, each over 1/p of the tensor
                if path == AllReducePath.CUSTOM_TWO_SHOT:  # vLLM's kernel's system fence
                    fixed += TWO_SHOT_FENCE_US * 1e-6
                moved = 2 * (p - 1) / p * nbytes
                data = 2 * self._stage(nbytes / p, per_pass, hop, rate)
        seconds, kernels = fixed + data, 1
        copies = self._copies(path)
        if copies:
            copy = elementwise_cost(self.gpu, [_COPY], nbytes / 2, Dtype.BF16)
            seconds += copies * copy.seconds
            kernels += copies
        return OpCost(
            name=f"all_reduce[{path.value}]",
            seconds=seconds,
            flops=nbytes,
            dram_bytes=2.0 * moved,  # as collective_cost counts: each byte out and in
            l2_bytes=0.0,
            bound=Bound.LATENCY if fixed >= data else Bound.COMMUNICATION,
            memory_seconds=data,
            overhead_seconds=seconds - data,
            kernels=kernels,
        )

    def _copies(self, path: AllReducePath) -> int:
        """Device copies around the kernel: symmetric memory copies the tensor into its
        buffer and the result out; the custom kernel outside a CUDA graph copies the
        input into its registered buffer first."""
        if path in (AllReducePath.SYMM_MEM_MULTIMEM, AllReducePath.SYMM_MEM_TWO_SHOT):
            return 2
        return 0 if self.registered else 1

    def _stage(self, nbytes: float, per_pass: int, hop: float, rate: float) -> float:
        """One peer-load pass over `nbytes` of each rank's buffer: a thread's loads from
        every peer wait one round trip (two hops) before its next iteration, and the
        bytes from the p - 1 peers share the GPU's link."""
        iterations = math.ceil(nbytes / per_pass)
        return max(iterations * 2 * hop, (self.num_gpus - 1) * nbytes / rate)

    def describe(self, row_bytes: float) -> str:
        """Which backend runs the group's all-reduces, by size and by tokens of
        `row_bytes` (one token's hidden state): the line a run prints."""
        p = self.num_gpus
        parts = []
        if self.custom_below:
            one_shot_below = self.custom_below
            if p > 2:
                one_shot_below = min(
                    self.custom_below,
                    next(limit for most, limit in ONE_SHOT_BELOW if p <= most),
                )
            parts.append(f"custom one-shot below {_size(one_shot_below, row_bytes)}")
            if one_shot_below < self.custom_below:
                parts.append(f"custom two-shot below {_size(self.custom_below, row_bytes)}")
        if self.symm_mem_up_to:
            kind = "multimem" if self.symm_mem_multimem else "two-shot"
            parts.append(f"symm-mem {kind} up to {_size(self.symm_mem_up_to, row_bytes)}")
        parts.append("NCCL above" if parts else "NCCL")
        why = f" ({'; '.join(self.off_reasons)})" if self.off_reasons else ""
        fusion = f"; {FUSION_NOT_MODELLED}" if self.fusable else ""
        return f"tp={p} all-reduce: " + ", ".join(parts) + why + fusion


def _size(nbytes: int, row_bytes: float) -> str:
    size = f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"
    tokens = nbytes / row_bytes  # between two token counts when not whole: the smaller's in
    whole = f"{tokens:g} tokens" if tokens.is_integer() else f"up to {int(tokens)} tokens"
    return f"{size} ({whole})"
