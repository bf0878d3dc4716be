"""InfersimWarnings kept per run, also when runs share a process in threads.

A run records the warnings it raises, puts them in its summary and passes each distinct
one on to the caller's `warnings` filters once, at the end (simulator.simulation). Python's
`warnings.catch_warnings` would record them by swapping the `warnings` module's filters
and display for the whole process, which threads undo for one another (Python's docs: it
"is not thread-safe"): two runs in a thread pool or on a threaded Dask worker lost their
warnings or took each other's. Here the record is a context variable instead: each
thread, and each task in it, sees only the `recording` it opened, and the process's
filters are never touched. An InfersimWarning raised with no recording open (a scenario
loaded outside a run) goes straight to `warnings.warn`, as any warning does.

Other categories (numpy's, pandas') are not infersim's to record: they reach the
caller's filters where they are raised.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from types import FrameType

from hardware_models.errors import InfersimWarning

_RECORDING: ContextVar[list[warnings.WarningMessage] | None] = ContextVar(
    "infersim_warnings", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[warnings.WarningMessage]]:
    """Record every InfersimWarning this thread (or task) raises within, into the list it
    gives, instead of raising it; the recording opened before it sees none of them."""
    caught: list[warnings.WarningMessage] = []
    token = _RECORDING.set(caught)
    try:
        yield caught
    finally:
        _RECORDING.reset(token)


@contextlib.contextmanager
def kept() -> Iterator[list[warnings.WarningMessage]]:
    """Record every InfersimWarning raised within into the list it gives and then raise
    each again (raise_again), also when the block stops with an error: for a cache
    (hardware_models.file_memo) that keeps them with the value the block made, to
    `replay` each time it serves that value again."""
    caught: list[warnings.WarningMessage] = []
    try:
        with recording() as caught:
            yield caught
    finally:
        for recorded in caught:
            raise_again(recorded)


def replay(kept: Iterable[warnings.WarningMessage]) -> None:
    """Warnings kept with a cached value, raised again into the open recording each time
    the value is served: every run's summary holds what limited it, also when an earlier
    run in the process read the file. With none open, nothing: the caller's filters saw
    them when they were first raised, and Python's default filter shows a line's
    warning once."""
    if _RECORDING.get() is not None:
        for recorded in kept:
            raise_again(recorded)


def warn(text: str, stacklevel: int = 1) -> None:
    """`text` as an InfersimWarning at the line `stacklevel` frames up (as warnings.warn
    counts: 1 is the caller's line): into the innermost open recording, else to the
    caller's filters through warnings.warn."""
    if _RECORDING.get() is None:
        warnings.warn(text, InfersimWarning, stacklevel=stacklevel + 1)
    else:
        warn_at(text, _frame_up(stacklevel))


def warn_at(text: str, frame: FrameType) -> None:
    """`text` as an InfersimWarning at `frame`'s line: into the innermost open recording,
    else to the caller's filters (module filters match `frame`'s module), shown again
    each time it is raised there, as each run's warnings are (raise_again)."""
    at = warnings.WarningMessage(
        InfersimWarning(text), InfersimWarning, frame.f_code.co_filename, frame.f_lineno
    )
    raise_again(at, frame.f_globals.get("__name__"))


def raise_again(recorded: warnings.WarningMessage, module: str | None = None) -> None:
    """A recorded warning raised again at the line it was raised: into the innermost open
    recording, else to the caller's filters and display, with no registry of the line's
    module: a warning of a run is not hidden as already shown by the run before it."""
    caught = _RECORDING.get()
    if caught is not None:
        caught.append(recorded)
        return
    where = (recorded.filename, recorded.lineno)
    if module is None:  # warn_explicit then takes it from the file name (None loses it)
        warnings.warn_explicit(recorded.message, recorded.category, *where)
    else:
        warnings.warn_explicit(recorded.message, recorded.category, *where, module)


def distinct(
    caught: list[warnings.WarningMessage],
) -> dict[tuple[type[Warning], str], warnings.WarningMessage]:
    """Each distinct warning once: one raised per replica is one fact."""
    once: dict[tuple[type[Warning], str], warnings.WarningMessage] = {}
    for caught_warning in caught:
        once.setdefault((caught_warning.category, str(caught_warning.message)), caught_warning)
    return once


def pass_on(
    caught: list[warnings.WarningMessage],
    keep: Callable[[warnings.WarningMessage], bool] = lambda _: True,
) -> None:
    """Recorded warnings (the distinct ones `keep` accepts, each once) to the caller's
    filters and display (or the recording the caller opened), where they were raised."""
    for caught_warning in distinct(caught).values():
        if keep(caught_warning):
            raise_again(caught_warning)


def _frame_up(levels: int) -> FrameType:
    """The frame `levels` above the caller (warn), or the outermost one."""
    frame = sys._getframe(1)
    for _ in range(levels):
        if frame.f_back is None:
            break
        frame = frame.f_back
    return frame
