"""`infersim plan`: the cheapest cluster that meets the SLOs, ranked."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hardware_models.errors import InfersimError
from simulator.cli.options import add_overrides
from simulator.cli.outputs import results_folder
from simulator.cli.sweep_cmd import add_executor_flags, connect
from simulator.formatting import WIDTH, sig, wrapped
from simulator.metrics.headline import labelled

if TYPE_CHECKING:
    import pandas as pd

    from simulator.scenario import Scenario


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.add_argument("scenario", type=Path, help="scenario YAML with a `plan:` section")
    parser.add_argument(
        "-o", "--output", type=Path, help="folder for plan.csv, plan.json and plots"
    )
    add_overrides(parser)
    add_executor_flags(parser, "candidates")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing plan")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from simulator.planner import PROBE_LENGTH
    from simulator.scenario import Scenario
    from simulator.workload.config import NO_STOP_CONDITION

    try:
        scenario = Scenario.from_yaml(args.scenario, args.overrides)
    except InfersimError as exc:  # a plan needs one only as the scenario does: say which works
        if NO_STOP_CONDITION not in str(exc):
            raise
        raise InfersimError(
            f"{exc}; in the file or as --set workload.num_requests=N: {PROBE_LENGTH}"
        ) from None
    name = f"plan-{scenario.name}"
    with results_folder(args.output, name, args.overwrite) as outdir:
        return _plan(args, scenario, outdir)


def _plan(args: argparse.Namespace, scenario: Scenario, outdir: Path) -> int:
    """Plan, print the table and write plan.csv and pareto.png to `outdir`."""
    from simulator.planner import (
        FEASIBLE,
        WHOLE_TRACE,
        candidates,
        pareto_figure,
        plan_capacity,
        planned_rate,
    )

    if scenario.plan and not args.quiet:  # a plan runs for minutes: say so before it starts
        n = len(candidates(scenario.plan))
        print(f"planning {n} candidate{'s' if n != 1 else ''} (GPU x tp x pp x policy) of "
              f"{scenario.name}", file=sys.stderr)  # fmt: skip
    with connect(args) as client:
        table = plan_capacity(
            scenario, workers=args.workers, client=client, progress=not args.quiet
        )
    plan = scenario.plan
    pct = plan.percentile
    split = ["prefill_replicas", "decode_replicas"] if plan.disaggregation else []
    ep = ["ep"] if scenario.parallelism.enable_expert_parallel else []
    shown = ["rank", "gpu", "tp", "pp", "dp", *ep, "policy", "max_num_seqs",
             "max_num_batched_tokens", "layout", "replicas", *split, "gpus",
             "usd_per_hour", "usd_per_million_output_tokens", f"ttft_{pct}_ms",
             f"tpot_{pct}_ms", "steady_goodput_requests_per_s", "joules_per_output_token",
             "calibration", "status", "see"]  # fmt: skip
    rate = planned_rate(scenario)
    head = (f"Plan for {scenario.model.name}: {sig(rate)} req/s, verified at "
            f"{sig(rate * (1 + plan.headroom))} req/s (+{plan.headroom:.0%} headroom), SLO at "
            f"{pct}; latencies, goodput and GPU J per output token at the verified rate, $ "
            f"per 1M output tokens at the planned {sig(rate)} req/s")  # fmt: skip
    print("\n".join(wrapped(head, "", "  ")))
    _print_table(table, shown)
    table.to_csv(outdir / "plan.csv", index=False)
    _write_provenance(scenario, outdir / "plan.json")
    pareto_figure(
        table,
        pct,
        title=scenario.name,
        slo_ms={"ttft": scenario.slo.ttft_ms, "tpot": scenario.slo.tpot_ms},
    ).savefig(outdir / "pareto.png", dpi=110)
    print(f"\nwrote plan.csv, plan.json and pareto.png to {outdir}/", file=sys.stderr)
    if not table["status"].isin(FEASIBLE).any():
        print("infersim: no candidate meets the SLOs (see the footnotes above)", file=sys.stderr)
        return 1
    if not (table["status"] == "ok").any():
        whole = table["note"].fillna("").str.contains(WHOLE_TRACE, regex=False).any()
        longer = "replay a longer trace" if whole else "raise plan.requests_per_probe"
        print("infersim: no candidate was verified: every feasible one's probe was too short "
              f"to judge overload (see the footnotes); {longer}", file=sys.stderr)  # fmt: skip
    return 0


def _write_provenance(scenario: Scenario, path: Path) -> None:
    """plan.json: what plan.csv came from, as a run's summary.json records it (its build,
    --set overrides, the files it read with their sha256, the resolved scenario)."""
    from simulator.provenance import origin

    data = {"provenance": {**origin(scenario), "scenario": scenario.model_dump(mode="json")}}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _footnotes(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Each row's reason and note as a numbered footnote under the table (they run to
    hundreds of characters, which would push the rows apart): the `see` column's marks
    and the footnotes' lines, wrapped."""
    marks, lines = [], []
    for _, row in table.iterrows():
        text = "; ".join(str(row[c]) for c in ("reason", "note") if not _blank(row.get(c)))
        if not text:
            marks.append("")
            continue
        mark = f"[{sum(map(bool, marks)) + 1}]"
        marks.append(mark)
        rank = "" if _blank(row.get("rank")) else f"rank {row['rank']} "
        pp = f" pp{row['pp']}" if row["pp"] > 1 else ""
        head = f"{mark} {rank}{row['gpu']} tp{row['tp']}{pp} {row['layout']} ({row['status']}): "
        lines += wrapped(text, head, " " * (len(mark) + 1))
    return marks, lines


def _calibration_note(table: pd.DataFrame) -> str:
    """What the ranking rests on where a ranked GPU was not priced on its own measured
    kernels (planner.calibration_source): a transferred profile or the datasheet's
    efficiencies, ranked against fitted GPUs or among themselves; '' when all are fitted."""
    from simulator.planner import FEASIBLE, FITTED

    ranked = table[table["status"].isin(FEASIBLE)]
    sources = dict(zip(ranked["gpu"], ranked["calibration"], strict=True))
    unmeasured = [f"{gpu} ({source})" for gpu, source in sources.items() if source != FITTED]
    if not unmeasured:
        return ""
    fitted = [gpu for gpu, source in sources.items() if source == FITTED]
    against = (
        f"ranked here against {' and '.join(fitted)}, priced on its own measured kernels"
        if fitted
        else "and no GPU here is priced on its own measured kernels"
    )
    return (
        f"calibration: {' and '.join(unmeasured)} priced without kernels measured on the GPU "
        "('from': a profile fitted on another chip; 'datasheet': the spec sheet's "
        f"efficiencies), so their rows are estimates, {against}"
    )


def _blank(value: object) -> bool:
    import pandas as pd

    return value is None or bool(pd.isna(value)) or value == ""


def _print_table(table: pd.DataFrame, shown: list[str]) -> None:
    """The plan table under the headers compare and sweep print (metrics.headline.labelled),
    '-' for what a row lacks (an infeasible row's counts), reasons and notes as
    footnotes, and what `unverified` means where a row is."""
    marks, lines = _footnotes(table)
    view = table.assign(see=marks)
    view = view[[c for c in shown if c in view]]
    for name in view:
        if str(view[name].dtype) == "Int64":
            view[name] = view[name].astype(object).where(view[name].notna(), "-")
    view = labelled(view)
    print(view.to_string(index=False, float_format=sig, na_rep="-", line_width=WIDTH))
    if (table["status"] == "unverified").any():
        print("unverified: met the SLOs, but its probe was too short to judge overload")
    if note := _calibration_note(table):
        print("\n".join(wrapped(note, "", "  ")))
    if lines:
        print()
        print("\n".join(lines))
