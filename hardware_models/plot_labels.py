"""Point labels that do not print over each other: each moves down a line at a time until
it overlaps no label placed before it (a greedy pass in display coordinates)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_MOVES = 40
LEADER = {"arrowstyle": "-", "lw": 0.4, "color": "0.55", "shrinkA": 0, "shrinkB": 2}
"""`arrowprops` for annotations: a thin line back to the point once a label has moved."""


def spread_labels(fig: Any, texts: Sequence[Any], step_points: float = 6.0) -> None:
    """Move the annotations `texts` of `fig` (offsets in points) apart; call it once the
    figure is laid out (titles, legends and limits set)."""
    if not texts:
        return
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    fig.draw_without_rendering()
    placed: list[Any] = []
    for text in texts:
        for _ in range(MAX_MOVES):
            box = Text.get_window_extent(text, renderer).expanded(1.05, 1.15)  # no leader
            if not any(box.overlaps(other) for other in placed):
                break
            dx, dy = text.xyann
            text.xyann = (dx, dy - step_points)
        placed.append(Text.get_window_extent(text, renderer))
