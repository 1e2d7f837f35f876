"""dlindex/catalog/backend.py: one backend object per catalog, chosen from its location, and the
errors a server catalog raises (dlindex's own, not sqlite3's)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dlindex import Catalog
from dlindex.catalog.backend import (
    CLOSED_ERRORS,
    INTEGRITY_ERRORS,
    OPERATIONAL_ERRORS,
    SQL_ERRORS,
    Connection,
    is_server_url,
)
from dlindex.catalog.connection import backend_for
from dlindex.errors import (
    CatalogBusyError,
    CatalogError,
    CatalogIntegrityError,
    CatalogLockTimeout,
    CatalogOperationalError,
    DlindexError,
    ExitCode,
)

from .backends import where


def test_the_location_picks_the_backend(tmp_path: Path) -> None:
    file = backend_for(tmp_path / "c.db")
    server = backend_for("postgresql://ann:s3cret@db.example:5432/cat")
    assert (file.name, file.is_server, file.advisor, file.storage) == ("sqlite", False, "replay", "file")
    assert (server.name, server.is_server, server.advisor, server.storage) == ("postgresql", True, "hypopg", "database")
    assert server.location == "postgresql://ann:***@db.example:5432/cat"  # never the password
    assert file.location == str(tmp_path / "c.db")
    assert is_server_url("POSTGRES://h/db") and not is_server_url(Path("postgresql://x"))
    assert file.files() == [str(tmp_path / "c.db"), *(str(tmp_path / "c.db") + s for s in ("-wal", "-journal", "-shm"))]
    assert server.files() == []


def test_the_error_tuples_hold_both_backends_errors() -> None:
    assert issubclass(CatalogLockTimeout, CatalogBusyError) and CatalogLockTimeout.exit_code == ExitCode.BUSY
    assert all(issubclass(e, DlindexError) for e in SQL_ERRORS if e is not sqlite3.Error)
    assert isinstance(CatalogLockTimeout("x"), OPERATIONAL_ERRORS) and isinstance(
        sqlite3.OperationalError(), OPERATIONAL_ERRORS
    )
    assert isinstance(CatalogIntegrityError("x"), INTEGRITY_ERRORS) and isinstance(
        sqlite3.IntegrityError(), INTEGRITY_ERRORS
    )
    assert isinstance(sqlite3.ProgrammingError(), CLOSED_ERRORS)


@pytest.mark.usefixtures("catalog_backend")
def test_the_catalog_holds_its_backend(tmp_path: Path) -> None:
    location = where(tmp_path / "c.db")
    with Catalog(location, create=True) as catalog:
        assert catalog.backend.name == ("postgresql" if isinstance(location, str) else "sqlite")
        assert catalog.location == catalog.backend.location
        conn: Connection = catalog.conn  # the protocol's type, whichever backend
        assert [tuple(row) for row in conn.stream("SELECT count(*) FROM roots")] == [(0,)]
        assert catalog.backend.schema_version(conn) > 0
        assert catalog.backend.size_bytes(conn) > 0


def test_catalog_db_is_the_sqlite_utils_view_of_a_file(tmp_path: Path) -> None:
    with Catalog(tmp_path / "c.db", create=True) as catalog:
        assert "image_metadata" in catalog.db.table_names()
        assert catalog.db.conn is catalog.conn


def test_catalog_db_refuses_a_server_catalog_in_one_line(pg_url: str) -> None:
    # It raised sqlite3.OperationalError "not supported on a PostgreSQL catalog: PRAGMA recursive_triggers"
    with Catalog(pg_url, create=True) as catalog, pytest.raises(CatalogError) as refused:
        _ = catalog.db
    message = str(refused.value)
    assert "\n" not in message and "sqlite-utils view of a catalog file" in message and "PostgreSQL" in message


def test_a_server_catalog_raises_dlindex_errors(pg_url: str) -> None:
    with Catalog(pg_url, create=True) as catalog:
        with pytest.raises(CatalogOperationalError):  # no PRAGMA is answered any more
            catalog.conn.execute("PRAGMA cache_size = -2000")
        with catalog.write_transaction() as tx:
            tx.execute("INSERT INTO roots (path) VALUES ('/r')")
        with pytest.raises(CatalogIntegrityError), catalog.write_transaction() as tx:
            tx.execute("INSERT INTO roots (id, path) VALUES (1, '/again')")
        other = Catalog(pg_url, wait=0.2)
        try:
            with catalog.write_transaction() as tx:
                tx.execute("UPDATE roots SET presplit = 1 WHERE id = 1")
                with pytest.raises(CatalogLockTimeout) as busy, other.write_transaction() as waiting:
                    waiting.execute("UPDATE roots SET presplit = 0 WHERE id = 1")
        finally:
            other.close()
        assert "another transaction held the rows" in str(busy.value) and "database is locked" not in str(busy.value)
