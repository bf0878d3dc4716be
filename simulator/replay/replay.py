"""Replay a measured run through the simulator and compare, figure by figure."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from hardware_models.errors import InfersimError
from simulator.provenance import pinned
from simulator.replay.bench_json import read_bench_json
from simulator.replay.config import ReplayOptions, replay_scenario
from simulator.replay.measured import MeasuredRun
from simulator.replay.plots import replay_cdfs, timeline_figure
from simulator.replay.run_folder import read_run_folder
from simulator.replay.versus_measured import (
    before_cache_fills,
    decode_only_step,
    latency_table,
    timeline,
)
from simulator.results import Results
from simulator.scenario import Scenario
from simulator.simulation import run_simulation, warnings_passed_on_once


def read_run(path: Path) -> MeasuredRun:
    """A run folder (meta.json, requests.jsonl, optional timeseries.csv) or a vLLM bench
    serve JSON."""
    if path.is_dir():
        return read_run_folder(path)
    if path.is_file() and path.suffix.lower() == ".json":
        return read_bench_json(path)
    if not path.exists():
        raise InfersimError(f"{path}: no such file or folder")
    raise InfersimError(
        f"{path}: not a run folder (meta.json, requests.jsonl) or a vLLM bench serve .json"
    )


@dataclass(frozen=True)
class Replay:
    """A measured run, the scenario replaying it, and the comparison."""

    run: MeasuredRun
    scenario: Scenario
    results: Results
    notes: tuple[str, ...]
    table: list[dict[str, Any]]
    timeline: pd.DataFrame | None
    decode_step: dict[str, float] | None
    before_cache_fills: dict[str, float] | None

    def to_dict(self) -> dict[str, Any]:
        """Everything replay.json holds; floats as computed (None where not measured). The
        scenario's trace is named from replay.json's folder, which `write` shares with it,
        so the file holds no folder the replay ran in."""
        requests = self.results.requests
        scenario = self.scenario.model_dump(mode="json")
        arrivals = scenario["workload"]["arrivals"]
        arrivals["path"] = Path(arrivals["path"]).name
        return {
            "source": str(self.run.source),
            "kind": self.run.kind,
            "gpu": self.scenario.hardware.gpu,
            "node": self.scenario.hardware.node,
            "calibration": self.scenario.hardware.calibration,
            "model": self.scenario.model.name,
            "notes": list(self.notes),
            "requests": len(self.run.requests),
            "simulated_completed": int((requests["outcome"] == "completed").sum()),
            "preemptions": int(requests["preemptions"].sum()),
            "kv_blocks_simulated": int(self.results.context.replicas[0].kv_total_blocks),
            "prefill_tokens_simulated": int(self.results.steps["prefill_tokens"].sum()),
            "prompt_tokens": int(self.run.requests["prompt"].sum()),
            "latency": self.table,
            "decode_only_step": self.decode_step,
            "before_cache_fills": self.before_cache_fills,
            "scenario": scenario,
            "provenance": self._provenance(),
        }

    def _provenance(self) -> dict[str, Any]:
        """The simulation's provenance (build_id, overrides, the links it priced, the files
        it read: the trace named from replay.json's folder, as in `scenario`) with the
        measured run's files, each pinned by its sha256: an edited run shows."""
        ran = self.results.context.provenance
        kept = ("infersim_version", "build_id", "overrides", "links")
        trace = "workload.arrivals.path"
        inputs = [pinned("run", path, str(path)) for path in self.run.files]
        inputs += [{**r, "path": Path(r["path"]).name} if r["field"] == trace else r
                   for r in ran.get("inputs", ())]  # fmt: skip
        return {**{key: ran[key] for key in kept if key in ran}, "inputs": inputs}

    def write(self, outdir: Path, *, plots: bool = True) -> list[Path]:
        """replay.json, timeline.csv and the plots, next to the trace.csv `replay` wrote."""
        outdir.mkdir(parents=True, exist_ok=True)
        written = [outdir / "trace.csv"]
        path = outdir / "replay.json"
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        written.append(path)
        if self.timeline is not None:
            self.timeline.to_csv(outdir / "timeline.csv", index=False)
            written.append(outdir / "timeline.csv")
        if plots:
            replay_cdfs(self.run, self.results).savefig(outdir / "latency_cdfs.png", dpi=110)
            written.append(outdir / "latency_cdfs.png")
            if self.timeline is not None:
                timeline_figure(self.timeline).savefig(outdir / "timeline.png", dpi=110)
                written.append(outdir / "timeline.png")
        return written


def replay(
    run: MeasuredRun, outdir: Path, options: ReplayOptions, *, progress: bool = False
) -> Replay:
    """Simulate `run` (its trace written to outdir/trace.csv) and compare."""
    outdir.mkdir(parents=True, exist_ok=True)
    with warnings_passed_on_once():  # a build refused at the model's context raised them too
        built, notes = replay_scenario(run, outdir / "trace.csv", options)
        results = run_simulation(built, progress=progress)
    scenario = built.scenario
    outcomes = results.requests["outcome"].value_counts()
    if outcomes.get("completed", 0) < len(results.requests):
        counts = ", ".join(
            f"{n} {name}" for name, n in outcomes.items() if n and name != "completed"
        )
        if not outcomes.get("completed", 0):
            reasons = results.requests["reason"].dropna().value_counts()
            why = ", ".join(f"{n} {reason}" for reason, n in reasons.items()) or counts
            raise InfersimError(
                f"the replay served none of the run's {len(results.requests)} requests "
                f"({why}): the settings it replays with cannot serve this run, so there "
                "is nothing to compare"
            )
        notes.append(f"not every request completed in the simulation ({counts}): the "
                     "simulated figures leave those out")  # fmt: skip
    line = early = step = None
    if run.timeline is not None:
        line = timeline(run.timeline, results)
        step = decode_only_step(line)
        early = before_cache_fills(run, run.timeline, results)
    else:
        notes.append("no engine log (timeseries.csv): no timeline and no decode-step check")
    return Replay(
        run=run,
        scenario=scenario,
        results=results,
        notes=(*run.notes, *notes),
        table=latency_table(run, results),
        timeline=line,
        decode_step=step,
        before_cache_fills=early,
    )


def _fmt(value: float | None, spec: str) -> str:
    """`value` in `spec`, or a dash as wide where the figure is missing."""
    if value is None or not math.isfinite(value):
        return "-".rjust(int(spec.split(",")[0].split(".")[0].lstrip("+")))
    return format(value, spec)


def report_text(result: Replay) -> str:
    """The terminal report: what was replayed, the notes, the table, the checks."""
    data = result.to_dict()
    lines = [
        f"{data['kind']} {data['source']}: {data['requests']} requests, {data['model']} on "
        f"{data['gpu']}, calibration: {data['calibration'] or 'none (uncalibrated)'}",
        *(f"  {note}" for note in result.notes),
        f"simulated completed: {data['simulated_completed']}, preemptions: {data['preemptions']}, "
        f"KV cache: {data['kv_blocks_simulated']:,} blocks per replica",
        f"{'metric':>6} {'stat':>4} {'measured_s':>11} {'simulated_s':>11} {'error_%':>8}",
    ]
    for row in result.table:
        lines.append(
            f"{row['metric']:>6} {row['stat']:>4} {_fmt(row['measured_s'], '11,.4f')} "
            f"{_fmt(row['simulated_s'], '11,.4f')} {_fmt(row['error_pct'], '+8.2f')}"
        )
    lines.append(
        f"prefill tokens simulated: {data['prefill_tokens_simulated']:,} for "
        f"{data['prompt_tokens']:,} prompt tokens (the rest is recomputation after preemption)"
    )
    if (early := result.before_cache_fills) is not None:
        left_out = early["not_simulated"]
        lines.append(
            f"the {early['requests']} requests served before the KV cache first fills "
            f"(log: t = {early['tick_s']:.0f} s) have their first tokens by "
            f"{early['measured_s']:.2f} s measured, {early['simulated_s']:.2f} s simulated "
            f"({early['error_pct']:+.1f}%)"
            + (f"; {left_out} more not served by the simulation, left out" if left_out else "")
        )
    if (step := result.decode_step) is not None:
        lines.append(
            f"decode step implied in the {step['ticks']} ticks without prefill: measured "
            f"{step['measured_ms']:.1f} ms, simulated {step['simulated_ms']:.1f} ms "
            f"({step['error_pct']:+.1f}%)"
        )
    return "\n".join(lines)
