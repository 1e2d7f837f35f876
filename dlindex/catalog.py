"""Opening a catalog: validation before any write, pragmas, and migrations."""

from __future__ import annotations

import os
import shlex
import sqlite3
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import faults
from .errors import CatalogBusyError, CatalogError, DlindexWarning, ReadOnlyCatalogError
from .migrations import APPLICATION_ID, LATEST_VERSION, apply_migrations, schema_version
from .owners import pid_alive
from .querylog import FLUSH_ENTRIES, QueryLog

if TYPE_CHECKING:
    from .query import QuerySpec

DEFAULT_DB = "dlindex.db"
BUSY_TIMEOUT_S = 30.0
PAGE_SIZE = 16384  # see _connect and docs/design.md
_BUMP_CHANGES = "UPDATE catalog_changes SET counter = counter + 1 WHERE id = 1"
_CHANGES = "SELECT counter FROM catalog_changes WHERE id = 1"
_LOG_FLUSH_TIMEOUT_MS = 100  # a busy catalog postpones a mid-run log flush, never stalls a reader
_RUNNING_SCANS = "SELECT id, pid FROM scans WHERE state = 'running'"
_ABANDON_SCAN = "UPDATE scans SET state = 'interrupted' WHERE id = ? AND state = 'running'"
_QUICK_CHECK_BUDGET_S = 0.1  # before the first write: whole-file check of catalogs up to ~20 MB
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


class Catalog:
    """An open catalog: a sqlite3 connection in autocommit mode plus its sqlite-utils view.

    ``Catalog("train.db")`` opens an existing catalog (``create=True`` allows a new file,
    which only ``scan`` does); every check runs before anything is written, so a foreign
    or newer file is refused untouched. Writes go through ``write_transaction()`` (BEGIN
    IMMEDIATE), so a writer never fails half-way on a lock upgrade and a crash leaves
    either all of a batch or none of it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        create: bool = False,
        log: bool | None = None,
        wait: float | None = None,
    ) -> None:
        """Args:
        log: record reads and writes in the query log; default: on unless ``$DLINDEX_NO_LOG``.
        wait: seconds to wait for another process's write lock (default ``$DLINDEX_WAIT``, 30).

        A catalog dlindex cannot write (a read-only file, folder or mount) opens read-only:
        reads work, the query log is skipped with one DlindexWarning, and a write raises
        ReadOnlyCatalogError.
        """
        self.path = Path(path if path is not None else os.environ.get("DLINDEX_DB", DEFAULT_DB))
        self.wait_s = default_wait() if wait is None else max(0.0, float(wait))
        #: why the catalog is read-only ("the file is not writable", ...), or None
        self.readonly_reason: str | None = _readonly_reason(self.path) if self.path.exists() else None
        if create and self.readonly_reason is not None:
            raise ReadOnlyCatalogError(f"catalog {self.path} is read-only ({self.readonly_reason}); nothing was changed")
        self.conn = _connect(self.path, create=create, readonly=self.readonly_reason is not None, wait_s=self.wait_s)
        self._db: Any = None
        self._checked_for_write = False
        if log is None:
            log = os.environ.get("DLINDEX_NO_LOG", "").strip().lower() in ("", "0", "false", "no")
        # Said once, at close, unless a refused write already said it is read-only.
        self._log_skipped = bool(log and self.readonly_reason is not None)
        if self._log_skipped:
            log = False
        self.querylog = QueryLog(log)
        # Small lookup tables (labels, roots) with the change counter they were read at.
        self.lookup_cache: dict[str, tuple[int, Any]] = {}

    @property
    def db(self) -> Any:
        """The connection as a ``sqlite_utils.Database`` (imported on first use: it pulls in
        pandas and numpy when they are installed, which would slow every command's start)."""
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self.conn)
        return self._db

    def close(self) -> None:
        self.flush_log()
        self.conn.close()
        if self._log_skipped:
            self._log_skipped = False
            warnings.warn(
                f"catalog {self.path} is read-only ({self.readonly_reason}): the query log was not recorded",
                DlindexWarning, stacklevel=2,
            )  # fmt: skip

    def __enter__(self) -> Catalog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def ensure_writable(self) -> None:
        """Raise now, before any long work, what the first write would raise: the catalog is
        read-only or damaged (a command that writes only at its end calls this first)."""
        if self.readonly_reason is not None:
            raise ReadOnlyCatalogError(f"catalog {self.path} is read-only ({self.readonly_reason}); nothing was changed")
        if not self._checked_for_write:
            self._check_before_first_write()

    @contextmanager
    def write_transaction(self, *, bookkeeping: bool = False) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; the change counter moves, so cached query results expire.

        Args:
            bookkeeping: dlindex's own log and cache writes: no counter bump, not logged.
        """
        conn = self.conn
        if self.readonly_reason is not None and (not bookkeeping or _write_command):
            self._log_skipped = False
            raise ReadOnlyCatalogError(f"catalog {self.path} is read-only ({self.readonly_reason}); nothing was changed")
        if (not bookkeeping or _write_command) and not self._checked_for_write:
            self._check_before_first_write()
        started = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise self._translate(e, bookkeeping) from None
        log = self.querylog
        if log.enabled and not bookkeeping:
            log.record_lock_wait(time.perf_counter() - started)  # busy retries happen inside BEGIN
        if log.enabled and not bookkeeping and isinstance(conn, _Connection):
            conn.on_write = log.count_write
        flushed = False
        try:
            yield conn
            if isinstance(conn, _Connection):
                conn.on_write = None
            if not bookkeeping:
                conn.execute(_BUMP_CHANGES)  # one row per transaction: scan speed is unaffected
                log.commit_writes()
                if log.due():
                    log.flush_into(conn)  # rides along: no transaction of its own
                    flushed = True
            conn.execute("COMMIT")
        except BaseException as e:
            if isinstance(conn, _Connection):
                conn.on_write = None
            log.discard_writes()
            rollback(conn)
            if isinstance(e, sqlite3.Error):
                raise self._translate(e, bookkeeping) from e
            raise
        if flushed:
            log.flushed()

    def _translate(self, e: sqlite3.Error, bookkeeping: bool) -> BaseException:
        """dlindex's own log and cache writes keep the raw error: their callers skip a busy or
        read-only catalog quietly. The user's writes get the one-line DlindexError."""
        if bookkeeping:
            return e
        if faults.sqlite_error_name(e).startswith("SQLITE_BUSY"):
            return CatalogBusyError(faults.busy_message(self.path, self.wait_s))
        if faults.is_disk_full(e):
            self._release_wal()
        return faults.translate_error(e, catalog=self.path) or e

    def _release_wal(self) -> None:
        """After a write failed for space, give back what the -wal file holds: committed pages
        move into the catalog and the log is cut to zero, so the space the failed transaction
        took is free again (for recording the failure, and for the user's next run)."""
        with suppress(sqlite3.Error):
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _check_before_first_write(self) -> None:
        """Refuse to write into a damaged catalog; record scans whose process died as interrupted.

        The whole-file check runs within a time budget (a catalog of ~20 MB is checked in full;
        a larger one as far as the budget reaches: every page a write touches is still checked
        by SQLite, and `dlindex check` reads everything).
        """
        from .check import quick_check

        problems = quick_check(self.conn, budget_s=_QUICK_CHECK_BUDGET_S)
        if problems:
            self.querylog.enabled = False  # not even bookkeeping goes into a damaged file
            raise faults.damaged_error(self.path, problems[0])
        self._checked_for_write = True
        try:
            dead = [sid for sid, pid in self.conn.execute(_RUNNING_SCANS).fetchall() if not pid_alive(pid)]
        except sqlite3.Error as e:
            raise faults.translate_error(e, catalog=self.path) or e from None
        if dead:
            # A scan killed (kill -9, power loss) before it could say so: it no longer runs.
            with suppress(sqlite3.Error), self.write_transaction(bookkeeping=True) as conn:
                conn.executemany(_ABANDON_SCAN, ((sid,) for sid in dead))

    def read(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] = (),
        *,
        on_done: Callable[[float, int], None] | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        """Run one read statement and yield its rows lazily, recording it in the query log.

        Args:
            on_done: called with (seconds spent in SQLite, rows) once the rows are exhausted.
        """
        logging = self.querylog.enabled
        started = time.perf_counter()
        cursor = self.conn.execute(sql, params)
        seconds = time.perf_counter() - started
        rows = 0
        try:
            while True:
                started = time.perf_counter()
                batch = cursor.fetchmany(256)
                seconds += time.perf_counter() - started
                if not batch:
                    break
                rows += len(batch)
                yield from batch
            if on_done is not None:
                on_done(seconds, rows)
        finally:
            # Also runs when the reader stops early (a closed pipe), maybe after close().
            with suppress(sqlite3.ProgrammingError):
                cursor.close()
                if logging:
                    self.querylog.record_read(self.conn, sql, params, seconds, rows)
                    self._maybe_flush_log()

    def changes(self) -> int:
        """The catalog change counter: it moves with every committed dlindex write."""
        return int(self.conn.execute(_CHANGES).fetchone()[0])

    def query(self, spec: QuerySpec | None = None, **options: Any) -> Iterator[dict[str, Any]]:
        """Rows matching filters, as dicts, lazily; see ``dlindex.query.QuerySpec`` for options.

            for row in Catalog("train.db").query(per_label=32, processed=True, seed=0):
                ...
        """
        from . import query  # on first use: commands that never query do not import it

        return query.query_rows(self, spec or query.QuerySpec(**options))

    def sample_ids(self, spec: QuerySpec | None = None, **options: Any) -> list[int]:
        """The ids that ``query`` with the same options would yield, in the same order."""
        from . import query

        return query.sample_ids(self, spec or query.QuerySpec(**options))

    def features(self, ids: Sequence[int], feature_type: str) -> Any:
        """The ``(len(ids), dim)`` numpy array of ``feature_type`` vectors, in the order of ``ids``.

        An unknown type raises InputError naming the known ones; see ``dlindex.features``.
        """
        from .features import feature_vectors  # numpy: only for callers that use features

        return feature_vectors(self, ids, feature_type)

    def flush_log(self, timeout_ms: int | None = None) -> None:
        """Write buffered query-log entries now (``close()`` does this)."""
        log = self.querylog
        if not log.enabled or not log.has_entries():
            return
        try:
            with self.busy_timeout(timeout_ms), self.write_transaction(bookkeeping=True) as conn:
                log.flush_into(conn)
            log.flushed()
        except sqlite3.OperationalError:
            # Busy or read-only: the log is evidence, not data; never fail the user's work.
            # A mid-run flush keeps its entries for the next try, up to a bound.
            if timeout_ms is None or len(log.entries) > 10 * FLUSH_ENTRIES:
                log.flushed()
        except sqlite3.ProgrammingError:
            log.flushed()  # the connection is already closed

    @contextmanager
    def busy_timeout(self, timeout_ms: int | None) -> Iterator[None]:
        """Wait at most ``timeout_ms`` for a lock inside the block (None: the usual 30 s)."""
        if timeout_ms is None:
            yield
            return
        self.conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")  # PRAGMA takes no parameters
        try:
            yield
        finally:
            try:
                self.conn.execute(f"PRAGMA busy_timeout = {int(self.wait_s * 1000)}")
            except sqlite3.ProgrammingError:
                pass  # closed meanwhile

    @contextmanager
    def rollback_journal(self) -> Iterator[bool]:
        """A rollback journal instead of WAL inside the block, if no other connection has the
        catalog open; yields whether it switched.

        For bulk appends: a rollback journal saves only pages that existed before the write
        transaction (an append adds new ones), where WAL writes every page twice, to the log
        and again at the checkpoint. A 2 GB feature import took 15.9 s instead of 41.6 s.
        The price: a process that opens the catalog meanwhile waits (busy timeout) until the
        block ends. ``synchronous = FULL`` keeps a rollback journal safe from power loss.
        """
        conn = self.conn
        try:
            with self.busy_timeout(0):  # someone else has it open: keep WAL, don't wait
                switched = conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
        except sqlite3.OperationalError:
            switched = False
        if switched:
            conn.execute("PRAGMA synchronous = FULL")
        flusher = _Writeback(self.path) if switched else None
        try:
            yield switched
        finally:
            if flusher is not None:
                flusher.stop()
            if switched:
                # Every open sets WAL again, so a failure here (a waiting opener won the
                # lock) costs nothing lasting.
                with suppress(sqlite3.Error):
                    conn.execute("PRAGMA synchronous = NORMAL")
                    conn.execute("PRAGMA journal_mode = WAL")

    def _maybe_flush_log(self) -> None:
        if self.querylog.due() and not self.conn.in_transaction:
            self.flush_log(timeout_ms=_LOG_FLUSH_TIMEOUT_MS)


class _Connection(sqlite3.Connection):
    """A connection that can report each write statement it runs (to the query log)."""

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


class _Writeback:
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


def open_catalog(path: str | os.PathLike[str] | None = None, *, create: bool = False) -> Catalog:
    """Open (or, with ``create``, make) a catalog; raise CatalogError before changing anything.

    Args:
        path: the database file; default ``$DLINDEX_DB`` or ``./dlindex.db``.
        create: allow a new file (only ``scan`` does this).
    """
    return Catalog(path, create=create)


def _connect(db_path: Path, *, create: bool, readonly: bool = False, wait_s: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    existed = db_path.exists()
    _check_before_open(db_path, create=create)
    if readonly:
        return _connect_readonly(db_path, wait_s)
    try:
        conn = sqlite3.connect(
            os.fspath(db_path), isolation_level=None, timeout=wait_s, check_same_thread=False,
            factory=_Connection,
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
    base = "file:" + urllib.parse.quote(os.fspath(path.absolute()))
    wal = Path(os.fspath(path) + "-wal")
    folder = path.parent if str(path.parent) else Path(".")
    wal_empty = not wal.exists() or wal.stat().st_size == 0
    if wal_empty and not _writable_dir(folder) and not Path(os.fspath(path) + "-shm").exists():
        return base + "?immutable=1"
    return base + "?mode=ro"


def connect_readonly(db_path: str | os.PathLike[str], *, timeout: float = BUSY_TIMEOUT_S, **options: Any) -> sqlite3.Connection:
    """A read-only sqlite3 connection to ``db_path`` (see ``readonly_uri``), for workers,
    loaders and scratch copies that must work on read-only catalogs too."""
    return sqlite3.connect(readonly_uri(db_path), uri=True, timeout=timeout, **options)


def _connect_readonly(db_path: Path, wait_s: float) -> sqlite3.Connection:
    try:
        conn = connect_readonly(db_path, timeout=wait_s, isolation_level=None, check_same_thread=False, factory=_Connection)
        conn.execute(f"PRAGMA busy_timeout = {int(wait_s * 1000)}")
        version = schema_version(conn)
    except UnicodeDecodeError as e:  # SQLite's message quoted garbage from a damaged schema
        raise faults.damaged_error(db_path, faults.garbled_message(e)) from None
    except sqlite3.Error as e:
        if faults.sqlite_error_name(e).startswith("SQLITE_BUSY"):
            raise CatalogBusyError(faults.busy_message(db_path, wait_s)) from None
        raise faults.translate_error(e, catalog=db_path) or CatalogError(f"cannot read catalog {db_path}: {e}") from None
    if version < LATEST_VERSION:
        conn.close()
        raise ReadOnlyCatalogError(
            f"catalog {db_path} is read-only and has schema version {version}, older than this dlindex's "
            f"{LATEST_VERSION}: run any dlindex command on it once with write access (it upgrades in place), "
            "or copy it somewhere writable"
        )
    return conn


def _readonly_reason(db_path: Path) -> str | None:
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


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open. SQLite ends some failed transactions itself
    (a full disk, an I/O error): a second ROLLBACK would raise "cannot rollback - no
    transaction is active" and hide the real cause, so that error is never raised from here."""
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _check_before_open(db_path: Path, *, create: bool) -> None:
    if not db_path.exists():
        if not create:
            raise CatalogError(
                f"no catalog at {db_path}; run: dlindex scan DIR --db {_quote_arg(db_path)}"
            )
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
    app_id, version, tables = _read_header(db_path)
    if app_id != APPLICATION_ID and (app_id != 0 or tables):
        raise CatalogError(f"{db_path} is an SQLite database but not a dlindex catalog")
    if app_id == 0 and not tables and not create:
        raise CatalogError(f"{db_path} is an empty SQLite database, not a dlindex catalog")
    if version > LATEST_VERSION:
        raise CatalogError(
            f"{db_path} has catalog schema version {version}, newer than this dlindex "
            f"supports ({LATEST_VERSION}); upgrade dlindex"
        )
    from .check import missing_tables

    lost = missing_tables(tables, version)
    if lost:
        raise faults.damaged_error(db_path, f"table {', '.join(lost)} is missing")


def _read_header(db_path: Path) -> tuple[int, int, set[str]]:
    try:
        try:
            return _header(db_path, "file:" + urllib.parse.quote(os.fspath(db_path.absolute())) + "?mode=ro")
        except sqlite3.Error as e:
            name = faults.sqlite_error_name(e)
            if name == "SQLITE_READONLY_ROLLBACK":
                # A hot journal: a writer in rollback-journal mode (a large features import)
                # was killed. Only a read-write open can roll it back, as any SQLite client
                # does; that restores the last committed state, it changes nothing.
                return _header(db_path, "file:" + urllib.parse.quote(os.fspath(db_path.absolute())) + "?mode=rw")
            if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")) and readonly_uri(db_path).endswith("immutable=1"):
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
        raise faults.translate_error(e, catalog=db_path) or CatalogError(f"cannot open catalog {db_path}: {e}") from None


def _header(db_path: Path, uri: str) -> tuple[int, int, set[str]]:
    conn = sqlite3.connect(uri, uri=True, timeout=default_wait())
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {str(name) for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except UnicodeDecodeError:
        # sqlite3 could not even decode the error message: the schema itself is garbage.
        raise faults.damaged_error(db_path, "malformed database schema") from None
    finally:
        conn.close()
    return int(app_id), int(version), tables


def _remove_new_file(db_path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(os.fspath(db_path) + suffix)
        except OSError:
            pass


def _quote_arg(path: Path) -> str:
    return shlex.quote(os.fspath(path))
