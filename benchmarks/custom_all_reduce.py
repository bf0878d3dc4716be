"""vLLM's custom and symmetric-memory all-reduce kernels, priced against the timings vLLM
published for them on H100s (hidden size 8192, bf16, one op's time in microseconds), and
the fit of the one constant no microbenchmark gives (the two-shot kernel's fence).

    python benchmarks/custom_all_reduce.py          # the kernels against vLLM's tables
    python benchmarks/custom_all_reduce.py --step   # a Llama-3.1-70B TP8 H100 decode step
    python benchmarks/custom_all_reduce.py --pcie   # a Llama-3.1-8B TP2 decode step on two
                                                    # L40S switch neighbours (peer access)

Sources (the PR descriptions' tables, `benchmarks/kernels/benchmark_device_communicators.py`):
vllm-project/vllm#24532 (TP4: ca_1stage, ca_2stage, pynccl, symm_mem_multimem,
symm_mem_two_shot) and vllm-project/vllm#24111 (TP6: ca_1stage, ca_2stage, pynccl,
symm_mem_multimem). The model is priced as a CUDA graph replays it (registered buffers,
the profile's per-kernel graph launch added), with the shipped h100-sxm profile.
"""

from __future__ import annotations

import argparse
import statistics

from hardware_models import custom_all_reduce as car
from hardware_models.calibration_lookup import choose_calibration
from hardware_models.custom_all_reduce import AllReducePath, TpAllReduce
from hardware_models.presets import load_gpu, load_node, with_calibration
from simulator.engine.step_cost import StepCostModel
from simulator.model_catalog import load_model

ROW = 8192 * 2  # one token of hidden size 8192 in bf16
ROWS = (32, 64, 96, 128, 192, 256)
PUBLISHED_US = {
    (4, AllReducePath.CUSTOM_ONE_SHOT): (10, 14, 19, 23, 30, 38),
    (4, AllReducePath.CUSTOM_TWO_SHOT): (17, 18, 25, 26, 35, 42),
    (4, AllReducePath.SYMM_MEM_MULTIMEM): (15, 18, 21, 23, 28),
    (4, AllReducePath.SYMM_MEM_TWO_SHOT): (16, 19, 19, 23, 25),
    (4, AllReducePath.NCCL): (21, 23, 25, 28, 33, 39),
    (6, AllReducePath.CUSTOM_ONE_SHOT): (13, 21, 30, 38, 53, 70),
    (6, AllReducePath.CUSTOM_TWO_SHOT): (15, 17, 20, 26, 29, 37),
    (6, AllReducePath.SYMM_MEM_MULTIMEM): (13, 16, 18, 21, 25, 31),
    (6, AllReducePath.NCCL): (23, 25, 32, 43, 47, 53),
}


def priced_us(gpus: int, path: AllReducePath, rows: int) -> float:
    """The model's microseconds for one op as a graph replays it."""
    gpu = with_calibration(load_gpu("h100-sxm"), "h100-sxm")
    node = load_node("dgx-h100")
    nccl_link = gpu.efficiency.link_for(gpus, node.intra_node_link)
    plan = TpAllReduce.plan(gpu, node, gpus, nccl_link)
    cost = plan.cost(rows * ROW, path)
    return (cost.seconds + cost.kernels * gpu.efficiency.launch_overhead_graph_us * 1e-6) * 1e6


def decode_steps(gpu_name: str, node_name: str, model: str, tp: int) -> None:
    """Decode-only steps of `model` on `tp` GPUs of `node_name` (2,000 keys a sequence,
    the GPU's shipped profile), all all-reduces on NCCL (as infersim priced them before)
    against vLLM's dispatch, and one all-reduce of the batch's hidden states on each."""
    gpu = choose_calibration(load_gpu(gpu_name)).gpu
    node, arch = load_node(node_name), load_model(model)
    vllm = StepCostModel(arch, gpu, node, tp=tp)
    nccl = StepCostModel(arch, gpu, node, tp=tp, custom_all_reduce=False, symm_mem_all_reduce=False)
    print(vllm.all_reduce_note())
    print(
        f"{'batch':>5} {'NCCL only ms':>12} {'vLLM ms':>8} {'change':>7} "
        f"{'NCCL us':>8} {'vLLM us':>8}  all-reduce backend"
    )
    for batch in (1, 8, 16, 32, 64, 128, 256):
        before = nccl.decode_steps(batch).one(batch * 2000).gpu_seconds
        after = vllm.decode_steps(batch).one(batch * 2000).gpu_seconds
        nbytes = batch * arch.hidden_size * 2
        ops = (nccl.tp_all_reduce.cost(nbytes), vllm.tp_all_reduce.cost(nbytes))
        change = 100 * (after - before) / before
        print(
            f"{batch:>5} {before * 1e3:>12.3f} {after * 1e3:>8.3f} {change:>+6.1f}% "
            f"{ops[0].seconds * 1e6:>8.2f} {ops[1].seconds * 1e6:>8.2f}  "
            f"{vllm.tp_all_reduce.path(nbytes).value}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    figure = parser.add_mutually_exclusive_group()
    figure.add_argument("--step", action="store_true", help="the TP8 H100 decode step instead")
    figure.add_argument("--pcie", action="store_true", help="the TP2 L40S decode step instead")
    args = parser.parse_args()
    if args.step:
        decode_steps("h100-sxm", "dgx-h100", "llama-3.1-70b", 8)
        return
    if args.pcie:
        decode_steps("l40s", "l40s-8x-pcie", "llama-3.1-8b", 2)
        return
    residuals = []
    print(f"{'tp':>3} {'kernel':<18} {'MiB':>5} {'published':>9} {'model':>7} {'error':>7}")
    errors: dict[AllReducePath, list[float]] = {}
    for (gpus, path), published in PUBLISHED_US.items():
        for rows, us in zip(ROWS, published, strict=False):
            model = priced_us(gpus, path, rows)
            if path == AllReducePath.CUSTOM_TWO_SHOT:
                residuals.append(us - (model - car.TWO_SHOT_FENCE_US))
            errors.setdefault(path, []).append(abs(model - us) / us)
            print(
                f"{gpus:>3} {path.value:<18} {rows * ROW / 2**20:>5.1f} {us:>9.0f} "
                f"{model:>7.1f} {100 * (model - us) / us:>+6.1f}%"
            )
    print()
    for path, errs in errors.items():
        print(f"{path.value:<18} MAPE {100 * statistics.mean(errs):5.1f}% over {len(errs)} rows")
    print(
        f"two-shot fence: median residual {statistics.median(residuals):.1f} us over "
        f"{len(residuals)} rows (TWO_SHOT_FENCE_US = {car.TWO_SHOT_FENCE_US})"
    )


if __name__ == "__main__":
    main()
