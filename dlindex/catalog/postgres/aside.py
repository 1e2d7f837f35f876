"""Streamed reads of a server catalog on a second connection, read as the server produces them.

The catalog's own connection is in autocommit mode, so a server-side cursor there must be
declared WITH HOLD to outlive its statement, and PostgreSQL then runs the whole query when the
DECLARE's transaction ends and copies every row into a temporary file before the first one is
fetched: at 10^7 rows gigabytes of the server's temp space and the whole query's time before
``query | head`` prints a line. A read that starts outside a transaction goes instead to a
second, read-only connection of the same catalog, as a plain cursor inside a READ ONLY
transaction that stays open while any such read is open: the server sends rows as the client
fetches them (STREAM_ROWS a round trip), and holds nothing beyond a batch. Each read still sees
what was committed when it started (READ COMMITTED, as before). Reads inside a write transaction
stay on the catalog's connection (they must see its uncommitted rows), and so do reads of its
temporary tables (``pg_temp``: that connection's own).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

from dlindex.catalog.postgres.cursor import STREAM_ROWS, Streamed
from dlindex.errors import CatalogSQLError

PgConnection = Any  # dlindex.catalog.postgres.connect's, which imports this module (no cycle)

_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY"
_END = "COMMIT"  # of a failed transaction, PostgreSQL rolls it back


class ReadsAside:
    """The second connection of one ``PgConnection`` and the reads open on it."""

    def __init__(self, open_connection: Callable[[], PgConnection], owner: PgConnection) -> None:
        self._open_connection = open_connection
        self._owner = owner  # whose pinned views (a past state) the second connection needs too
        self._conn: PgConnection | None = None
        self._pid = 0
        self._reads: set[int] = set()

    def stream(self, text: str, params: Sequence[Any] | Mapping[str, Any] | None) -> Streamed:
        """Declare a cursor for PostgreSQL ``text`` (bound) and return its rows, fetched lazily."""
        conn = self._connection()
        if not self._reads:
            with conn._statement(False):
                conn.raw.execute(_BEGIN)
        slot = min(set(range(len(self._reads) + 1)) - self._reads)  # reused names: one pg_stat_statements entry
        self._reads.add(slot)
        cursor = conn._cursor(name=f"dlindex_read_{slot}")
        cursor.itersize = STREAM_ROWS
        try:
            with conn._statement(False, cursor):
                cursor.execute(text, params)
        except CatalogSQLError:
            self._done(slot)
            raise
        return Streamed(cursor, lambda: self._done(slot), conn._statement)

    def _connection(self) -> PgConnection:
        # a forked child never touches its parent's socket: it opens its own
        if self._conn is None or self._pid != os.getpid() or self._conn.raw.closed:
            self._conn, self._pid, self._reads = self._open_connection(), os.getpid(), set()
            if self._owner.pinned:
                self._conn.pin(self._owner.pinned)
        return self._conn

    def _done(self, slot: int) -> None:
        self._reads.discard(slot)
        conn = self._conn
        if not self._reads and conn is not None and self._pid == os.getpid() and not conn.raw.closed:
            with suppress(conn._psycopg.Error):
                conn.raw.execute(_END)

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            with suppress(self._conn._psycopg.Error):
                self._conn.close()
        self._conn, self._reads = None, set()
