"""NCCL all-reduce timings across the GPUs of this machine (torch.distributed).

One process per GPU, joined through a file in a temporary folder (no network). Every
GPU count 2, 4, ... up to all of them is timed over the plan's message sizes, each on the
first p ranks; rank 0 times with CUDA events (as nccl-tests does) and writes the rows.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hardware_models.calibration.harness.benches import Bench, Progress, make_row
from hardware_models.calibration.harness.plan import Plan
from hardware_models.calibration.harness.timing import median_seconds


def gpu_counts(world: int) -> list[int]:
    counts = [p for p in (2, 4, 8, 16) if p < world]
    return [*counts, world]


def _worker(rank: int, world: int, folder: str, plan: Plan) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world
    )
    results = []
    for count in gpu_counts(world):
        group = dist.new_group(list(range(count)))  # every rank must create every group
        if rank < count:
            for nbytes in plan.collective_bytes:
                buffer = torch.ones(nbytes // 2, dtype=torch.float16, device="cuda")
                secs = median_seconds(
                    torch,
                    "cuda",
                    lambda buffer=buffer, group=group: dist.all_reduce(buffer, group=group),
                    plan.warmup,
                    plan.repeats,
                )
                results.append((count, nbytes, secs))
        dist.barrier()
    if rank == 0:
        Path(folder, "results.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def all_reduce(bench: Bench, progress: Progress) -> list[dict]:
    torch = bench.torch
    world = torch.cuda.device_count() if bench.device == "cuda" else 0
    if world < 2 or not bench.plan.collective_bytes:
        progress(f"collectives: skipped ({world} GPU(s) visible; NCCL needs at least 2)")
        return []
    with tempfile.TemporaryDirectory() as folder:
        torch.multiprocessing.spawn(_worker, args=(world, folder, bench.plan), nprocs=world)
        results = json.loads(Path(folder, "results.json").read_text())
    progress(f"collectives: all-reduce on {', '.join(map(str, gpu_counts(world)))} GPUs")
    return [
        make_row(
            bench.gpu,
            "all_reduce",
            "float16",
            "nccl_all_reduce",
            num_gpus=count,
            nbytes=nbytes,
            size=nbytes,
            measured_s=secs,
        )
        for count, nbytes, secs in results
    ]
