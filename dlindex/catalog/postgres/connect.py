"""PostgreSQL connections to a server catalog, which run dlindex's SQLite-dialect SQL.

The URL, the checks before any write, the schema under an advisory lock, and the connection.
``PgConnection`` speaks ``dlindex.catalog.backend.Connection`` (execute, executemany, stream,
fetch, rowcount, lastrowid, in_transaction) and raises dlindex's own exceptions for what fails
(``dlindex_error``: CatalogLockTimeout for a lock wait that ran out or a deadlock, CatalogFullError,
CatalogReadOnlySQLError, CatalogIntegrityError, else CatalogOperationalError). Statements are rewritten
by ``dialect.translate``; bulk inserts use COPY (``copy_rows``); psycopg 3 is imported only when
a ``postgresql://`` catalog is opened (``pip install 'dlindex[postgres]'``). Streamed reads are
read whole, so every connection plans cursors for all their rows (``cursor_tuple_fraction``).
"""

from __future__ import annotations

import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from dlindex.catalog.postgres.aside import ReadsAside
from dlindex.catalog.postgres.cursor import STREAM_ROWS, Counted, PgCursor, Rows, Streamed
from dlindex.catalog.postgres.dialect import bind, translate, wants_lastrowid
from dlindex.catalog.postgres.migrations import ensure_schema
from dlindex.errors import (
    CatalogClosedError,
    CatalogConnectionLost,
    CatalogError,
    CatalogFullError,
    CatalogIntegrityError,
    CatalogLockTimeout,
    CatalogOperationalError,
    CatalogReadOnlySQLError,
    CatalogSQLError,
    InputError,
)

_CONNECT_TIMEOUT_S = 10


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "postgresql://..."
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = urllib.parse.quote(parts.username or "", safe="")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def busy_message(path: object, wait_s: float, detail: str) -> str:
    return (
        f"catalog {path}: another transaction held the rows this one needs for over {wait_s:.3g} s "
        f"({detail}); run the command again, or wait longer with --wait SECONDS"
    )


_QUIET = logging.NullHandler()  # one instance: addHandler ignores a handler it already has


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise InputError("a postgresql:// catalog needs psycopg 3: pip install 'dlindex[postgres]'") from None
    # psycopg logs what it ignores while ending a failed pipeline ("error ignored terminating …");
    # with no logging set up, Python's last-resort handler would print that beside dlindex's one
    # error line. A NullHandler keeps it off stderr; an application's own handlers still get it.
    logging.getLogger("psycopg").addHandler(_QUIET)
    return psycopg


def connect(url: str, *, create: bool, wait_s: float) -> PgConnection:
    """Open the server catalog at ``url``; with ``create`` make its tables if the database
    has none. Raises CatalogError (one line, nothing written) for an unreachable server, a
    refused login, a database that is not a dlindex catalog or one of another version."""
    psycopg = _psycopg()
    shown = redact(url)
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError as e:
        raise InputError(f"--db {shown}: not a valid PostgreSQL URL ({e})") from None
    try:
        raw = psycopg.connect(url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S, application_name="dlindex")
    except psycopg.ProgrammingError as e:
        raise InputError(f"--db {shown}: not a valid PostgreSQL URL ({_first_line(e)})") from None
    except psycopg.OperationalError as e:
        raise CatalogError(f"cannot open the PostgreSQL catalog {shown}: {_first_line(e)}") from None
    conn = PgConnection(raw, shown, aside=lambda: connect_readonly(url, wait_s=conn.wait_s, aside=False))
    try:
        conn.set_lock_wait(wait_s)
        ensure_schema(conn, create=create)
    except BaseException:
        conn.close()
        raise
    return conn


def connect_readonly(url: str, *, wait_s: float, aside: bool = True) -> PgConnection:
    """A read-only connection to an existing server catalog (a scan worker's diff reads);
    ``aside``: its streamed reads go to a second one (``dlindex.catalog.postgres.aside``)."""
    psycopg = _psycopg()
    try:
        raw = psycopg.connect(url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S, application_name="dlindex",
                              options="-c default_transaction_read_only=on")  # fmt: skip
    except psycopg.Error as e:
        raise CatalogError(f"cannot open the PostgreSQL catalog {redact(url)}: {_first_line(e)}") from None
    conn = PgConnection(
        raw, redact(url), aside=(lambda: connect_readonly(url, wait_s=wait_s, aside=False)) if aside else None
    )
    conn.set_lock_wait(wait_s)
    return conn


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    # libpq says "connection to server at "HOST", port N failed:" before the reason
    return re.sub(r"^(?:connection failed: )?(?:connection to server (?:at|on) .*? failed: )?", "", text) or text


class PgConnection:
    """A psycopg connection in autocommit mode (transactions are BEGIN ... COMMIT statements,
    as on dlindex's SQLite connections) that speaks dlindex's SQLite dialect."""

    backend = "postgresql"
    on_write: Callable[[str, int, int, float], None] | None = None  # as LoggedConnection's

    def __init__(self, raw: Any, shown: str, aside: Callable[[], PgConnection] | None = None) -> None:
        self.raw = raw
        self.shown = shown
        self._aside = ReadsAside(aside, self) if aside is not None else None  # streamed reads outside a transaction
        self.pinned: tuple[str, ...] = ()  # the views of a past state (pin), made again on the second connection
        self._open_reads: set[int] = set()  # slots of streamed reads not yet closed
        self._lost_because = "the server closed the connection"
        self._psycopg = _psycopg()
        self._register_numeric()
        raw.execute("SET cursor_tuple_fraction = 1")

    def _register_numeric(self) -> None:
        # sum() and avg() of integers are numeric on PostgreSQL; dlindex (like SQLite) wants
        # int and float, never Decimal, in its results and JSON output.
        from psycopg.adapt import Loader

        class NumericLoader(Loader):
            def load(self, data: Any) -> int | float:
                text = bytes(data).decode()
                if text in ("NaN", "Infinity", "-Infinity"):
                    return float(text)
                return int(text) if "." not in text and "e" not in text.lower() else float(text)

        self.raw.adapters.register_loader("numeric", NumericLoader)

    @property
    def in_transaction(self) -> bool:
        status = self.raw.info.transaction_status
        return bool(status != self._psycopg.pq.TransactionStatus.IDLE)

    wait_s = 30.0

    def set_lock_wait(self, wait_s: float) -> None:
        """How long a statement waits for another transaction's row lock before it fails
        (CatalogLockTimeout): ``--wait``, like SQLite's busy timeout."""
        self.execute_raw(f"SET lock_timeout = {int(max(wait_s, 0.001) * 1000)}")  # an int, not input
        self.wait_s = wait_s

    def execute(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] = (), /) -> PgCursor:
        if _EXPLAIN.match(sql):
            return self._explain(_EXPLAIN.sub("", sql, count=1), parameters)
        translated = translate(sql)
        text, params = bind(translated, parameters)
        returning_id = wants_lastrowid(text)
        if returning_id:
            text = f"{text} RETURNING id"
        cursor = self._cursor()
        started = time.perf_counter()
        with self._statement(self._may_fail_and_go_on(text), cursor):
            cursor.execute(text, params)
        report = self.on_write
        if report is not None and (cursor.description is None or returning_id) and cursor.rowcount >= 0:
            report(sql, 1, cursor.rowcount, time.perf_counter() - started)
        lastrowid = None
        if returning_id:
            row = cursor.fetchone()
            lastrowid = int(row[0]) if row else None
        return PgCursor(cursor, lastrowid)

    def stream(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] = ()) -> PgCursor:
        """Run a read through a server-side cursor, so the client holds one batch of rows at a
        time, not the whole result (a query of millions of samples); ``Catalog.read`` uses it."""
        text, params = bind(translate(sql), parameters)
        if self._aside is not None and not self.in_transaction and "pg_temp." not in text:
            return self._aside.stream(text, params)  # no WITH HOLD: no copy of the whole result first
        # the lowest free name: pg_stat_statements keys a DECLARE by its text, cursor name
        # included, so reused names keep one entry per statement (index advice reads them)
        slot = min(set(range(len(self._open_reads) + 1)) - self._open_reads)
        self._open_reads.add(slot)
        cursor = self._cursor(name=f"dlindex_read_{slot}", withhold=True)
        cursor.itersize = STREAM_ROWS
        try:
            with self._statement(False, cursor):
                cursor.execute(text, params)
        except CatalogSQLError:
            self._open_reads.discard(slot)
            raise
        return Streamed(cursor, lambda: self._open_reads.discard(slot), self._statement)

    def pin(self, statements: Sequence[str]) -> None:
        """A past state's temporary views (catalog.as_of), here and on the second connection."""
        for statement in ("BEGIN READ WRITE", *statements, "COMMIT"):
            self.execute_raw(statement)
        self.pinned = tuple(statements)

    def execute_raw(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> PgCursor:
        """Run PostgreSQL SQL as it is (psycopg parameters)."""
        cursor = self._cursor()
        with self._statement(False, cursor):
            cursor.execute(sql, parameters)
        return PgCursor(cursor)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> PgCursor:
        translated = translate(sql)
        cursor = self._cursor()
        rows = calls = 0
        started = time.perf_counter()
        with self._statement(self._may_fail_and_go_on(translated.text, bulk=True), cursor):
            batch: list[Any] = []
            text = None
            for parameters in seq_of_parameters:
                text, params = bind(translated, parameters)
                batch.append(params)
                calls += 1
                if len(batch) >= 1000:
                    cursor.executemany(text, batch)
                    rows += max(cursor.rowcount, 0)
                    batch = []
            if batch and text is not None:
                cursor.executemany(text, batch)
                rows += max(cursor.rowcount, 0)
        report = self.on_write
        if report is not None and calls:
            report(sql, calls, rows, time.perf_counter() - started)
        return Counted(cursor, rows)

    def _explain(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any]) -> PgCursor:
        """EXPLAIN QUERY PLAN as SQLite answers it, (id, parent, 0, detail) per line, with
        PostgreSQL's plan lines ("Seq Scan on t", "Index Scan using i on t") as the details."""
        text, params = bind(translate(sql), parameters)
        cursor = self._cursor()
        try:
            cursor.execute(f"EXPLAIN {text}", params)
            lines = [str(row[0]).strip().removeprefix("->").strip() for row in cursor.fetchall()]
        except self._psycopg.Error as e:
            raise (self.lost_error(e) if self.lost(e) else self.dlindex_error(e)) from e
        finally:
            with suppress(self._psycopg.Error):
                cursor.close()
        return Rows(
            [
                (i, 0, 0, line)
                for i, line in enumerate(lines)
                if not line.startswith(
                    (
                        "Filter:",
                        "Index Cond:",
                        "Recheck Cond:",
                        "Sort Key:",
                        "Hash Cond:",
                        "Join Filter:",
                        "Group Key:",
                        "Rows Removed",
                        "Output:",
                    )
                )
            ]
        )

    def _may_fail_and_go_on(self, text: str, *, bulk: bool = False) -> bool:
        """A plain INSERT inside a transaction, or any bulk INSERT (an upsert of many rows, whose
        foreign keys may refuse one): dlindex catches its IntegrityError and goes on in the same
        transaction (as SQLite allows), which PostgreSQL permits only back to a savepoint. One
        savepoint per bulk call costs nothing; one per single-row upsert would."""
        pattern = _INSERT if bulk else _PLAIN_INSERT
        return bool(pattern.match(text)) and self.in_transaction

    def _cursor(self, **options: Any) -> Any:
        """A psycopg cursor; on a closed connection CatalogClosedError, which code finishing a read
        after close() expects (dlindex.catalog.backend.CLOSED_ERRORS), as on a file catalog."""
        if self.raw.closed:
            if getattr(self.raw, "broken", False):  # closed by the server, not by dlindex
                raise self.lost_error(None)
            raise CatalogClosedError("Cannot operate on a closed database.")
        return self.raw.cursor(**options)

    @contextmanager
    def _statement(self, savepoint: bool, cursor: Any = None) -> Iterator[None]:
        """Run a statement, under a savepoint if asked; a PostgreSQL error leaves as dlindex's
        (``dlindex_error``), after rolling back to the savepoint and closing ``cursor``."""
        try:
            if savepoint:
                self.raw.execute("SAVEPOINT dlindex_statement")
            yield
            if savepoint:
                self.raw.execute("RELEASE SAVEPOINT dlindex_statement")
        except self._psycopg.Error as e:
            if self.lost(e):
                raise self.lost_error(e) from None
            if savepoint:
                with suppress(self._psycopg.Error):
                    self.raw.execute("ROLLBACK TO SAVEPOINT dlindex_statement")
            if cursor is not None:
                with suppress(self._psycopg.Error):
                    cursor.close()
            raise self.dlindex_error(e) from e

    def copy_rows(
        self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, logged_as: str | None = None
    ) -> int:
        """COPY ``rows`` into ``table`` (names are dlindex's own, checked): PostgreSQL's bulk path."""
        for name in (table, *columns):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"not an identifier: {name!r}")
        n = 0
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
        started = time.perf_counter()
        # a failed COPY (a duplicate key) leaves the transaction usable, as a plain INSERT does
        with self._statement(self.in_transaction), self._cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
                n += 1
        report = self.on_write
        if report is not None and n:
            # logged as the INSERT it stands for, so the log reads the same on both backends
            shown = logged_as or f"INSERT INTO {table} ({', '.join(columns)}) VALUES (COPY)"
            report(shown, n, n, time.perf_counter() - started)
        return n

    def lost(self, e: Exception) -> bool:
        """Whether ``e`` says the server connection is gone: the server stopped, crashed or
        restarted, or the network dropped it. No statement can run on it any more."""
        errors = self._psycopg.errors
        if isinstance(e, (errors.AdminShutdown, errors.CrashShutdown, errors.CannotConnectNow)):
            return True
        return bool(getattr(self.raw, "broken", False)) or str(getattr(e, "sqlstate", None) or "").startswith("08")

    def lost_error(self, e: Exception | None) -> CatalogConnectionLost:
        """One line for a lost server: PostgreSQL rolled back the open transaction, so what
        was committed before is all there is."""
        if e is not None:
            self._lost_because = _first_line(e)
        return CatalogConnectionLost(
            f"lost the connection to the PostgreSQL catalog {self.shown} ({self._lost_because}); the "
            "transaction in progress was rolled back, what was committed is kept: run the command "
            "again when the server is back"
        )

    def dlindex_error(self, e: Exception) -> CatalogSQLError:
        """dlindex's exception for a PostgreSQL error (dlindex.errors: busy, full, read-only,
        integrity; anything else a CatalogOperationalError, as SQLite reports it)."""
        errors = self._psycopg.errors
        message = _first_line(e)
        if isinstance(e, self._psycopg.IntegrityError):
            return CatalogIntegrityError(message)
        if isinstance(e, (errors.LockNotAvailable, errors.DeadlockDetected, errors.SerializationFailure)):
            return CatalogLockTimeout(busy_message(self.shown, self.wait_s, message))
        if isinstance(e, (errors.DiskFull, errors.OutOfMemory)):
            return CatalogFullError(
                f"disk full: the PostgreSQL catalog {self.shown} has no room left ({message}); what was "
                "committed is kept and the catalog is consistent. Free some space and run the command again"
            )
        if isinstance(e, (errors.ReadOnlySqlTransaction, errors.InsufficientPrivilege)):
            return CatalogReadOnlySQLError(f"catalog {self.shown} is read-only ({message}); nothing was changed")
        if isinstance(e, self._psycopg.DataError):
            return CatalogSQLError(message)
        return CatalogOperationalError(message)

    def rollback_quietly(self) -> None:
        if self.in_transaction:
            with suppress(self._psycopg.Error):
                self.raw.execute("ROLLBACK")

    def commit(self) -> None:  # nothing to do: as dlindex's SQLite connections, in autocommit mode
        pass

    def close(self) -> None:
        if self._aside is not None:
            self._aside.close()
        self.raw.close()


_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+QUERY\s+PLAN\s+", re.IGNORECASE)
_INSERT = re.compile(r"^\s*INSERT\s+INTO\b", re.I)
_PLAIN_INSERT = re.compile(r"^\s*INSERT\s+INTO\b(?!.*\bON\s+CONFLICT\b)", re.I | re.S)
