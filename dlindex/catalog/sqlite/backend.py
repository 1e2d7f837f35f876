"""The SQLite backend: a catalog file, its journals beside it, and one writer at a time."""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dlindex import faults
from dlindex.catalog.as_of import view_statements
from dlindex.catalog.backend import Backend, Connection, ReadConnection
from dlindex.catalog.sqlite.connect import Writeback, connect, connect_readonly, readonly_reason
from dlindex.catalog.sqlite.migrations import schema_version
from dlindex.catalog.sqlite.text_schema import has_search
from dlindex.errors import CatalogBusyError

if TYPE_CHECKING:
    from dlindex.catalog.sqlite.check_ahead import CheckAhead

_CACHE_KIB = "SELECT * FROM pragma_cache_size"
_MAX_CACHE_KIB = 256 * 1024
_RUNNING_SCANS = "SELECT id, pid FROM scans WHERE state = 'running'"
_QUICK_CHECK_BUDGET_S = 0.1  # before the first write: files up to 32 MiB in full, a larger one as far as 0.1 s reaches


class SqliteBackend(Backend):
    name = "sqlite"
    is_server = False
    advisor = "replay"
    storage = "file"

    def __init__(self, location: str | os.PathLike[str]) -> None:
        self.path = Path(location)
        self.url = os.path.abspath(self.path)
        self._ahead: CheckAhead | None = None

    @property
    def location(self) -> str:
        return os.fsdecode(self.url)

    def readonly_reason(self) -> str | None:
        return readonly_reason(Path(self.path)) if Path(self.path).exists() else None

    def connect(self, *, create: bool, readonly: bool, wait_s: float) -> Connection:
        conn = connect(Path(self.path), create=create, readonly=readonly, wait_s=wait_s)
        return cast(Connection, conn)

    def connect_reader(self, *, timeout: float, any_thread: bool = False) -> ReadConnection:
        conn = connect_readonly(self.location, timeout=timeout, check_same_thread=not any_thread)
        return cast(ReadConnection, conn)

    def identity(self, conn: Connection) -> str:
        """The file by host, real path and inode: a new file at the same path is another catalog."""
        real = os.path.realpath(self.path)
        st = os.stat(real)
        text = f"file:{socket.gethostname()}:{real}:{st.st_dev}:{st.st_ino}"
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:24]

    def features_dir(self, conn: Connection) -> Path:
        return Path(os.fspath(self.path) + "-features")

    def files(self) -> list[str]:
        path = os.fspath(self.path)
        return [path, *(path + suffix for suffix in ("-wal", "-journal", "-shm"))]

    def is_location(self, written_from: str) -> bool:
        return os.path.realpath(written_from) == os.path.realpath(self.path)

    def schema_version(self, conn: Connection) -> int:
        return schema_version(cast(sqlite3.Connection, conn))

    def size_bytes(self, conn: Connection) -> int:
        total = 0
        for suffix in ("", "-wal"):
            with suppress(OSError):
                total += os.path.getsize(os.fspath(self.path) + suffix)
        return total

    def bulk_insert(
        self, conn: Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, statement: str
    ) -> None:
        conn.executemany(statement, rows)

    def set_lock_wait(self, conn: Connection, wait_ms: int) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")  # PRAGMA takes no parameters

    def busy_error(self, path: Path | str, wait_s: float, e: BaseException) -> CatalogBusyError:
        return CatalogBusyError(faults.busy_message(Path(path), wait_s))

    def lock_rows(self, conn: Connection, selects: Sequence[str]) -> None:
        """Nothing: BEGIN IMMEDIATE already holds the file's write lock."""

    def pin_state(self, conn: ReadConnection, state: int) -> None:
        for statement in view_statements(state, qualify="main"):
            conn.execute(statement)

    def end_temp_table(self, conn: Connection, table: str) -> None:
        if not table.isidentifier():
            raise ValueError(f"not a table name: {table!r}")
        conn.execute(f"DROP TABLE IF EXISTS temp.{table}")  # a name from dlindex's code, checked

    def check_before_first_write(self, conn: Connection) -> list[int]:
        """The whole-file check runs within a time budget (a catalog of ~20 MB is checked in
        full; a larger one as far as the budget reaches: every page a write touches is still
        checked by SQLite, and `dlindex check` reads everything)."""
        from dlindex.catalog.check import quick_check
        from dlindex.pids import pid_alive

        ahead, self._ahead = self._ahead, None
        problems = ahead.verdict() if ahead is not None else None
        if problems is None:
            problems = quick_check(cast(sqlite3.Connection, conn), budget_s=_QUICK_CHECK_BUDGET_S)
        if problems:
            raise faults.damaged_error(self.path, problems[0])
        try:
            return [sid for sid, pid in conn.execute(_RUNNING_SCANS).fetchall() if not pid_alive(pid)]
        except sqlite3.Error as e:
            raise faults.translate_error(e, catalog=self.path) or e from None

    def start_write_check(self) -> None:
        """The same check, on a thread and a connection of its own (dlindex.catalog.sqlite.check_ahead)."""
        from dlindex.catalog.sqlite.check_ahead import CheckAhead

        if self._ahead is None:
            self._ahead = CheckAhead(self.location, _QUICK_CHECK_BUDGET_S)

    def stop_write_check(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()

    @contextmanager
    def page_cache(self, conn: Connection, size: int) -> Iterator[None]:
        """As large as the write (at most 256 MiB): with SQLite's default 2 MiB, index pages are
        spilled to the WAL and rewritten over and over (a 1,000,000-vector import: 15-20% slower)."""
        before = int(conn.execute(_CACHE_KIB).fetchone()[0])
        kib = min(_MAX_CACHE_KIB, size // 1024 + 1024)
        conn.execute(f"PRAGMA cache_size = {-int(kib)}")  # PRAGMA takes no parameters; an int
        try:
            yield
        finally:
            conn.execute(f"PRAGMA cache_size = {int(before)}")

    def release_space(self, conn: Connection) -> None:
        """Committed pages move into the catalog and the -wal file is cut to zero."""
        with suppress(sqlite3.Error):
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def has_text_search(self, conn: Connection) -> bool:
        return has_search(cast(sqlite3.Connection, conn))

    @contextmanager
    def rollback_journal(self, conn: Connection, wait_s: float) -> Iterator[bool]:
        """A rollback journal instead of WAL: it saves only pages that existed before the write
        transaction (an append adds new ones), where WAL writes every page twice, to the log and
        again at the checkpoint. ``synchronous = FULL`` keeps it safe from power loss."""
        try:
            self.set_lock_wait(conn, 0)  # someone else has it open: keep WAL, don't wait
            switched = conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
        except sqlite3.OperationalError:
            switched = False
        finally:
            with suppress(sqlite3.ProgrammingError):  # closed meanwhile
                self.set_lock_wait(conn, int(wait_s * 1000))
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

    def read_arrow(
        self, conn: Connection, sql: str, params: Mapping[str, Any], columns: Sequence[tuple[str, str]]
    ) -> Iterator[Any] | None:
        from dlindex.catalog.sqlite.arrow_read import open_batches  # pyarrow and the driver: only here

        if conn.in_transaction:  # its uncommitted rows: only this connection sees them
            return None
        return open_batches(conn, self.path, sql, params, columns)

    def sqlite_utils(self, conn: Connection) -> Any:
        # imported on first use: it pulls in pandas and numpy when they are installed
        import sqlite_utils

        return sqlite_utils.Database(cast(sqlite3.Connection, conn))
