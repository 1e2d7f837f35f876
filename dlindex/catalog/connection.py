"""The Catalog: one open catalog, its write transactions, and the query log of its reads."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from dlindex import faults
from dlindex.catalog.as_of import Pinned, pinned_state, resolve
from dlindex.catalog.backend import (
    CLOSED_ERRORS,
    SQL_ERRORS,
    Backend,
    Connection,
    ReadConnection,
    is_server_url,
)
from dlindex.catalog.recorder import QueryLog, flush_catalog_log
from dlindex.catalog.sqlite.backend import SqliteBackend
from dlindex.catalog.sqlite.connect import DEFAULT_DB, default_wait, is_write_command, rollback
from dlindex.catalog.state import BUMP, CatalogState, new_token, read_state
from dlindex.catalog.versions import OpenVersion, versioned
from dlindex.errors import (
    DamagedCatalogError,
    DlindexError,
    DlindexWarning,
    ReadOnlyCatalogError,
)

_CHANGES = "SELECT counter FROM catalog_changes WHERE id = 1"
_ABANDON_SCAN = "UPDATE scans SET state = 'interrupted' WHERE id = ? AND state = 'running'"
_LOG_FLUSH_TIMEOUT_MS = 100  # a busy catalog postpones a mid-run log flush, never stalls a reader


def backend_for(location: str | os.PathLike[str]) -> Backend:
    """The backend of the catalog at ``location``: a ``postgresql://`` URL is a server catalog,
    anything else a file (nothing is opened yet). The server's modules are imported only for a
    server catalog: a tenth of a file catalog's command start-up."""
    if is_server_url(location):
        from dlindex.catalog.postgres.backend import PostgresBackend

        return PostgresBackend(str(location))
    return SqliteBackend(location)


class Catalog:
    """An open catalog: a sqlite3 connection in autocommit mode plus its sqlite-utils view.

    ``Catalog("train.db")`` opens an existing catalog (``create=True`` allows a new file,
    which only ``scan`` does); every check runs before anything is written, so a foreign
    or newer file is refused untouched. Writes go through ``write_transaction()`` (BEGIN
    IMMEDIATE), so a writer never fails half-way on a lock upgrade and a crash leaves
    either all of a batch or none of it.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, create: bool = False, log: bool | None = None,
        wait: float | None = None, at: str | None = None,
    ) -> None:  # fmt: skip
        """Args:
        log: record reads and writes in the query log; default: on unless ``$DLINDEX_NO_LOG``.
        wait: seconds to wait for another process's write lock (default ``$DLINDEX_WAIT``, 30).
        at: read the catalog as it stood at this version, tag or export (dlindex.catalog.as_of).

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
        #: what differs between a file and a server catalog (dlindex.catalog.backend);
        #: ``backend.name`` is "sqlite" or "postgresql" (docs/postgres.md)
        self.backend: Backend = backend_for(location)
        self.path, self.url = self.backend.path, self.backend.url
        self.readonly_reason = self.backend.readonly_reason()
        if create and self.readonly_reason is not None:
            raise ReadOnlyCatalogError(
                f"catalog {self.path} is read-only ({self.readonly_reason}); nothing was changed"
            )
        self.conn: Connection = self.backend.connect(
            create=create, readonly=self.readonly_reason is not None, wait_s=self.wait_s
        )
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
        self.open_version: OpenVersion | None = None  # the running command's (Catalog.versioned)
        #: the state every read answers for (``at``), or None: the catalog as it is now
        self.pinned: Pinned | None = None
        if at is not None:
            try:
                self.pinned = resolve(self.conn, at)
                self.backend.pin_state(self.conn, self.pinned.state)
            except BaseException:
                self.conn.close()
                raise

    def connect_reader(self, *, any_thread: bool = False) -> ReadConnection:
        """Another read-only connection to this catalog, at the same state (``at``)."""
        reader = self.backend.connect_reader(timeout=self.wait_s, any_thread=any_thread)
        if self.pinned is not None:
            self.backend.pin_state(reader, self.pinned.state)
        return reader

    def versioned(self, command: str) -> AbstractContextManager[OpenVersion]:
        """The writes inside the block are one numbered version (dlindex.catalog.versions):
        opened by its first write, closed at the end (or dropped where nothing changed)."""
        return versioned(self, command)

    @property
    def location(self) -> str:
        """Where the catalog is, as index.json and messages name it: the file's absolute path,
        or the server catalog's URL without its password."""
        return self.backend.location

    def identity(self) -> str:
        """Which catalog this is, as a digest that two different catalogs never share: a file by
        host, real path and inode (a new file at the same path is another catalog); a server
        catalog by its URL (with this host's name where the URL is local), its database and
        its tables (a dropped and remade catalog is another one). Keys the L2 cache and the
        matrix cache of a server catalog."""
        return self.backend.identity(self.conn)

    @property
    def db(self) -> Any:
        """The catalog file as a ``sqlite_utils.Database`` (imported on first use: it pulls in
        pandas and numpy when they are installed, which would slow every command's start).
        A server catalog has no such view: CatalogError, in one line."""
        if self._db is None:
            self._db = self.backend.sqlite_utils(self.conn)
        return self._db

    def close(self) -> None:
        self.backend.stop_write_check()
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
            self.found_damaged(exc)
        self.close()

    def found_damaged(self, exc: BaseException) -> None:
        """After an error that says the file is damaged, write nothing more into it: the user
        was told "nothing was written", and `dlindex check` must read the file as it was found."""
        if faults.is_damage(exc):
            self.querylog.enabled = False

    def check_ahead(self) -> None:
        """Start the check the first write runs, now and beside the caller's own start-up: a
        command that will write calls this as soon as the catalog is open (``dlindex scan``)."""
        if self.readonly_reason is None and not self._checked_for_write:
            self.backend.start_write_check()

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
    def write_transaction(self, *, bookkeeping: bool = False) -> Iterator[Connection]:
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
        except SQL_ERRORS as e:
            raise self._translate(e, bookkeeping) from None
        try:  # first: the rows this transaction writes carry the state it makes (history_schema)
            if not bookkeeping:
                conn.execute(BUMP, {"token": new_token()})
        except SQL_ERRORS as e:
            rollback(conn)
            raise self._translate(e, bookkeeping) from None
        log = self.querylog
        if log.enabled and not bookkeeping:
            log.record_lock_wait(time.perf_counter() - started)  # busy retries happen inside BEGIN
        if log.enabled and not bookkeeping:
            conn.on_write = log.count_write
        flushed = False
        try:
            yield conn
            conn.on_write = None
            if not bookkeeping:
                if self.open_version is not None:
                    self.open_version.touch(conn)
                if log.due():
                    log.flush_into(conn)  # rides along: no transaction of its own
                    flushed = True
            conn.execute("COMMIT")
        except BaseException as e:
            conn.on_write = None
            log.discard_writes()
            rollback(conn)
            if isinstance(e, SQL_ERRORS):
                raise self._translate(e, bookkeeping) from e
            if isinstance(e, UnicodeDecodeError) and isinstance(e.object, bytes):
                # Python's sqlite3 could not decode SQLite's message about a statement: dlindex's
                # statements are UTF-8, so it quotes damaged schema text (found by a schema fuzzer).
                raise faults.damaged_error(self.path, f"SQLite's message is not UTF-8: {e.object[:80]!r}") from e
            raise
        if flushed:
            log.flushed()
        log.commit_writes()  # only now: the writes of a transaction that did not commit are never logged as done

    def _translate(self, e: Exception, bookkeeping: bool) -> BaseException:
        """dlindex's own log and cache writes keep the raw error: their callers skip a busy or
        read-only catalog quietly. The user's writes get the one-line DlindexError (a server
        catalog's errors already are one)."""
        self.found_damaged(e)
        if bookkeeping or isinstance(e, DlindexError):
            return e
        if faults.sqlite_error_name(e).startswith("SQLITE_BUSY"):
            return self.backend.busy_error(self.path, self.wait_s, e)
        if faults.is_disk_full(e):
            # give back what the failed transaction took (for recording the failure, and for
            # the user's next run)
            self.backend.release_space(self.conn)
        return faults.translate_error(e, catalog=self.path) or e

    def _check_before_first_write(self) -> None:
        """Refuse to write into a damaged catalog; record scans whose process died as interrupted."""
        try:
            dead = self.backend.check_before_first_write(self.conn)
        except DamagedCatalogError:
            self.querylog.enabled = False  # not even bookkeeping goes into a damaged file
            raise
        self._checked_for_write = True
        if dead:
            # A scan killed (kill -9, power loss) before it could say so: it no longer runs.
            with suppress(*SQL_ERRORS), self.write_transaction(bookkeeping=True) as conn:
                conn.executemany(_ABANDON_SCAN, ((sid,) for sid in dead))

    def read(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any] = (),
        *,
        on_done: Callable[[float, int], None] | None = None,
    ) -> Iterator[tuple[Any, ...]]:
        """Run one read statement and yield its rows lazily, recording it in the query log;
        ``on_done`` is called with (seconds spent in SQLite, rows) once the rows are exhausted."""
        started = time.perf_counter()
        # bounded memory for any result: a server catalog streams, a file catalog's cursor already does
        cursor = self.conn.stream(sql, params)

        def batches() -> Generator[list[tuple[Any, ...]], None, None]:
            try:
                while batch := cursor.fetchmany(256):
                    yield batch
            finally:
                with suppress(*CLOSED_ERRORS):
                    cursor.close()

        seconds = time.perf_counter() - started
        yield from self.logged_read(sql, params, batches(), on_done=on_done, seconds=seconds, log=self.querylog.enabled)

    def logged_read(
        self,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any],
        batches: Generator[Sequence[tuple[Any, ...]], None, None],
        *,
        on_done: Callable[[float, int], None] | None = None,
        seconds: float = 0.0,
        log: bool = True,
    ) -> Iterator[tuple[Any, ...]]:
        """The rows of ``batches`` (``sql``'s, however they are read: ``read``, or
        dlindex.query.fetch), timed and logged as ``sql`` once they end or the reader stops."""
        rows = 0
        try:
            while True:
                started = time.perf_counter()
                batch = next(batches, None)
                seconds += time.perf_counter() - started
                if batch is None:
                    break
                rows += len(batch)
                yield from batch
            if on_done is not None:
                on_done(seconds, rows)
        except SQL_ERRORS as e:
            self.found_damaged(e)  # before the log below would record (and flush) this read
            raise
        finally:
            # Also runs when the reader stops early (a closed pipe), maybe after close().
            with suppress(*CLOSED_ERRORS):
                batches.close()  # the cursor, or the other connections, first
                if log and self.querylog.enabled:
                    self.querylog.record_read(self.conn, sql, params, seconds, rows)
                    self._maybe_flush_log()

    def changes(self) -> int:
        """The catalog change counter: it moves with every committed dlindex write (pinned: its ``at``)."""
        return self.pinned.state if self.pinned else int(self.conn.execute(_CHANGES).fetchone()[0])

    def state(self) -> CatalogState:
        """The counter with the token of the last write: names this content even across a
        restore from a backup (dlindex.catalog.state), as caches outside the catalog need.
        Pinned: the state read, whose content never changes, under a token of its own."""
        return pinned_state(self.pinned) if self.pinned else read_state(self.conn)

    def flush_log(self, timeout_ms: int | None = None) -> None:
        """Write buffered query-log entries now (``close()`` does this)."""
        flush_catalog_log(self, timeout_ms)

    @contextmanager
    def busy_timeout(self, timeout_ms: int | None) -> Iterator[None]:
        """Wait at most ``timeout_ms`` for a lock inside the block (None: the usual 30 s)."""
        if timeout_ms is None:
            yield
            return
        self.backend.set_lock_wait(self.conn, int(timeout_ms))
        try:
            yield
        finally:
            with suppress(*CLOSED_ERRORS):  # closed meanwhile
                self.backend.set_lock_wait(self.conn, int(self.wait_s * 1000))

    @contextmanager
    def rollback_journal(self) -> Iterator[bool]:
        """A rollback journal instead of WAL inside the block, if no other connection has the
        catalog open; yields whether it switched.

        For bulk appends (a 2 GB feature import: 15.9 s instead of 41.6 s); the backend says
        why and what it costs (``Backend.rollback_journal``).
        """
        with self.backend.rollback_journal(self.conn, self.wait_s) as switched:
            yield switched

    def _maybe_flush_log(self) -> None:
        if self.querylog.due() and not self.conn.in_transaction:
            self.flush_log(timeout_ms=_LOG_FLUSH_TIMEOUT_MS)


def connect_reader(location: str, *, timeout: float, any_thread: bool = False) -> ReadConnection:
    """A read-only connection of the catalog's own backend, for reads in another process.

    Args:
        any_thread: the connection may be used from threads other than the opener's.
    """
    return backend_for(location).connect_reader(timeout=timeout, any_thread=any_thread)


def open_catalog(path: str | os.PathLike[str] | None = None, *, create: bool = False) -> Catalog:
    """Open (or, with ``create``: make, as only ``scan`` does) the catalog at ``path`` (default
    ``$DLINDEX_DB`` or ``./dlindex.db``); raise CatalogError before changing anything."""
    return Catalog(path, create=create)
