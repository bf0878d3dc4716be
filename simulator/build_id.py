"""Which build of the simulator produced a result: the package version and a digest of
every source and preset file, so results of two different builds are never mixed (a sweep
resumed after an upgrade or an edit reruns nothing silently)."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import metadata
from pathlib import Path

_PACKAGES = ("simulator", "hardware_models")
_SUFFIXES = (".py", ".yaml")


@cache
def build_id() -> str:
    """`<version>+<12 hex digits>`; the digest covers the files' paths and contents."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.suffix in _SUFFIXES and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    try:
        version = metadata.version("infersim")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version}+{digest.hexdigest()[:12]}"
