"""Opening a catalog: validation before any write, pragmas, and migrations."""

from __future__ import annotations

import os
import shlex
import sqlite3
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from .errors import CatalogError
from .migrations import APPLICATION_ID, LATEST_VERSION, apply_migrations

DEFAULT_DB = "dlindex.db"
BUSY_TIMEOUT_S = 30.0
_SQLITE_MAGIC = b"SQLite format 3\x00"


class Catalog:
    """An open catalog: a sqlite3 connection in autocommit mode plus its sqlite-utils view.

    ``Catalog("train.db")`` opens an existing catalog (``create=True`` allows a new file,
    which only ``scan`` does); every check runs before anything is written, so a foreign
    or newer file is refused untouched. Writes go through ``write_transaction()`` (BEGIN
    IMMEDIATE), so a writer never fails half-way on a lock upgrade and a crash leaves
    either all of a batch or none of it.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, create: bool = False) -> None:
        self.path = Path(path if path is not None else os.environ.get("DLINDEX_DB", DEFAULT_DB))
        self.conn = _connect(self.path, create=create)
        self._db: Any = None

    @property
    def db(self) -> Any:
        """The connection as a ``sqlite_utils.Database`` (imported on first use: it pulls in
        pandas and numpy when they are installed, which would slow every command's start)."""
        if self._db is None:
            import sqlite_utils

            self._db = sqlite_utils.Database(self.conn)
        return self._db

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def write_transaction(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")


def open_catalog(path: str | os.PathLike[str] | None = None, *, create: bool = False) -> Catalog:
    """Open (or, with ``create``, make) a catalog; raise CatalogError before changing anything.

    Args:
        path: the database file; default ``$DLINDEX_DB`` or ``./dlindex.db``.
        create: allow a new file (only ``scan`` does this).
    """
    return Catalog(path, create=create)


def _connect(db_path: Path, *, create: bool) -> sqlite3.Connection:
    existed = db_path.exists()
    _check_before_open(db_path, create=create)
    try:
        conn = sqlite3.connect(
            os.fspath(db_path), isolation_level=None, timeout=BUSY_TIMEOUT_S, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        # WAL + NORMAL survives a killed process; only power loss may drop the last commits.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        apply_migrations(conn)
    except sqlite3.Error as e:
        if not existed:
            _remove_new_file(db_path)
        raise CatalogError(f"cannot open catalog {db_path}: {e}") from None
    return conn


def _check_before_open(db_path: Path, *, create: bool) -> None:
    if not db_path.exists():
        if not create:
            raise CatalogError(
                f"no catalog at {db_path}; run: dlindex scan DIR --db {_quote_arg(db_path)}"
            )
        parent = db_path.parent if str(db_path.parent) else Path(".")
        if not parent.is_dir():
            raise CatalogError(f"cannot create catalog {db_path}: folder {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise CatalogError(f"cannot create catalog {db_path}: folder {parent} is not writable")
        return
    if db_path.is_dir():
        raise CatalogError(f"{db_path} is a directory, not a catalog file")
    try:
        with open(db_path, "rb") as f:
            magic = f.read(len(_SQLITE_MAGIC))
    except OSError as e:
        raise CatalogError(f"cannot read catalog {db_path}: {e.strerror}") from None
    if not magic:
        if create:
            return  # an empty file is an empty database: scan may initialise it
        raise CatalogError(f"{db_path} is empty, not a dlindex catalog")
    if magic != _SQLITE_MAGIC:
        raise CatalogError(f"{db_path} is not a dlindex catalog (not an SQLite database)")
    app_id, version, tables = _read_header(db_path)
    if app_id != APPLICATION_ID and (app_id != 0 or tables):
        raise CatalogError(f"{db_path} is an SQLite database but not a dlindex catalog")
    if app_id == 0 and not tables and not create:
        raise CatalogError(f"{db_path} is an empty SQLite database, not a dlindex catalog")
    if version > LATEST_VERSION:
        raise CatalogError(
            f"{db_path} has catalog schema version {version}, newer than this dlindex "
            f"supports ({LATEST_VERSION}); upgrade dlindex"
        )


def _read_header(db_path: Path) -> tuple[int, int, int]:
    uri = "file:" + urllib.parse.quote(os.fspath(db_path.absolute())) + "?mode=ro"
    try:
        ro = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
        try:
            app_id = ro.execute("PRAGMA application_id").fetchone()[0]
            version = ro.execute("PRAGMA user_version").fetchone()[0]
            tables = ro.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:
            ro.close()
    except sqlite3.Error as e:
        raise CatalogError(f"{db_path} is not a readable dlindex catalog: {e}") from None
    return int(app_id), int(version), int(tables)


def _remove_new_file(db_path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(os.fspath(db_path) + suffix)
        except OSError:
            pass


def _quote_arg(path: Path) -> str:
    return shlex.quote(os.fspath(path))
