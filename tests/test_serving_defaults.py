"""Unset batch limits are what `vllm serve` would choose for the GPU (EngineArgs
.get_batch_defaults of the emulated release), said in the summary; set ones are kept; the
memory plan sizes the profile run's logits by max_num_seqs; `estimate` plans as `run`."""

from __future__ import annotations

import re

import pytest

from hardware_models.presets import load_gpu
from simulator import simulate
from simulator.build import batch_limits_of, build_replica
from simulator.cli.main import main
from simulator.memory_planner import activation_bytes, plan_memory
from simulator.model_catalog import load_model
from simulator.scenario import Scenario
from simulator.vllm_defaults import EMULATED_VLLM_VERSION
from tests.conftest import scenario_dict

EMULATED = ".".join(map(str, EMULATED_VLLM_VERSION))


def _unset(gpu: str, **serving) -> Scenario:
    """The test scenario on `gpu` with neither batch limit set (unless in `serving`);
    prefix caching is set, so only the batch limits take defaults."""
    data = scenario_dict(hardware={"gpu": gpu})
    data["serving"] = {"policy": "chunked_prefill", "enable_prefix_caching": True, **serving}
    return Scenario.from_dict(data)


@pytest.mark.parametrize(
    ("gpu", "seqs", "tokens"),
    [
        ("h100-sxm", 1024, 8192),
        ("h200-sxm", 1024, 8192),
        ("mi300x", 1024, 8192),
        ("a100-80gb-sxm", 256, 2048),  # left out by name from vLLM 0.9.0 (PR #17885)
        ("l40s", 256, 2048),  # under 70 GiB
        ("rtx-4090", 256, 2048),
    ],
)
def test_unset_batch_limits_are_vllm_serves_for_the_gpu(gpu, seqs, tokens):
    build = build_replica(_unset(gpu))
    assert (build.config.max_num_seqs, build.config.max_num_batched_tokens) == (seqs, tokens)
    assert len(build.defaults) == 2
    assert all(f"vLLM {EMULATED} default for `vllm serve`" in line for line in build.defaults)


def test_set_limits_are_kept_and_only_the_unset_one_defaulted():
    build = build_replica(_unset("h100-sxm", max_num_seqs=64))
    assert (build.config.max_num_seqs, build.config.max_num_batched_tokens) == (64, 8192)
    assert [line.split(" = ")[0] for line in build.defaults] == ["serving.max_num_batched_tokens"]
    set_both = build_replica(_unset("h100-sxm", max_num_seqs=64, max_num_batched_tokens=512))
    assert set_both.defaults == ()
    assert set_both.config.max_num_batched_tokens == 512


def test_an_unset_max_num_seqs_is_at_most_the_budget_given():
    """vLLM 0.19's EngineArgs._set_default_max_num_seqs_and_batched_tokens_args bounds
    default sequences by the budget (`--max-num-batched-tokens 512` alone starts with
    512), so what vLLM starts is not refused as a budget below 1024 sequences."""
    build = build_replica(_unset("h100-sxm", max_num_batched_tokens=512))
    assert (build.config.max_num_seqs, build.config.max_num_batched_tokens) == (512, 512)
    (line,) = build.defaults
    assert line.startswith(f"serving.max_num_seqs = 512 (vLLM {EMULATED} default")
    assert "lowered to max_num_batched_tokens = 512 (the max_num_batched_tokens given" in line
    above = build_replica(_unset("h100-sxm", max_num_batched_tokens=4096))
    assert above.config.max_num_seqs == 1024  # the GPU's default, under the budget


def test_an_unset_budget_is_at_most_max_num_seqs_times_max_model_len():
    """EngineArgs bounds a default budget by max_num_seqs * max_model_len (vllm #17853)."""
    build = build_replica(_unset("h100-sxm", max_num_seqs=2, max_model_len=1024))
    assert build.config.max_num_batched_tokens == 2048
    assert "lowered to max_num_seqs * max_model_len = 2 * 1024" in build.defaults[0]


def test_static_and_dynamic_batches_do_not_take_vllms_defaults():
    """Not vLLM's scheduler: infersim's own 256 sequences and 2048 tokens on any GPU; the
    budget only sizes the memory plan's profile run (their batches have no token budget),
    so neither the header nor the resolved scenario announces a default for it."""
    for policy in ("static", "dynamic"):
        build = build_replica(_unset("h100-sxm", policy=policy))
        assert (build.config.max_num_seqs, build.config.max_num_batched_tokens) == (256, 2048)
        (line,) = build.defaults
        assert line.startswith("serving.max_num_seqs = 256") and f"the {policy} policy's" in line
        scenario = _unset("h100-sxm", policy=policy).with_overrides(["workload.num_requests=5"])
        summary = simulate(scenario, progress=False).summary()
        serving = summary["provenance"]["scenario"]["serving"]
        assert (serving["max_num_seqs"], serving["max_num_batched_tokens"]) == (256, None)
        assert not any(
            "max_num_batched_tokens" in d for d in summary["run"]["configuration"]["defaults"]
        )
        assert batch_limits_of(scenario) == {"max_num_seqs": 256, "max_num_batched_tokens": None}


def test_the_gpu_size_the_defaults_read_is_what_cuda_reports():
    """vLLM's 70 GiB rule reads the memory CUDA reports (79.22 GiB on an H100 SXM), not
    the 80 GB it is sold as; the header says which figure it took."""
    build = build_replica(_unset("h100-sxm"))
    visible = load_gpu("h100-sxm").cuda_memory_bytes / 2**30
    assert visible < 80
    assert all(f"{visible:.2f} GiB as CUDA reports it, at least 70" in d for d in build.defaults)


def test_the_continuous_policy_defaults_its_budget_to_at_least_max_model_len():
    """Chunked prefill off: vLLM's EngineArgs takes max(max_model_len, the default)."""
    small = build_replica(_unset("rtx-4090", policy="continuous", max_model_len=4096))
    assert small.config.max_num_batched_tokens == 4096
    big = build_replica(_unset("h100-sxm", policy="continuous", max_model_len=4096))
    assert big.config.max_num_batched_tokens == 8192


def test_the_summary_records_what_each_default_became():
    data = scenario_dict(hardware={"gpu": "h100-sxm"})
    data["serving"] = {"policy": "chunked_prefill", "max_num_seqs": 32}
    data["workload"]["num_requests"] = 20
    summary = simulate(Scenario.from_dict(data)).summary()
    origin = summary["provenance"]
    assert origin["scenario"]["serving"]["max_num_batched_tokens"] == 8192
    assert origin["scenario"]["serving"]["max_num_seqs"] == 32
    assert origin["scenario"]["serving"]["enable_prefix_caching"] is True
    assert len(origin["defaults"]) == 2
    assert origin["defaults"][0].startswith("serving.max_num_batched_tokens = 8192 (vLLM")
    assert origin["defaults"][1].startswith("serving.enable_prefix_caching = True (vLLM")
    header = summary["run"]["configuration"]
    assert header["defaults"] == origin["defaults"]


def test_the_logits_of_the_profile_run_are_max_num_seqs_wide():
    """vLLM's profile run samples one position per request (min(tokens, max_num_seqs)), so
    the planner's activations follow serving.max_num_seqs, not a fixed 256: Llama-3.1's
    128k vocabulary over 1024 sequences outweighs its forward pass over 8192 tokens."""
    arch, gpu = load_model("llama-3.1-8b"), load_gpu("h100-sxm")
    for seqs in (16, 1024):
        plan = plan_memory(arch, gpu, max_num_batched_tokens=8192, max_num_seqs=seqs)
        expected = activation_bytes(arch, 8192, sampled_tokens=min(8192, seqs))
        assert plan.activations == pytest.approx(expected)

    def built(seqs: int):
        data = scenario_dict(hardware={"gpu": "h100-sxm"}, model={"name": "llama-3.1-8b"})
        data["serving"] = {"policy": "chunked_prefill", "max_num_seqs": seqs, "max_model_len": 8192}
        return build_replica(Scenario.from_dict(data)).memory

    few, many = built(16), built(1024)
    assert few.activations < many.activations
    assert few.kv_capacity_tokens > many.kv_capacity_tokens


def _kv_tokens(out: str) -> int:
    return int(re.search(r"KV capacity[^\d]*(\d+) tokens", out).group(1))


@pytest.mark.parametrize(
    ("model", "gpu", "flags", "serving"),
    [
        # a max_model_len one sequence of fits: at the models' 131072 vLLM would not start
        ("gpt-oss-120b", "h100-sxm", ["--max-model-len", "32768"], {"max_model_len": 32768}),
        ("llama-3.1-8b", "rtx-4090", ["--max-model-len", "32768"], {"max_model_len": 32768}),
        (
            "llama-3.1-8b",
            "h100-sxm",
            ["--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "4096",
             "--max-num-seqs", "128", "--max-model-len", "16384"],
            {"gpu_memory_utilization": 0.8, "max_num_batched_tokens": 4096,
             "max_num_seqs": 128, "max_model_len": 16384},
        ),
    ],
)  # fmt: skip
def test_estimate_plans_memory_as_run_does(capsys, model, gpu, flags, serving):
    """Same model, GPU and serving settings: `estimate` weighs the checkpoint's format (not
    bf16) and holds the KV tokens the run's replica holds."""
    assert main(["estimate", "--model", model, "--gpu", gpu, *flags]) == 0
    out = capsys.readouterr().out
    data = scenario_dict(hardware={"gpu": gpu}, model={"name": model})
    data["serving"] = {"policy": "chunked_prefill", **serving}
    memory = build_replica(Scenario.from_dict(data)).memory
    assert f"{memory.weight_dtype} weights" in out
    assert _kv_tokens(out) == memory.kv_capacity_tokens


def test_estimate_fits_gpt_oss_120b_on_one_h100_as_run_does(capsys):
    assert main(["estimate", "--model", "gpt-oss-120b", "--gpu", "h100-sxm"]) == 0
    assert "inference: 1 GPUs" in capsys.readouterr().out


def test_estimate_refuses_a_bad_serving_flag_in_one_line(capsys):
    code = main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-num-seqs", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--max-num-seqs 0: Input should be greater than or equal to 1" in err
    assert len(err.strip().splitlines()) == 1


def test_an_amd_gpu_says_rocm_reports_its_memory():
    """vLLM reads the size from torch.cuda, which on an MI300X is ROCm's HIP runtime: the
    header said "as CUDA reports it"."""
    build = build_replica(_unset("mi300x"))
    assert any("GiB as ROCm reports it, at least 70" in d for d in build.defaults)
    assert not any("CUDA" in d for d in build.defaults)
