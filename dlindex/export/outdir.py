"""The folder an export is written to: made beside OUT_DIR, swapped in only when complete.

``--overwrite`` replaces only a folder that is a dlindex export (a valid index.json, and
nothing in the folder that it does not list, each listed file of its listed size); it
refuses the catalog's folder, a scanned root or a folder above one, ``.``, ``/`` and the
home folder. The swap is one ``renameat2(RENAME_EXCHANGE)`` where Linux offers it, so OUT_DIR
always holds the old export or the new one; elsewhere the old one is moved aside first and
put back by the next export if a crash came between the two renames.

Temporary folders are named ``.{OUT_DIR}.dlindex-{host}-{pid}-{start}.{random}.tmp|.old``:
the next export removes those of processes on this host that are gone (never of a live one;
a reused pid has another start time). ``features export`` does the same for its temporary
``.npz`` files with ``dlindex.features.tempfiles``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from dlindex.export.plan import ExportError
from dlindex.pids import host_tag, pid_alive, process_start

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_KNOWN_EXTRA = frozenset({".upper.part"})  # a jsonl export's second process, if it died mid-write
_LEFTOVER = re.compile(
    r"^\.(?P<name>.+)\.dlindex-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)\.[^.]+\.(?:tmp|old)$"
)


def temp_prefix(name: str) -> str:
    """The start of a temporary file or folder name beside ``name``, marked with this process."""
    return f".{name}.dlindex-{host_tag()}-{os.getpid()}-{process_start(os.getpid())}."


def remove_leftovers(parent: Path, name: str, restore: Path | None = None) -> int:
    """Remove temporaries of ``name`` in ``parent`` that dead processes on this host left
    behind; with ``restore`` absent, a dead process's ``.old`` folder (an export moved aside
    before the crash) is put back there instead. Returns how many were cleaned up."""
    cleaned = 0
    host = host_tag()
    try:
        entries = sorted(os.listdir(parent))
    except OSError:
        return 0
    for entry in entries:
        match = _LEFTOVER.match(entry)
        if not match or match["name"] != name or match["host"] != host:
            continue
        if pid_alive(int(match["pid"]), int(match["start"])):
            continue
        path = parent / entry
        try:
            if entry.endswith(".old") and restore is not None and not os.path.lexists(restore):
                inner = path / "export"
                os.rename(inner if inner.is_dir() else path, restore)
            if stat.S_ISDIR(os.lstat(path).st_mode):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            continue  # not ours to force
        cleaned += 1
    return cleaned


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system cannot."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError, TypeError):
        return False
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if func(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # this file system cannot exchange
    raise OSError(code, os.strerror(code), os.fspath(b))


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.path.abspath(path))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def check_replaceable(out_dir: Path, protected_files: Iterable[str], roots: Iterable[str]) -> None:
    """Raise ExportError unless OUT_DIR is a folder ``--overwrite`` may replace."""
    real = _real(out_dir)
    home = os.path.expanduser("~")
    if real == "/":
        raise ExportError(f"refusing to replace {out_dir}: it is the root folder /")
    if home not in ("", "~", "/") and real == _real(home):
        raise ExportError(f"refusing to replace {out_dir}: it is your home folder; export to a new folder inside it")
    if real == _real(os.getcwd()):
        raise ExportError(f"refusing to replace {out_dir}: it is the current folder; export to a new folder inside it")
    for name in protected_files:
        if _under(_real(name), real):
            raise ExportError(f"refusing to replace {out_dir}: it holds the catalog {name}; export to another folder")
    for root in roots:
        if _under(_real(root), real):
            what = "is" if _real(root) == real else "holds"
            raise ExportError(
                f"refusing to replace {out_dir}: it {what} the scanned root {root}; export to another folder"
            )


def check_old_export(out_dir: Path) -> None:
    """Raise ExportError unless everything in OUT_DIR belongs to the dlindex export there."""
    from dlindex.export.part import load_part
    from dlindex.exported.index import INDEX, PARQUET_INDEX, PART_INDEX, index_path, listed_shards
    from dlindex.exported.reader import load_index

    keep = "remove it yourself or choose another folder"
    own = index_path(out_dir)  # index.json, or _index.json of a parquet export
    part = not os.path.lexists(own) and os.path.lexists(out_dir / PART_INDEX)  # a part of a --part export
    if not os.path.lexists(own) and not part:
        raise ExportError(
            f"refusing to replace {out_dir}: it has no {INDEX}, so it is not a dlindex export "
            f"(nor a parquet one, with {PARQUET_INDEX}); {keep}"
        )
    try:
        if part:
            own = out_dir / PART_INDEX
            sizes = load_part(out_dir).listed()
        else:
            index = load_index(out_dir)
            sizes = {entry["file"]: entry["bytes"] for entry in (*listed_shards(index), *index.get("files", []))}
    except ExportError as e:
        raise ExportError(f"refusing to replace {out_dir}: {e}; {keep}") from None
    sizes[own.name] = -1
    folders = {os.path.dirname(name) for name in sizes} - {""}
    for parent, dirs, files in os.walk(out_dir):
        for entry in (*dirs, *files):
            full = Path(parent) / entry
            rel = os.path.relpath(full, out_dir)
            info = os.lstat(full)
            if stat.S_ISDIR(info.st_mode) and rel in folders:
                continue
            if rel in _KNOWN_EXTRA and stat.S_ISREG(info.st_mode):
                continue
            if rel not in sizes or not stat.S_ISREG(info.st_mode):
                raise ExportError(
                    f"refusing to replace {out_dir}: {rel} is not part of the export there; "
                    "remove it yourself or choose another folder"
                )
            if sizes[rel] >= 0 and info.st_size != sizes[rel]:
                raise ExportError(
                    f"refusing to replace {out_dir}: {rel} has {info.st_size} bytes, its {own.name} says "
                    f"{sizes[rel]}; remove it yourself or choose another folder"
                )
        dirs[:] = [d for d in dirs if not os.path.islink(Path(parent) / d)]


class OutputDir:
    """A temporary folder next to OUT_DIR that becomes OUT_DIR only when the export is complete.

    Args:
        protected_files: the catalog and its journals; OUT_DIR may not hold them.
        roots: the catalog's scanned roots; OUT_DIR may not be one or hold one.
    """

    def __init__(
        self, out_dir: Path, overwrite: bool, protected_files: Iterable[str] = (), roots: Iterable[str] = ()
    ) -> None:
        self.out_dir = out_dir
        self.overwrite = overwrite
        parent = out_dir.parent
        if not parent.is_dir():
            raise ExportError(f"cannot write {out_dir}: folder {parent} does not exist")
        remove_leftovers(parent, out_dir.name, restore=out_dir)
        if out_dir.is_symlink():
            raise ExportError(f"{out_dir} is a symbolic link; name the folder itself")
        if out_dir.exists() and not out_dir.is_dir():
            raise ExportError(f"{out_dir} exists and is not a folder")
        check_replaceable(out_dir, list(protected_files), list(roots))
        self.replaces = out_dir.is_dir() and any(out_dir.iterdir())
        if self.replaces:
            if not overwrite:
                raise ExportError(f"{out_dir} exists and is not empty; remove it, choose another, or pass --overwrite")
            check_old_export(out_dir)
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ExportError(f"cannot write {out_dir}: folder {parent} is not writable")
        self.prefix = temp_prefix(out_dir.name)
        self.tmp = Path(tempfile.mkdtemp(prefix=self.prefix, suffix=".tmp", dir=parent))

    def commit(self) -> None:
        """Put the complete export in place of OUT_DIR (ExportError if OUT_DIR changed meanwhile)."""
        try:
            self._commit()
        except ExportError:
            raise
        except OSError as e:
            raise ExportError(f"cannot put the export in place at {self.out_dir}: {e.strerror}") from None

    def _commit(self) -> None:
        os.chmod(self.tmp, 0o755)  # mkdtemp makes 0700; an export is meant to be shared
        if not (self.out_dir.is_dir() and any(self.out_dir.iterdir())):
            try:
                os.rename(self.tmp, self.out_dir)  # replaces an empty folder in one step
                return
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        if not self.overwrite:
            raise ExportError(f"{self.out_dir} was filled while exporting; the new export is not kept")
        check_old_export(self.out_dir)  # again: it may have changed while we wrote
        if _exchange(self.tmp, self.out_dir):
            shutil.rmtree(self.tmp, ignore_errors=True)  # self.tmp now holds the old export
            return
        # No exchange here: move the old one aside, then put the new one in place; a crash
        # between the two leaves a .old folder that the next export puts back.
        old = Path(tempfile.mkdtemp(prefix=self.prefix, suffix=".old", dir=self.out_dir.parent))
        os.rename(self.out_dir, old / "export")
        try:
            os.rename(self.tmp, self.out_dir)
        except BaseException:
            os.rename(old / "export", self.out_dir)
            raise
        shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
