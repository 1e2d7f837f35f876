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

PREFIX = "dlindex-advisor-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-[A-Za-z0-9_]+")
# What a scratch directory may hold: the copy and SQLite's side files.
_OURS = re.compile(r"scratch\.db(?:-journal|-wal|-shm)?")


def process_start(pid: int) -> int:
    """When ``pid`` started (clock ticks after boot), 0 where /proc cannot tell; -1 if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return -1 if os.path.isdir("/proc/self") else _exists(pid)
    except OSError:
        return 0
    try:
        # The command name (field 2) is parenthesised and may hold spaces: count after its ")".
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return 0


def _exists(pid: int) -> int:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return -1
    except OSError:
        return 0
    return 0


def make_scratch_dir(base: str | os.PathLike[str] | None = None) -> Path:
    """A new private directory named after this process."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{max(process_start(pid), 0)}-", dir=base))


def owner_alive(name: str) -> bool:
    """Whether the process that made scratch directory ``name`` still runs (True when unsure)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return True
    pid, start = int(m.group(1)), int(m.group(2))
    now = process_start(pid)
    if now < 0:
        return False
    return not (start and now and now != start)  # the pid now belongs to another process


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
