"""One error type for every input problem, so the CLI can print one line instead of a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotated: importing errors must not load pydantic
    from pydantic import ValidationError


class InfersimError(Exception):
    """A problem with the user's input or configuration, explained in one line."""


class InfersimWarning(UserWarning):
    """Input that quietly limits or bends the result: the run goes on and says so, in one
    line (the CLI prints it as `infersim: warning: ...`)."""


class InfeasibleError(InfersimError):
    """A configuration that is valid but cannot run (the model does not fit, ...)."""


def describe_validation_error(err: ValidationError, source: str = "") -> str:
    """Turn a pydantic error into 'source: field.path: message (got value)' lines."""
    lines = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"]) or "(top level)"
        got = item.get("input")
        got_text = "" if isinstance(got, dict) else f" (got {got!r})"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {message}{got_text}" if item["loc"] else f"{message}{got_text}")
    prefix = f"{source}: " if source else ""
    return prefix + "; ".join(lines)
