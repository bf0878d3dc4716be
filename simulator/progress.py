"""A progress bar for long runs that costs nothing per request when it is not shown."""

from __future__ import annotations

import sys


class Progress:
    """Counts finished items (a run's requests, a plan's candidates); redraws about 200
    times per run, only on a terminal."""

    def __init__(self, total: int | None, *, enabled: bool, label: str, unit: str = "req") -> None:
        self._bar = None
        self._shown = 0
        self._every = max(1, (total or 1) // 200)
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit=unit, leave=False, file=sys.stderr)

    def update(self, done: int) -> None:
        if self._bar is not None and done - self._shown >= self._every:
            self._bar.update(done - self._shown)
            self._shown = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
