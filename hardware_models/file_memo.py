"""A file's parsed contents, read again only when the file changes.

GPU, node and model files are parsed and validated once per process, as a sweep or a
plan loads the same few hundreds of times. A cache keyed on the path alone would serve
a file's old contents after an analyst edits it in a running notebook, so each entry is
kept with the file's identity and version as `os.stat` gives them (device, inode, size,
modification time in ns) and checked on every call: one `stat` (a few microseconds) against
a parse and a validation. A file rewritten in place within one tick of the filesystem's
clock and to the same size is the one edit this does not see.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

_Version = tuple[int, int, int, int]


def _version(path: Path) -> _Version | None:
    """The file's identity and version, None when it cannot be read (the loader says why)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def per_file_version(load: Callable[Concatenate[Path, P], T]) -> Callable[Concatenate[Path, P], T]:
    """`load(path, ...)`, cached per path and further (hashable) arguments while the file
    stays the same; one entry per path and arguments, replaced when the file changes.
    Errors are not cached: they are raised again."""
    held: dict[Hashable, tuple[_Version, T]] = {}

    @functools.wraps(load)
    def cached(path: Path, *args: P.args, **kwargs: P.kwargs) -> T:
        key = (path, args, tuple(sorted(kwargs.items())))
        version = _version(path)  # before reading: an edit during the read is seen next time
        entry = held.get(key)
        if version is not None and entry is not None and entry[0] == version:
            return entry[1]
        value = load(path, *args, **kwargs)
        if version is not None:
            held[key] = (version, value)
        return value

    return cached
