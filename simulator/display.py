"""A run's summary as HTML, so a notebook shows `Results` as tables rather than as text.

The rows are the terminal table's (`simulator.metrics.terminal`: `notes`, `summary_rows`,
`breakdown_rows`), built by the same functions, so a run reads the same in a terminal and
in Jupyter; only the layout differs: the figures on the left, the latency percentiles as
a real table on the right, the breakdowns below.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from simulator.formatting import fleet_text, ms
from simulator.metrics.terminal import (
    CLASS_LATENCY_ROWS,
    LATENCY_COLS,
    LATENCY_ROWS,
    breakdown_rows,
    notes,
    summary_rows,
)
from simulator.provenance import header_lines


def _row(cells: list[str], tag: str = "td") -> str:
    """A table row: the label cell left-aligned, numbers right-aligned (Jupyter's default)."""
    label, *numbers = cells
    rest = "".join(f"<{tag}>{cell}</{tag}>" for cell in numbers)
    return f'<tr><{tag} style="text-align:left">{label}</{tag}>{rest}</tr>'


def _latency_rows(latency: Mapping[str, Any], names: tuple[str, ...]) -> list[str]:
    rows = [_row(["ms", *LATENCY_COLS, "n"], "th")]
    rows += [
        _row([name.upper(), *(ms(latency[name][col]) for col in LATENCY_COLS),
              f"{latency[name]['count']:,}"])
        for name in names
    ]  # fmt: skip
    return rows


def _breakdowns(summary: Mapping[str, Any]) -> list[str]:
    """The terminal's rows per priority class, per pool and per engine, then each class's
    latency percentiles as a table of their own."""
    rows = breakdown_rows(summary)
    if not rows:
        return []
    parts = ["<table>" + "".join(_row([escape(t), escape(x)]) for t, x, _ in rows) + "</table>"]
    parts += [
        f"<table><caption>{escape(topic)} (ms)</caption>"
        f"{''.join(_latency_rows(latency, CLASS_LATENCY_ROWS))}</table>"
        for topic, _, latency in rows
        if latency is not None
    ]
    return parts


_NOTE_STYLE = {"warning": ' style="color:#8a5300"', "overloaded": ' style="color:#b00020"'}


def summary_html(summary: Mapping[str, Any]) -> str:
    """HTML for `Results._repr_html_`: a caption and what ran, the notes (calibration,
    kernels, warnings, the overload verdict), the figures beside the latency percentiles
    (ms), then the priority classes, pools and engines when there are several."""
    run = summary["run"]
    caption = (
        f"<b>{escape(str(run['scenario']))}</b> seed {run['seed']}, "
        f"{run['duration_s']:,.1f} s simulated, {escape(fleet_text(run))}"
    )
    parts = [f"<p>{caption}</p>"]
    if "configuration" in run:
        parts.append(f"<p>{'<br>'.join(escape(t) for t in header_lines(run['configuration']))}</p>")
    parts += [
        f"<p{_NOTE_STYLE.get(topic, '')}><b>{escape(topic.capitalize())}:</b> {escape(text)}</p>"
        for topic, text in notes(summary)
    ]
    figures = "".join(_row([escape(topic), escape(text)]) for topic, text in summary_rows(summary))
    parts.append(
        '<div style="display:flex;gap:2em;align-items:flex-start">'
        f"<table>{figures}</table>"
        f"<table>{''.join(_latency_rows(summary['latency'], LATENCY_ROWS))}</table></div>"
    )
    parts += _breakdowns(summary)
    return "\n".join(parts)
