"""A progress bar for long runs that costs nothing per request when it is not shown."""

from __future__ import annotations

import sys
from typing import Any

# Seconds between redraws in a notebook, where each redraw is a message to the browser.
NOTEBOOK_INTERVAL_S = 0.5


def _in_notebook(stream: Any) -> bool:
    """True where `stream` is a Jupyter kernel's output (ipykernel's OutStream), which
    the notebook renders with carriage returns applied: a bar redrawn in place."""
    return type(stream).__module__.startswith("ipykernel.")


def bar_options(enabled: bool) -> dict[str, Any] | None:
    """tqdm's keywords for a bar on stderr where one can be seen: a terminal, or a
    notebook (throttled, one line updated in place, no new dependency); None elsewhere
    (a log file, a CI pipe, a worker process) and when `enabled` is False, so nothing is
    written there."""
    stream = sys.stderr
    if not enabled:
        return None
    if stream.isatty():
        return {"file": stream, "leave": False}
    if _in_notebook(stream):
        return {"file": stream, "leave": False, "mininterval": NOTEBOOK_INTERVAL_S}
    return None


class Progress:
    """Counts finished items (a run's requests, a plan's candidates); redraws about 200
    times per run, only on a terminal or in a notebook (`bar_options`)."""

    def __init__(self, total: int | None, *, enabled: bool, label: str, unit: str = "req") -> None:
        self._bar = None
        self._shown = 0
        self._every = max(1, (total or 1) // 200)
        if (options := bar_options(enabled)) is not None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit=unit, **options)

    def update(self, done: int) -> None:
        if self._bar is not None and done - self._shown >= self._every:
            self._bar.update(done - self._shown)
            self._shown = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
