"""SQLite connections to a catalog file: checks before any write, pragmas, read-only opens.

Also immutable opens (read-only storage) and the wait for another writer's lock.

Everything here works on plain ``sqlite3`` connections; ``Catalog`` (connection.py) is the
layer above. Later the home of the other backends.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

from dlindex import faults
from dlindex.catalog.backend import Connection
from dlindex.catalog.sqlite.migrations import (
    APPLICATION_ID,
    LATEST_VERSION,
    apply_migrations,
    changed_columns,
    missing_tables,
    schema_version,
)
from dlindex.errors import CatalogBusyError, CatalogError, ReadOnlyCatalogError

DEFAULT_DB = "dlindex.db"
BUSY_TIMEOUT_S = 30.0
PAGE_SIZE = 16384  # see _connect and docs/design.md
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # what an SQLite INTEGER (and so a rowid) holds
_wait_override: float | None = None
_write_command = False


def set_default_wait(seconds: float | None, *, write_command: bool = True) -> None:
    """How long catalogs opened from now on wait for another writer's lock (None: the default,
    ``$DLINDEX_WAIT`` or 30 s); what ``--wait SECONDS`` sets.

    Args:
        write_command: this process runs a write command (every one takes ``--wait``): its
            own log and index writes, not only data writes, are refused on a damaged catalog.
    """
    global _wait_override, _write_command
    _wait_override = seconds
    _write_command = write_command


def default_wait() -> float:
    if _wait_override is not None:
        return max(0.0, float(_wait_override))
    raw = os.environ.get("DLINDEX_WAIT", "").strip()
    try:
        return max(0.0, float(raw)) if raw else BUSY_TIMEOUT_S
    except ValueError:
        return BUSY_TIMEOUT_S


def is_write_command() -> bool:
    """Whether this process runs a write command (see ``set_default_wait``)."""
    return _write_command


class LoggedConnection(sqlite3.Connection):
    """A connection that can report each write statement it runs (to the query log); it speaks
    dlindex.catalog.backend.Connection."""

    on_write: Callable[[str, int, int, float], None] | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        report = self.on_write
        if report is None:
            return super().execute(sql, parameters)
        started = time.perf_counter()
        cursor = super().execute(sql, parameters)
        if cursor.rowcount >= 0:  # -1: a SELECT or DDL, not a row write
            report(sql, 1, cursor.rowcount, time.perf_counter() - started)
        return cursor

    def stream(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        """A read whose rows come as the caller fetches them: sqlite3's cursor already does."""
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        report = self.on_write
        if report is None:
            return super().executemany(sql, parameters)
        counted = _Counted(parameters)
        started = time.perf_counter()
        cursor = super().executemany(sql, counted)
        if counted.n:
            report(sql, counted.n, max(cursor.rowcount, 0), time.perf_counter() - started)
        return cursor


class _Counted:
    """An iterable that counts what it yields (statement executions in an executemany)."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = iter(items)
        self.n = 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item = next(self.items)
        self.n += 1
        return item


class Writeback:
    """Flush the catalog file to disk every half second while a bulk write runs (Linux).

    The kernel keeps written pages in memory until gigabytes are dirty, so the commit's fsync
    of a 2 GB import waited ~7 s for the disk while the CPU was idle; syncing as we go overlaps
    the two (a 2 GB import took 13.7-13.8 s instead of 14.6-16.7 s). It syncs SQLite's own
    descriptors of the file, found in /proc/self/fd: opening and closing one of ours would
    drop SQLite's POSIX locks on it. An extra fdatasync never breaks SQLite's write ordering.
    """

    def __init__(self, db_path: Path, interval_s: float = 0.5) -> None:
        self.target = os.path.realpath(db_path)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interval_s,), name="dlindex-writeback", daemon=True)
        self.thread.start()

    def _run(self, interval_s: float) -> None:
        fds = None
        while not self.done.wait(interval_s):
            if fds is None:
                fds = self._sqlite_fds()
            for fd in fds:
                with suppress(OSError):
                    os.fdatasync(fd)

    def _sqlite_fds(self) -> list[int]:
        found = []
        with suppress(OSError):  # no /proc: nothing to do
            for name in os.listdir("/proc/self/fd"):
                with suppress(OSError, ValueError):
                    if os.readlink(f"/proc/self/fd/{name}") == self.target:
                        found.append(int(name))
        return found

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def connect(
    db_path: Path, *, create: bool, readonly: bool = False, wait_s: float = BUSY_TIMEOUT_S
) -> sqlite3.Connection:
    existed = db_path.exists()
    _check_before_open(db_path, create=create)
    if readonly:
        return _connect_readonly(db_path, wait_s)
    try:
        conn = sqlite3.connect(
            os.fspath(db_path), isolation_level=None, timeout=wait_s, check_same_thread=False,
            factory=LoggedConnection,
        )  # fmt: skip
        conn.execute(f"PRAGMA busy_timeout = {int(wait_s * 1000)}")
        # New catalogs only (a no-op once a file has tables): 16 KiB pages hold seven 2 KiB
        # feature vectors where 4 KiB pages hold one, which made imports 3x faster.
        conn.execute(f"PRAGMA page_size = {int(PAGE_SIZE)}")
        conn.execute("PRAGMA journal_mode = WAL")
        # WAL + NORMAL survives a killed process; only power loss may drop the last commits.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        apply_migrations(conn)
    except UnicodeDecodeError as e:  # SQLite's message quoted garbage from a damaged schema
        raise faults.damaged_error(db_path, faults.garbled_message(e)) from None
    except sqlite3.Error as e:
        if not existed:
            _remove_new_file(db_path)
        if faults.sqlite_error_name(e).startswith("SQLITE_BUSY"):
            raise CatalogBusyError(faults.busy_message(db_path, wait_s)) from None
        translated = faults.translate_error(e, catalog=db_path)
        if translated is not None:
            raise translated from None
        raise CatalogError(f"cannot open catalog {db_path}: {e}") from None
    return conn


def readonly_uri(db_path: str | os.PathLike[str]) -> str:
    """The URI that opens ``db_path`` for reading wherever it lies: ``mode=ro``, or
    ``immutable=1`` when no -wal/-shm can be made beside it (a read-only folder or mount)
    and none is there, so the file alone holds every committed change."""
    path = Path(db_path)
    wal = Path(os.fspath(path) + "-wal")
    folder = path.parent if str(path.parent) else Path(".")
    wal_empty = not wal.exists() or wal.stat().st_size == 0
    if wal_empty and not _writable_dir(folder) and not Path(os.fspath(path) + "-shm").exists():
        return _file_uri(path, "immutable=1")
    return _file_uri(path, "mode=ro")


def _file_uri(path: Path, query: str) -> str:
    return f"file:{urllib.parse.quote(os.fspath(path.absolute()))}?{query}"


def connect_readonly(
    db_path: str | os.PathLike[str], *, timeout: float = BUSY_TIMEOUT_S, **options: Any
) -> sqlite3.Connection:
    """A read-only sqlite3 connection to ``db_path`` (see ``readonly_uri``), for workers,
    loaders and scratch copies that must work on read-only catalogs too."""
    conn: sqlite3.Connection = sqlite3.connect(readonly_uri(db_path), uri=True, timeout=timeout, **options)
    return conn


def _connect_readonly(db_path: Path, wait_s: float) -> sqlite3.Connection:
    try:
        conn = connect_readonly(
            db_path, timeout=wait_s, isolation_level=None, check_same_thread=False, factory=LoggedConnection
        )
        conn.execute(f"PRAGMA busy_timeout = {int(wait_s * 1000)}")
        version = schema_version(conn)
    except UnicodeDecodeError as e:  # SQLite's message quoted garbage from a damaged schema
        raise faults.damaged_error(db_path, faults.garbled_message(e)) from None
    except sqlite3.Error as e:
        if faults.sqlite_error_name(e).startswith("SQLITE_BUSY"):
            raise CatalogBusyError(faults.busy_message(db_path, wait_s)) from None
        raise faults.translate_error(e, catalog=db_path) or CatalogError(
            f"cannot read catalog {db_path}: {e}"
        ) from None
    if version < LATEST_VERSION:
        conn.close()
        raise ReadOnlyCatalogError(
            f"catalog {db_path} is read-only and has schema version {version}, older than this dlindex's "
            f"{LATEST_VERSION}: run any dlindex command on it once with write access (it upgrades in place), "
            "or copy it somewhere writable"
        )
    return conn


def readonly_reason(db_path: Path) -> str | None:
    """Why dlindex cannot write ``db_path``, or None when it can."""
    try:
        if os.statvfs(db_path).f_flag & os.ST_RDONLY:
            return "read-only filesystem"
    except OSError:
        pass
    if not os.access(db_path, os.W_OK):
        return "the file is not writable"
    folder = db_path.parent if str(db_path.parent) else Path(".")
    if not _writable_dir(folder):
        # WAL needs -wal and -shm beside the file; writable ones already there will do.
        sidecars = [Path(os.fspath(db_path) + suffix) for suffix in ("-wal", "-shm")]
        if not all(p.exists() and os.access(p, os.W_OK) for p in sidecars):
            return f"its folder {folder} is not writable"
    return None


def _writable_dir(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def rollback(conn: Connection) -> None:
    """Roll back if a transaction is still open. SQLite ends some failed transactions itself
    (a full disk, an I/O error): a second ROLLBACK would raise "cannot rollback - no
    transaction is active" and hide the real cause, so that error is never raised from here."""
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _check_before_open(db_path: Path, *, create: bool) -> None:
    if not db_path.exists():
        if not create:
            raise CatalogError(f"no catalog at {db_path}; run: dlindex scan DIR --db {_quote_arg(db_path)}")
        parent = db_path.parent if str(db_path.parent) else Path(".")
        if not parent.is_dir():
            raise CatalogError(f"cannot create catalog {db_path}: folder {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise CatalogError(f"cannot create catalog {db_path}: folder {parent} is not writable")
        return
    if db_path.is_dir():
        raise CatalogError(f"{db_path} is a directory, not a catalog file")
    # Never open() the file itself: closing any descriptor of it drops every POSIX lock this
    # process holds on it, including those of other open connections (another thread's
    # catalog), and a writer elsewhere may then reset the WAL under them (SQLite's "How To
    # Corrupt", 2.1). SQLite's own ro connection below shares those locks safely.
    try:
        size = db_path.stat().st_size
    except OSError as e:
        raise CatalogError(f"cannot read catalog {db_path}: {e.strerror}") from None
    if not os.access(db_path, os.R_OK):
        raise CatalogError(f"cannot read catalog {db_path}: Permission denied")
    if size == 0:
        if create:
            return  # an empty file is an empty database: scan may initialise it
        raise CatalogError(f"{db_path} is empty, not a dlindex catalog")
    app_id, version, tables, columns = _read_header(db_path)
    if app_id != APPLICATION_ID and (app_id != 0 or tables):
        raise CatalogError(f"{db_path} is an SQLite database but not a dlindex catalog")
    if app_id == 0 and not tables and not create:
        raise CatalogError(f"{db_path} is an empty SQLite database, not a dlindex catalog")
    if version > LATEST_VERSION:
        raise CatalogError(
            f"{db_path} has catalog schema version {version}, newer than this dlindex "
            f"supports ({LATEST_VERSION}); upgrade dlindex"
        )
    if version < 0:  # user_version is a signed 32-bit header field; dlindex never writes a negative one
        raise faults.damaged_error(db_path, f"the schema version in its header is {version}")
    lost = missing_tables(tables, version)
    if lost:
        raise faults.damaged_error(db_path, f"table {', '.join(lost)} is missing")
    if columns:
        raise faults.damaged_error(
            db_path, f"column {', '.join(columns[:3])} is not as dlindex made it: renamed, retyped or no longer a key"
        )


def _read_header(db_path: Path) -> tuple[int, int, set[str], list[str]]:
    try:
        try:
            return _header(db_path, _file_uri(db_path, "mode=ro"))
        except sqlite3.Error as e:
            name = faults.sqlite_error_name(e)
            if name == "SQLITE_READONLY_ROLLBACK":
                # A hot journal: a writer in rollback-journal mode (a large features import)
                # was killed. Only a read-write open can roll it back, as any SQLite client
                # does; that restores the last committed state, it changes nothing.
                return _header(db_path, _file_uri(db_path, "mode=rw"))
            if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")) and readonly_uri(db_path).endswith(
                "immutable=1"
            ):
                return _header(db_path, readonly_uri(db_path))  # no -wal/-shm can be made here, none is needed
            raise
    except sqlite3.Error as e:
        name = faults.sqlite_error_name(e)
        if name == "SQLITE_NOTADB":
            raise CatalogError(f"{db_path} is not a dlindex catalog (not an SQLite database)") from None
        if name.startswith("SQLITE_BUSY"):
            raise CatalogBusyError(faults.busy_message(db_path, default_wait())) from None
        if name.startswith("SQLITE_CORRUPT"):
            raise faults.damaged_error(db_path, str(e)) from None
        if name == "SQLITE_READONLY_ROLLBACK":
            raise ReadOnlyCatalogError(
                f"catalog {db_path} has a hot journal left by a killed writer and cannot be written here; "
                "open it once with write access to roll that back"
            ) from None
        raise faults.translate_error(e, catalog=db_path) or CatalogError(
            f"cannot open catalog {db_path}: {e}"
        ) from None


def _header(db_path: Path, uri: str) -> tuple[int, int, set[str], list[str]]:
    conn = sqlite3.connect(uri, uri=True, timeout=default_wait())
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {str(name) for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns = changed_columns(conn, int(version))
    except UnicodeDecodeError:
        # sqlite3 could not even decode the error message: the schema itself is garbage.
        raise faults.damaged_error(db_path, "malformed database schema") from None
    finally:
        conn.close()
    return int(app_id), int(version), tables, columns


def _remove_new_file(db_path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with suppress(OSError):
            os.unlink(os.fspath(db_path) + suffix)


def _quote_arg(path: Path) -> str:
    return shlex.quote(os.fspath(path))
