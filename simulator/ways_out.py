"""How an error names the way out of it: the command line's flags while `infersim` runs a
command, the Python arguments otherwise, so the message fits whoever called
(`pass --overwrite` to a shell user, `pass overwrite=True` to a notebook)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_COMMAND_LINE: ContextVar[bool] = ContextVar("command_line", default=False)


@contextmanager
def on_command_line() -> Iterator[None]:
    """While a command of `infersim` runs (simulator.cli.main)."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def option(python: str, flag: str) -> str:
    """The way out as the caller gives it: `flag` on the command line, else `python`."""
    return flag if _COMMAND_LINE.get() else python
