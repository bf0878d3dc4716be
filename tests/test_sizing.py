import pytest

from hardware_models.presets import load_gpu
from simulator.memory_planner import framework_overhead_bytes, plan_memory
from simulator.model_catalog import load_model
from simulator.sizing import (
    detailed_inference,
    detailed_training,
    quick_inference_gpus,
    quick_training_gpus,
)


@pytest.fixture(scope="module")
def h100():
    return load_gpu("h100-sxm")


def test_quick_estimates_for_llama_2_70b_fp16(h100):
    arch = load_model("llama-2-70b")
    assert quick_inference_gpus(arch, h100, "fp16") == 2
    assert quick_training_gpus(arch, h100, "fp16") == 11


def test_zero_stages_reduce_per_gpu_memory(h100):
    arch = load_model("llama-2-7b")
    per_gpu = [
        detailed_training(arch, h100, dp=8, zero_stage=stage, micro_batch=1, seq_len=2048).per_gpu
        for stage in (0, 1, 2, 3)
    ]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert len(set(per_gpu)) == 4


def test_zero_stage_0_holds_16_bytes_per_param(h100):
    arch = load_model("llama-2-7b")
    est = detailed_training(arch, h100, dp=4, zero_stage=0)
    states = est.weights + est.gradients + est.optimizer_states
    assert states == pytest.approx(16 * arch.param_count())
    assert not est.fits


def test_min_dp_zero3_fits(h100):
    arch = load_model("llama-2-70b")
    est = detailed_training(arch, h100, dp=1, zero_stage=3, activation_checkpointing=True)
    assert est.min_dp_zero3 is not None
    fits = detailed_training(
        arch, h100, dp=est.min_dp_zero3, zero_stage=3, activation_checkpointing=True
    )
    assert fits.fits
    below = detailed_training(
        arch, h100, dp=est.min_dp_zero3 - 1, zero_stage=3, activation_checkpointing=True
    )
    assert not below.fits


def test_grad_accum_changes_batch_not_memory(h100):
    arch = load_model("llama-2-7b")
    one = detailed_training(arch, h100, dp=8, zero_stage=3, micro_batch=2, grad_accum_steps=1)
    four = detailed_training(arch, h100, dp=8, zero_stage=3, micro_batch=2, grad_accum_steps=4)
    assert one.per_gpu == four.per_gpu
    assert four.effective_batch == 2 * 4 * 8


def test_checkpointing_cuts_activations(h100):
    arch = load_model("llama-2-7b")
    plain = detailed_training(arch, h100, seq_len=4096)
    ckpt = detailed_training(arch, h100, seq_len=4096, activation_checkpointing=True)
    assert ckpt.activations < plain.activations / 5


def test_kv_grows_linearly_with_batch(h100):
    arch = load_model("llama-3.1-8b")
    kv = [detailed_inference(arch, h100, batch=b, seq_len=4096).kv_cache for b in (1, 2, 8)]
    assert kv[1] == 2 * kv[0]
    assert kv[2] == 8 * kv[0]
    assert kv[0] == 4096 * 131072


def test_non_flash_attention_is_quadratic_in_seq(h100):
    arch = load_model("llama-2-7b")
    short = detailed_inference(arch, h100, seq_len=2048, flash_attention=False)
    long = detailed_inference(arch, h100, seq_len=4096, flash_attention=False)
    assert long.attention_scores == 4 * short.attention_scores
    flash = detailed_inference(arch, h100, seq_len=4096, flash_attention=True)
    assert flash.attention_scores == 0
    assert long.gpus >= flash.gpus


def test_inference_gpu_count(h100):
    arch = load_model("llama-2-70b")
    est = detailed_inference(arch, h100, batch=1, seq_len=4096)
    assert est.gpus == 2
    big = detailed_inference(arch, h100, batch=64, seq_len=4096)
    assert big.gpus > est.gpus
    assert big.breakdown()[-1][0] == "total"


def test_detailed_estimates_budget_as_the_serving_plan(h100):
    """The memory CUDA reports, less the modelled non-torch memory (at the tp the count
    rounds to), as plan_memory charges it: not the datasheet, not a flat 1.5 GB."""
    inference = detailed_inference(load_model("llama-3.1-70b"), h100)
    assert inference.tp == 2
    assert inference.framework_overhead == framework_overhead_bytes(h100, 2)
    assert inference.usable_per_gpu == pytest.approx(0.9 * h100.cuda_memory_bytes)
    training = detailed_training(load_model("llama-3.1-8b"), h100)
    assert training.capacity_per_gpu == h100.cuda_memory_bytes
    assert training.framework_overhead == framework_overhead_bytes(h100, 1)


@pytest.mark.parametrize("model", ["gpt-oss-120b", "llama-3.1-8b"])
@pytest.mark.parametrize("gpu", ["h100-sxm", "b200"])
def test_detailed_weights_are_the_serving_plans(model, gpu):
    """One rule for both sections of `infersim estimate`: gpt-oss's MXFP4 experts are
    padded for the kernel of the GPU (70.75 GB on an H100, not 65.25) in each."""
    arch, spec = load_model(model), load_gpu(gpu)
    dtype = "mxfp4" if model.startswith("gpt-oss") else "bf16"
    inference = detailed_inference(arch, spec, weight_dtype=dtype)
    plan = plan_memory(arch, spec, weight_dtype=dtype, max_num_seqs=1, max_num_batched_tokens=2048)
    assert inference.weights == plan.weights
