"""The Catalog: one open catalog, its write transactions, and the query log of its reads."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from dlindex import faults
from dlindex.catalog.postgres.connect import PgConnection, is_server_url, redact
from dlindex.catalog.postgres.connect import connect as connect_postgres
from dlindex.catalog.postgres.dialect import postgres_form
from dlindex.catalog.recorder import FLUSH_ENTRIES, QueryLog
from dlindex.catalog.sqlite.connect import (
    DEFAULT_DB,
    LoggedConnection,
    Writeback,
    connect,
    default_wait,
    is_write_command,
    readonly_reason,
    rollback,
)
from dlindex.catalog.state import BUMP, CatalogState, new_token, read_state
from dlindex.errors import CatalogBusyError, CatalogConnectionLost, DlindexWarning, ReadOnlyCatalogError
from dlindex.procs import pid_alive

_SERVER_IDENTITY = postgres_form(
    "SELECT 0, 0",
    "SELECT (SELECT oid FROM pg_database WHERE datname = current_database()), 'dlindex_schema'::regclass::oid",
)
_CHANGES = "SELECT counter FROM catalog_changes WHERE id = 1"
_LOG_FLUSH_TIMEOUT_MS = 100  # a busy catalog postpones a mid-run log flush, never stalls a reader
_RUNNING_SCANS = "SELECT id, pid FROM scans WHERE state = 'running'"
_ABANDON_SCAN = "UPDATE scans SET state = 'interrupted' WHERE id = ? AND state = 'running'"
_QUICK_CHECK_BUDGET_S = 0.1  # before the first write: whole-file check of catalogs up to ~20 MB


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
        location = path if path is not None else os.environ.get("DLINDEX_DB", DEFAULT_DB)
        self.wait_s = default_wait() if wait is None else max(0.0, float(wait))
        #: why the catalog is read-only ("the file is not writable", ...), or None
        self.readonly_reason: str | None = None
        #: the catalog file, or the server catalog's URL without its password
        self.path: Path | str
        #: what another process opens: the file's path, or the server catalog's full URL
        self.url: str
        #: "sqlite" (a file) or "postgresql" (a server catalog, docs/postgres.md)
        self.backend: str
        self.conn: Any
        if is_server_url(location):
            self.url = str(location)
            self.path = redact(self.url)
            self.backend = "postgresql"
            self.conn = connect_postgres(self.url, create=create, wait_s=self.wait_s)
        else:
            self.path = file = Path(location)
            self.url = os.path.abspath(file)
            self.backend = "sqlite"
            self.readonly_reason = readonly_reason(file) if file.exists() else None
            if create and self.readonly_reason is not None:
                raise ReadOnlyCatalogError(
                    f"catalog {self.path} is read-only ({self.readonly_reason}); nothing was changed"
                )
            self.conn = connect(file, create=create, readonly=self.readonly_reason is not None, wait_s=self.wait_s)
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
    def location(self) -> str:
        """Where the catalog is, as index.json and messages name it: the file's absolute path,
        or the server catalog's URL without its password."""
        return os.fsdecode(self.url) if self.backend == "sqlite" else str(self.path)

    def identity(self) -> str:
        """Which catalog this is, as a digest that two different catalogs never share: a file by
        host, real path and inode (a new file at the same path is another catalog); a server
        catalog by its URL (with this host's name where the URL is local), its database and
        its tables (a dropped and remade catalog is another one). Keys the L2 cache and the
        matrix cache of a server catalog."""
        if self.backend == "sqlite":
            real = os.path.realpath(self.path)
            st = os.stat(real)
            text = f"file:{socket.gethostname()}:{real}:{st.st_dev}:{st.st_ino}"
        else:
            parts = urllib.parse.urlsplit(self.location)
            host = parts.hostname or ""
            local = host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")
            where = f"{host}:{parts.port or ''}" + (f"@{socket.gethostname()}" if local else "")
            row = self.conn.execute(_SERVER_IDENTITY).fetchone()
            text = json.dumps([parts.scheme, where, parts.path, *row])
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:24]

    def local_cache_dir(self) -> Path:
        """This machine's folder for what a server catalog's clients cache (feature matrices):
        ``$XDG_CACHE_HOME/dlindex/<identity>``, so a dropped and remade catalog never meets an
        old cache."""
        if self.backend == "sqlite":
            return Path(os.fspath(self.path) + "-cache")
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "dlindex" / self.identity()

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
        if exc is not None:
            self._found_damaged(exc)
        self.close()

    def _found_damaged(self, exc: BaseException) -> None:
        """After an error that says the file is damaged, write nothing more into it: the user
        was told "nothing was written", and `dlindex check` must read the file as it was found."""
        if faults.is_damage(exc):
            self.querylog.enabled = False

    def ensure_writable(self) -> None:
        """Raise now, before any long work, what the first write would raise: the catalog is
        read-only or damaged (a command that writes only at its end calls this first)."""
        if self.readonly_reason is not None:
            raise ReadOnlyCatalogError(
                f"catalog {self.path} is read-only ({self.readonly_reason}); nothing was changed"
            )
        if not self._checked_for_write:
            self._check_before_first_write()

    @contextmanager
    def write_transaction(self, *, bookkeeping: bool = False) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; the change counter moves, so cached query results expire.

        Args:
            bookkeeping: dlindex's own log and cache writes: no counter bump, not logged.
        """
        conn = self.conn
        if self.readonly_reason is not None and (not bookkeeping or is_write_command()):
            self._log_skipped = False
            raise ReadOnlyCatalogError(
                f"catalog {self.path} is read-only ({self.readonly_reason}); nothing was changed"
            )
        if (not bookkeeping or is_write_command()) and not self._checked_for_write:
            self._check_before_first_write()
        started = time.perf_counter()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise self._translate(e, bookkeeping) from None
        log = self.querylog
        if log.enabled and not bookkeeping:
            log.record_lock_wait(time.perf_counter() - started)  # busy retries happen inside BEGIN
        if log.enabled and not bookkeeping and isinstance(conn, (LoggedConnection, PgConnection)):
            conn.on_write = log.count_write
        flushed = False
        try:
            yield conn
            if isinstance(conn, (LoggedConnection, PgConnection)):
                conn.on_write = None
            if not bookkeeping:
                conn.execute(BUMP, {"token": new_token()})  # one row per transaction: scan speed is unaffected
                log.commit_writes()
                if log.due():
                    log.flush_into(conn)  # rides along: no transaction of its own
                    flushed = True
            conn.execute("COMMIT")
        except BaseException as e:
            if isinstance(conn, (LoggedConnection, PgConnection)):
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
        self._found_damaged(e)
        if bookkeeping:
            return e
        if faults.sqlite_error_name(e).startswith("SQLITE_BUSY"):
            if self.backend == "postgresql":
                return CatalogBusyError(
                    f"catalog {self.path}: another transaction held the rows this one needs for over "
                    f"{self.wait_s:.3g} s ({e}); run the command again, or wait longer with --wait SECONDS"
                )
            return CatalogBusyError(faults.busy_message(Path(self.path), self.wait_s))
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
        if self.backend == "postgresql":
            # The server checks its own pages; a scan's pid means nothing on another host,
            # so a killed scan stays 'running' until the next scan of its root ends it.
            self._checked_for_write = True
            return
        from dlindex.catalog.check import quick_check

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
        # a server catalog streams (bounded memory for any result); a file catalog's cursor already does
        cursor = self.conn.stream(sql, params) if self.backend == "postgresql" else self.conn.execute(sql, params)
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
        except sqlite3.Error as e:
            self._found_damaged(e)  # before the log below would record (and flush) this read
            raise
        finally:
            # Also runs when the reader stops early (a closed pipe), maybe after close().
            with suppress(sqlite3.ProgrammingError):
                cursor.close()
                if logging and self.querylog.enabled:
                    self.querylog.record_read(self.conn, sql, params, seconds, rows)
                    self._maybe_flush_log()

    def changes(self) -> int:
        """The catalog change counter: it moves with every committed dlindex write."""
        return int(self.conn.execute(_CHANGES).fetchone()[0])

    def state(self) -> CatalogState:
        """The counter with the token of the last write: names this content even across a
        restore from a backup (dlindex.catalog.state), as caches outside the catalog need."""
        return read_state(self.conn)

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
        except (sqlite3.ProgrammingError, CatalogConnectionLost):
            log.flushed()  # the connection is already closed (by the server: the next command says so)

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
            with suppress(sqlite3.ProgrammingError):  # closed meanwhile
                self.conn.execute(f"PRAGMA busy_timeout = {int(self.wait_s * 1000)}")

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
        flusher = Writeback(Path(self.path)) if switched else None
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


def connect_reader(location: str, *, timeout: float, any_thread: bool = False) -> Any:
    """A read-only connection of the catalog's own backend, for reads in another process.

    Args:
        any_thread: the connection may be used from threads other than the opener's.
    """
    if is_server_url(location):
        from dlindex.catalog.postgres.connect import connect_readonly as connect_postgres_readonly

        return connect_postgres_readonly(location, wait_s=timeout)
    from dlindex.catalog.sqlite.connect import connect_readonly

    return connect_readonly(location, timeout=timeout, check_same_thread=not any_thread)


def open_catalog(path: str | os.PathLike[str] | None = None, *, create: bool = False) -> Catalog:
    """Open (or, with ``create``, make) a catalog; raise CatalogError before changing anything.

    Args:
        path: the database file; default ``$DLINDEX_DB`` or ``./dlindex.db``.
        create: allow a new file (only ``scan`` does this).
    """
    return Catalog(path, create=create)
