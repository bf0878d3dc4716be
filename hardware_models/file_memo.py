"""A file's parsed contents, read again only when the file changes.

GPU, node and model files are parsed and validated once per process, as a sweep or a
plan loads the same few hundreds of times. A cache keyed on the path alone would serve
a file's old contents after an analyst edits it in a running notebook, so each entry is
kept with the file's identity and version as `os.stat` gives them (device, inode, size,
modification time in ns) and checked on every call: one `stat` (a few microseconds) against
a parse and a validation. A file rewritten in place within one tick of the filesystem's
clock and to the same size is the one edit this does not see.

The InfersimWarnings a load raises (an old node file, a checkpoint's quantization not
understood) are kept with its value and raised again into the open recording on each
later call (warning_scope.replay): each run records them in its summary, not only the
first run in the process that read the file.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar
from warnings import WarningMessage

from hardware_models.warning_scope import kept, replay

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
    Errors are not cached: they are raised again. The warnings the load raised are kept
    with the value and raised again on each call that serves it (see the module's doc)."""
    held: dict[Hashable, tuple[_Version, T, tuple[WarningMessage, ...]]] = {}

    @functools.wraps(load)
    def cached(path: Path, *args: P.args, **kwargs: P.kwargs) -> T:
        key = (path, args, tuple(sorted(kwargs.items())))
        version = _version(path)  # before reading: an edit during the read is seen next time
        entry = held.get(key)
        if version is not None and entry is not None and entry[0] == version:
            replay(entry[2])
            return entry[1]
        with kept() as raised:
            value = load(path, *args, **kwargs)
        if version is not None:
            held[key] = (version, value, tuple(raised))
        return value

    return cached
