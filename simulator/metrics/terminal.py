"""A run's summary as aligned text for a 100-column terminal: what ran (model, hardware,
layout, dtypes, policy, load), its warnings, then the figures, one topic a line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulator.formatting import (
    busy_text,
    engine_labels,
    fleet_text,
    front_end_text,
    goodput_rate_text,
    ms,
    num,
    pct,
    preemption_text,
    sig,
    slo_text,
    usd,
    wrapped,
)
from simulator.metrics.overload import TOO_SHORT
from simulator.metrics.summary import PERCENTILES, cost_basis_text
from simulator.provenance import header_lines

MAX_REPLICA_LINES = 8  # beyond this the table shows pools only; summary.json has them all
_LABEL = 12  # width of the topic column


def _latency_table(latency: Mapping[str, Any], rows: tuple[str, ...], indent: str) -> list[str]:
    cols = ("mean", *(f"p{q}" for q in PERCENTILES), "max")
    head = f"{indent}{'(ms)':<10}" + "".join(f"{c:>10}" for c in cols) + f"{'n':>13}"
    lines = [head]
    for name in rows:
        block = latency[name]
        cells = "".join(f"{ms(block[c]):>10}" for c in cols)
        lines.append(f"{indent}{name.upper():<10}{cells}{block['count']:>13,}")
    return lines


def _line(label: str, text: str) -> list[str]:
    return wrapped(text, f"{label:<{_LABEL}}")


def _header(summary: Mapping[str, Any]) -> list[str]:
    run = summary["run"]
    head = f"{run['scenario']}  seed {run['seed']}  {num(run['duration_s'])} s simulated"
    if "wall" in run:
        head += f"  [{run['wall']['seconds']:.2f} s wall]"
    if "configuration" in run:
        lines = [head]
        for text in header_lines(run["configuration"]):
            lines += wrapped(text, "  ", "    ")
        return lines
    return [f"{head}  {fleet_text(run)}"]


def _throughput(t: Mapping[str, Any]) -> list[str]:
    lines = _line(
        "throughput",
        f"{sig(t['requests_per_s'])} req/s  input {num(t['input_tokens_per_s'], ',.0f')} tok/s  "
        f"output {num(t['output_tokens_per_s'], ',.0f')} tok/s  (whole run)",
    )
    if t.get("steady_requests_per_s") is not None:
        lines += _line(
            "",
            f"{sig(t['steady_requests_per_s'])} req/s  output "
            f"{num(t['steady_output_tokens_per_s'], ',.0f')} tok/s  (steady state: 10%-90% "
            "of completions)",
        )
    return lines


def _cost(cost: Mapping[str, Any]) -> list[str]:
    """The price and the run's total, then per request and per token on their basis:
    steady state, or the whole run (with why) when the run had none."""
    basis = cost_basis_text(cost)
    lines = _line(
        "cost",
        f"{usd(cost['usd_per_hour'])}/h  run {usd(cost['usd_total'])} "
        f"({usd(cost.get('run_usd_per_million_output_tokens'))}/1M output tok, drain included)",
    )
    lines += _line(
        "",
        f"{usd(cost['usd_per_request'])}/request  "
        f"{usd(cost['usd_per_million_output_tokens'])}/1M output tok  "
        f"{usd(cost['usd_per_million_total_tokens'])}/1M tok  ({basis})",
    )
    if cost.get("note"):
        lines += _line("", cost["note"])
    return lines


def _kwh(x: float | None) -> str:
    """Four significant digits: a short run's few watt-hours are not '0.000'."""
    return sig(x, 4)


def _energy(e: Mapping[str, Any]) -> list[str]:
    """The GPUs' energy and power first (what ML.ENERGY and MLPerf Power measure), the
    facility's (x PUE) named as such; then per token and request on the cost's basis."""
    basis = cost_basis_text(e)
    hosts = e.get("host_energy_kwh")
    with_hosts = f" with hosts' {_kwh(hosts)} kWh" if hosts else ""
    lines = _line(
        "energy",
        f"GPUs {_kwh(e.get('gpu_energy_kwh'))} kWh, {num(e['average_power_w'], ',.0f')} "
        f"W/GPU (whole run)  facility {_kwh(e['energy_kwh'])} kWh at PUE {e['pue']:g}"
        f"{with_hosts}, {usd(e['usd_energy'])}",
    )
    # the power on the per-token figures' basis: the whole run's where it had no steady state
    steady = e.get("steady_power_w")
    power = e["average_power_w"] if steady is None else steady
    lines += _line(
        "",
        f"GPUs {sig(e['joules_per_output_token'])} J/output tok  "
        f"{sig(e.get('joules_per_request'))} J/request  "
        f"{num(power, ',.0f')} W/GPU  ({basis}; facility "
        f"{sig(e.get('facility_joules_per_output_token'))} J/output tok)",
    )
    if e.get("note"):
        lines += _line("", e["note"])
    return lines


def _goodput(g: Mapping[str, Any], c: Mapping[str, Any]) -> str:
    """Against the arrived requests first, so a failed, rejected or unfinished one counts
    as a miss; then against the completed ones, which is what latency percentiles see."""
    rest = ", ".join(
        f"{c[key]:,} {text}"
        for key, text in (
            ("rejected", "rejected"),
            ("failed", "failed"),
            ("in_flight", "in flight"),
        )
        if c[key]
    )
    return (
        f"{goodput_rate_text(g)} meet {slo_text(g['slo'])}: "
        f"{g['requests_meeting_slo']:,} of {c['arrived']:,} arrived "
        f"({pct(g.get('fraction_of_arrived'))}), {pct(g['fraction'])} of {c['completed']:,} "
        "completed" + (f"; {rest}" if rest else "")
    )


def summary_table(summary: Mapping[str, Any]) -> str:
    """A compact aligned text rendering of `summarize`'s dict for terminals and notebooks."""
    c, t = summary["counts"], summary["throughput"]
    g, u, kv = summary["goodput"], summary["utilisation"], summary["kv"]
    cost, e = summary["cost"], summary["energy"]
    prefix = summary.get("prefix_cache", {"hit_rate": None})
    lines = _header(summary)
    for calibration in summary["run"].get("calibrations", []):
        lines += wrapped(calibration, "  calibration ", "    ")
    for all_reduce in summary["run"].get("all_reduce", []):
        lines += wrapped(all_reduce, "  all-reduce  ", "    ")
    for moe_kernel in summary["run"].get("moe_kernel", []):
        lines += wrapped(moe_kernel, "  moe kernel  ", "    ")
    for warning in summary.get("warnings", []):
        lines += wrapped(warning, "warning: ", "  ")
    if summary["overloaded"]:
        lines += wrapped(f"*** OVERLOADED: {summary['overload_reason']} ***", "", "  ")
    elif summary.get("overload_verdict") == TOO_SHORT:
        lines += wrapped(summary["overload_note"], "note: ", "  ")
    rejected = ", ".join(f"{k} {v}" for k, v in c["rejected_by_reason"].items())
    bound = ", ".join(f"{k} {pct(v)}" for k, v in u["bound_share"].items() if v)
    hits = prefix["hit_rate"]
    lines += _line(
        "requests",
        f"arrived {c['arrived']:,}  completed {c['completed']:,}  rejected {c['rejected']:,}"
        f"{f' ({rejected})' if rejected else ''}  failed {c['failed']:,}  "
        f"retried {c.get('retried', 0):,}  in flight "
        f"{c['in_flight']:,} ({c['in_flight_queued']:,} queued, {c['in_flight_running']:,} "
        "running)",
    )
    lines += _throughput(t)
    lines.append("latency")
    lines += _latency_table(summary["latency"], ("ttft", "tpot", "itl", "e2e", "queueing"), "  ")
    lines += _line("goodput", _goodput(g, c))
    if (front := summary.get("frontend")) is not None:
        lines += _line("front end", front_end_text(front))
    lines += _line(
        "utilisation",
        f"MFU {pct(u['mfu'])} ({pct(u['mfu_busy'])} while busy)  "
        f"MBU {pct(u['mbu'])} ({pct(u['mbu_busy'])} while busy)",
    )
    lines += _line("", busy_text(u["gpu_busy_fraction"]))
    lines += _line("", f"bound by {bound or '-'} (share of busy time)")
    lines += _line(
        "kv cache",
        f"mean {pct(kv['mean_utilisation'])}  max {pct(kv['max_utilisation'])}  preemptions "
        f"{preemption_text(kv)}" + (f"  prefix hits {pct(hits)} of prompt tokens" if hits else ""),
    )
    lines += _cost(cost)
    lines += _energy(e)
    for name, block in summary.get("priority_classes", {}).items():
        lines.append(
            f"class {name}: arrived {block['arrived']:,}  completed {block['completed']:,}  "
            f"meets SLO {pct(block['slo_fraction_of_arrived'])} of arrived, "
            f"{pct(block['slo_fraction'])} of completed"
        )
        lines += _latency_table(block, ("ttft", "tpot", "e2e"), "  ")
    for name, p in summary.get("per_pool", {}).items():
        lines.append(
            f"pool {name:<10} {p['replicas']} x {p['gpus'] // p['replicas']} x {p['gpu']}  "
            f"completed {p['completed']:,}  {sig(p['requests_per_s'])} req/s  "
            f"{num(p['output_tokens_per_s'], ',.0f')} tok/s  busy {pct(p['busy_fraction'])}"
            f"  {num(p.get('average_power_w'), ',.0f')} W/GPU"
        )
    replicas = summary.get("per_replica", [])
    shown = replicas if len(replicas) <= MAX_REPLICA_LINES else []
    labels = engine_labels([r.get("dp_rank") for r in shown])
    width = max([11, *map(len, labels)])  # `replica 12 ` as it was before dp ranks
    for r, label in zip(shown, labels, strict=True):
        lines.append(
            f"{label:<{width}} {r['gpus']} x {r['gpu']}  completed {r['completed']:,}  "
            f"{sig(r['requests_per_s'])} req/s  "
            f"{num(r['output_tokens_per_s'], ',.0f')} tok/s  busy {pct(r['busy_fraction'])}"
            f"  {num(r.get('average_power_w'), ',.0f')} W/GPU"
        )
    return "\n".join(lines)
