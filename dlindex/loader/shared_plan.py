"""An epoch plan's arrays in one memory-mapped file, written once and opened read-only by every worker.

The plan of a rank (every selected sample's id and class, and the reading order) is written to
``$DLINDEX_PLAN_DIR``, else ``/dev/shm`` (memory the kernel shares between processes), else the
temp folder. The process that wrote it maps it read-only; a DataLoader worker, forked or spawned,
maps the same file instead of receiving a pickled copy. The file is removed when the plan that
wrote it is dropped or the process exits. Before writing, the free space of the folder is checked:
too little is one line naming the folder, the bytes needed and the bytes free.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlindex.errors import DlindexError

ENV = "DLINDEX_PLAN_DIR"
_SHM = "/dev/shm"
_ALIGN = 64
_PREFIX = "dlindex-plan-"


class PlanSpaceError(DlindexError):
    """The plan folder has too little free space for an epoch plan."""


@dataclass(frozen=True)
class Section:
    """One array of the file: where it starts, its dtype and its length."""

    offset: int
    dtype: str
    count: int


@dataclass(frozen=True)
class PlanFile:
    """A written plan file: its path and its sections by name (what a worker needs to map it)."""

    path: str
    sections: tuple[tuple[str, Section], ...]
    size: int

    def arrays(self) -> dict[str, np.ndarray[Any, Any]]:
        """Every section as a read-only array over one shared mapping of the file."""
        with open(self.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_READ) if self.size else None
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name, s in self.sections:
            if mapped is None or s.count == 0:
                out[name] = np.zeros(0, dtype=s.dtype)
            else:
                out[name] = np.frombuffer(mapped, dtype=s.dtype, count=s.count, offset=s.offset)
        return out


def plan_dir() -> str:
    """Where plans are written: $DLINDEX_PLAN_DIR, /dev/shm when there is one, else the temp folder."""
    chosen = os.environ.get(ENV)
    if chosen:
        return chosen
    if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK):
        return _SHM
    return tempfile.gettempdir()


def free_bytes(folder: str) -> int:
    """Bytes an unprivileged process may still write in ``folder``."""
    st = os.statvfs(folder)
    return int(st.f_bavail) * int(st.f_frsize)


def write_plan(arrays: dict[str, np.ndarray[Any, Any]], owner: object) -> PlanFile:
    """Write ``arrays`` to a new plan file, removed when ``owner`` is collected or at exit."""
    folder = plan_dir()
    sections: list[tuple[str, Section]] = []
    at = 0
    for name, array in arrays.items():
        at = -(-at // _ALIGN) * _ALIGN
        sections.append((name, Section(at, array.dtype.str, int(array.size))))
        at += int(array.nbytes)
    need = at
    try:
        free = free_bytes(folder)
    except OSError as e:
        raise PlanSpaceError(f"the epoch plan folder {folder} cannot be used ({e.strerror or e}); "
                             f"set {ENV} to a writable folder") from None  # fmt: skip
    if need > free:
        raise PlanSpaceError(f"the epoch plan needs {need:,} bytes in {folder}, which has {free:,} free; "
                             f"set {ENV} to a folder with room")  # fmt: skip
    sweep(folder)
    path = os.path.join(folder, f"{_PREFIX}{os.getpid()}-{secrets.token_hex(6)}.bin")
    try:
        with open(path, "xb") as f:
            for (_, section), array in zip(sections, arrays.values(), strict=True):
                f.seek(section.offset)
                f.write(np.ascontiguousarray(array).data)
            f.truncate(need)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise PlanSpaceError(f"the epoch plan ({need:,} bytes) could not be written to {folder}: "
                             f"{e.strerror or e}; set {ENV} to a folder with room") from None  # fmt: skip
    weakref.finalize(owner, _remove, path, os.getpid())
    return PlanFile(path, tuple(sections), need)


def sweep(folder: str) -> None:
    """Remove the plans (and spills) of processes that are gone (killed before they could remove their own)."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith(_PREFIX) and n.endswith(".bin")]
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX) :].partition("-")[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: theirs to remove
    return True


def release(plan_file: PlanFile) -> None:
    """Remove the file now (its mappings stay valid): a plan made inside a worker, which no other
    process opens and whose exit skips the clean-up at exit."""
    with contextlib.suppress(OSError):
        os.unlink(plan_file.path)


def _remove(path: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked worker dropping its inherited copy leaves the file to its owner
        with contextlib.suppress(OSError):
            os.unlink(path)
