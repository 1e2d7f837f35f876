"""The scratch copy index advice is measured on: made, its schema read, indexes built and dropped.

The catalog is copied with SQLite's backup API from a read-only connection (a large one is
sampled: every k-th row of its big tables); candidate indexes are built, timed and dropped
on the copy only. Statements from logs run on it only through ``sandbox.guarded``
connections. ``stats`` measures what candidates are chosen by, ``writes`` what an index
adds to inserts and updates.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dlindex.advisor.copy_stats import CopyStatistics, has_stat1
from dlindex.advisor.leftovers import make_scratch_dir, remove_leftovers
from dlindex.advisor.shapes import TableInfo
from dlindex.advisor.sqltext import Constant, index_where, quote_identifier
from dlindex.advisor.write_cost import WriteCosts
from dlindex.catalog.sandbox import guarded
from dlindex.catalog.sqlite.connect import readonly_uri

SAMPLE_ROWS = 2_000_000  # a table larger than this is sampled on the scratch copy
_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
_INDEXES = "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' ORDER BY tbl_name, name"
_SCHEMA = "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
_INDEX_STAT1 = "SELECT tbl, idx, stat FROM sqlite_stat1 WHERE idx = ?"
_RESTORE_STAT1 = "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES (?, ?, ?)"


@dataclass(frozen=True)
class IndexDef:
    """An index as it exists: its columns, partial WHERE (as constants when it is that simple)."""

    name: str
    table: str
    sql: str | None  # None for the indexes SQLite makes for PRIMARY KEY / UNIQUE
    columns: tuple[str, ...]
    where: tuple[Constant, ...] | None  # None: full index; () never; unparsable WHERE -> ("?",)
    partial: bool

    @property
    def constraint(self) -> bool:
        return self.sql is None


class Scratch:
    """A private copy of the catalog (or of a sample of it) to build and time indexes on."""

    def __init__(self, catalog: str | os.PathLike[str], sample_rows: int = SAMPLE_ROWS) -> None:
        remove_leftovers()  # of runs killed before they could clean up (kill -9)
        self.dir = make_scratch_dir()
        self.path = self.dir / "scratch.db"
        self.sample = 1
        try:
            self._copy(Path(catalog), sample_rows)
            self.admin = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.admin.execute("PRAGMA journal_mode = DELETE")
            self.reader = guarded(self.path)
            self.planner = guarded(self.path, cache=False)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.stats = CopyStatistics(self.admin)
        self.writes = WriteCosts(self.admin, self.path, self.stats)

    def close(self) -> None:
        for conn in (getattr(self, "reader", None), getattr(self, "planner", None), getattr(self, "admin", None)):
            if conn is not None:
                conn.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Scratch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _copy(self, catalog: Path, sample_rows: int) -> None:
        source = guarded(catalog)
        source.set_authorizer(None)  # our own reads below; the backup itself reads pages
        try:
            largest = 0
            for (name,) in source.execute(_TABLES).fetchall():
                largest = max(largest, _max_rowid(source, name))
            target = sqlite3.connect(self.path)
            try:
                if largest <= sample_rows:
                    source.backup(target)
                else:
                    self.sample = -(-largest // sample_rows)
                    _sampled_copy(source, target, catalog, self.sample, sample_rows)
            finally:
                target.close()
        finally:
            source.close()

    # --- the schema -----------------------------------------------------------------------

    def tables(self) -> dict[str, TableInfo]:
        infos: dict[str, TableInfo] = {}
        for (name,) in self.admin.execute(_TABLES).fetchall():
            cols = self.admin.execute(f"PRAGMA table_info({quote_identifier(name)})").fetchall()
            pk = [c for c in cols if c[5]]
            if self._has_rowid(name):
                rowid = pk[0][1] if len(pk) == 1 and str(pk[0][2]).upper() == "INTEGER" else None
                infos[name] = TableInfo.make(name, [c[1] for c in cols], rowid)
            else:  # WITHOUT ROWID (feature_state): its primary key names its rows, in key order
                key = [c[1] for c in sorted(pk, key=lambda c: int(c[5]))]
                infos[name] = TableInfo.make(name, [c[1] for c in cols], None, key)
        return infos

    def _has_rowid(self, table: str) -> bool:
        try:
            self.admin.execute(f"SELECT rowid FROM {quote_identifier(table)} LIMIT 0")
        except sqlite3.OperationalError:
            return False
        return True

    def indexes(self) -> list[IndexDef]:
        found: list[IndexDef] = []
        for name, table, sql in self.admin.execute(_INDEXES).fetchall():
            cols = tuple(
                r[2] for r in self.admin.execute(f"PRAGMA index_xinfo({quote_identifier(name)})") if r[5] and r[2]
            )
            where, partial = index_where(sql)
            found.append(IndexDef(name, table, sql, cols, where, partial))
        return found

    # --- building -------------------------------------------------------------------------

    def create(self, name: str, sql: str) -> None:
        self.admin.execute(sql)
        self.admin.execute(f"ANALYZE {quote_identifier(name)}")

    def drop(self, name: str) -> None:
        self.admin.execute(f"DROP INDEX IF EXISTS {quote_identifier(name)}")

    @contextmanager
    def without(self, name: str, sql: str) -> Iterator[None]:
        """The copy without index ``name`` for a while, then with it and its statistics as they were."""
        saved = self.admin.execute(_INDEX_STAT1, (name,)).fetchall() if has_stat1(self.admin) else []
        self.drop(name)
        try:
            yield
        finally:
            self.admin.execute(sql)
            if saved:
                self.admin.executemany(_RESTORE_STAT1, saved)
                self.admin.execute("ANALYZE sqlite_schema")  # reloads the statistics without computing any
            self.stats.clear()

    def analyze(self) -> None:
        self.admin.execute("ANALYZE")


def _sampled_copy(source: sqlite3.Connection, target: sqlite3.Connection, catalog: Path, k: int, rows: int) -> None:
    """The schema, small tables whole, large ones every k-th rowid; then the indexes and fresh statistics."""
    schema = source.execute(_SCHEMA).fetchall()
    for kind, _name, sql in schema:
        if kind == "table":
            target.execute(sql)
    target.commit()
    target.execute("ATTACH DATABASE ? AS src", (readonly_uri(catalog),))
    for kind, name, _sql in schema:
        if kind != "table":
            continue
        t = quote_identifier(name)
        where = f" WHERE rowid % {int(k)} = 0" if _max_rowid(source, name) > rows else ""
        target.execute(f"INSERT INTO main.{t} SELECT * FROM src.{t}{where}")
    target.commit()
    target.execute("DETACH DATABASE src")
    for kind, _name, sql in schema:
        if kind in ("index", "trigger", "view"):
            target.execute(sql)
    target.execute("ANALYZE")
    target.commit()


def _max_rowid(conn: sqlite3.Connection, table: str) -> int:
    """The largest rowid (about the row count, cheaply); 0 for a WITHOUT ROWID table (copied whole)."""
    try:
        return int(conn.execute(f"SELECT max(rowid) FROM {quote_identifier(table)}").fetchone()[0] or 0)
    except sqlite3.OperationalError:
        return 0
