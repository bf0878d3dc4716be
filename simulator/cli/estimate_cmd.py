"""`infersim estimate`: how many GPUs a model needs, the quick way and the detailed way."""

from __future__ import annotations

import argparse
import typing

from hardware_models.accelerator import AcceleratorSpec
from hardware_models.dtypes import parse_dtype
from hardware_models.errors import InfeasibleError
from hardware_models.presets import load_gpu
from simulator.engine.kv_groups import vllm_default_groups
from simulator.engine.weight_format import check_weight_support, weight_format
from simulator.memory_planner import GB, plan_memory
from simulator.model_catalog import load_model
from simulator.scenario import KvDType, ServingSection
from simulator.sizing import (
    TRAINING_MULTIPLIER,
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
        default="bf16",
        help="weight dtype or format, as model.weight_dtype (fp16, bf16, fp8, fp8_block, nvfp4, "
        "mxfp4, ...)",
    )
    parser.add_argument(
        "--kv-dtype",
        choices=typing.get_args(KvDType),
        help="KV-cache dtype, as vLLM's --kv-cache-dtype (default: the model's dtype, as "
        "vLLM's auto: fp16 with fp16 weights, else bf16; quantised weights keep a bf16 KV "
        "cache)",
    )
    parser.add_argument(
        "--max-model-len",
        type=_positive,
        help="longest prompt + output the serving plan must hold one of (default: the "
        "model's context), as serving.max_model_len",
    )
    parser.add_argument("--batch", type=_positive, default=1, help="sequences in flight")
    parser.add_argument("--seq", type=_positive, default=2048, help="tokens per sequence")
    parser.add_argument(
        "--tp", type=_positive, help="tensor-parallel degree to plan (default: the GPUs needed)"
    )
    parser.add_argument("--no-flash", action="store_true", help="materialise attention scores")
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


def _capacity(gpu: AcceleratorSpec) -> str:
    """A GPU's memory in GB (1e9 bytes, as every size here) and in the GiB it is sold as."""
    return f"{gpu.memory_bytes / GB:.2f} GB = {gpu.memory.capacity_gb:g} GiB"


def _rows(rows: list[tuple[str, float]]) -> str:
    return "\n".join(f"  {item:<28}{gb:>10.2f} GB" for item, gb in rows)


def _run(args: argparse.Namespace) -> int:
    arch = load_model(args.model)
    gpu = load_gpu(args.gpu)
    # The weight format as `run` reads model.weight_dtype: nvfp4 stays nvfp4 (its own
    # scales, its own kernels), and one vLLM has no kernel for on this GPU is refused.
    precision = weight_format(args.precision)
    check_weight_support(gpu, precision, "--precision")
    kv_dtype = parse_dtype(args.kv_dtype or ("fp16" if precision == "fp16" else "bf16"))
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
        est = detailed_inference(
            arch,
            gpu,
            weight_dtype=precision,
            kv_dtype=kv_dtype,
            batch=args.batch,
            seq_len=args.seq,
            flash_attention=not args.no_flash,
        )
    quick_inf = quick_inference_gpus(arch, gpu, precision)
    quick_train = quick_training_gpus(arch, gpu, precision)
    print(f"{arch.display_name} ({params_b:.2f} B parameters) on {gpu.display_name}")
    print(f"  ({_capacity(gpu)} each), {precision} weights")
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
        print(f"  {verdict} in {_capacity(gpu)}; effective batch {est.effective_batch}")
        if est.min_dp_zero3:
            print(f"  ZeRO-3 fits from dp={est.min_dp_zero3}")
        return 0
    print(f"\nDetailed inference, batch {args.batch} x {args.seq} tokens, {kv_dtype.value} KV:")
    print(_rows(est.breakdown()))
    rounded = f" ({est.gpus} by memory, rounded up to a valid tp)" if est.tp != est.gpus else ""
    print(f"  GPUs needed: {est.tp}{rounded}")
    tp = args.tp or est.tp  # the plan at the tp just recommended, unless one is asked for
    chosen = "--tp" if args.tp else "the GPUs needed"
    print(f"\nServing plan at tp={tp} ({chosen}; vLLM-style memory budget):")
    block_size = ServingSection.model_fields["block_size"].default
    try:
        plan = plan_memory(
            arch,
            gpu,
            weight_dtype=precision,
            kv_dtype=kv_dtype,
            tp=tp,
            kv_groups=vllm_default_groups(arch, block_size),
            max_model_len=args.max_model_len or arch.max_position_embeddings,
            block_size=block_size,
        )
    except InfeasibleError as exc:
        print(f"  {exc}")
        return 0
    print(plan.table())
    refusal = plan.refusal("--max-model-len")
    if refusal:
        print(f"  vLLM would not start: {refusal}")
    return 0
