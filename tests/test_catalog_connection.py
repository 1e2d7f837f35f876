"""Opening catalogs: creation, validation before any write, schema versions."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from dlindex import Catalog, CatalogError
from dlindex.catalog.sqlite.history_schema import SCHEMA_INDEXES
from dlindex.catalog.sqlite.migrations import APPLICATION_ID, LATEST_VERSION


def test_create_makes_schema_with_version_and_wal(db_path: Path) -> None:
    with Catalog(db_path, create=True) as catalog:
        tables = set(catalog.db.table_names())
        assert {"roots", "labels", "image_metadata", "scans"} <= tables
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
        assert catalog.conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert catalog.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert catalog.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert catalog.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000


def test_image_metadata_has_the_issue_columns(db_path: Path) -> None:
    with Catalog(db_path, create=True) as catalog:
        columns = {c.name for c in catalog.db["image_metadata"].columns}
    assert {
        "id", "file_path", "label_id", "width", "height", "processed", "created_at", "root_id",
        "format", "mode", "bytes", "mtime_ns", "xxh3_128", "status", "error",
        "processing_status", "updated_at",
    } <= columns  # fmt: skip


def test_no_secondary_indexes_by_default(db_path: Path) -> None:
    """The schema makes one index of its own (the rows written since a state, for versions);
    every other is `dlindex index`'s or the user's."""
    with Catalog(db_path, create=True) as catalog:
        named = catalog.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        ).fetchall()
    assert sorted(n for (n,) in named) == sorted(SCHEMA_INDEXES)


def test_missing_catalog_is_an_error_and_creates_nothing(db_path: Path) -> None:
    with pytest.raises(CatalogError, match="no catalog at"):
        Catalog(db_path)
    assert not db_path.exists()


def test_non_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"hello, I am a text file\n")
    with pytest.raises(CatalogError, match="not an SQLite database"):
        Catalog(path, create=True)
    assert path.read_bytes() == b"hello, I am a text file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(CatalogError, match="not a dlindex catalog"):
        Catalog(path, create=True)
    assert path.read_bytes() == before


def test_newer_schema_is_refused_untouched(db_path: Path) -> None:
    Catalog(db_path, create=True).close()
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {LATEST_VERSION + 5}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = db_path.read_bytes()
    with pytest.raises(CatalogError, match="newer than this dlindex"):
        Catalog(db_path)
    assert db_path.read_bytes() == before


def test_unwritable_location_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        Catalog(tmp_path / "no" / "such" / "dir" / "x.db", create=True)


def test_directory_is_not_a_catalog(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="is a directory"):
        Catalog(tmp_path)


def test_empty_file_becomes_a_catalog_only_with_create(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(CatalogError, match="empty"):
        Catalog(path)
    Catalog(path, create=True).close()
    with Catalog(path) as catalog:
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION


def test_reopening_does_not_migrate_again(db_path: Path) -> None:
    Catalog(db_path, create=True).close()
    with Catalog(db_path) as catalog:
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION


def test_version_4_catalog_gets_cheap_checks_keeping_rows_indexes_and_features(tmp_path: Path) -> None:
    from dlindex.catalog.sqlite.migrations import MIGRATIONS

    db = tmp_path / "v4.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    for migration in MIGRATIONS[:4]:
        migration(conn)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 4")
    conn.execute("INSERT INTO roots (path) VALUES ('/r')")
    conn.execute("INSERT INTO labels (name) VALUES ('a')")
    conn.execute(
        "INSERT INTO image_metadata (root_id, file_path, label_id, processing_status) VALUES (1, 'a/1.png', 1, 'queued')"
    )
    conn.execute("INSERT INTO feature_types (name, dim, extractor) VALUES ('f', 1, 'x')")
    conn.execute("INSERT INTO image_features (image_id, feature_type, vector) VALUES (1, 'f', x'0000803f')")
    conn.execute("CREATE INDEX user_made ON image_metadata (status)")
    reader = sqlite3.connect(db, isolation_level=None)  # open before the migration: must see the new schema
    assert reader.execute("SELECT count(*) FROM image_metadata").fetchone() == (1,)

    with Catalog(db) as catalog:
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
        assert catalog.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        sql = catalog.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'image_metadata'").fetchone()[0]
        assert " IN (" not in sql
        assert catalog.conn.execute("SELECT count(*) FROM image_features").fetchone() == (1,)
        assert catalog.conn.execute("SELECT name FROM sqlite_master WHERE name = 'user_made'").fetchone()

    for bad in ("UPDATE image_metadata SET status = 'gone'", "UPDATE image_metadata SET processing_status = 'done'"):
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            reader.execute(bad)
    reader.execute("UPDATE image_metadata SET status = 'missing', processing_status = NULL")
    reader.close()


def test_version_4_catalog_with_edited_constraints_is_migrated_without_the_rewrite(tmp_path: Path) -> None:
    from dlindex.catalog.sqlite.migrations import MIGRATIONS

    db = tmp_path / "v4-edited.db"
    conn = sqlite3.connect(db, isolation_level=None)
    for migration in MIGRATIONS[:4]:
        migration(conn)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 4")
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'image_metadata'").fetchone()
    edited = sql.replace("'corrupt', 'missing'", "'corrupt','missing'")
    (version,) = conn.execute("PRAGMA schema_version").fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'image_metadata'", (edited,))
    conn.execute(f"PRAGMA schema_version = {version + 1}")
    conn.execute("PRAGMA writable_schema = OFF")
    conn.close()

    with Catalog(db) as catalog:  # opens: the rewrite is a speed-up, not a requirement
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
        sql_after = catalog.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'image_metadata'").fetchone()[0]
        # m005 left the edited CHECKs alone (later migrations add or change other columns only)
        assert "CHECK (status IN ('ok', 'corrupt','missing'))" in sql_after and "status = 'ok' OR" not in sql_after
        assert catalog.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux only")
def test_writeback_syncs_sqlites_own_descriptor_and_stops(scanned_db: Path) -> None:
    import threading

    from dlindex.catalog.sqlite.connect import Writeback as _Writeback

    with Catalog(scanned_db) as catalog:
        flusher = _Writeback(catalog.path, interval_s=0.01)
        fds = flusher._sqlite_fds()
        assert fds and all(os.path.samefile(f"/proc/self/fd/{fd}", scanned_db) for fd in fds)
        flusher.stop()
        assert not any(t.name == "dlindex-writeback" for t in threading.enumerate())
        with catalog.rollback_journal() as switched:  # alone: it switches, flushes, switches back
            assert switched
            assert catalog.conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert catalog.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert not any(t.name == "dlindex-writeback" for t in threading.enumerate())


def test_a_catalog_from_before_the_file_keys_gets_them_keeping_its_rows(tmp_path: Path) -> None:
    from dlindex.catalog.sqlite.migrations import MIGRATIONS, m015_file_keys, path_hash

    db = tmp_path / "v11.db"
    conn = sqlite3.connect(db, isolation_level=None)
    for migration in MIGRATIONS[: MIGRATIONS.index(m015_file_keys)]:
        migration(conn)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {MIGRATIONS.index(m015_file_keys)}")
    conn.execute("INSERT INTO roots (path) VALUES ('/r')")
    conn.execute("INSERT INTO image_metadata (root_id, file_path, bytes, mtime_ns) VALUES (1, 'a.png', 3, 4)")
    conn.close()
    with Catalog(db) as catalog:
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
        found = catalog.conn.execute(
            "SELECT file_path, bytes, mtime_ns, inode, ctime_ns, path_hash FROM image_metadata"
        )
        assert found.fetchall() == [("a.png", 3, 4, None, None, path_hash("a.png"))]
