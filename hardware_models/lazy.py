"""Public names of a package imported on first use (PEP 562), so that importing the
package, or one light submodule of it, does not import every module behind its names."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_names(
    package: str, sources: Mapping[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: a name in `sources` is imported from
    the module it maps to the first time it is asked for, then kept in the package;
    `dir(package)` lists the `public` names alone, not the module's own imports
    (`TYPE_CHECKING`, `annotations`, `lazy_names`) nor the submodules loaded so far."""
    namespace = sys.modules[package].__dict__
    listed = set(public)

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(listed)

    return __getattr__, __dir__
