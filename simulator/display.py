"""A run's summary as HTML, so a notebook shows `Results` as tables rather than as text.

The numbers and their formatting are the terminal table's (`simulator.metrics.summary`),
so a run reads the same in a terminal and in Jupyter; only the layout differs: headline
figures on the left, the latency percentiles as a real table on the right.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from simulator.formatting import (
    busy_text,
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
)
from simulator.metrics.summary import PERCENTILES, cost_basis_text
from simulator.provenance import header_lines

_LATENCY_ROWS = ("ttft", "tpot", "itl", "e2e", "queueing")
_LATENCY_COLS = ("mean", *(f"p{q}" for q in PERCENTILES), "max")


def _row(cells: list[str], tag: str = "td") -> str:
    """A table row: the label cell left-aligned, numbers right-aligned (Jupyter's default)."""
    label, *numbers = cells
    rest = "".join(f"<{tag}>{cell}</{tag}>" for cell in numbers)
    return f'<tr><{tag} style="text-align:left">{label}</{tag}>{rest}</tr>'


def _headline(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    c, t, g = summary["counts"], summary["throughput"], summary["goodput"]
    u, kv, cost, e = summary["utilisation"], summary["kv"], summary["cost"], summary["energy"]
    front = summary.get("frontend")
    basis = cost_basis_text(cost)
    return [
        ("arrived / completed", f"{c['arrived']:,} / {c['completed']:,}"),
        ("rejected / failed / retried",
         f"{c['rejected']:,} / {c['failed']:,} / {c.get('retried', 0):,}"),
        ("in flight (queued, running)",
         f"{c['in_flight']:,} ({c['in_flight_queued']:,}, {c['in_flight_running']:,})"),
        ("throughput", f"{sig(t['requests_per_s'])} req/s"),
        ("steady-state throughput", f"{sig(t.get('steady_requests_per_s'))} req/s"),
        ("tokens/s in / out",
         f"{num(t['input_tokens_per_s'], ',.0f')} / {num(t['output_tokens_per_s'], ',.0f')}"),
        (f"goodput ({slo_text(g['slo'])})", goodput_rate_text(g)),
        ("arrived / completed within the SLO",
         f"{pct(g.get('fraction_of_arrived'))} / {pct(g['fraction'])}"),
        *([("front end", front_end_text(front))] if front is not None else []),
        # what a planner reads as headroom first; busy after, with what it means
        ("MFU / MBU", f"{pct(u['mfu'])} / {pct(u['mbu'])}"),
        ("KV mean / max", f"{pct(kv['mean_utilisation'])} / {pct(kv['max_utilisation'])}"),
        ("busy", busy_text(u["gpu_busy_fraction"]).removeprefix("busy ")),
        ("preemptions", preemption_text(kv)),
        ("cost", f"{usd(cost['usd_per_hour'])}/h, run {usd(cost['usd_total'])}"),
        (f"$ per request ({basis})", usd(cost["usd_per_request"])),
        (f"$ per 1M output tokens ({basis})", usd(cost["usd_per_million_output_tokens"])),
        ("energy: GPUs / facility (PUE)", f"{num(e.get('gpu_energy_kwh'), ',.3f')} / "
                   f"{num(e['energy_kwh'], ',.3f')} kWh"),
        (f"GPU J per output token ({cost_basis_text(e)})",
         num(e["joules_per_output_token"], ",.3g")),
    ]  # fmt: skip


def _breakdowns(summary: Mapping[str, Any]) -> list[str]:
    """Rows per priority class and per pool, when the run has several."""
    rows = []
    classes = summary.get("priority_classes", {})
    if classes:
        rows.append(_row(["class", "arrived", "completed", "meets SLO arrived / completed",
                          "TTFT p99 ms", "TPOT p99 ms", "E2E p99 ms"], "th"))  # fmt: skip
    for name, c in classes.items():
        rows.append(_row([escape(name), f"{c['arrived']:,}", f"{c['completed']:,}",
                          f"{pct(c['slo_fraction_of_arrived'])} / {pct(c['slo_fraction'])}",
                          ms(c["ttft"]["p99"]),
                          ms(c["tpot"]["p99"]), ms(c["e2e"]["p99"])]))  # fmt: skip
    pools = summary.get("per_pool", {})
    if pools:
        rows.append(_row(["pool", "replicas", "GPUs", "completed", "req/s", "out tok/s",
                          "busy"], "th"))  # fmt: skip
    for name, p in pools.items():
        rows.append(_row([f"{escape(name)} ({escape(p['gpu'])})", str(p["replicas"]),
                          str(p["gpus"]), f"{p['completed']:,}",
                          num(p["requests_per_s"], ",.2f"),
                          num(p["output_tokens_per_s"], ",.0f"),
                          pct(p["busy_fraction"])]))  # fmt: skip
    return rows


def summary_html(summary: Mapping[str, Any]) -> str:
    """HTML for `Results._repr_html_`: a caption, an overload warning when there is one,
    the headline figures, the latency percentiles (ms), and the priority classes and
    pools when there are several."""
    run = summary["run"]
    caption = (
        f"<b>{escape(str(run['scenario']))}</b> seed {run['seed']}, "
        f"{run['duration_s']:,.1f} s simulated, {escape(fleet_text(run))}"
    )
    parts = [f"<p>{caption}</p>"]
    if "configuration" in run:
        parts.append(f"<p>{'<br>'.join(escape(t) for t in header_lines(run['configuration']))}</p>")
    parts += [
        f'<p style="color:#8a5300"><b>Warning:</b> {escape(w)}</p>' for w in summary["warnings"]
    ]
    if summary["overloaded"]:
        reason = escape(str(summary["overload_reason"]))
        parts.append(f'<p style="color:#b00020"><b>Overloaded:</b> {reason}</p>')
    elif summary.get("overload_note"):
        parts.append(f"<p><b>Note:</b> {escape(summary['overload_note'])}</p>")
    parts += [
        f"<p><b>Calibration:</b> {escape(c)}</p>" for c in summary["run"].get("calibrations", [])
    ]
    parts += [f"<p><b>All-reduce:</b> {escape(a)}</p>" for a in run.get("all_reduce", [])]
    parts += [f"<p><b>MoE kernel:</b> {escape(m)}</p>" for m in run.get("moe_kernel", [])]
    headline = "".join(_row([escape(k), escape(v)]) for k, v in _headline(summary))
    latency = summary["latency"]
    lat_rows = [_row(["ms", *_LATENCY_COLS, "n"], "th")]
    lat_rows += [
        _row([name.upper(), *(ms(latency[name][col]) for col in _LATENCY_COLS),
              f"{latency[name]['count']:,}"])
        for name in _LATENCY_ROWS
    ]  # fmt: skip
    parts.append(
        '<div style="display:flex;gap:2em;align-items:flex-start">'
        f"<table>{headline}</table><table>{''.join(lat_rows)}</table></div>"
    )
    if breakdowns := _breakdowns(summary):
        parts.append(f"<table>{''.join(breakdowns)}</table>")
    return "\n".join(parts)
