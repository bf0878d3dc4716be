"""infersim's memory plan beside vLLM's own start-up logs.

vLLM prints what it measured when it sizes the KV cache: "Model loading took X GiB",
"Available KV cache memory: X GiB" / "available_kv_cache_memory", "GPU KV cache size: N
tokens" (or "# GPU blocks: N"). The cases below are such figures pasted into public vLLM
issues and pull requests, with the settings they ran with; each row prints infersim's
plan_memory for the same settings beside them. A negative vLLM KV figure is a start-up
vLLM refused ("No available memory for the cache blocks").

Run: .venv/bin/python benchmarks/vllm_startup_memory.py
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from urllib.parse import urlparse

import simulator as sim
from hardware_models.errors import InfeasibleError
from simulator.engine.kv_groups import kv_cache_groups
from simulator.memory_planner import plan_memory, stage_weight_bytes, stage_weights
from simulator.vllm_defaults import parse_version

GIB = 2**30
VLLM = "https://github.com/vllm-project/vllm"


@dataclass(frozen=True)
class Case:
    source: str  # where the figures were published
    version: str  # the vLLM that printed them
    model: str  # infersim's catalog name (a stand-in where noted)
    gpu: str  # infersim's preset
    weight_dtype: str
    tp: int
    gpu_memory_utilization: float
    max_num_batched_tokens: int  # the profile run's tokens (V0 without chunked prefill:
    # max_model_len)
    max_num_seqs: int  # the sampler's rows (vLLM's default for that version and GPU)
    kv_gib: float | None = None  # vLLM's KV cache memory, GiB (negative: refused)
    kv_tokens: int | None = None  # vLLM's KV cache size in tokens
    weights_gib: float | None = None  # "Model loading took"
    hybrid: bool = False  # vLLM V1's hybrid KV cache manager (sliding-window layers)
    kv_dtype: str = "bf16"
    note: str = ""


# fmt: off
CASES = [
    Case(f"{VLLM}/pull/10511", "0.6.4 V0", "llama-3.1-8b", "h100-sxm", "bf16", 1, 0.90,
         8192, 256, kv_gib=53.29, weights_gib=14.96,
         note="Llama-3-8B (same shapes as 3.1)"),
    Case(f"{VLLM}/pull/10511", "0.6.4 V0", "llama-3.1-8b", "h100-sxm", "bf16", 2, 0.90,
         8192, 256, kv_gib=71.29 - 7.48 - 3.58 - 1.26, weights_gib=7.48,
         note="KV = 71.29 usable - 7.48 weights - 3.58 non-torch - 1.26 peak, its log"),
    Case(f"{VLLM}/issues/10702", "0.6.4 V0", "llama-3.1-70b", "h200-sxm", "bf16", 8, 0.95,
         2048, 256, kv_gib=110.52, note="settings as read by the review; log not re-found"),
    Case("../shared/data/e2e/rtx4090-llama-3.1-8b-vllm-0.19/meta.json", "0.19 V1",
         "llama-3.1-8b", "rtx-4090", "bf16", 1, 0.90, 2048, 256, kv_tokens=41408,
         note="measured run (kv_cache.num_kv_tokens)"),
    Case(f"{VLLM}/pull/2031", "0.2.4 V0", "llama-2-7b", "a100-80gb-sxm", "fp16", 1, 0.90,
         4096, 256, kv_tokens=7351 * 16, kv_dtype="fp16"),
    Case(f"{VLLM}/pull/2031", "0.2.4 V0", "llama-2-70b", "a100-80gb-sxm", "fp16", 4, 0.90,
         4096, 256, kv_tokens=20865 * 16, kv_dtype="fp16"),
    Case(f"{VLLM}/issues/21348", "0.9 V1", "qwen3-235b-a22b", "h100-sxm", "fp8_block", 4,
         0.90, 8192, 1024, kv_gib=8.11, kv_tokens=178880,
         note="ran with LMCacheConnectorV1 as kv-transfer connector (its command)"),
    Case(f"{VLLM}/issues/23278", "0.10.1 V1", "gpt-oss-120b", "h100-sxm", "mxfp4", 1, 0.90,
         8192, 1024, kv_gib=-2.14, weights_gib=65.97, hybrid=True,
         note="Marlin MXFP4 backend (its log)"),
    Case(f"{VLLM}/issues/27508", "0.11 V1", "gpt-oss-120b", "h100-sxm", "mxfp4", 1, 0.95,
         1024, 1024, kv_gib=1.71, hybrid=True),
    Case(f"{VLLM}/issues/33155", "0.14.1 V1", "gpt-oss-120b", "h100-sxm", "mxfp4", 1, 0.90,
         8192, 1024, weights_gib=64.38, hybrid=True,
         note="Triton MXFP4 backend (its log): not modelled"),
    Case("https://myoceane.fr/index.php/ai-vllm-a100-gemma-4/", "0.19.0 V1", "gpt-oss-20b",
         "a100-80gb-sxm", "mxfp4", 1, 0.65, 2048, 256, kv_gib=36.56, weights_gib=13.72,
         hybrid=True, note="A100 (0.65 x 80 GB holds its 13.72 + 36.56 GiB); max_model_len 131072"),
    Case(f"{VLLM}/issues/6746", "0.5.3 V0", "llama-3.1-405b", "h100-sxm", "fp8", 8, 0.90,
         8192, 256, weights_gib=57.75,
         note="Meta's FP8 keeps attention and the first/last layers 16-bit: not modelled"),
]
# fmt: on


def _plan(case: Case):
    arch, gpu = sim.load_model(case.model), sim.load_gpu(case.gpu)
    settings = dict(
        weight_dtype=case.weight_dtype,
        kv_dtype=case.kv_dtype,
        tp=case.tp,
        gpu_memory_utilization=case.gpu_memory_utilization,
        max_num_batched_tokens=case.max_num_batched_tokens,
        kv_groups=kv_cache_groups(arch, block_size=16) if case.hybrid else None,
    )
    # Older infersim commits (the "before" column) took no max_num_seqs or vllm_version.
    parameters = inspect.signature(plan_memory).parameters
    if "max_num_seqs" in parameters:
        settings["max_num_seqs"] = case.max_num_seqs
    if "vllm_version" in parameters:  # the sampler's bytes a logit differ by version
        settings["vllm_version"] = parse_version(case.version)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_memory(arch, gpu, **settings)


def _weights(case: Case) -> float:
    """The plan's weights on the most loaded GPU, for a plan that does not fit."""
    arch, gpu = sim.load_model(case.model), sim.load_gpu(case.gpu)
    layout = dict(weight_dtype=case.weight_dtype, tp=case.tp)
    if "gpu" in inspect.signature(stage_weights).parameters:  # as _plan's note
        layout["gpu"] = gpu
    return stage_weight_bytes(arch, **layout)


def _error(ours: float, theirs: float | None) -> str:
    if theirs is None or theirs <= 0:
        return ""
    return f"{(ours / theirs - 1) * 100:+.1f}%"


def _label(source: str) -> str:
    """'issues 10702' for a GitHub thread, the host for another page, 'e2e meta' for data."""
    if source.startswith(VLLM):
        return " ".join(source.rsplit("/", 2)[-2:])
    if source.startswith("http"):
        return urlparse(source).netloc
    return "e2e meta"


def rows() -> list[list[str]]:
    table = []
    for case in CASES:
        label = _label(case.source)
        setting = (
            f"{case.gpu} {case.model} {case.weight_dtype} tp{case.tp} "
            f"gmu {case.gpu_memory_utilization} mnbt {case.max_num_batched_tokens} "
            f"seqs {case.max_num_seqs}"
        )
        vllm_kv = "" if case.kv_gib is None else f"{case.kv_gib:.2f}"
        vllm_tokens = "" if case.kv_tokens is None else f"{case.kv_tokens:,}"
        vllm_weights = "" if case.weights_gib is None else f"{case.weights_gib:.2f}"
        try:
            plan = _plan(case)
        except InfeasibleError:
            weights = _weights(case) / GIB
            table.append([label, case.version, setting, vllm_weights, f"{weights:.2f}",
                          vllm_kv, "refuses", vllm_tokens, "", "", case.note])  # fmt: skip
            continue
        weights, kv = plan.weights / GIB, plan.kv_capacity_bytes / GIB
        error = _error(plan.kv_capacity_tokens, case.kv_tokens) or _error(kv, case.kv_gib)
        table.append([
            label, case.version, setting, vllm_weights, f"{weights:.2f}", vllm_kv,
            f"{kv:.2f}", vllm_tokens, f"{plan.kv_capacity_tokens:,}", error, case.note,
        ])  # fmt: skip
    return table


def main() -> None:
    header = ["source", "vLLM", "settings", "weights vLLM", "weights infersim",
              "KV GiB vLLM", "KV GiB infersim", "KV tokens vLLM", "KV tokens infersim",
              "KV error", "note"]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows():
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
