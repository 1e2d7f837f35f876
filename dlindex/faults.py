"""Low-level failures (SQLite result codes, OS errors) turned into one clear DlindexError.

Every command goes through ``translate_error`` (the CLI's ``handle_errors``, the catalog's
write transactions), so a full disk, a damaged file or a held lock reads the same in
``scan``, ``mark``, ``features import`` or an export: what happened, where, what to do.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterable
from pathlib import Path

from dlindex.errors import CatalogBusyError, DamagedCatalogError, DiskFullError, DlindexError, ReadOnlyCatalogError

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# SQLite's PENDING byte and the RESERVED byte after it (rollback-journal writers), and the
# WAL write lock, the first lock byte of the -shm file (walIndexLock in sqlite3.c).
_PENDING_BYTE = 0x40000000
_WAL_WRITE_LOCK = 120

_SCHEMA_GONE = ("no such column:", "no such table:", "no such function:")
# sqlite3's own error for a TEXT value whose bytes are not UTF-8 (it quotes the bytes after it)
_NOT_UTF8 = re.compile(r"Could not decode to UTF-8 column '([^']*)'")


def sqlite_error_name(exc: BaseException) -> str:
    return str(getattr(exc, "sqlite_errorname", "") or "")


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
        return True
    if isinstance(exc, sqlite3.Error):
        return sqlite_error_name(exc) == "SQLITE_FULL" or "database or disk is full" in str(exc)
    return False


def is_damage(exc: BaseException) -> bool:
    """Whether ``exc`` says the catalog file is damaged (a corrupt page, not a database, text
    that is not UTF-8): such a file is written no more, not even dlindex's own log."""
    if isinstance(exc, DamagedCatalogError):
        return True
    if not isinstance(exc, sqlite3.Error):
        return False
    name = sqlite_error_name(exc)
    return (
        name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB" or "malformed" in str(exc)
        or _NOT_UTF8.match(str(exc)) is not None
    )  # fmt: skip


def translate_error(
    exc: BaseException, *, catalog: str | os.PathLike[str] | None = None, paths: Iterable[str | os.PathLike[str]] = ()
) -> DlindexError | None:
    """The DlindexError that says what ``exc`` means for the user, or None (a bug: keep it).

    Args:
        catalog: the catalog being written, if any.
        paths: other files or folders the command writes (an export folder), to find the full disk.
    """
    if isinstance(exc, DlindexError):
        return exc
    if is_disk_full(exc):
        return disk_full_error(exc, catalog=catalog, paths=paths)
    if isinstance(exc, PermissionError):
        named = exc.filename if exc.filename is not None else catalog
        return DlindexError(f"permission denied: {os.fsdecode(named) if named is not None else 'a file dlindex needs'}")
    if not isinstance(exc, sqlite3.Error):
        return None
    name = sqlite_error_name(exc)
    where = f"catalog {catalog}" if catalog is not None else "the catalog"
    if name.startswith("SQLITE_CORRUPT") or name == "SQLITE_NOTADB" or "malformed" in str(exc):
        return damaged_error(catalog, str(exc))
    if isinstance(exc, sqlite3.IntegrityError) and str(exc).startswith("CHECK constraint failed"):
        # dlindex writes only values its own CHECKs accept (the tests hold it): a CHECK that
        # refuses one is schema text that is no longer dlindex's (found by a schema fuzzer)
        return damaged_error(catalog, f"a CHECK constraint of its schema refused a value dlindex writes: {exc}")
    undecodable = _NOT_UTF8.match(str(exc))
    if undecodable is not None:  # dlindex writes only UTF-8 TEXT (other names get stand-ins): damage
        return damaged_error(catalog, f"a value in column {undecodable.group(1)[:60]} is not UTF-8 text")
    if catalog is not None and isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(_SCHEMA_GONE):
        # a write of dlindex's names only its own schema, checked at open: a name gone now is in a
        # trigger or index whose text was changed (found by the schema fuzzer)
        return damaged_error(catalog, f"its schema no longer has what a write needs: {exc}")
    if name.startswith("SQLITE_READONLY"):
        return ReadOnlyCatalogError(f"{where} is read-only ({exc}); nothing was changed")
    if name.startswith("SQLITE_BUSY") and catalog is not None:
        return CatalogBusyError(busy_message(Path(catalog), None))
    if name.startswith("SQLITE_IOERR"):
        full = _fullest(_candidates(catalog, paths))
        if full is not None and full[1] < 1 << 20:  # an I/O error beside a full disk is the full disk
            return disk_full_error(exc, catalog=catalog, paths=paths)
        return DlindexError(f"I/O error on {where}: {exc}; check the disk, then run the command again")
    return None


def garbled_message(e: UnicodeDecodeError) -> str:
    """SQLite's own error text when it held bytes that are not UTF-8 (sqlite3 fails to decode
    it): names read from a damaged schema or page."""
    raw = e.object if isinstance(e.object, bytes) else bytes(e.object)
    return raw.decode("utf-8", "backslashreplace")


def damaged_error(catalog: str | os.PathLike[str] | None, detail: str) -> DamagedCatalogError:
    db = os.fspath(catalog) if catalog is not None else "dlindex.db"
    detail = " ".join(detail.split())  # SQLite may quote a whole damaged CREATE statement: one line
    return DamagedCatalogError(
        f"catalog {db} is damaged ({detail}); nothing was written. Run: dlindex check --db {db}; " + recovery_hint(db)
    )


def recovery_hint(db: str | os.PathLike[str]) -> str:
    """How to save a damaged catalog's readable rows, in words (the steps: ``dlindex check --help``)."""
    return f"to recover: dlindex check --db {os.fspath(db)} --recover-to NEW.db (steps: dlindex check --help)"


def disk_full_error(
    exc: BaseException, *, catalog: str | os.PathLike[str] | None = None, paths: Iterable[str | os.PathLike[str]] = ()
) -> DiskFullError:
    """Name the full filesystem: the file the OS named, else the fullest place dlindex writes."""
    quota = isinstance(exc, OSError) and exc.errno == errno.EDQUOT
    what = "disk quota exceeded" if quota else "disk full"
    named = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    candidates = _candidates(catalog, paths)
    if named:
        where = os.fsdecode(named)
        free = _free_bytes(where)
    else:
        found = _fullest(candidates)
        where, free = found if found is not None else (os.fspath(catalog or "."), None)
        if _is_tempdir(where):
            where += " (temporary files; set SQLITE_TMPDIR or TMPDIR to a folder with space)"
    space = f", {_human(free)} free" if free is not None else ""
    return DiskFullError(
        f"{what}: no space left writing {where}{space}; what was committed is kept and the catalog "
        "is consistent. Free some space and run the command again"
    )


def _candidates(catalog: str | os.PathLike[str] | None, paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    found = [os.fspath(p) for p in paths]
    if catalog is not None:
        found.insert(0, os.fspath(catalog))
    # SQLite's temporary files (sorts, temp tables) go where SQLITE_TMPDIR or TMPDIR say.
    for tmp in (os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR"), tempfile.gettempdir()):
        if tmp:
            found.append(tmp)
    return found


def _is_tempdir(path: str) -> bool:
    return path in {os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR"), tempfile.gettempdir()}


def _existing(path: str) -> str | None:
    p = Path(path).absolute()
    for candidate in (p, *p.parents):
        if candidate.exists():
            return os.fspath(candidate)
    return None


def _free_bytes(path: str) -> int | None:
    existing = _existing(path)
    if existing is None:
        return None
    try:
        st = os.statvfs(existing)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _fullest(candidates: list[str]) -> tuple[str, int] | None:
    """The candidate on the filesystem with the least space left, as (path, free bytes)."""
    best: tuple[str, int] | None = None
    for path in candidates:
        free = _free_bytes(path)
        if free is not None and (best is None or free < best[1]):
            best = (path, free)
    return best


def _human(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def busy_message(db_path: Path, waited_s: float | None) -> str:
    """Say that another process holds the write lock, which one if the OS tells us, and what to do."""
    waited = f" for {waited_s:.3g} s" if waited_s is not None else ""
    holder = lock_holder(db_path)
    who = (
        f"another dlindex process ({holder})"
        if holder and "dlindex" in holder
        else (f"another process ({holder})" if holder else "another dlindex process")
    )
    return (
        f"catalog {db_path} stayed locked{waited} by {who}; "
        "run the command again when that finishes, or wait longer with --wait SECONDS"
    )


def lock_holder(db_path: Path) -> str | None:
    """``pid N: command line`` of the process holding SQLite's write lock on ``db_path`` (Linux
    /proc/locks; None elsewhere or when nobody holds it). No file of the catalog is opened."""
    targets: dict[int, set[int]] = {}
    for path, offsets in (
        (os.fspath(db_path) + "-shm", {_WAL_WRITE_LOCK}),
        (os.fspath(db_path), {_PENDING_BYTE, _PENDING_BYTE + 1}),
    ):
        try:
            targets[os.stat(path).st_ino] = offsets
        except OSError:
            continue
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 120 120"; blocked waiters start with "->"
        if len(fields) < 8 or fields[1] == "->" or fields[3] != "WRITE":
            continue
        try:
            pid, inode, start = int(fields[4]), int(fields[5].rsplit(":", 1)[1]), int(fields[6])
        except (ValueError, IndexError):
            continue
        if start in targets.get(inode, ()):
            return f"pid {pid}: {_command_line(pid)}" if pid != os.getpid() else f"pid {pid}: this process"
    return None


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "unknown command"
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] == "dlindex":
        argv = ["dlindex", *argv[3:]]
    elif argv and os.path.basename(argv[0]).startswith("python") and len(argv) > 1 and argv[1].endswith("dlindex"):
        argv = ["dlindex", *argv[2:]]
    text = " ".join(argv) or "unknown command"
    return text if len(text) <= 120 else text[:117] + "..."
