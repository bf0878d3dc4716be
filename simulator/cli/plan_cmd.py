"""`infersim plan`: the cheapest cluster that meets the SLOs, ranked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hardware_models.errors import InfersimError
from simulator.cli.options import add_overrides
from simulator.cli.sweep_cmd import add_executor_flags, connect
from simulator.formatting import WIDTH, sig


def register(parser: argparse.ArgumentParser) -> None:
    """Arguments and handler of the subcommand (its one-line help is in cli/main.py)."""
    parser.add_argument("scenario", type=Path, help="scenario YAML with a `plan:` section")
    parser.add_argument("-o", "--output", type=Path, help="folder for plan.csv and plots")
    add_overrides(parser)
    add_executor_flags(parser, "candidates", "; 1 runs them in this process")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing plan")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from simulator.cli.run_cmd import free_results_dir
    from simulator.planner import (
        FEASIBLE,
        WHOLE_TRACE,
        candidates,
        pareto_figure,
        plan_capacity,
        planned_rate,
    )
    from simulator.scenario import Scenario

    scenario = Scenario.from_yaml(args.scenario, args.overrides)
    outdir = args.output or free_results_dir(f"plan-{scenario.name}")
    if outdir.exists() and any(outdir.iterdir()) and not args.overwrite:
        raise InfersimError(f"{outdir} already has results; pass --overwrite or another -o")
    if scenario.plan and not args.quiet:  # a plan runs for minutes: say so before it starts
        print(f"planning {len(candidates(scenario.plan))} candidates (GPU x tp x pp x policy)"
              f" of {scenario.name}", file=sys.stderr)  # fmt: skip
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
             f"tpot_{pct}_ms", "status", "reason", "note"]  # fmt: skip
    rate = planned_rate(scenario)
    print(f"Plan for {scenario.model.name}: {sig(rate)} req/s, verified at "
          f"{sig(rate * (1 + plan.headroom))} req/s (+{plan.headroom:.0%} headroom), SLO at "
          f"{pct}; latencies at the verified rate, $ per 1M output tokens at the planned "
          f"{sig(rate)} req/s")  # fmt: skip
    print(table[[c for c in shown if c in table]].to_string(
        index=False, float_format=sig, na_rep="-", line_width=WIDTH))  # fmt: skip
    outdir.mkdir(parents=True, exist_ok=True)
    table.to_csv(outdir / "plan.csv", index=False)
    pareto_figure(
        table,
        pct,
        title=scenario.name,
        slo_ms={"ttft": scenario.slo.ttft_ms, "tpot": scenario.slo.tpot_ms},
    ).savefig(outdir / "pareto.png", dpi=110)
    print(f"\nwrote plan.csv and pareto.png to {outdir}/", file=sys.stderr)
    if not table["status"].isin(FEASIBLE).any():
        print("infersim: no candidate meets the SLOs (see the reasons above)", file=sys.stderr)
        return 1
    if not (table["status"] == "ok").any():
        whole = table["note"].fillna("").str.contains(WHOLE_TRACE, regex=False).any()
        longer = "replay a longer trace" if whole else "raise plan.requests_per_probe"
        print("infersim: no candidate was verified: every feasible one's probe was too short "
              f"to judge overload (see the notes); {longer}", file=sys.stderr)  # fmt: skip
    return 0
