"""`infersim replay`: run folders with and without the engine's resolved settings, TP2,
vLLM bench serve JSON, vLLM's defaults by version, bad input as one line, and the real
RTX 4090 run against the figures benchmarks/README.md quotes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hardware_models.errors import InfersimError, InfersimWarning
from simulator.cli.main import main
from simulator.replay.bench_json import vllm_client_arrivals
from simulator.replay.config import catalog_name_for, gpu_preset_for
from simulator.vllm_defaults import batch_limits, parse_version, symm_mem_default, vllm_default
from tests.conftest import SHARED_DATA, needs_shared_data, scenario_dict
from tests.test_architecture import LLAMA_31_8B_CONFIG

RTX_4090 = {"device_name": "NVIDIA GeForce RTX 4090", "device_total_memory_bytes": 25250627584}
H100 = {"device_name": "NVIDIA H100 80GB HBM3", "device_total_memory_bytes": 85520809984}


def _meta(**changes: Any) -> dict[str, Any]:
    meta = {"model": "meta-llama/Llama-3.1-8B", "vllm_version": "0.19.0", "hardware": RTX_4090}
    return {**meta, **changes}


def write_run(folder: Path, meta: dict[str, Any], count: int = 24, log: bool = True) -> Path:
    """A small run folder: `count` requests 0.2 s apart with made-up engine timestamps."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps(meta))
    rng = np.random.default_rng(7)
    lines = []
    for i in range(count):
        queued = 100.0 + 0.2 * i
        output = int(rng.integers(8, 64))
        first = queued + 0.05 + 0.001 * i
        lines.append(
            json.dumps(
                {
                    "request_id": f"r{i}",
                    "input_toks": int(rng.integers(64, 512)),
                    "output_toks": output,
                    "queued_ts": queued,
                    "first_token_ts": first,
                    "last_token_ts": first + 0.02 * (output - 1),
                }
            )
        )
    (folder / "requests.jsonl").write_text("\n".join(lines) + "\n")
    if log:
        rows = ["t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct"]
        rows += [f"{t}.0,{500 if t < 5 else 0},{300},{4},{0},{5.0}" for t in range(1, 9)]
        (folder / "timeseries.csv").write_text("\n".join(rows) + "\n")
    return folder


def replay(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["replay", *argv, "--no-plots"])
    out, err = capsys.readouterr()
    return code, out, err


def written(out: Path) -> dict[str, Any]:
    return json.loads((out / "replay.json").read_text())


def test_folder_without_kv_cache_or_resolved_config_uses_vllm_defaults(tmp_path, capsys):
    run = write_run(
        tmp_path / "run",
        {"model": "meta-llama/Llama-3.1-8B", "vllm_version": "0.19.0", "hardware": RTX_4090,
         "engine_kwargs": {"max_model_len": 4096}},
    )  # fmt: skip
    code, out, err = replay(capsys, str(run), "-o", str(tmp_path / "out"))
    assert code == 0, err
    for line in (
        "assumed max_num_seqs = 256 (vLLM 0.19.0 default",
        "assumed max_num_batched_tokens = 2048",
        "assumed enable_prefix_caching = True",
        "assumed block_size = 16",
        "assumed gpu_memory_utilization = 0.9",
        "assumed async_scheduling = True",
        "assumed enforce_eager = False",
        "num_gpu_blocks not recorded",
        "GPU: rtx-4090",
        "model: llama-3.1-8b",
    ):
        assert line in out
    data = written(tmp_path / "out")
    serving = data["scenario"]["serving"]
    assert (serving["max_num_seqs"], serving["max_num_batched_tokens"]) == (256, 2048)
    assert serving["policy"] == "chunked_prefill" and serving["max_model_len"] == 4096
    assert data["simulated_completed"] == 24 and data["calibration"] == "rtx-4090"
    rows = {(r["metric"], r["stat"]): r for r in data["latency"]}
    assert len(rows) == 16
    ttft = rows["ttft", "mean"]
    assert ttft["measured_s"] == pytest.approx(0.05 + 0.001 * 11.5)
    assert ttft["error_pct"] == pytest.approx(
        100 * (ttft["simulated_s"] - ttft["measured_s"]) / ttft["measured_s"]
    )
    assert rows["itl", "mean"]["measured_s"] == pytest.approx(0.02)
    assert rows["itl", "p50"]["measured_s"] is None  # the folder has no per-token times
    assert data["decode_only_step"] is not None
    assert (tmp_path / "out" / "timeline.csv").is_file()


def test_replay_is_deterministic(tmp_path, capsys):
    run = write_run(tmp_path / "run", _meta(), log=False)
    for out in ("a", "b"):
        assert replay(capsys, str(run), "-o", str(tmp_path / out))[0] == 0
    a = written(tmp_path / "a")
    # the trace each wrote is named from its own folder, so the two files are the same
    assert a["scenario"]["workload"]["arrivals"]["path"] == "trace.csv"
    assert (tmp_path / "a/replay.json").read_bytes() == (tmp_path / "b/replay.json").read_bytes()
    assert "no engine log" in " ".join(a["notes"]) and a["decode_only_step"] is None


def test_replay_json_pins_the_run_and_the_build(tmp_path, capsys):
    """replay.json's provenance: the build, and each file of the measured run and of the
    simulation (the trace it wrote, named from its folder) with its sha256."""
    import hashlib

    from simulator.build_id import build_id

    run = write_run(tmp_path / "run", _meta())
    assert replay(capsys, str(run), "-o", str(tmp_path / "out"))[0] == 0
    made = written(tmp_path / "out")["provenance"]
    assert made["build_id"] == build_id()

    def sha(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    names = ("meta.json", "requests.jsonl", "timeseries.csv")
    assert made["inputs"] == [
        *({"field": "run", "path": str(run / n), "sha256": sha(run / n)} for n in names),
        {"field": "workload.arrivals.path", "path": "trace.csv",
         "sha256": sha(tmp_path / "out" / "trace.csv")},
    ]  # fmt: skip


def test_dp2_ep_run_replays_with_its_ranks_and_experts(tmp_path, capsys):
    run = write_run(
        tmp_path / "run",
        {"model": "mistralai/Mixtral-8x7B-v0.1", "vllm_version": "0.10.1", "hardware": H100,
         "engine_kwargs": {"tensor_parallel_size": 2, "data_parallel_size": 2,
                           "enable_expert_parallel": True, "dtype": "bfloat16"}},
    )  # fmt: skip
    code, out, err = replay(capsys, str(run), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "assumed all2all_backend = allgather_reducescatter" in out
    par = written(tmp_path / "out")["scenario"]["parallelism"]
    assert (par["tp"], par["dp"], par["enable_expert_parallel"]) == (2, 2, True)


def _replay_h100_tp2(tmp_path, capsys, version: str, **engine) -> tuple[str, dict]:
    """A Llama-3.1-70B TP2 run on H100s of vLLM `version`: the replay's output and
    scenario."""
    engine = {"tensor_parallel_size": 2, "dtype": "bfloat16", **engine}
    meta = {"model": "meta-llama/Llama-3.1-70B", "vllm_version": version, "hardware": H100,
            "engine_kwargs": engine}  # fmt: skip
    run = write_run(tmp_path / "run", meta)
    code, out, err = replay(capsys, str(run), "-o", str(tmp_path / "out"))
    assert code == 0, err
    return out, written(tmp_path / "out")["scenario"]


def test_tp2_run_on_h100_takes_the_big_gpu_defaults(tmp_path, capsys):
    out, scenario = _replay_h100_tp2(tmp_path, capsys, "0.10.1", enforce_eager=True)
    assert "assumed max_num_batched_tokens = 8192" in out
    assert "assumed max_num_seqs = 1024" in out
    assert "assumed async_scheduling = False" in out  # opt-in before 0.14
    assert scenario["parallelism"]["tp"] == 2 and scenario["hardware"]["gpu"] == "h100-sxm"
    assert scenario["engine"]["cuda_graphs"] is False
    assert scenario["hardware"]["calibration"] == "h100-sxm"
    assert "assumed allreduce_use_symm_mem = false (vLLM 0.10.1: no symmetric-memory" in out
    assert scenario["parallelism"]["allreduce_use_symm_mem"] is False


def test_a_tp2_runs_all_reduce_switches_come_from_its_engine_and_version(tmp_path, capsys):
    out, scenario = _replay_h100_tp2(tmp_path, capsys, "0.11.0", disable_custom_all_reduce=True)
    assert "assumed allreduce_use_symm_mem = true (vLLM 0.11.0: on in 0.11.0" in out
    par = scenario["parallelism"]
    assert (par["disable_custom_all_reduce"], par["allreduce_use_symm_mem"]) == (True, True)


@pytest.mark.parametrize(
    ("version", "on", "said"),
    [
        ((0, 10, 2), False, "off in 0.10.2 (vllm-project/vllm#24696)"),
        ((0, 11, 0), True, "on in 0.11.0"),
        ((0, 11, 2), False, "off from 0.11.1 (vllm-project/vllm#26925)"),
        ((0, 14, 0), False, "uncertain which release in between turned it back on"),
        ((0, 18, 0), True, "on again by 0.18.0"),
        ((0, 25, 1), True, "on again by 0.18.0"),
    ],
)
def test_the_symmetric_memory_default_follows_each_release(version, on, said):
    """VLLM_ALLREDUCE_USE_SYMM_MEM was turned on and off several times; a release the
    sources do not pin says it guessed."""
    default = symm_mem_default(version)
    assert default.value is on and said in default.reason


def test_overrides_and_flags_replace_the_run(tmp_path, capsys):
    run = write_run(tmp_path / "run", _meta(), log=False)
    code, _, err = replay(
        capsys, str(run), "-o", str(tmp_path / "out"), "--gpu", "l40s", "--calibration",
        "none", "--model", "llama-2-7b", "--set", "serving.max_num_seqs=8",
    )  # fmt: skip
    assert code == 0, err
    data = written(tmp_path / "out")
    assert data["gpu"] == "l40s" and data["calibration"] is None
    assert data["model"] == "llama-2-7b"
    assert data["scenario"]["serving"]["max_num_seqs"] == 8


def test_vllm_defaults_by_version_and_gpu():
    def batch(version: str, name: str, gib: float) -> tuple[object, object]:
        v = parse_version(version)
        return (
            vllm_default("max_num_batched_tokens", v, name, gib).value,
            vllm_default("max_num_seqs", v, name, gib).value,
        )

    assert batch("0.8.2", "NVIDIA GeForce RTX 4090", 23.5) == (2048, 1024)
    assert batch("0.8.5.post1", "NVIDIA GeForce RTX 4090", 23.5) == (2048, 256)
    assert batch("0.8.4", "NVIDIA H100 80GB HBM3", 79.6) == (8192, 1024)
    assert batch("0.8.4", "NVIDIA A100-SXM4-80GB", 79.2) == (2048, 256)
    assert batch("0.8.5", "NVIDIA A100-SXM4-80GB", 79.2) == (8192, 1024)
    assert batch("0.9.0", "NVIDIA A100-SXM4-80GB", 79.2) == (2048, 256)
    assert batch("0.19.0", "AMD Instinct MI300X", 191.5) == (8192, 1024)
    assert batch("v0.11.0rc1", "NVIDIA L40S", 44.4) == (2048, 256)
    no_chunks = {"chunked_prefill": False, "max_model_len": 32768}
    assert vllm_default("max_num_batched_tokens", (0, 19, 0), "x", 1, **no_chunks).value == 32768
    no_chunks["max_model_len"] = 1024
    assert vllm_default("max_num_batched_tokens", (0, 19, 0), "x", 1, **no_chunks).value == 2048
    assert not vllm_default("async_scheduling", (0, 13, 0), "x", 1).value
    assert vllm_default("async_scheduling", (0, 14, 0), "x", 1).value
    assert "checked up to 0.28.0" in vllm_default("block_size", (0, 30, 1), "x", 1).reason
    with pytest.raises(InfersimError, match="predates the V1 engine"):
        vllm_default("max_num_seqs", (0, 7, 3), "x", 1)
    with pytest.raises(InfersimError, match="not a version number"):
        parse_version("latest")


def test_each_batch_limit_bounds_the_others_default_from_its_release():
    """EngineArgs: unset sequences at most the budget (from 0.10), an unset budget at most
    max_num_seqs * max_model_len (from 0.12); before, vLLM kept the GPU's defaults."""

    def limits(version: tuple[int, int, int], **given: int | None) -> dict[str, object]:
        given = {"max_num_seqs": None, "max_num_batched_tokens": None, **given}
        chosen = batch_limits(
            version, "NVIDIA H100 80GB HBM3", 79.2, chunked_prefill=True, max_model_len=1024,
            **given,
        )  # fmt: skip
        return {name: default.value for name, default in chosen.items()}

    assert limits((0, 19, 0), max_num_batched_tokens=512) == {"max_num_seqs": 512}
    assert limits((0, 9, 2), max_num_batched_tokens=512) == {"max_num_seqs": 1024}
    assert limits((0, 19, 0), max_num_seqs=2) == {"max_num_batched_tokens": 2048}
    assert limits((0, 11, 0), max_num_seqs=2) == {"max_num_batched_tokens": 8192}
    assert limits((0, 19, 0)) == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}


def test_a_recorded_budget_bounds_the_default_sequences_replayed(tmp_path, capsys):
    meta = _meta(hardware=H100, engine_kwargs={"max_num_batched_tokens": 512})
    code, out, err = replay(capsys, str(write_run(tmp_path / "run", meta)), "-o",
                            str(tmp_path / "out"))  # fmt: skip
    assert code == 0, err
    assert "assumed max_num_seqs = 512 (vLLM 0.19.0 default" in out
    assert written(tmp_path / "out")["scenario"]["serving"]["max_num_seqs"] == 512


def test_a_default_that_old_vllm_would_refuse_is_not_replayed(tmp_path, capsys):
    """vLLM 0.9 did not bound its 1024 default sequences by a budget of 512, and refused
    that pair at start-up: the run must have set max_num_seqs, so say to give it."""
    meta = _meta(vllm_version="0.9.2", hardware=H100,
                 engine_kwargs={"max_num_batched_tokens": 512})  # fmt: skip
    code, _, err = replay(capsys, str(write_run(tmp_path / "run", meta)), "-o",
                          str(tmp_path / "out"))  # fmt: skip
    assert code != 0
    assert "max_num_seqs: not recorded in the run, and vLLM 0.9.2's default" in err
    assert "--set serving.max_num_seqs=N" in err


def bench_result(count: int = 20, **extra: Any) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    outputs = [int(n) for n in rng.integers(4, 40, count)]
    itls = [[0.02 + 0.001 * (j % 3) for j in range(n - 1)] for n in outputs]
    return {
        "model_id": "meta-llama/Llama-3.1-8B",
        "request_rate": 4.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "input_lens": [int(n) for n in rng.integers(32, 400, count)],
        "output_lens": outputs,
        "ttfts": [0.04] * count,
        "itls": itls,
        "latencies": [0.04 + sum(gaps) for gaps in itls],
        "errors": [""] * count,
        **extra,
    }


def test_bench_json_with_poisson_arrivals(tmp_path, capsys):
    data = bench_result()
    data["errors"][3] = "Connection reset"
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    args = (str(path), "-o", str(tmp_path / "out"), "--gpu", "rtx-4090")
    code, _, err = replay(capsys, *args)
    assert code == 2 and "pass --vllm-version" in err and len(err.splitlines()) == 1
    code, out, err = replay(capsys, *args, "--vllm-version", "0.19.0")
    assert code == 0, err
    assert "drawn Poisson at the recorded 4 requests/s with seed 0" in out
    assert "1 failed requests" in out
    # measured through vLLM's API server; replayed without it unless --set says so
    assert "replayed with the engine alone unless --set frontend.kind=vllm_api_server" in out
    result = written(tmp_path / "out")
    assert result["requests"] == 19 and result["simulated_completed"] == 19
    rows = {(r["metric"], r["stat"]): r for r in result["latency"]}
    gaps = [g for i, request in enumerate(data["itls"]) if i != 3 for g in request]
    assert rows["itl", "p50"]["measured_s"] == pytest.approx(np.percentile(gaps, 50))
    assert rows["ttft", "p99"]["measured_s"] == pytest.approx(0.04)


def test_bench_json_start_times_are_the_arrivals(tmp_path, capsys):
    data = bench_result(start_times=[10.0 + 0.5 * i for i in range(20)])
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    code, out, err = replay(
        capsys, str(path), "-o", str(tmp_path / "out"), "--gpu", "rtx-4090",
        "--vllm-version", "0.19.0",
    )  # fmt: skip
    assert code == 0, err
    assert "recorded send times" in out
    assert "prefix reuse: the file records lengths, not prompts" in out
    trace = (tmp_path / "out" / "trace.csv").read_text().splitlines()
    assert trace[2].startswith("0.5,")


def test_client_arrivals_follow_vllm():
    times = vllm_client_arrivals(50, rate=5.0, burstiness=1.0, seed=0)
    np.random.seed(0)
    gaps = np.cumsum([np.random.gamma(shape=1.0, scale=0.2) for _ in range(50)])
    assert times == pytest.approx(gaps * 10.0 / gaps[-1])
    assert times[-1] == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("meta", "edit", "needle"),
    [
        (_meta(), ("requests.jsonl", None), "requests.jsonl: no such file"),
        (_meta(), ("meta.json", None), "no meta.json"),
        (_meta(), ("meta.json", "{oops"), "meta.json: invalid JSON"),
        (_meta(), ("requests.jsonl", '{"input_toks": 3}\n{not json\n'), "line 1: 'output_toks'"),
        (_meta(), ("requests.jsonl", "\n{not json\n"), "line 2: invalid JSON"),
        (_meta(), ("timeseries.csv", "t,running\n1,2\n"), "missing column(s) prompt_through"),
        (_meta(model="acme/NotAModel-1B"), None, "model 'acme/NotAModel-1B' is not in the"),
        (_meta(hardware={"device_name": "Acme X1"}), None, "'Acme X1' matches no GPU preset"),
        (_meta(vllm_version="0.6.3"), None, "predates the V1 engine"),
        (_meta(engine_kwargs={"max_model_len": 200}), None,
         "engine_kwargs.max_model_len 200: 20 of the run's requests are longer"),
        (_meta(hardware={**RTX_4090, "device_total_memory_bytes": "24GB"}), None,
         "hardware.device_total_memory_bytes: '24GB' is not a whole number"),
        (_meta(kv_cache={"num_gpu_blocks": 500, "num_kv_tokens": 8000},
               engine_kwargs={"block_size": 32}), None,
         "kv_cache.num_kv_tokens 8000 is not num_gpu_blocks x block_size (500 x 32 = 16000)"),
    ],
)  # fmt: skip
def test_bad_run_folders_are_one_line(tmp_path, capsys, meta, edit, needle):
    run = write_run(tmp_path / "run", meta)
    if edit is not None:
        name, text = edit
        if text is None:
            (run / name).unlink()
        else:
            (run / name).write_text(text)
    code, _, err = replay(capsys, str(run), "-o", str(tmp_path / "out"))
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("infersim: error:")
    assert needle in err


def test_bench_json_without_detail_is_refused(tmp_path, capsys):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"model_id": "x", "request_rate": 1.0, "mean_ttft_ms": 3.0}))
    code, _, err = replay(capsys, str(path), "--gpu", "rtx-4090")
    assert code == 2 and "--save-detailed" in err and len(err.splitlines()) == 1


@pytest.mark.shared_data
@needs_shared_data
def test_real_rtx4090_run_reproduces_the_published_figures(tmp_path, capsys):
    run = SHARED_DATA / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19"
    figures = {}
    for label, extra in (("calibrated", ()), ("uncalibrated", ("--calibration", "none"))):
        code, _, err = replay(capsys, str(run), "-o", str(tmp_path / label), *extra)
        assert code == 0, err
        data = written(tmp_path / label)
        rows = {(r["metric"], r["stat"]): r["error_pct"] for r in data["latency"]}
        figures[label] = [round(rows[m, "mean"], 1) for m in ("ttft", "tpot", "e2e")]
        figures[label] += [data["preemptions"]]
    # benchmarks/README.md, "End to end"
    assert figures == {"calibrated": [8.7, 5.9, 8.0, 181], "uncalibrated": [14.8, 10.4, 13.7, 176]}
    step = data["decode_only_step"]
    assert (step["ticks"], round(step["error_pct"], 1)) == (41, 1.3)


@pytest.mark.shared_data
@needs_shared_data
def test_vllm_defaults_rebuild_the_real_runs_recorded_settings(tmp_path, capsys):
    """The RTX 4090 run's meta.json cut to model, version and GPU: the defaults table must
    give the engine settings vLLM 0.19 resolved and recorded (all but the KV cache size,
    which the memory planner derives instead)."""
    source = SHARED_DATA / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19"
    meta = json.loads((source / "meta.json").read_text())
    bare = tmp_path / "bare"
    bare.mkdir()
    keep = ("model", "vllm_version", "hardware")
    (bare / "meta.json").write_text(json.dumps({k: meta[k] for k in keep}))
    (bare / "requests.jsonl").write_text((source / "requests.jsonl").read_text())
    scenarios = {}
    for label, run in (("full", source), ("bare", bare)):
        code, _, err = replay(capsys, str(run), "-o", str(tmp_path / f"out-{label}"))
        assert code == 0, err
        scenario = written(tmp_path / f"out-{label}")["scenario"]
        scenarios[label] = (scenario["serving"], scenario["engine"], scenario["model"])
    full, bare_ = scenarios["full"], scenarios["bare"]
    for recorded in ("num_gpu_blocks", "max_model_len"):
        full[0].pop(recorded), bare_[0].pop(recorded)
    assert full == bare_


def test_without_chunked_prefill_a_step_holds_a_whole_prompt(tmp_path, capsys):
    """vLLM raises max_num_batched_tokens to max_model_len when chunked prefill is off:
    a 3,000-token prompt runs (it used to be rejected at the 2,048 default)."""
    kwargs = {"enable_chunked_prefill": False, "max_model_len": 4096}
    run = write_run(tmp_path / "run", _meta(engine_kwargs=kwargs), log=False)
    lines = (run / "requests.jsonl").read_text().splitlines()
    lines[3] = json.dumps({**json.loads(lines[3]), "input_toks": 3000})
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = replay(capsys, str(run), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "assumed max_num_batched_tokens = 4096" in out
    data = written(tmp_path / "out")
    assert data["scenario"]["serving"]["policy"] == "continuous"
    assert data["simulated_completed"] == data["requests"] == 24


def test_what_the_engine_resolved_wins_over_its_arguments(tmp_path, capsys):
    """The engine may change what it was given: the resolved value replays, and the
    argument that disagrees is said."""
    kv_cache = {"block_size": 16, "num_gpu_blocks": 500, "num_kv_tokens": 8000}
    meta = _meta(kv_cache=kv_cache, engine_kwargs={"block_size": 32, "max_model_len": 4096})
    run = write_run(tmp_path / "run", meta, log=False)
    code, out, err = replay(capsys, str(run), "-o", str(tmp_path / "out"))
    assert code == 0, err
    serving = written(tmp_path / "out")["scenario"]["serving"]
    assert (serving["block_size"], serving["num_gpu_blocks"]) == (16, 500)
    assert "block_size: engine_kwargs.block_size says 32, kv_cache.block_size 16" in out


def test_requests_the_simulation_rejects_are_said(tmp_path, capsys):
    run = write_run(tmp_path / "run", _meta(), log=False)
    code, out, err = replay(
        capsys, str(run), "-o", str(tmp_path / "out"), "--set", "serving.max_model_len=300"
    )
    assert code == 0, err
    rejected = (
        written(tmp_path / "out")["requests"] - written(tmp_path / "out")["simulated_completed"]
    )
    assert rejected > 0 and f"({rejected} rejected)" in out
    assert "--set serving.max_model_len=300 (applied last)" in out


def test_a_replay_that_serves_nothing_is_refused(tmp_path, capsys):
    run = write_run(tmp_path / "run", _meta())
    code, _, err = replay(
        capsys, str(run), "-o", str(tmp_path / "out"), "--set", "serving.num_gpu_blocks=1"
    )
    # the shipped RTX 4090 profile's extrapolation note, the run's rejection warning, then
    # the refusal
    extrapolated, warning, error = err.strip().splitlines()
    assert "calibration rtx-4090: its GEMMs here run" in extrapolated
    assert code == 2 and warning.startswith("infersim: warning: 24 of 24 requests (100%)")
    assert "the replay served none of the run's 24 requests (24 prompt + output" in error


def test_early_requests_the_simulation_rejects_are_left_out_of_the_cache_check(tmp_path, capsys):
    """Requests before the KV cache fills that the simulation rejected are counted, not
    a NaN in the figure."""
    run = write_run(tmp_path / "run", _meta())
    rows = ["t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct"]
    rows += [f"{t}.0,500,300,4,0,{5.0 if t < 3 else 99.0}" for t in range(1, 9)]
    (run / "timeseries.csv").write_text("\n".join(rows) + "\n")
    code, out, err = replay(
        capsys, str(run), "-o", str(tmp_path / "out"), "--set", "serving.max_model_len=300"
    )
    assert code == 0, err
    early = written(tmp_path / "out")["before_cache_fills"]
    assert early["not_simulated"] > 0 and early["requests"] + early["not_simulated"] == 15
    assert np.isfinite(early["simulated_s"]) and "nan" not in out
    assert f"; {early['not_simulated']} more not served by the simulation, left out" in out


def test_plots_are_written(tmp_path, capsys):
    run = write_run(tmp_path / "run", _meta())
    assert main(["replay", str(run), "-o", str(tmp_path / "out"), "--quiet"]) == 0
    for name in ("latency_cdfs.png", "timeline.png", "timeline.csv", "trace.csv"):
        assert (tmp_path / "out" / name).stat().st_size > 100
    assert "wrote 5 files" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("device", "preset"),
    [
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 4090 D", None),  # fewer SMs than the preset
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
        ("NVIDIA A100 80GB PCIe", None),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L40", None),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_device_names_map_to_presets_or_to_nothing(device, preset):
    assert gpu_preset_for(device) == preset


def test_model_ids_map_to_the_catalog():
    assert catalog_name_for("meta-llama/Llama-3.1-8B") == ("llama-3.1-8b", "")
    name, how = catalog_name_for("meta-llama/Llama-3.1-8B-Instruct")
    assert name == "llama-3.1-8b" and "base meta-llama/Llama-3.1-8B" in how
    assert catalog_name_for("meta-llama/Llama-2-7b-chat-hf")[0] == "llama-2-7b"
    assert catalog_name_for("mistralai/Mistral-7B-v0.1") == ("mistral-7b", "")
    assert catalog_name_for("acme/NotAModel-1B") is None


def test_a_setting_of_the_wrong_type_names_its_place(tmp_path, capsys):
    run = write_run(tmp_path / "run", _meta(kv_cache={"block_size": "16"}), log=False)
    code, _, err = replay(capsys, str(run), "-o", str(tmp_path / "out"))
    assert code == 2
    assert (
        err.strip()
        == "infersim: error: meta.json kv_cache.block_size: '16' is not a whole number >= 1"
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"request_rate": "inf"}, "all at once (request_rate inf"),
        ({"max_concurrency": 8}, "capped concurrency at 8"),
        ({"ramp_up_strategy": "linear"}, "a ramp-up (linear)"),
        ({"request_rate": 2.0, "burstiness": 0.5}, "drawn gamma (burstiness 0.5) at the"),
        ({"request_rate": 2.0, "seed": "42"}, "with seed 42, as vLLM's client"),
    ],
)
def test_bench_json_arrivals_without_start_times(tmp_path, capsys, extra, needle):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench_result(**extra)))
    code, out, err = replay(
        capsys, str(path), "-o", str(tmp_path / "out"), "--gpu", "rtx-4090",
        "--vllm-version", "0.19.0",
    )  # fmt: skip
    assert needle in (out if code == 0 else err)
    assert code == (2 if "max_concurrency" in extra or "ramp_up_strategy" in extra else 0)


def test_a_path_that_is_neither_folder_nor_json_is_refused(tmp_path, capsys):
    run = write_run(tmp_path / "run", _meta(), log=False)
    code, _, err = replay(capsys, str(run / "requests.jsonl"))
    assert code == 2 and "not a run folder" in err and len(err.splitlines()) == 1
    code, _, err = replay(capsys, str(tmp_path / "missing"))
    assert code == 2 and "no such file or folder" in err


def test_model_from_a_config_json(tmp_path, capsys):
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(LLAMA_31_8B_CONFIG))
    run = write_run(tmp_path / "run", _meta(model="my-org/private-8b"), log=False)
    code, _, err = replay(capsys, str(run), "-o", str(tmp_path / "a"))
    assert code == 2 and "'my-org/private-8b' is not in the catalog" in err
    code, _, err = replay(capsys, str(run), "-o", str(tmp_path / "b"), "--model", str(config))
    assert code == 0, err
    by_path = written(tmp_path / "b")["latency"]
    assert replay(capsys, str(run), "-o", str(tmp_path / "c"), "--model", "llama-3.1-8b")[0] == 0
    assert by_path == written(tmp_path / "c")["latency"]  # the same shapes, the same replay


def _simulated_bench_json(
    tmp_path: Path, capsys, frontend: dict | None = None, **serving: Any
) -> Path:
    """`infersim run --bench-json` of the shared test scenario at 60 requests."""
    scenario = tmp_path / "s.yaml"
    sections = {"workload": {"num_requests": 60}, "serving": serving}
    sections |= {"frontend": frontend} if frontend else {}
    scenario.write_text(json.dumps(scenario_dict(**sections)))
    bench = tmp_path / "bench.json"
    args = ["run", str(scenario), "-o", str(tmp_path / "run"), "--quiet", "--no-plots"]
    assert main([*args, "--bench-json", str(bench)]) == 0
    capsys.readouterr()
    return bench


def test_a_simulated_bench_json_replays_as_itself(tmp_path, capsys):
    """Writer (`run --bench-json`) and reader (`replay`) share one format: a simulated run
    written as a bench result and replayed with the same engine settings reads back its
    own arrivals and latencies and reproduces them."""
    bench = _simulated_bench_json(tmp_path, capsys)
    settings = [
        "--set", "serving.max_num_seqs=64", "--set", "serving.max_num_batched_tokens=512",
    ]  # fmt: skip
    code, out, err = replay(
        capsys, str(bench), "-o", str(tmp_path / "out"), "--gpu", "a100-80gb-sxm",
        "--model", "llama-2-7b", "--vllm-version", "0.19.0", *settings,
    )  # fmt: skip
    assert code == 0, err
    assert "recorded send times" in out
    assert "prefix reuse: the file records lengths, not prompts" in out
    rows = {(r["metric"], r["stat"]): r for r in written(tmp_path / "out")["latency"]}
    ttfts = json.loads(bench.read_text())["ttfts"]
    assert rows["ttft", "mean"]["measured_s"] == pytest.approx(np.mean(ttfts))
    for metric in ("ttft", "tpot", "e2e"):
        for stat in ("mean", "p50", "p99"):
            assert rows[metric, stat]["error_pct"] == pytest.approx(0, abs=1e-9), (metric, stat)


def test_a_simulated_bench_json_carries_its_engine_settings(tmp_path, capsys):
    """infersim writes the run's engine settings into its bench JSON (`infersim_meta`), so
    a replay needs no --vllm-version, --gpu or --set: it runs with the run's own token
    budget and prefix caching, not vLLM's defaults (8,192 tokens, caching on), and
    reproduces it."""
    bench = _simulated_bench_json(tmp_path, capsys, enable_prefix_caching=False)
    meta = json.loads(bench.read_text())["infersim_meta"]
    assert meta["engine_kwargs"]["max_num_batched_tokens"] == 512
    assert meta["engine_kwargs"]["enable_prefix_caching"] is False
    code, out, err = replay(capsys, str(bench), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "engine settings: the simulated run's own" in out
    assert "assumed" not in out  # no vLLM default stood in for a setting
    rows = written(tmp_path / "out")["latency"]
    assert all(
        r["error_pct"] == pytest.approx(0, abs=1e-9) for r in rows if r["error_pct"] is not None
    )


def test_a_simulated_bench_json_with_vllm_default_batch_limits_replays_alone(tmp_path, capsys):
    """A run leaving max_num_seqs and max_num_batched_tokens to vLLM's defaults records the
    values it resolved and the vLLM release it emulates, so its bench JSON replays with no
    --vllm-version; the replay says its latencies are simulated, not a client's."""
    bench = _simulated_bench_json(tmp_path, capsys, max_num_seqs=None, max_num_batched_tokens=None)
    meta = json.loads(bench.read_text())["infersim_meta"]
    provenance = json.loads((tmp_path / "run" / "summary.json").read_text())["provenance"]
    resolved = provenance["scenario"]["serving"]
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        assert meta["engine_kwargs"][name] == resolved[name] is not None
    assert meta["vllm_version"] == "0.19.0"
    code, out, err = replay(capsys, str(bench), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "infersim-simulated vLLM bench serve JSON" in out
    assert "latencies as infersim simulated them" in out and "client measured" not in out
    rows = written(tmp_path / "out")["latency"]
    assert all(
        r["error_pct"] == pytest.approx(0, abs=1e-9) for r in rows if r["error_pct"] is not None
    )


def test_a_simulated_bench_json_through_the_api_server_replays_through_it(tmp_path, capsys):
    """A run through the modelled API server records its front end in infersim_meta, and
    the replay runs through it too: its own latencies back, not the engine alone's (TPOT
    -54% before). Its ITLs are written spread evenly (the front end's token times are not
    kept), which the replay says, so only the ITL percentiles may differ."""
    frontend = {"kind": "vllm_api_server", "api_server_count": 2}
    bench = _simulated_bench_json(tmp_path, capsys, frontend=frontend)
    meta = json.loads(bench.read_text())["infersim_meta"]
    assert meta["frontend"]["kind"] == "vllm_api_server"
    assert meta["frontend"]["api_server_count"] == 2
    code, out, err = replay(capsys, str(bench), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "front end: vllm_api_server (the simulated run's own, infersim_meta)" in out
    assert "through its model of vLLM's API server, replayed through it too" in out
    assert "ITL: 60 of the file's requests have their gaps spread evenly" in out
    rows = written(tmp_path / "out")["latency"]
    exact = [r for r in rows if r["metric"] != "itl" or r["stat"] == "mean"]
    assert all(r["error_pct"] == pytest.approx(0, abs=1e-9) for r in exact), exact


def test_a_simulated_bench_json_without_a_front_end_records_none(tmp_path, capsys):
    bench = _simulated_bench_json(tmp_path, capsys)
    assert "frontend" not in json.loads(bench.read_text())["infersim_meta"]


def test_the_timeline_sums_every_rank_of_a_multi_rank_run():
    """A DP run's ranks are replicas of the results: running, waiting and KV use at a tick
    are their sum, as the engine's log sums its engines, not one rank's."""
    import pandas as pd

    from simulator.replay.versus_measured import _sampled

    steps = pd.DataFrame(
        {"replica": [0, 1, 0, 1], "start": [0.0, 0.0, 1.0, 1.5], "batch_size": [2, 3, 4, 5],
         "waiting": [1, 0, 0, 2], "kv_blocks_used": [10, 20, 30, 40]}
    )  # fmt: skip
    running, waiting, kv = _sampled(steps.sort_values("start"), np.array([0.5, 1.2, 2.0]))
    assert running.tolist() == [5, 7, 9] and waiting.tolist() == [1, 0, 2]
    assert kv.tolist() == [30, 50, 70]


def test_a_replay_builds_its_replicas_once_and_warns_once(tmp_path, capsys, monkeypatch):
    """A run that records no max_model_len is built to learn whether vLLM would start
    at the model's context; that build is the one simulated (it was built twice, and
    its warnings shown twice). The figures are those of a scenario simulated afresh."""
    import simulator.build as build_module
    from simulator.replay import ReplayOptions, read_run
    from simulator.replay import replay as replay_run
    from simulator.simulation import simulate

    scenario = tmp_path / "s.yaml"
    model = {"name": "gpt-oss-20b", "weight_dtype": "bf16"}  # upcast: a warning
    hardware = {"gpu": "b200", "calibration": "none"}
    sections = {"workload": {"num_requests": 40}, "model": model, "hardware": hardware}
    scenario.write_text(json.dumps(scenario_dict(**sections)))
    bench = tmp_path / "bench.json"
    args = ["run", str(scenario), "-o", str(tmp_path / "run"), "--quiet", "--no-plots"]
    assert main([*args, "--bench-json", str(bench)]) == 0
    capsys.readouterr()
    assert "max_model_len" not in json.loads(bench.read_text())["infersim_meta"]["engine_kwargs"]
    builds, build = [], build_module.build_replica
    monkeypatch.setattr(build_module, "build_replica", lambda *a: builds.append(a) or build(*a))
    with pytest.warns(InfersimWarning) as shown:
        result = replay_run(read_run(bench), tmp_path / "out", ReplayOptions())
    assert len(builds) == 1
    upcast = [w for w in shown if "checkpoint is stored in fp4" in str(w.message)]
    assert len(upcast) == 1
    assert any("checkpoint is stored in fp4" in t for t in result.results.summary()["warnings"])
    monkeypatch.undo()
    afresh = simulate(result.scenario)
    assert afresh.requests.equals(result.results.requests)
    assert afresh.steps.equals(result.results.steps)
