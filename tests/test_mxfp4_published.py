"""gpt-oss's MXFP4 experts on Hopper and Blackwell against published measurements
(benchmarks/README.md, "gpt-oss MXFP4 backends"): the widening rate comes from one
B200 kernel time; the rest of that layer and three vLLM runs on Hopper check it."""

from __future__ import annotations

import importlib.util
import warnings

import pytest

import simulator as sim
from hardware_models.efficiency import MOE_FORMATS
from hardware_models.moe import MoeLayer, MoeShape, upcast_s
from hardware_models.presets import load_gpu
from simulator.build import build_replica
from simulator.caveats import configuration_warnings
from simulator.scenario import Scenario

# A third-party write-up (TRT-LLM's castBfloat16 W4A16 MoE, gpt-oss-120b, one B200, 128
# decoding sequences): gate|up 711.8 us a layer, 38.89 ms a step over 36 layers.
B200_GATE_UP_S = 711.8e-6
B200_LAYER_S = 38.89e-3 / 36


def test_b200_gate_up_reproduces_the_kernel_time_the_rate_was_taken_from():
    b200 = load_gpu("b200")
    active = 128 * (1 - (1 - 1 / 128) ** (128 * 4))  # balanced routing, one tile each
    assert upcast_s(b200, active, 2 * 2880, 2880) == pytest.approx(B200_GATE_UP_S, rel=0.01)


def test_b200_whole_layer_matches_the_published_step():
    """The down projection and the rest of the layer were not fitted: within 3%."""
    layer = MoeLayer(
        load_gpu("b200"), MoeShape(2880, 2880, 4, 128, moe_format="w4a16_mxfp4_trtllm")
    )
    assert layer.cost(128).seconds == pytest.approx(B200_LAYER_S, rel=0.03)


def test_matmul_ogs_runs_seven_kernels_a_layer():
    """_topk_forward, _sum_bitmatrix_rows, _combined_routing_memset,
    _combined_routing_compute, gate|up, down, _reduce_grouped."""
    h100 = load_gpu("h100-sxm")
    assert MoeLayer(h100, MoeShape(2880, 2880, 4, 32, moe_format="w4a16_mxfp4_triton")).kernels == 7
    assert MOE_FORMATS["w4a16_mxfp4_trtllm"].kernels == 4


def _run(path: str, sets: list[str] | None = None) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sim.simulate(Scenario.from_yaml(path, sets or []), progress=False).summary()


@pytest.mark.parametrize(
    ("scenario", "measured"),
    [
        ("benchmarks/gpt_oss_120b_h200_tp8_c8.yaml", 1947.66),  # vllm#30326
        ("benchmarks/gpt_oss_120b_h200_tp8_c128.yaml", 12781.05),
    ],
)
def test_h200_tp8_output_throughput_within_5_percent_of_vllm_30326(scenario, measured):
    out = _run(scenario)["throughput"]["output_tokens_per_s"]
    assert out == pytest.approx(measured, rel=0.05)


def test_b200_one_user_within_20_percent_of_sglang_9004():
    """gpt-oss-20b, tp 1, one user, 512 in and 1,024 out, bf16-activation MXFP4 MoE:
    364 output tok/s measured (SGLang, another engine)."""
    sets = [
        "hardware.gpu=b200",
        "model.name=gpt-oss-20b",
        "parallelism.tp=1",
        "workload.arrivals.users=1",
        "workload.prompt_tokens.tokens=512",
        "workload.output_tokens.tokens=1024",
        "workload.num_requests=10",
        "serving.max_model_len=4096",
    ]
    out = _run("benchmarks/gpt_oss_120b_h200_tp8_c8.yaml", sets)["throughput"]
    assert out["output_tokens_per_s"] == pytest.approx(364, rel=0.20)


@pytest.mark.parametrize(("marlin", "measured_s"), [("false", 1.58), ("true", 1.17)])
def test_h100_bench_latency_batch_within_10_percent_of_vllm_27523(marlin, measured_s):
    """The same batch with matmul_ogs (the default) and with Marlin experts."""
    sets = [f"model.mxfp4_use_marlin={marlin}"]
    e2e = _run("benchmarks/gpt_oss_120b_h100_latency_bs8.yaml", sets)["latency"]["e2e"]["max"]
    assert e2e == pytest.approx(measured_s, rel=0.10)


def _caveats(gpu: str, *extra: str) -> list[str]:
    sets = [f"hardware.gpu={gpu}", "model.name=gpt-oss-20b", "model.weight_dtype=fp4", *extra]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build = build_replica(Scenario.from_yaml("scenarios/quickstart.yaml", sets))
    return [w for w in configuration_warnings(build) if "MXFP4 experts on" in w]


def test_a_run_says_how_little_checks_its_mxfp4_experts_price():
    """matmul_ogs (Hopper) and FlashInfer's TRT-LLM MoE (B200) say what their price was
    checked against; Marlin, validated on the L40S table, says nothing."""
    (hopper,) = _caveats("h100-sxm")
    assert "TRITON" in hopper and "vllm#30326" in hopper and "vllm#27523" in hopper
    (blackwell,) = _caveats("b200")
    assert "FLASHINFER_TRTLLM_MXFP4_BF16" in blackwell and "711.8 us" in blackwell
    assert _caveats("l40s") == []
    assert _caveats("h100-sxm", "model.mxfp4_use_marlin=true") == []


@pytest.mark.parametrize(("seqs", "context"), [(8, 1536), (128, 1536)])
def test_the_step_decomposition_adds_up_to_the_engines_price(seqs, context):
    """benchmarks/decode_step_parts.py's parts sum to StepCostModel.step's price, so the
    README's part-by-part comparison stays the engine's."""
    spec = importlib.util.spec_from_file_location("parts", "benchmarks/decode_step_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scenario = f"benchmarks/gpt_oss_120b_h200_tp8_c{seqs}.yaml"
    rows, step = module.parts(scenario, seqs, context)
    total = sum(seconds * calls for _, seconds, calls, _ in rows)
    assert total == pytest.approx(step.seconds, rel=1e-9)
