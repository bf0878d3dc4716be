"""Which build of the simulator produced a result: the package version and a digest of
every source, preset and calibration table, so results of two different builds are never
mixed (a sweep resumed after an upgrade or an edit reruns nothing silently)."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import metadata
from pathlib import Path

_PACKAGES = ("simulator", "hardware_models")
# Sources, presets, and the package data that feeds results (published calibration tables).
_SUFFIXES = (".py", ".yaml", ".csv")


def source_digest(root: Path) -> str:
    """sha256 over the paths and contents of the packages' files under `root` that
    change results (by suffix)."""
    digest = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.suffix in _SUFFIXES and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def build_id() -> str:
    """`<version>+<12 hex digits>`; the digest covers the files' paths and contents."""
    try:
        version = metadata.version("infersim")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version}+{source_digest(Path(__file__).resolve().parents[1])[:12]}"
