"""Temporary files that say who wrote them, so leftovers of a killed run can be removed.

``features export`` writes ``.<name>.dlx-<host>-<pid>-<start>-<random>.tmp`` beside its
target and renames it into place. ``kill -9`` (or a power cut) leaves that file behind; the
next export into the same folder deletes such files whose process is gone: same host
(an 8-hex hash of the host name, so a file written by another machine on a shared disk is
never judged by our process table), and no process with that pid, or one with another
start time (the pid was reused). A live process's file, and every file that does not have
exactly this form, are never touched.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

from dlindex.pids import host_tag, pid_alive, process_start

_PATTERN = re.compile(
    r"\.(?P<name>.+)\.dlx-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})-(?P<start>[0-9]{1,20})-[A-Za-z0-9_]{1,16}\.tmp\Z"
)


def create(target: Path) -> tuple[int, str]:
    """A new temporary file beside ``target``: (descriptor, path), like ``mkstemp``."""
    prefix = f".{target.name}.dlx-{host_tag()}-{os.getpid()}-{process_start(os.getpid())}-"
    return tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=target.parent)


def remove_leftovers(folder: Path) -> list[str]:
    """Delete the temporary files of dead dlindex processes in ``folder``; return their names."""
    removed: list[str] = []
    host = host_tag()
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _PATTERN.match(name)
        if match is None or match["host"] != host:
            continue
        if pid_alive(int(match["pid"]), int(match["start"])):
            continue
        path = folder / name
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):  # never a link, a folder or a FIFO
                os.unlink(path)
                removed.append(name)
        except OSError:
            pass  # gone meanwhile, or not ours to delete: leave it
    return removed
