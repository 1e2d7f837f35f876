"""Scratch directories named after their owner, so a later run can remove those of dead processes.

A scratch copy lives in ``<tmp>/dlindex-advisor-<pid>-<start>-<random>``: ``start`` is when
the owning process started (clock ticks since boot, from ``/proc/<pid>/stat``), so a pid
reused by another process does not keep a leftover alive. A run killed with ``kill -9``
cannot clean up after itself; the next run does, and never touches a live owner's copy,
another program's directory, or a directory holding anything but a scratch catalog.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from dlindex.pids import pid_alive, process_start

PREFIX = "dlindex-advisor-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-[A-Za-z0-9_]+")
# What a scratch directory may hold: the copy and SQLite's side files.
_OURS = re.compile(r"scratch\.db(?:-journal|-wal|-shm)?")


def make_scratch_dir(base: str | os.PathLike[str] | None = None) -> Path:
    """A new private directory named after this process."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{process_start(pid)}-", dir=base))


def owner_alive(name: str) -> bool:
    """Whether the process that made scratch directory ``name`` still runs (True when unsure)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return True
    return pid_alive(int(m.group(1)), int(m.group(2)))


def remove_leftovers(base: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the scratch directories of processes that are gone; return what was removed."""
    root = Path(base if base is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not _NAME.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False) or owner_alive(entry.name):
            continue
        path = Path(entry.path)
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            names = os.listdir(path)
        except OSError:
            continue
        if not all(_OURS.fullmatch(n) and (path / n).is_file() and not (path / n).is_symlink() for n in names):
            continue  # not only a scratch catalog: not ours to delete
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
