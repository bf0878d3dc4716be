"""infersim's memory plan beside the KV cache vLLM reported at start-up.

Each row is a published vLLM start-up log (a GitHub issue or pull request: the URL, the
settings it ran with, and what vLLM logged as "Available KV cache memory" or "GPU KV cache
size"); the run's own measured RTX 4090 log (../shared/data/e2e, read where present) is
one more. infersim plans each with plan_memory as `infersim run` calls it. A setting the
source left to vLLM is vLLM's default for that release (simulator.vllm_defaults: max_num_seqs
and max_num_batched_tokens by GPU); V0 releases (before 0.8) defaulted to 256 sequences on
every GPU, their budget is given. `--before` plans as infersim did before the batch limits
followed vLLM: the logits sized for 256 sequences whatever max_num_seqs was, and a default
budget of 2048 tokens.

    python benchmarks/vllm_startup_memory.py [--before]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from hardware_models.errors import InfeasibleError
from hardware_models.presets import load_gpu
from simulator.engine.kv_groups import kv_cache_groups
from simulator.memory_planner import plan_memory
from simulator.model_catalog import load_model
from simulator.vllm_defaults import parse_version, vllm_default

GIB = 2**30
V0_MAX_NUM_SEQS = 256  # vLLM's SchedulerConfig default before the V1 engine, every GPU
MEASURED = (
    Path(__file__).resolve().parents[2] / "shared/data/e2e/rtx4090-llama-3.1-8b-vllm-0.19/meta.json"
)


@dataclass(frozen=True)
class Source:
    """A vLLM start-up log: where, how it ran (None: vLLM's default), what it reported."""

    url: str
    vllm: str
    model: str
    gpu: str
    weights: str
    tp: int
    gmu: float
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    kv_gib: float | None  # "Available KV cache memory" (GiB; negative: refused to start)
    kv_tokens: int | None  # "GPU KV cache size" (tokens) or blocks x block size


VLLM = "https://github.com/vllm-project/vllm"  # Llama-3-8B: the shapes of llama-3.1-8b
SOURCES = (
    Source(f"{VLLM}/pull/10511", "0.6.4", "llama-3.1-8b", "h100-sxm", "bf16", 1, 0.9, 8192,
           V0_MAX_NUM_SEQS, 53.29, None),
    Source(f"{VLLM}/pull/10511", "0.6.4", "llama-3.1-8b", "h100-sxm", "bf16", 2, 0.9, 8192,
           V0_MAX_NUM_SEQS, 58.97, None),
    Source(f"{VLLM}/issues/10702", "0.6.4", "llama-3.1-70b", "h200-sxm", "bf16", 8, 0.95,
           2048, V0_MAX_NUM_SEQS, 110.52, None),
    Source(f"{VLLM}/issues/10517", "0.6", "llama-3.1-8b", "rtx-4090", "bf16", 1, 0.9, 20000,
           V0_MAX_NUM_SEQS, None, 1952 * 16),
    Source(f"{VLLM}/issues/10517", "0.6", "llama-3.1-8b", "rtx-4090", "bf16", 1, 0.9, 29000,
           V0_MAX_NUM_SEQS, None, 1478 * 16),
    Source(f"{VLLM}/pull/2031", "0.2", "llama-2-7b", "a100-80gb-sxm", "fp16", 1, 0.9, 4096,
           V0_MAX_NUM_SEQS, None, 7351 * 16),
    Source(f"{VLLM}/pull/2031", "0.2", "llama-2-70b", "a100-80gb-sxm", "fp16", 4, 0.9, 4096,
           V0_MAX_NUM_SEQS, None, 20865 * 16),
    Source(f"{VLLM}/issues/21348", "0.9", "qwen3-235b-a22b", "h100-sxm", "fp8_block", 4,
           0.9, None, None, 8.11, 178880),
    Source(f"{VLLM}/issues/23278", "0.10.1", "gpt-oss-120b", "h100-sxm", "mxfp4", 1, 0.9,
           None, None, -2.14, None),
    Source(f"{VLLM}/issues/27508", "0.11.0", "gpt-oss-120b", "h100-sxm", "mxfp4", 1, 0.95,
           1024, None, 1.71, None),
)  # fmt: skip


def _measured() -> Source | None:
    """The measured RTX 4090 run's own log, where ../shared/data is present."""
    if not MEASURED.is_file():
        return None
    meta = json.loads(MEASURED.read_text())
    args, kv = meta["engine_kwargs"], meta["kv_cache"]
    return Source("../shared/data/e2e (measured)", meta["vllm_version"], "llama-3.1-8b",
                  "rtx-4090", "bf16", args["tensor_parallel_size"], kv["gpu_memory_utilization"],
                  args["max_num_batched_tokens"], args["max_num_seqs"], None,
                  kv["num_kv_tokens"])  # fmt: skip


def _limits(source: Source, before: bool) -> tuple[int, int | None]:
    """(max_num_batched_tokens, max_num_seqs) as the source's vLLM ran (None for the
    sequences: the planner's old fixed 256, with --before)."""
    gpu = load_gpu(source.gpu)
    version = parse_version(source.vllm)

    def chosen(field: str, given: int | None) -> int:
        if given is not None:
            return given
        return int(vllm_default(field, version, gpu.display_name, gpu.memory_bytes / GIB).value)

    tokens = source.max_num_batched_tokens
    if before:
        return (2048 if tokens is None else tokens), None
    return chosen("max_num_batched_tokens", tokens), chosen("max_num_seqs", source.max_num_seqs)


def _plan(source: Source, before: bool) -> tuple[float | None, int | None, int, int | None]:
    """infersim's KV cache (GiB and tokens; None where it refuses to start) and the batch
    limits it planned with."""
    arch, gpu = load_model(source.model), load_gpu(source.gpu)
    tokens, seqs = _limits(source, before)
    try:
        plan = plan_memory(
            arch,
            gpu,
            weight_dtype=source.weights,
            kv_dtype="fp16" if source.weights == "fp16" else "bf16",
            tp=source.tp,
            gpu_memory_utilization=source.gmu,
            max_num_batched_tokens=tokens,
            kv_groups=kv_cache_groups(arch, block_size=16) if arch.num_sliding_layers else None,
            **({} if seqs is None else {"max_num_seqs": seqs}),
        )
    except InfeasibleError:  # no room left for a KV cache: infersim refuses to start
        return None, None, tokens, seqs
    return plan.kv_capacity_bytes / GIB, plan.kv_capacity_tokens, tokens, seqs


def _error(ours: float | None, theirs: float | None) -> str:
    """Relative error; in GiB where vLLM had no KV cache left (it refused to start)."""
    if ours is None or theirs is None:
        return ""
    return f"{ours - theirs:+.2f} GiB" if theirs <= 0 else f"{(ours / theirs - 1) * 100:+.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", action="store_true", help="plan as infersim did before")
    args = parser.parse_args(argv)
    sources = [*SOURCES, *filter(None, [_measured()])]
    print("| source | vLLM | model, GPU, tp | mnbt / seqs | vLLM KV GiB | infersim KV GiB | "
          "vLLM tokens | infersim tokens | error |")  # fmt: skip
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for source in sources:
        kv_gib, kv_tokens, tokens, seqs = _plan(source, args.before)
        theirs = "refused" if source.kv_gib is not None and source.kv_gib <= 0 else source.kv_gib
        ours = "refused" if kv_gib is None else f"{kv_gib:.2f}"
        error = _error(kv_tokens, source.kv_tokens) or _error(kv_gib, source.kv_gib)
        print(
            f"| {source.url} | {source.vllm} | {source.model}, {source.gpu}, tp{source.tp} | "
            f"{tokens} / {seqs or 256} | {theirs if theirs is not None else ''} | {ours} | "
            f"{source.kv_tokens or ''} | {kv_tokens or ''} | {error} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
