"""The list of files infersim wrote into a results folder (MANIFEST, one path relative to
the folder a line): what a later overwrite of the folder removes, so that no file of an
earlier run, sweep or plan outlives it beside the new results. Written by every writer of
a results folder: the CLI's (simulator.cli.outputs.results_folder) and Results.write's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path, PurePath

MANIFEST = ".infersim-files"


def listed(outdir: Path, known: Iterable[str] = ()) -> list[str]:
    """The MANIFEST's paths; any that would lead outside `outdir` (edited by hand) left out.
    A folder without one (written before writers kept it) lists those of the `known`
    names (infersim's own file names) that are there."""
    manifest = outdir / MANIFEST
    if not manifest.is_file():
        return [name for name in known if (outdir / name).is_file()]
    names = manifest.read_text().splitlines()
    return [n for n in names if not PurePath(n).is_absolute() and ".." not in PurePath(n).parts]


def record(outdir: Path, names: Iterable[str]) -> None:
    """List `names` (paths relative to `outdir`) as the files infersim wrote there."""
    (outdir / MANIFEST).write_text("".join(f"{name}\n" for name in sorted(set(names))))


def remove(outdir: Path, names: Iterable[str]) -> None:
    """Remove these files below `outdir` and the subfolders that leaves empty."""
    for name in names:
        path = outdir / name
        path.unlink(missing_ok=True)
        for parent in path.parents:
            if parent == outdir:
                break
            with contextlib.suppress(OSError):  # not empty: something else is in it
                parent.rmdir()


def clear(outdir: Path, known: Iterable[str]) -> None:
    """Remove the files the MANIFEST lists, those of the `known` names, and the MANIFEST."""
    remove(outdir, {*known, *listed(outdir)})
    (outdir / MANIFEST).unlink(missing_ok=True)
