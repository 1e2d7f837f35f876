"""The PostgreSQL backend: a server catalog many hosts share, with row locks and COPY."""

from __future__ import annotations

import hashlib
import json
import socket
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from dlindex.cache_dir import cache_dir
from dlindex.catalog.as_of import view_statements
from dlindex.catalog.backend import Backend, Connection, ReadConnection
from dlindex.catalog.postgres.connect import PgConnection, busy_message, connect, connect_readonly, redact
from dlindex.errors import CatalogBusyError, CatalogError

_SERVER_IDENTITY = (
    "SELECT (SELECT oid FROM pg_database WHERE datname = current_database()), 'dlindex_schema'::regclass::oid"
)
_DATABASE_SIZE = "SELECT pg_database_size(current_database())"


class PostgresBackend(Backend):
    name = "postgresql"
    is_server = True
    advisor = "hypopg"
    storage = "database"

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = redact(url)

    @property
    def location(self) -> str:
        return str(self.path)

    def readonly_reason(self) -> str | None:
        return None  # the server says so per statement (CatalogReadOnlySQLError)

    def connect(self, *, create: bool, readonly: bool, wait_s: float) -> Connection:
        return connect(self.url, create=create, wait_s=wait_s)

    def connect_reader(self, *, timeout: float, any_thread: bool = False) -> ReadConnection:
        return connect_readonly(self.url, wait_s=timeout)

    def identity(self, conn: Connection) -> str:
        """The URL (with this host's name where the URL is local), its database and its tables
        (a dropped and remade catalog is another one)."""
        parts = urllib.parse.urlsplit(self.location)
        host = parts.hostname or ""
        local = host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")
        where = f"{host}:{parts.port or ''}" + (f"@{socket.gethostname()}" if local else "")
        row = _server(conn).execute_raw(_SERVER_IDENTITY).fetchone()
        text = json.dumps([parts.scheme, where, parts.path, *(row or ())])
        return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:24]

    def features_dir(self, conn: Connection) -> Path:
        """This machine's cache folder, ``$XDG_CACHE_HOME/dlindex/<identity>/features``, so a
        dropped and remade catalog never meets an old cache."""
        return cache_dir() / self.identity(conn) / "features"

    def files(self) -> list[str]:
        return []  # a server catalog has no files here

    def is_location(self, written_from: str) -> bool:
        return written_from == self.location

    def schema_version(self, conn: Connection) -> int:
        from dlindex.catalog.postgres.migrations import stored_version

        return stored_version(_server(conn))

    def size_bytes(self, conn: Connection) -> int:
        row = _server(conn).execute_raw(_DATABASE_SIZE).fetchone()
        return int(row[0]) if row else 0

    def bulk_insert(
        self, conn: Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, statement: str
    ) -> None:
        """COPY: PostgreSQL's bulk path, logged as ``statement``."""
        _server(conn).copy_rows(table, columns, rows, logged_as=statement)

    def set_lock_wait(self, conn: Connection, wait_ms: int) -> None:
        _server(conn).set_lock_wait(wait_ms / 1000)

    def busy_error(self, path: Path | str, wait_s: float, e: BaseException) -> CatalogBusyError:
        return CatalogBusyError(busy_message(path, wait_s, str(e)))

    def lock_rows(self, conn: Connection, selects: Sequence[str]) -> None:
        for select in selects:
            conn.execute(select).fetchall()

    def pin_state(self, conn: ReadConnection, state: int) -> None:
        server = cast(PgConnection, conn)
        (schema,) = server.execute_raw("SELECT current_schema()").fetchone() or ("public",)
        server.pin(view_statements(state, qualify='"' + str(schema).replace('"', '""') + '"'))

    def end_temp_table(self, conn: Connection, table: str) -> None:
        """Emptied, not dropped: a new temp table each call is a new statement to the server's
        statistics (pg_stat_statements), which would crowd out the real workload."""
        if not table.isidentifier():
            raise ValueError(f"not a table name: {table!r}")
        conn.execute(f"DELETE FROM temp.{table}")  # a name from dlindex's code, checked

    def check_before_first_write(self, conn: Connection) -> list[int]:
        """Nothing to check: the server checks its own pages; a scan's pid means nothing on
        another host, so a killed scan stays 'running' until the next scan of its root ends it."""
        return []

    @contextmanager
    def page_cache(self, conn: Connection, size: int) -> Iterator[None]:
        yield  # the server sizes its own buffers

    def release_space(self, conn: Connection) -> None:
        """Nothing: the server gives back a rolled-back transaction's space itself."""

    def has_text_search(self, conn: Connection) -> bool:
        return True  # PostgreSQL's full-text search is built in (text_schema)

    @contextmanager
    def rollback_journal(self, conn: Connection, wait_s: float) -> Iterator[bool]:
        yield False  # the server keeps its own write-ahead log

    def sqlite_utils(self, conn: Connection) -> Any:
        raise CatalogError(
            f"Catalog.db is the sqlite-utils view of a catalog file; {self.location} is a PostgreSQL "
            "catalog: read it with Catalog.read(SQL) or psql"
        )


def _server(conn: Connection) -> PgConnection:
    return cast(PgConnection, conn)
