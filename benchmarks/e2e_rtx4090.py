"""Replay the measured vLLM run on an RTX 4090 through the simulator and compare.

Reference: `../shared/data/e2e/rtx4090-llama-3.1-8b-vllm-0.19/` (LLMServingSim, MIT):
vLLM 0.19.0 serving Llama-3.1-8B (bf16, TP1) on one GeForce RTX 4090, 300 ShareGPT
requests. The replay uses the run's own arrivals (engine queue times), prompt and output
lengths, and engine configuration (max_num_seqs, max_num_batched_tokens, chunked prefill,
block size, num_gpu_blocks, CUDA graphs, async scheduling) on the `rtx-4090` preset with
its shipped calibration (`hardware_models/presets/calibrations/rtx-4090.yaml`: GEMM
efficiency fitted to published RTX 4090 matmul figures, nothing from this run).

    python benchmarks/e2e_rtx4090.py [--data DIR] [--out DIR] [--uncalibrated]
                                     [--set key=value ...]

Prints simulated vs measured TTFT, TPOT and end-to-end latency (mean, p50, p90, p99)
with % error, and writes the table and overlaid CDFs under the output folder. It also
lines the run up second by second against the engine's own log (`timeseries.csv`:
running and waiting requests, KV cache use, prompt and generation throughput), writes
that as `timeline.csv` and `timeline.png`, and prints the decode step time both imply in
the seconds where neither prefilled anything, which separates the cost model's error
from the scheduler's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "e2e" / "rtx4090-llama-3.1-8b-vllm-0.19"
STATS = ("mean", "p50", "p90", "p99")


def load_measured(data: Path) -> pd.DataFrame:
    """Per-request latencies as the reference defines them (engine clock)."""
    frame = pd.read_json(data / "requests.jsonl", lines=True)
    frame["arrival"] = frame["queued_ts"] - frame["queued_ts"].min()
    frame["ttft"] = frame["first_token_ts"] - frame["queued_ts"]
    frame["tpot"] = (frame["last_token_ts"] - frame["first_token_ts"]) / (frame["output_toks"] - 1)
    frame["e2e"] = frame["last_token_ts"] - frame["queued_ts"]
    return frame.sort_values("arrival", kind="stable", ignore_index=True)


def scenario_for(
    data: Path, measured: pd.DataFrame, out: Path, overrides: list[str], calibrated: bool = True
):
    from simulator.scenario import Scenario

    meta = json.loads((data / "meta.json").read_text())
    engine, cache = meta["engine_kwargs"], meta["kv_cache"]
    sched = meta["resolved_config"]["scheduler_config"]
    trace = out / "trace.csv"
    pd.DataFrame(
        {
            "arrived_at": measured["arrival"],
            "num_prefill_tokens": measured["input_toks"],
            "num_decode_tokens": measured["output_toks"],
        }
    ).to_csv(trace, index=False)
    scenario = Scenario.from_dict(
        {
            "name": "e2e-rtx4090-llama-3.1-8b",
            "hardware": {"gpu": "rtx-4090", "calibration": "rtx-4090" if calibrated else None},
            "model": {"name": "llama-3.1-8b", "weight_dtype": "bf16", "kv_dtype": "bf16"},
            "serving": {
                "policy": "chunked_prefill" if sched["enable_chunked_prefill"] else "continuous",
                "max_num_seqs": engine["max_num_seqs"],
                "max_num_batched_tokens": engine["max_num_batched_tokens"],
                "block_size": cache["block_size"],
                "num_gpu_blocks": cache["num_gpu_blocks"],
                "gpu_memory_utilization": cache["gpu_memory_utilization"],
                "max_model_len": engine["max_model_len"],
                "enable_prefix_caching": cache["enable_prefix_caching"],
            },
            "engine": {
                "cuda_graphs": not meta["resolved_config"]["model_config"]["enforce_eager"],
                "async_scheduling": sched["async_scheduling"],
            },
            "workload": {
                "arrivals": {"kind": "trace", "path": str(trace)},
                "num_requests": len(measured),
            },
            "output": {"plots": False, "progress": False},
        }
    )
    return scenario.with_overrides(overrides)


def _stats(values: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(np.mean(values)),
        "p50": float(np.percentile(values, 50)),
        "p90": float(np.percentile(values, 90)),
        "p99": float(np.percentile(values, 99)),
    }


def compare(measured: pd.DataFrame, simulated: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for metric in ("ttft", "tpot", "e2e"):
        m = _stats(measured[metric].to_numpy())
        s = _stats(simulated[metric].dropna().to_numpy())
        for stat in STATS:
            rows.append(
                {
                    "metric": metric,
                    "stat": stat,
                    "measured_s": m[stat],
                    "simulated_s": s[stat],
                    "error_%": 100 * (s[stat] - m[stat]) / m[stat],
                }
            )
    return pd.DataFrame(rows)


def timeline(data: Path, results) -> pd.DataFrame:
    """Per engine-log tick (1 s), measured and simulated side by side, each as vLLM logs
    it: prompt tokens counted when a request's first token comes out, generated tokens,
    and running / waiting / KV use sampled at the tick."""
    measured = pd.read_csv(data / "timeseries.csv")
    ticks = measured["t"].to_numpy()
    requests, steps = results.requests, results.steps
    total_blocks = results.context.replicas[0].kv_total_blocks
    first = requests["first_token"].to_numpy()
    ends = (steps["start"] + steps["duration"]).to_numpy()
    # the step running at each tick (the last one started by then)
    at = np.clip(np.searchsorted(steps["start"].to_numpy(), ticks, side="right") - 1, 0, None)
    edges = np.concatenate(([ticks[0] - 1], ticks))
    prefill = steps["prefill_tokens"].to_numpy()
    generated = np.histogram(ends, edges, weights=steps["decode_tokens"])[0]
    generated += np.histogram(first, edges)[0]  # each request's first token
    return pd.DataFrame(
        {
            "t": ticks,
            "measured_prompt_tok_s": measured["prompt_throughput"],
            "simulated_prompt_tok_s": np.histogram(first, edges, weights=requests["prompt"])[0],
            "measured_gen_tok_s": measured["gen_throughput"],
            "simulated_gen_tok_s": generated,
            "measured_running": measured["running"],
            "simulated_running": steps["batch_size"].to_numpy()[at],
            "measured_waiting": measured["waiting"],
            "simulated_waiting": steps["waiting"].to_numpy()[at],
            "measured_kv_pct": measured["kv_cache_pct"],
            "simulated_kv_pct": 100 * steps["kv_blocks_used"].to_numpy()[at] / total_blocks,
            "simulated_prefill_tok_s": np.histogram(ends, edges, weights=prefill)[0],
        }
    )


def decode_only_step_ms(line: pd.DataFrame) -> tuple[float, float, int]:
    """Mean decode step time implied by running / generated tokens per second, measured
    and simulated, over the ticks in which neither prefilled anything."""
    quiet = (
        (line["measured_prompt_tok_s"] == 0)
        & (line["simulated_prefill_tok_s"] == 0)
        & (line["measured_running"] > 0)
    )
    line = line[quiet]
    measured = 1000 * line["measured_running"].sum() / line["measured_gen_tok_s"].sum()
    simulated = 1000 * line["simulated_running"].sum() / line["simulated_gen_tok_s"].sum()
    return measured, simulated, int(quiet.sum())


def before_cache_fills(
    data: Path, measured: pd.DataFrame, simulated: pd.DataFrame
) -> tuple[int, float, float, float] | None:
    """(requests, tick, measured s, simulated s): the requests whose first token came
    before the engine log first shows the KV cache 99% full, and when the last of them
    got it in each. The cache is not full yet, so this times the prefill steps with next
    to nothing of preemption in it: the cost model apart from the scheduler. None when
    the cache never fills or nothing came before."""
    log = pd.read_csv(data / "timeseries.csv")
    tick = float(log.loc[log["kv_cache_pct"] >= 99, "t"].min())
    start = measured["queued_ts"].min()
    first = (measured["first_token_ts"] - start).to_numpy()
    early = first < tick  # all False when tick is NaN
    if not early.any():
        return None
    simulated = simulated.sort_values("arrival", kind="stable", ignore_index=True)
    return (
        int(early.sum()),
        tick,
        float(first[early].max()),
        float(simulated["first_token"].to_numpy()[early].max()),
    )


def plot_timeline(line: pd.DataFrame):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 7), layout="constrained")
    panels = (
        ("gen_tok_s", "generated tokens / s"),
        ("running", "running requests"),
        ("waiting", "waiting requests"),
        ("kv_pct", "KV cache used (%)"),
    )
    for ax, (column, title) in zip(figure.subplots(2, 2).flat, panels, strict=True):
        ax.plot(line["t"], line[f"measured_{column}"], label="measured (vLLM log)")
        ax.plot(line["t"], line[f"simulated_{column}"], label="simulated")
        ax.set_title(title)
        ax.set_xlabel("s")
    figure.axes[0].legend()
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/e2e_rtx4090")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument(
        "--uncalibrated", action="store_true", help="the preset's default efficiencies"
    )
    args = parser.parse_args(argv)
    if not (args.data / "requests.jsonl").is_file():
        print(f"skipped: no measured run at {args.data}", file=sys.stderr)
        return 0
    from hardware_models.errors import InfersimError
    from simulator.simulation import simulate

    args.out.mkdir(parents=True, exist_ok=True)
    measured = load_measured(args.data)
    try:
        calibrated = not args.uncalibrated
        scenario = scenario_for(args.data, measured, args.out, args.overrides, calibrated)
        results = simulate(scenario, progress=False)
    except InfersimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    simulated = results.requests
    table = compare(measured, simulated)
    table.to_csv(args.out / "comparison.csv", index=False)
    calibration = scenario.hardware.calibration or "none (uncalibrated)"
    print(f"RTX 4090, Llama-3.1-8B, vLLM 0.19.0, {len(measured)} requests; "
          f"calibration: {calibration}")  # fmt: skip
    print(f"simulated completed: {(simulated['outcome'] == 'completed').sum()}, "
          f"preemptions: {int(simulated['preemptions'].sum())}")  # fmt: skip
    print(table.to_string(index=False, float_format=lambda x: f"{x:,.3f}"))
    from simulator.metrics.plots import latency_cdfs

    figure = latency_cdfs({"measured": measured, "simulated": simulated})
    figure.savefig(args.out / "latency_cdfs.png", dpi=110)
    line = timeline(args.data, results)
    line.to_csv(args.out / "timeline.csv", index=False)
    plot_timeline(line).savefig(args.out / "timeline.png", dpi=110)
    prefill = int(results.steps["prefill_tokens"].sum())
    print(f"prefill tokens simulated: {prefill:,} for {int(measured['input_toks'].sum()):,} "
          "prompt tokens (the rest is recomputation after preemption)")  # fmt: skip
    early = before_cache_fills(args.data, measured, simulated)
    if early is not None:
        count, tick, m_s, s_s = early
        print(f"the {count} requests served before the KV cache first fills "
              f"(log: t = {tick:.0f} s) have their first tokens by {m_s:.2f} s measured, "
              f"{s_s:.2f} s simulated ({100 * (s_s - m_s) / m_s:+.1f}%)")  # fmt: skip
    m_ms, s_ms, ticks = decode_only_step_ms(line)
    print(f"decode step implied in the {ticks} ticks without prefill: measured {m_ms:.1f} ms, "
          f"simulated {s_ms:.1f} ms ({100 * (s_ms - m_ms) / m_ms:+.1f}%)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
