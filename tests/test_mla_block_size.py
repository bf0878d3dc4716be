"""An MLA model on CUDA runs at the KV block size vLLM forces for its attention backend
(CudaPlatformBase.check_and_update_config): 64 for FlashMLA on Hopper, 64 (or 32) for
FlashInfer MLA and a multiple of 128 for CUTLASS MLA on datacenter Blackwell; the header
says it where the block size was vLLM's default 16, the run warns where it was another."""

from __future__ import annotations

import warnings

import pytest

from hardware_models.errors import InfersimWarning
from hardware_models.presets import load_gpu
from simulator.build import ReplicaBuild, build_replica
from simulator.caveats import mla_block_size
from simulator.cli.main import main
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from tests.conftest import scenario_dict


def _deepseek_on_h200(**serving) -> tuple[ReplicaBuild, list[str]]:
    scenario = Scenario.from_dict(
        scenario_dict(
            hardware={"gpu": "h200-sxm"},
            model={"name": "deepseek-v3", "weight_dtype": "fp8_block"},
            parallelism={"tp": 8},
            serving={"max_num_batched_tokens": 4096, "max_model_len": 8192, **serving},
        )
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build = build_replica(scenario)
    said = [str(w.message) for w in caught if issubclass(w.category, InfersimWarning)]
    return build, [text for text in said if "block_size" in text]


def test_deepseek_on_hopper_runs_at_flashmlas_64_said_in_the_header():
    build, warned = _deepseek_on_h200()
    assert build.config.block_size == 64 and not warned
    line = "serving.block_size = 64 (vLLM forces it for FlashMLA, deepseek-v3's MLA attention"
    assert f"{line} on h200-sxm)" in build.defaults


def test_a_block_size_flashmla_cannot_read_is_replaced_and_warned():
    build, warned = _deepseek_on_h200(block_size=32)
    assert build.config.block_size == 64
    assert len(warned) == 1 and "serving.block_size=32: vLLM forces it for FlashMLA" in warned[0]
    assert "the run uses 64" in warned[0]
    kept, warned = _deepseek_on_h200(block_size=128)  # a multiple of 64: vLLM keeps it
    assert kept.config.block_size == 128 and not warned
    assert not [line for line in kept.defaults if "block_size" in line]


@pytest.mark.parametrize(
    ("gpu", "qk_nope", "block_size", "forced"),
    [
        ("h100-sxm", 128, 16, (64, "FlashMLA")),
        ("h100-sxm", 128, 256, None),
        ("b200", 128, 16, (64, "FlashInfer MLA")),
        ("b200", 128, 32, None),  # FlashInfer MLA takes 32 too
        ("b200", 64, 16, (128, "CUTLASS MLA")),  # FlashInfer MLA's kernel needs 128-wide heads
        ("b200", 64, 64, (128, "CUTLASS MLA")),
        ("a100-80gb-sxm", 128, 16, None),  # Triton MLA: the block is kept
        ("rtx-pro-6000", 128, 16, None),  # Blackwell 12.x is not capability family 100
        ("mi300x", 128, 16, None),  # ROCm: not the CUDA platform's rule
    ],
)
def test_the_forced_block_size_follows_vllms_backend_choice_by_gpu(
    gpu, qk_nope, block_size, forced
):
    arch = load_model("deepseek-v3").model_copy(update={"qk_nope_head_dim": qk_nope})
    got = mla_block_size(arch, load_gpu(gpu), block_size)
    assert (got if got is None else (got.size, got.backend)) == forced


def test_a_model_without_mla_keeps_its_block_size():
    assert mla_block_size(load_model("llama-3.1-8b"), load_gpu("h100-sxm"), 16) is None


def test_estimate_plans_deepseek_at_the_forced_block_size_as_run_does(capsys):
    main(["estimate", "--model", "deepseek-v3", "--gpu", "h200-sxm", "--tp", "8"])
    out = capsys.readouterr().out
    assert "default serving.block_size = 64 (vLLM forces it for FlashMLA" in out
