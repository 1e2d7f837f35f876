"""The backend seam: what a catalog's connection offers, and what differs between a file and a server.

``dlindex.catalog.connection.backend_for(location)`` picks the backend from the ``--db`` value:
a ``postgresql://`` URL is a server catalog (``dlindex.catalog.postgres``), anything else a file
(``dlindex.catalog.sqlite``). ``Catalog.backend`` is that object; code above the catalog asks it
(``catalog.backend.bulk_insert(...)``, ``catalog.backend.is_server``) rather than comparing
names. Every connection speaks the ``Connection`` protocol below, in dlindex's SQL (SQLite's
dialect, translated for PostgreSQL by ``dlindex.catalog.postgres.dialect``).

A server catalog's statements fail with dlindex's own exceptions (``CatalogSQLError`` and its
kind: busy, full, read-only, integrity); a file catalog's with sqlite3's, untranslated on the
hot path. Code that catches either catches the tuples below.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar, Protocol

from dlindex.errors import (
    CatalogBusyError,
    CatalogClosedError,
    CatalogIntegrityError,
    CatalogOperationalError,
    CatalogSQLError,
)

Params = Sequence[Any] | Mapping[str, Any]

#: any failed statement, on either backend
SQL_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, CatalogSQLError)
#: a row a constraint refused (a duplicate key, a foreign key to no row)
INTEGRITY_ERRORS: tuple[type[Exception], ...] = (sqlite3.IntegrityError, CatalogIntegrityError)
#: locked, full, read-only: the catalog could not run the statement now
OPERATIONAL_ERRORS: tuple[type[Exception], ...] = (sqlite3.OperationalError, CatalogOperationalError)
#: a statement on a connection closed before it
CLOSED_ERRORS: tuple[type[Exception], ...] = (sqlite3.ProgrammingError, CatalogClosedError)

SERVER_SCHEMES = ("postgresql://", "postgres://")


class Cursor(Protocol):
    """The rows of one statement (sqlite3's cursor, or a server catalog's)."""

    @property
    def rowcount(self) -> int: ...
    @property
    def lastrowid(self) -> int | None: ...
    @property
    def description(self) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchmany(self, size: int = ..., /) -> list[Any]: ...
    def fetchall(self) -> list[Any]: ...
    def close(self) -> None: ...
    def __iter__(self) -> Iterator[Any]: ...
    def __next__(self) -> Any: ...


class ReadConnection(Protocol):
    """A connection another process or thread opens to read (``Backend.connect_reader``)."""

    def execute(self, sql: str, parameters: Params = ..., /) -> Cursor: ...
    def close(self) -> None: ...


class Connection(ReadConnection, Protocol):
    """What the library uses of a catalog's connection, in autocommit mode: transactions are
    BEGIN ... COMMIT statements (``Catalog.write_transaction``)."""

    #: called with (sql, calls, rows, seconds) after each write while set (the query log)
    on_write: Callable[[str, int, int, float], None] | None

    @property
    def in_transaction(self) -> bool: ...
    def executemany(self, sql: str, seq_of_parameters: Iterable[Any], /) -> Cursor: ...
    def stream(self, sql: str, parameters: Params = ..., /) -> Cursor:
        """A read whose rows come in batches: the client never holds the whole result."""
        ...

    def commit(self) -> None: ...


def is_server_url(location: object) -> bool:
    """Whether a ``--db`` value names a server catalog rather than a file."""
    return isinstance(location, str) and location.lower().startswith(SERVER_SCHEMES)


class Backend(ABC):
    """What differs between a catalog file and a server catalog; one per Catalog."""

    #: "sqlite" (a file) or "postgresql" (a server catalog, docs/postgres.md)
    name: ClassVar[str]
    #: a server catalog: many hosts share it; it checks its own pages, owns no files here
    is_server: ClassVar[bool]
    #: how `dlindex index` judges candidates: "replay" (SQLite's planner on a scratch copy) or
    #: "hypopg" (hypothetical indexes on the server); dlindex.advisor dispatches on it
    advisor: ClassVar[str]
    #: what ``dlindex stats`` calls the catalog's storage
    storage: ClassVar[str]

    #: the catalog file, or the server catalog's URL without its password
    path: Path | str
    #: what another process opens: the file's absolute path, or the server catalog's full URL
    url: str

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the catalog is, as index.json and messages name it."""

    @abstractmethod
    def readonly_reason(self) -> str | None:
        """Why this catalog can only be read (a read-only file, folder or mount), or None."""

    @abstractmethod
    def connect(self, *, create: bool, readonly: bool, wait_s: float) -> Connection:
        """Open the catalog (``create``: make it if absent), schema checked and migrated."""

    @abstractmethod
    def connect_reader(self, *, timeout: float, any_thread: bool = False) -> ReadConnection:
        """A read-only connection for reads in another process (or, ``any_thread``, threads)."""

    @abstractmethod
    def identity(self, conn: Connection) -> str:
        """Which catalog this is, as text two different catalogs never share."""

    @abstractmethod
    def features_dir(self, conn: Connection) -> Path:
        """Where this machine keeps the catalog's feature matrices."""

    @abstractmethod
    def files(self) -> list[str]:
        """The catalog's files on this machine (none for a server catalog)."""

    @abstractmethod
    def is_location(self, written_from: str) -> bool:
        """Whether ``written_from`` (an export's index.json) names this very catalog."""

    @abstractmethod
    def schema_version(self, conn: Connection) -> int:
        """The catalog's schema version (dlindex.catalog.sqlite.migrations.LATEST_VERSION once open)."""

    @abstractmethod
    def size_bytes(self, conn: Connection) -> int:
        """The catalog's size on disk."""

    @abstractmethod
    def bulk_insert(
        self, conn: Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, statement: str
    ) -> None:
        """Insert many rows into ``table``: ``statement`` (an INSERT of ``columns``) per row, or
        the backend's faster bulk path; the query log shows ``statement`` either way."""

    @abstractmethod
    def set_lock_wait(self, conn: Connection, wait_ms: int) -> None:
        """How long the next statements wait for another writer's lock."""

    @abstractmethod
    def busy_error(self, path: Path | str, wait_s: float, e: BaseException) -> CatalogBusyError:
        """The one line for a write that waited ``wait_s`` for a lock in vain."""

    @abstractmethod
    def lock_rows(self, conn: Connection, selects: Sequence[str]) -> None:
        """Take the row locks ``selects`` (SELECT ... FOR UPDATE) name, where rows have locks
        (a file catalog's write transaction already holds the whole file)."""

    @abstractmethod
    def pin_state(self, conn: ReadConnection, state: int) -> None:
        """Make ``conn`` read the catalog as it stood at ``state`` (dlindex.catalog.as_of)."""

    @abstractmethod
    def end_temp_table(self, conn: Connection, table: str) -> None:
        """Be done with this connection's temp table ``table`` (a name from dlindex's code)."""

    @abstractmethod
    def check_before_first_write(self, conn: Connection) -> list[int]:
        """Refuse to write into a damaged catalog (raise); the ids of scans marked running whose
        process died."""

    def start_write_check(self) -> None:  # noqa: B027 - optional: most backends start nothing
        """Start now, beside the caller's own work, what ``check_before_first_write`` will
        check; nothing where the backend has nothing to start early (a server checks its own
        pages)."""

    def stop_write_check(self) -> None:  # noqa: B027 - optional, as above
        """Stop a check started early that no write came to use (the catalog is closing)."""

    @abstractmethod
    def page_cache(self, conn: Connection, size: int) -> AbstractContextManager[None]:
        """A page cache sized for a write of ``size`` bytes, while the block runs."""

    @abstractmethod
    def release_space(self, conn: Connection) -> None:
        """After a write failed for space, give back what the failed transaction took."""

    @abstractmethod
    def has_text_search(self, conn: Connection) -> bool:
        """Whether the catalog has its full-text index of texts (``image_texts_fts``)."""

    @abstractmethod
    def rollback_journal(self, conn: Connection, wait_s: float) -> AbstractContextManager[bool]:
        """A cheaper journal for a bulk append while the block runs, where the backend has
        one and no other connection is open; yields whether it switched (``Catalog.rollback_journal``)."""

    @abstractmethod
    def sqlite_utils(self, conn: Connection) -> Any:
        """The catalog as a ``sqlite_utils.Database`` (``Catalog.db``)."""

    def read_arrow(
        self, conn: Connection, sql: str, params: Mapping[str, Any], columns: Sequence[tuple[str, str]]
    ) -> Iterator[Any] | None:
        """``sql``'s rows as Arrow record batches of ``columns`` ((name, "int"|"text"|"blob"), in
        the statement's order), read in C; None where this backend cannot (the caller reads tuples)."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.location}>"
