"""Where a command's results go: the folder and files it will write, made and checked
before it simulates, so a path that cannot take them is one line at the start (exit 2)
and not an error after minutes of simulation."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from hardware_models.errors import InfersimError
from simulator.metrics.manifest import MANIFEST, listed, record, remove
from simulator.metrics.writer import run_files

if TYPE_CHECKING:
    from collections.abc import Iterator


def folder_name(name: str, what: str = "name") -> str:
    """A scenario or variant name as a folder below the results folder: refused when it
    would land elsewhere (absolute, empty, or with '.' or '..' parts)."""
    parts = PurePath(name).parts
    if not parts or PurePath(name).is_absolute() or any(p in (".", "..") for p in parts):
        raise InfersimError(
            f"{what} {name!r} cannot name a results folder (it would not be a folder "
            "inside it); rename it or pass -o"
        )
    return name


def free_results_dir(name: str, root: Path = Path("results")) -> Path:
    """results/<name>, or results/<name>-2, -3, ...: made here, the first that does not
    exist yet (mkdir refuses one that does), so two commands started at once never share
    a folder and earlier results are never replaced."""
    base = candidate = root / folder_name(name)
    writable_folder(base.parent, f"results folder {base.parent}")
    n = 1
    while True:
        try:
            candidate.mkdir()
        except FileExistsError:
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
        else:
            return candidate


def writable_folder(path: Path, where: str | None = None) -> bool:
    """Make `path` (and its parents) and check a file can be made in it; whether it was
    made here. A path through a file, or where nothing may be written, is refused, named
    as `where` says (default: as -o)."""
    made = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:  # FileExistsError: a file where a folder must be
        reason = "a file is in the way" if isinstance(exc, FileExistsError) else exc.strerror
        where = where or f"-o {path}"
        raise InfersimError(f"{where}: cannot write there: {reason or exc}") from None
    return made


def writable_file(flag: str, path: Path, overwrite: bool) -> None:
    """A file a command will write: refused now when it is a folder, already exists
    (unless `overwrite`), or its folder cannot take it."""
    if path.is_dir():
        raise InfersimError(f"{flag} {path}: is a folder; give a file name")
    if path.exists() and not overwrite:
        raise InfersimError(f"{flag} {path}: exists; pass --overwrite or another name")
    writable_folder(path.parent, f"{flag} {path}")


@contextlib.contextmanager
def results_folder(
    given: Path | None, name: str, overwrite: bool, *, resumable: bool = False
) -> Iterator[Path]:
    """The folder a command writes into: `given` (-o; refused when it is a file, or holds
    results, unless `overwrite` or the command decides that itself: `resumable`), else a
    fresh results/<name>[-N]. Made and checked writable on entry. On the way out its
    MANIFEST lists the files infersim wrote there; with `overwrite`, after a command that
    finished, the ones an earlier command wrote and this one did not are removed (with
    the subfolders that leaves empty), so none outlives its run. A folder made here that
    stayed empty is removed."""
    if given is None:
        outdir, made = free_results_dir(name), True
    else:
        outdir = given
        if outdir.exists() and not outdir.is_dir():
            raise InfersimError(f"{outdir} exists and is not a directory; choose another -o")
        if not (overwrite or resumable) and outdir.is_dir() and any(outdir.iterdir()):
            raise InfersimError(f"{outdir} already has results; pass --overwrite or another -o")
        made = writable_folder(outdir)
    earlier = listed(outdir, run_files())  # a run's files, where no MANIFEST names them
    listed_tops = {file.split("/")[0] for file in earlier}
    tops = set(os.listdir(outdir))
    before = _files(outdir, listed_tops)
    finished = False
    try:
        yield outdir
        finished = True
    finally:
        now = _files(outdir, listed_tops | (set(os.listdir(outdir)) - tops))
        written = {file for file, stat in now.items() if before.get(file) != stat}
        stale = set(earlier) - written
        if overwrite and finished:
            remove(outdir, stale)
            stale = set()
        if ours := written | (stale & now.keys()):
            record(outdir, ours)
        elif made:
            with contextlib.suppress(OSError):  # only an empty folder goes
                outdir.rmdir()


def _files(outdir: Path, walked: set[str]) -> dict[str, tuple[int, int, int]]:
    """The files in `outdir` and below its subfolders named in `walked` (infersim's: made
    by this command or listed before; not a user's, which may be large), by their paths
    relative to it: inode, size and modification time, which change when one is written."""
    found = {}
    for top in outdir.iterdir():
        below = top.name in walked and top.is_dir() and not top.is_symlink()
        for path in top.rglob("*") if below else (top,):
            if path.is_file() and (name := path.relative_to(outdir).as_posix()) != MANIFEST:
                stat = path.stat()
                found[name] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return found
