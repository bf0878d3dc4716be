"""A run's summary as aligned text for a 100-column terminal: what ran (model, hardware,
layout, dtypes, policy, load), its warnings, then the figures, one topic a line. The rows
(`notes`, `summary_rows`, `breakdown_rows`) are built here once; `simulator.display` lays
the same rows out as HTML for a notebook."""

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
from simulator.metrics.summary import PERCENTILES, cost_basis_text
from simulator.provenance import header_lines

MAX_REPLICA_LINES = 8  # beyond this the table shows pools only; summary.json has them all
_LABEL = 12  # width of the topic column
LATENCY_COLS = ("mean", *(f"p{q}" for q in PERCENTILES), "max")
LATENCY_ROWS = ("ttft", "tpot", "itl", "e2e", "queueing")
CLASS_LATENCY_ROWS = ("ttft", "tpot", "e2e")
LATENCY_BEFORE = "goodput"  # the summary row the latency table goes before


def _latency_table(latency: Mapping[str, Any], rows: tuple[str, ...], indent: str) -> list[str]:
    head = f"{indent}{'(ms)':<10}" + "".join(f"{c:>10}" for c in LATENCY_COLS) + f"{'n':>13}"
    lines = [head]
    for name in rows:
        block = latency[name]
        cells = "".join(f"{ms(block[c]):>10}" for c in LATENCY_COLS)
        lines.append(f"{indent}{name.upper():<10}{cells}{block['count']:>13,}")
    return lines


Row = tuple[str, str]  # (topic, text); a continuation line has an empty topic


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


def _throughput(t: Mapping[str, Any]) -> list[Row]:
    rows = [
        (
            "throughput",
            f"{sig(t['requests_per_s'])} req/s  input {num(t['input_tokens_per_s'], ',.0f')} "
            f"tok/s  output {num(t['output_tokens_per_s'], ',.0f')} tok/s  (whole run)",
        )
    ]
    if t.get("steady_requests_per_s") is not None:
        rows.append(
            (
                "",
                f"{sig(t['steady_requests_per_s'])} req/s  output "
                f"{num(t['steady_output_tokens_per_s'], ',.0f')} tok/s  (steady state: "
                "10%-90% of completions)",
            )
        )
    return rows


def _cost(cost: Mapping[str, Any]) -> list[Row]:
    """The price and the run's total, then per request and per token on their basis:
    steady state, or the whole run (with why) when the run had none."""
    basis = cost_basis_text(cost)
    rows = [
        (
            "cost",
            f"{usd(cost['usd_per_hour'])}/h  run {usd(cost['usd_total'])} "
            f"({usd(cost.get('run_usd_per_million_output_tokens'))}/1M output tok, drain "
            "included)",
        ),
        (
            "",
            f"{usd(cost['usd_per_request'])}/request  "
            f"{usd(cost['usd_per_million_output_tokens'])}/1M output tok  "
            f"{usd(cost['usd_per_million_total_tokens'])}/1M tok  ({basis})",
        ),
    ]
    return rows + ([("", cost["note"])] if cost.get("note") else [])


def _kwh(x: float | None) -> str:
    """Four significant digits: a short run's few watt-hours are not '0.000'."""
    return sig(x, 4)


def _energy(e: Mapping[str, Any]) -> list[Row]:
    """The GPUs' energy and power first (what ML.ENERGY and MLPerf Power measure), the
    facility's (x PUE) named as such; then per token and request on the cost's basis."""
    basis = cost_basis_text(e)
    hosts = e.get("host_energy_kwh")
    with_hosts = f" with hosts' {_kwh(hosts)} kWh" if hosts else ""
    rows = [
        (
            "energy",
            f"GPUs {_kwh(e.get('gpu_energy_kwh'))} kWh, {num(e['average_power_w'], ',.0f')} "
            f"W/GPU (whole run)  facility {_kwh(e['energy_kwh'])} kWh at PUE {e['pue']:g}"
            f"{with_hosts}, {usd(e['usd_energy'])}",
        )
    ]
    # the power on the per-token figures' basis: the whole run's where it had no steady state
    steady = e.get("steady_power_w")
    power = e["average_power_w"] if steady is None else steady
    rows.append(
        (
            "",
            f"GPUs {sig(e['joules_per_output_token'])} J/output tok  "
            f"{sig(e.get('joules_per_request'))} J/request  "
            f"{num(power, ',.0f')} W/GPU  ({basis}; facility "
            f"{sig(e.get('facility_joules_per_output_token'))} J/output tok)",
        )
    )
    return rows + ([("", e["note"])] if e.get("note") else [])


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


def notes(summary: Mapping[str, Any]) -> list[Row]:
    """What the figures rest on and what to doubt in them, shown before them: the
    calibration, all-reduce and MoE kernel the cost model chose, the warnings, and the
    overload verdict (or why the run was too short to judge)."""
    run = summary["run"]
    rows = [("calibration", text) for text in run.get("calibrations", [])]
    rows += [("all-reduce", text) for text in run.get("all_reduce", [])]
    rows += [("moe kernel", text) for text in run.get("moe_kernel", [])]
    rows += [("warning", text) for text in summary.get("warnings", [])]
    if summary["overloaded"]:
        rows.append(("overloaded", str(summary["overload_reason"])))
    elif summary.get("overload_note"):  # set only where the verdict is too short to judge
        rows.append(("note", summary["overload_note"]))
    return rows


def summary_rows(summary: Mapping[str, Any]) -> list[Row]:
    """The run's figures, one (topic, text) pair a line: the rows the terminal table and the
    notebook's HTML (`simulator.display`) both show, so the two cannot drift apart. The
    latency percentiles go before `goodput` (`LATENCY_BEFORE`) as a table of their own."""
    c, t = summary["counts"], summary["throughput"]
    g, u, kv = summary["goodput"], summary["utilisation"], summary["kv"]
    hits = summary.get("prefix_cache", {"hit_rate": None})["hit_rate"]
    rejected = ", ".join(f"{k} {v}" for k, v in c["rejected_by_reason"].items())
    bound = ", ".join(f"{k} {pct(v)}" for k, v in u["bound_share"].items() if v)
    front = summary.get("frontend")
    return [
        (
            "requests",
            f"arrived {c['arrived']:,}  completed {c['completed']:,}  rejected "
            f"{c['rejected']:,}{f' ({rejected})' if rejected else ''}  failed {c['failed']:,}  "
            f"retried {c.get('retried', 0):,}  in flight {c['in_flight']:,} "
            f"({c['in_flight_queued']:,} queued, {c['in_flight_running']:,} running)",
        ),
        *_throughput(t),
        (LATENCY_BEFORE, _goodput(g, c)),
        *([("front end", front_end_text(front))] if front is not None else []),
        (
            "utilisation",
            f"MFU {pct(u['mfu'])} ({pct(u['mfu_busy'])} while busy)  "
            f"MBU {pct(u['mbu'])} ({pct(u['mbu_busy'])} while busy)",
        ),
        ("", busy_text(u["gpu_busy_fraction"])),
        ("", f"bound by {bound or '-'} (share of busy time)"),
        (
            "kv cache",
            f"mean {pct(kv['mean_utilisation'])}  max {pct(kv['max_utilisation'])}  "
            f"preemptions {preemption_text(kv)}"
            + (f"  prefix hits {pct(hits)} of prompt tokens" if hits else ""),
        ),
        *_cost(summary["cost"]),
        *_energy(summary["energy"]),
    ]


def breakdown_rows(summary: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any] | None]]:
    """(topic, text, the latency block or None) per priority class, per pool, and per
    engine while there are at most `MAX_REPLICA_LINES` (summary.json has them all)."""
    rows: list[tuple[str, str, Mapping[str, Any] | None]] = [
        (
            f"class {name}",
            f"arrived {block['arrived']:,}  completed {block['completed']:,}  meets SLO "
            f"{pct(block['slo_fraction_of_arrived'])} of arrived, "
            f"{pct(block['slo_fraction'])} of completed",
            block,
        )
        for name, block in summary.get("priority_classes", {}).items()
    ]
    rows += [
        (
            f"pool {name}",
            f"{p['replicas']} x {p['gpus'] // p['replicas']} x {p['gpu']}  "
            f"{_engine_text(p)}  busy {pct(p['busy_fraction'])}  "
            f"{num(p.get('average_power_w'), ',.0f')} W/GPU",
            None,
        )
        for name, p in summary.get("per_pool", {}).items()
    ]
    replicas = summary.get("per_replica", [])
    shown = replicas if len(replicas) <= MAX_REPLICA_LINES else []
    labels = engine_labels([r.get("dp_rank") for r in shown])
    rows += [
        (
            label,
            f"{r['gpus']} x {r['gpu']}  {_engine_text(r)}  busy {pct(r['busy_fraction'])}  "
            f"{num(r.get('average_power_w'), ',.0f')} W/GPU",
            None,
        )
        for r, label in zip(shown, labels, strict=True)
    ]
    return rows


def _engine_text(block: Mapping[str, Any]) -> str:
    return (
        f"completed {block['completed']:,}  {sig(block['requests_per_s'])} req/s  "
        f"{num(block['output_tokens_per_s'], ',.0f')} tok/s"
    )


_NOTE_PREFIX = {  # (first line, continuation) per note topic
    "calibration": ("  calibration ", "    "),
    "all-reduce": ("  all-reduce  ", "    "),
    "moe kernel": ("  moe kernel  ", "    "),
    "warning": ("warning: ", "  "),
    "note": ("note: ", "  "),
}


def summary_table(summary: Mapping[str, Any]) -> str:
    """A compact aligned text rendering of `summarize`'s dict for terminals and notebooks."""
    lines = _header(summary)
    for topic, text in notes(summary):
        if topic == "overloaded":
            lines += wrapped(f"*** OVERLOADED: {text} ***", "", "  ")
        else:
            lines += wrapped(text, *_NOTE_PREFIX[topic])
    rows = summary_rows(summary)
    at = [topic for topic, _ in rows].index(LATENCY_BEFORE)
    for topic, text in rows[:at]:
        lines += _line(topic, text)
    lines.append("latency")
    lines += _latency_table(summary["latency"], LATENCY_ROWS, "  ")
    for topic, text in rows[at:]:
        lines += _line(topic, text)
    breakdowns = breakdown_rows(summary)
    width = max([11, *(len(topic) for topic, _, _ in breakdowns)])  # `replica 12 `
    for topic, text, latency in breakdowns:
        lines.append(f"{topic:<{width}} {text}")
        if latency is not None:
            lines += _latency_table(latency, CLASS_LATENCY_ROWS, "  ")
    return "\n".join(lines)
