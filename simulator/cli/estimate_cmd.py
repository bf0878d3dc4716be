"""`infersim estimate`: how many GPUs a model needs, the quick way and the detailed way."""

from __future__ import annotations

import argparse
import typing

from pydantic import ValidationError

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import parse_dtype
from hardware_models.errors import InfeasibleError, InfersimError
from hardware_models.node import NodeSpec
from hardware_models.presets import load_gpu
from simulator.architecture import ModelArchitecture
from simulator.build import check_tp_on_node, default_node, resolve_weight_dtype
from simulator.caveats import check_serving_starts, mla_block_size
from simulator.engine.kv_groups import vllm_default_groups
from simulator.engine.weight_format import check_weight_support, weight_format
from simulator.memory_planner import ESTIMATE_SETTINGS, GB, DoesNotFit, plan_memory
from simulator.model_catalog import load_model
from simulator.scenario import VLLM_KV_DTYPES, KvDType, ServingSection
from simulator.sizing import (
    TRAINING_MULTIPLIER,
    InferenceEstimate,
    detailed_inference,
    detailed_training,
    quick_inference_gpus,
    quick_training_gpus,
)


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.add_argument("--model", required=True, help="catalog name or config.json path")
    parser.add_argument("--gpu", required=True, help="GPU preset name or YAML path")
    parser.add_argument(
        "--precision",
        help="weight dtype or format, as model.weight_dtype (fp16, bf16, fp8, fp8_block, nvfp4, "
        "mxfp4, ...); default: the checkpoint's, as `infersim run` serves it",
    )
    parser.add_argument(
        "--kv-dtype",
        choices=(*typing.get_args(KvDType), *VLLM_KV_DTYPES),
        help="KV-cache dtype, as vLLM's --kv-cache-dtype (default: the model's dtype, as "
        "vLLM's auto: fp16 with fp16 weights, else bf16; quantised weights keep a bf16 KV "
        "cache)",
    )
    parser.add_argument("--batch", type=_positive, default=1, help="sequences in flight")
    parser.add_argument("--seq", type=_positive, default=2048, help="tokens per sequence")
    parser.add_argument(
        "--tp", type=_positive, help="tensor-parallel degree to plan (default: the GPUs needed)"
    )
    parser.add_argument("--no-flash", action="store_true", help="materialise attention scores")
    for flag, kind in _SERVING_FLAGS.items():
        name = flag.removeprefix("--").replace("-", "_")
        parser.add_argument(flag, type=kind, help=f"as serving.{name} in a scenario")
    parser.add_argument("--training", action="store_true", help="estimate training instead")
    parser.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage")
    parser.add_argument("--dp", type=_positive, default=1, help="data-parallel GPUs (training)")
    parser.add_argument(
        "--grad-accum", type=_positive, default=1, help="gradient accumulation steps"
    )
    parser.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    parser.set_defaults(handler=_run)


def _positive(text: str) -> int:
    """A count flag: refused with its name by argparse before anything is printed."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


# the serving plan's settings, named and meant as the scenario's serving fields
_SERVING_FLAGS = {
    "--gpu-memory-utilization": float,
    "--max-num-batched-tokens": int,
    "--max-num-seqs": int,
    "--max-model-len": int,
}


def _serving(
    args: argparse.Namespace, gpu: AcceleratorSpec, context: int
) -> tuple[ServingSection, tuple[str, ...]]:
    """The serving section `run` would plan with: the flags given, the scenario's defaults
    (vLLM's for this GPU) for the rest, and the lines saying what was defaulted."""
    given = {
        name: value
        for name in (flag.removeprefix("--").replace("-", "_") for flag in _SERVING_FLAGS)
        if (value := getattr(args, name)) is not None
    }
    try:
        serving = ServingSection(**given)
    except ValidationError as exc:
        raise InfersimError(
            "; ".join(
                f"--{str(error['loc'][0]).replace('_', '-')} {error['input']!r}: {error['msg']}"
                for error in exc.errors()
            )
        ) from None
    return serving.with_vllm_defaults(gpu, serving.max_model_len or context)


def _check_seq(arch: ModelArchitecture, seq: int) -> None:
    """vLLM serves no sequence longer than the model's context: its ModelConfig
    (_get_and_verify_max_len) refuses a max_model_len above it at start-up, unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (not modelled); so sizing memory for one is refused."""
    context = arch.max_position_embeddings
    if seq > context:
        raise InfersimError(
            f"--seq {seq} is above {arch.name}'s context of {context} tokens "
            "(max_position_embeddings): vLLM serves no sequence that long (it refuses a "
            f"max_model_len above the context at start-up); give --seq at most {context}"
        )


def _tp_refusal(tp: int, node: NodeSpec, field: str) -> str:
    """Why `run` would refuse a tensor-parallel group of `tp` on the node it picks for the
    GPU (check_tp_on_node), or ''."""
    try:
        check_tp_on_node(tp, node, field)
    except InfeasibleError as exc:
        return f"{exc} (the node `run` picks for this GPU without hardware.node)"
    return ""


def _gpus_needed(arch: ModelArchitecture, est: InferenceEstimate, refused: str) -> str:
    """The GPU count, and why no single tensor-parallel group of it runs where that is so:
    more than the heads split over, or more than the node holds."""
    if not est.tp_holds:
        return (
            f"  GPUs needed: {est.gpus} by memory ({est.total / GB:,.2f} GB), more than the "
            f"largest tensor-parallel size {arch.name} splits over, tp={est.tp} "
            f"({arch.num_attention_heads} attention heads, {arch.num_kv_heads} KV heads): "
            "add pipeline stages (a scenario's parallelism.pp, tp x pp GPUs) or lower "
            "--batch / --seq"
        )
    rounded = f" ({est.gpus} by memory, rounded up to a valid tp)" if est.tp != est.gpus else ""
    line = f"  GPUs needed: {est.tp}{rounded}"
    return f"{line}\n  and `infersim run` refuses that layout: {refused}" if refused else line


def _start_refusal(
    arch: ModelArchitecture, serving: ServingSection, max_model_len: int, budget_default: bool
) -> str:
    """Why vLLM would refuse these settings before planning memory, as `run` refuses them
    (ModelConfig's context check, SchedulerConfig.verify_max_model_len) but naming the
    flags to change; '' when it starts.
    `budget_default`: --max-num-batched-tokens was not given (vLLM's default was taken)."""
    try:
        check_serving_starts(
            arch, serving, max_model_len, budget_default=budget_default, names=ESTIMATE_SETTINGS
        )
    except InfeasibleError as exc:
        return str(exc)
    return ""


def _capacity(gpu: AcceleratorSpec) -> str:
    """A GPU's memory in GB (1e9 bytes, as every size here): the GiB it is sold as, and
    the share of it CUDA reports, which the detailed estimates and the plan budget from."""
    return (
        f"{gpu.memory_bytes / GB:.2f} GB = {gpu.memory.capacity_gb:g} GiB on the datasheet, "
        f"{gpu.cuda_memory_bytes / GB:.2f} GB of it visible to CUDA"
    )


def _rows(rows: list[tuple[str, float]]) -> str:
    return "\n".join(f"  {item:<28}{gb:>10.2f} GB" for item, gb in rows)


def _run(args: argparse.Namespace) -> int:
    arch = load_model(args.model)
    gpu = load_gpu(args.gpu)
    # The weight format as `run` reads model.weight_dtype: unset, the checkpoint's; nvfp4
    # stays nvfp4 (its own scales, its own kernels), and one vLLM has no kernel for on this
    # GPU is refused.
    precision = weight_format(resolve_weight_dtype(args.precision, arch))
    check_weight_support(gpu, precision, "--precision")
    asked = VLLM_KV_DTYPES.get(args.kv_dtype, args.kv_dtype)
    kv_dtype = parse_dtype(asked or ("fp16" if precision == "fp16" else "bf16"))
    context = arch.max_position_embeddings
    serving, defaults = _serving(args, gpu, context)
    if forced := mla_block_size(arch, gpu, serving.block_size):  # as `run` resolves it
        serving = serving.model_copy(update={"block_size": forced.size})
        defaults = (forced.default_line, *defaults)
    params_b = arch.param_count() / 1e9
    # Every estimate before the first line of output, so bad input is an error alone.
    if args.training:
        est = detailed_training(
            arch,
            gpu,
            dp=args.dp,
            zero_stage=args.zero,
            micro_batch=args.batch,
            seq_len=args.seq,
            grad_accum_steps=args.grad_accum,
            activation_checkpointing=args.checkpointing,
            flash_attention=not args.no_flash,
        )
    else:
        _check_seq(arch, args.seq)
        est = detailed_inference(
            arch,
            gpu,
            weight_dtype=precision,
            kv_dtype=kv_dtype,
            batch=args.batch,
            seq_len=args.seq,
            flash_attention=not args.no_flash,
            gpu_memory_utilization=serving.gpu_memory_utilization,
        )
    quick_inf = quick_inference_gpus(arch, gpu, precision)
    quick_train = quick_training_gpus(arch, gpu, precision)
    print(f"{arch.display_name} ({params_b:.2f} B parameters) on {gpu.display_name}")
    print(f"  (each {_capacity(gpu)}), {precision} weights")
    print("\nQuick sizing (weights only):")
    print(f"  inference: {quick_inf} GPUs  = ceil({params_b:.1f} B x bytes/param / GPU memory)")
    print(
        f"  training:  {quick_train} GPUs  = x{TRAINING_MULTIPLIER} (optimizer 2x, gradients 1x, "
        "activations 1x, buffers 2x)"
    )
    if args.training:
        print(
            f"\nDetailed training, mixed precision, ZeRO-{args.zero} over dp={args.dp}, "
            f"micro-batch {args.batch} x {args.seq} tokens:"
        )
        print(_rows(est.breakdown()))
        verdict = "fits" if est.fits else "does NOT fit"
        print(
            f"  {verdict} in the {est.capacity_per_gpu / GB:.2f} GB CUDA sees; "
            f"effective batch {est.effective_batch}"
        )
        if est.min_dp_zero3:
            print(f"  ZeRO-3 fits from dp={est.min_dp_zero3}")
        return 0
    print(f"\nDetailed inference, batch {args.batch} x {args.seq} tokens, {kv_dtype.value} KV:")
    print(_rows(est.breakdown()))
    node = default_node(gpu)
    refused = _tp_refusal(est.tp, node, "tp")
    print(_gpus_needed(arch, est, refused))
    tp = args.tp or est.tp  # the plan at the tp just recommended, unless one is asked for
    if args.tp:
        chosen, refused = "--tp", _tp_refusal(tp, node, "--tp")
    else:
        chosen = "the GPUs needed" if est.tp_holds else "the largest valid tp"
    if refused:
        shown = f": {refused}" if args.tp else " (above)"
        print(f"\nServing plan: none, `infersim run` refuses tp={tp}{shown}")
        return 0
    print(f"\nServing plan at tp={tp} ({chosen}; vLLM-style memory budget):")
    for line in defaults:
        print(f"  default {line}")
    max_len = serving.max_model_len or context
    refusal = _start_refusal(arch, serving, max_len, args.max_num_batched_tokens is None)
    if refusal:
        print(f"  vLLM would not start: {refusal}")
        return 0
    try:
        plan = plan_memory(
            arch,
            gpu,
            weight_dtype=precision,
            kv_dtype=kv_dtype,
            tp=tp,
            gpu_memory_utilization=serving.gpu_memory_utilization,
            max_num_batched_tokens=serving.max_num_batched_tokens,
            max_num_seqs=serving.max_num_seqs,
            kv_groups=vllm_default_groups(arch, serving.block_size),
            max_model_len=max_len,
            block_size=serving.block_size,
        )
    except DoesNotFit as exc:
        print(f"  {exc.named(ESTIMATE_SETTINGS)}")
        return 0
    except InfeasibleError as exc:
        print(f"  {exc}")
        return 0
    print(plan.table())
    refusal = plan.refusal(ESTIMATE_SETTINGS)
    if refusal:
        print(f"  vLLM would not start: {refusal}")
    if plan.kv_groups is None:  # as vLLM's "Maximum concurrency for N tokens per request"
        print(f"  {'sequences of max_model_len':<28}{plan.kv_capacity_tokens / max_len:>10.2f}")
    return 0
