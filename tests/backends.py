"""The same tests on both catalog backends: a SQLite file, and a database on a real PostgreSQL server.

A test module opts in with ``pytestmark = ON_BOTH_BACKENDS``: each of its tests then runs twice,
as ``[sqlite]`` and as ``[postgresql]``. Its catalogs are still named as files
(``tmp_path / "c.db"``); ``where(path)`` turns that name into the catalog's location on the
backend of the run: the path itself, or the URL of a new database on the session's server
(tests/servers.py), made on first use and dropped after the test. ``where(path, migrated=True)``
gives a database that already holds an empty catalog, copied from a template database migrated
once per session (``CREATE DATABASE ... TEMPLATE``) rather than migrated anew. ``raw(location)`` reads and
writes a catalog behind dlindex's back with the backend's own driver (sqlite3 or psycopg), with
``?`` parameters on both. A test about SQLite files themselves (journals, file names, sqlite3's
own plan text) is marked ``@SQLITE_ONLY``.

The postgresql runs skip, with the reason, where no server can be started, and fail where the test
left a catalog file in its temp folder: it did not put its catalog on the server.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from .servers import with_database

BACKENDS = ("sqlite", "postgresql")
ON_BOTH_BACKENDS = pytest.mark.usefixtures("catalog_backend")
SQLITE_ONLY = pytest.mark.parametrize("catalog_backend", ["sqlite"], indirect=True)

Location = Path | str  # a catalog file, or a postgresql:// URL


class _ServerDatabases:
    """The databases one test made on the session's PostgreSQL server, by the file name they stand for."""

    def __init__(self, server_url: str, template: str) -> None:
        self.server_url = server_url
        self.template = template
        self.urls: dict[Path, str] = {}

    def url_for(self, path: Path, migrated: bool = False) -> str:
        if path not in self.urls:
            name = _create_database(self.server_url, self.template if migrated else None)
            self.urls[path] = with_database(self.server_url, name)
        return self.urls[path]

    def drop_all(self) -> None:
        from psycopg import connect, sql

        with connect(self.server_url, autocommit=True) as conn:
            for url in self.urls.values():
                name = url.rsplit("/", 1)[1]
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


_active: _ServerDatabases | None = None  # set while a [postgresql] test runs


def _create_database(server_url: str, template: str | None = None) -> str:
    """A new database on the server (a copy of ``template`` if given); its name."""
    from psycopg import connect, sql

    name = f"dlindex_test_{uuid.uuid4().hex[:12]}"
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with connect(server_url, autocommit=True) as conn:
        conn.execute(statement)
    return name


@pytest.fixture(scope="session")
def catalog_template(postgres_server: str) -> Iterator[str]:
    """The name of a database holding an empty catalog of the current schema, made once per session:
    ``where(path, migrated=True)`` copies it (a file-level copy, no migration run per test)."""
    from psycopg import connect, sql

    from dlindex import Catalog

    name = _create_database(postgres_server)
    try:
        Catalog(with_database(postgres_server, name), create=True).close()
        yield name
    finally:
        with connect(postgres_server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(params=BACKENDS)
def catalog_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The backend this run of the test puts its catalogs on."""
    global _active
    if request.param == "sqlite":
        yield "sqlite"
        return
    server = request.getfixturevalue("postgres_server")  # skips, saying why, where there is none
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")
    tmp_path: Path = request.getfixturevalue("tmp_path")
    # a server catalog's client cache (feature matrices) goes under XDG_CACHE_HOME: the test's, not ~/.cache
    request.getfixturevalue("monkeypatch").setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    databases = _ServerDatabases(server, request.getfixturevalue("catalog_template"))
    _active = databases
    try:
        yield "postgresql"
    finally:
        _active = None
        databases.drop_all()
    # a catalog file made in a [postgresql] run means the test did not go through where(): it ran on SQLite
    stray = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("*") if p.name.endswith((".db", ".sqlite")))
    assert not stray, f"a [postgresql] run made SQLite catalogs: {stray}"


def backend_first(request: pytest.FixtureRequest) -> None:
    """In a fixture that places a catalog: set the run's backend up first, whatever the order of
    the test's arguments (a module on one backend has no ``catalog_backend``)."""
    if "catalog_backend" in request.fixturenames:
        request.getfixturevalue("catalog_backend")


def on_postgresql() -> bool:
    return _active is not None


def where(path: Path, migrated: bool = False) -> Location:
    """Where the catalog named ``path`` lives in this run: the file itself, or its server database
    (with ``migrated``, a new one that already holds an empty catalog: the caller creates the catalog)."""
    return path if _active is None else _active.url_for(path, migrated)


def is_server(location: Location) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


def catalog_exists(location: Location) -> bool:
    """Is there a catalog at ``location``: a file, or dlindex's tables in the server database."""
    if not is_server(location):
        return Path(location).exists()
    with raw(location) as conn:
        return bool(conn.execute("SELECT to_regclass('dlindex_schema') IS NOT NULL").fetchone()[0])


class _PgRaw:
    """psycopg behind the sqlite3 calls the tests make: ``?`` parameters, execute and executemany."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url)

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")  # the tests' SQL has no '?' inside literals

    def execute(self, sql: str, params: Sequence[object] = ()) -> Any:
        return self.conn.execute(self._sql(sql), tuple(params))  # type: ignore[arg-type]

    def executemany(self, sql: str, seq: Any) -> Any:
        with self.conn.cursor() as cursor:
            cursor.executemany(self._sql(sql), seq)

    def reset_ids(self) -> None:
        """Rows inserted with explicit ids leave the identity sequences behind: move them past."""
        for table in ("roots", "labels", "image_metadata"):
            self.conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), coalesce(max(id), 0) + 1, false) FROM {table}"
            )


@contextmanager
def raw(location: Location) -> Iterator[Any]:
    """A connection to the catalog that is not dlindex's, committed at the end of the block."""
    if is_server(location):
        conn = _PgRaw(str(location))
        try:
            with conn.conn.transaction():
                yield conn
        finally:
            conn.conn.close()
    else:
        with closing(sqlite3.connect(location)) as lite, lite:
            yield lite


def schema_before(location: Location, migration: Any) -> None:
    """Turn a catalog back to the schema version before ``migration`` (a function of
    ``dlindex.catalog.sqlite.migrations``), as the dlindex of that version left it: every column that
    migration and the later ones added is dropped, the version set back. The next open
    migrates it forward again."""
    from dlindex.catalog.sqlite.migrations import MIGRATIONS

    version = MIGRATIONS.index(migration)
    with raw(location) as conn:
        drop_made_after(conn, version, is_server(location))
        for table, column in columns_added_after(version):
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        if is_server(location):
            conn.execute("UPDATE dlindex_schema SET version = ?", (version,))
        else:
            conn.execute(f"PRAGMA user_version = {version}")


def drop_made_after(conn: Any, version: int, server: bool = False) -> None:
    """Drop the tables (and on SQLite their triggers) a schema step past ``version`` made, where
    a step made a table of its own; before the columns go (a trigger names its columns)."""
    from dlindex.catalog.sqlite.migrations import SCAN_DIGESTS

    if version < 21:  # m021_texts: the table takes its FTS5 triggers; then the index table, functions
        conn.execute("DROP TABLE IF EXISTS image_texts")
        conn.execute("DROP TABLE IF EXISTS image_texts_fts")
        if server:
            for function in ("image_texts_fts(TEXT)", "dlindex_tsquery(TEXT)", "dlindex_fold(TEXT)"):
                conn.execute(f"DROP FUNCTION IF EXISTS {function}")
    if version < 20:  # m020_history_by_label
        conn.execute("DROP INDEX IF EXISTS image_history_label")
    if version < 19:  # m019_versions: its triggers, tables and index (before the columns go)
        for trigger, table in (
            ("image_history_inserted", "image_metadata"), ("image_history_updated", "image_metadata"),
            ("image_history_deleted", "image_metadata"), ("label_history_inserted", "labels"),
            ("label_history_deleted", "labels"), ("label_history_renamed", "labels"),
            ("label_history_changed", "labels"),
        ):  # fmt: skip
            conn.execute(f"DROP TRIGGER IF EXISTS {trigger}" + (f" ON {table}" if server else ""))
        for table in ("image_history", "label_history", "version_tags", "versions", "version_floor"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute("DROP INDEX IF EXISTS image_metadata_valid_from")
    if version < 16:  # m016_scan_digests (the server's has no triggers)
        for statement in () if server else SCAN_DIGESTS[1:]:
            conn.execute(f"DROP TRIGGER IF EXISTS {statement.split()[2]}")
        conn.execute("DROP TABLE IF EXISTS scan_digests")
    if version < 17:  # m017_extractor_versions
        conn.execute("DROP TABLE IF EXISTS extractor_versions")
    if version < 18 and server:  # m018_auto_features (the stale function is replaced, not made)
        conn.execute("DROP TRIGGER IF EXISTS feature_auto_inserted ON image_metadata")
        conn.execute("DROP FUNCTION IF EXISTS dlindex_features_auto()")
    if version < 18 and not server:  # m018_auto_features: its trigger, and the stale trigger as it was
        from dlindex.catalog.sqlite.early_migrations import _M007

        conn.execute("DROP TRIGGER IF EXISTS feature_auto_inserted")
        conn.execute("DROP TRIGGER IF EXISTS image_features_stale")
        conn.execute(_M007[-1])  # m007's image_features_stale


def columns_added_after(version: int) -> list[tuple[str, str]]:
    """(table, column) of every column a schema step past ``version`` added (read from the server
    schema's steps, which spell out the same columns as SQLite's migrations)."""
    import re

    from dlindex.catalog.postgres.migrations import MIGRATIONS as PG_MIGRATIONS

    added = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)")
    made = re.compile(r"CREATE TABLE (\w+)")  # a table a step made goes whole (drop_made_after)
    tables = {m.group(1) for v, steps in PG_MIGRATIONS if v > version for s in steps if (m := made.match(s))}
    return [
        m.groups() for v, steps in PG_MIGRATIONS if v > version for s in steps
        if (m := added.match(s)) and m.group(1) not in tables
    ]  # type: ignore[misc]  # fmt: skip
