"""The scratch copy index advice is measured on: made, its schema read, indexes built and dropped.

The catalog is copied with SQLite's backup API from a read-only connection (a large one is
sampled: every k-th rowid of its big tables, fetched by rowid so the copy's cost does not grow
with the catalog); candidate indexes are built, timed and dropped
on the copy only. Statements from logs run on it only through ``dlindex.catalog.sandbox.guarded``
connections. ``Scratch.stats`` (``CopyStatistics``: rows, distinct values, widths) measures
what candidates are chosen by, ``Scratch.writes`` (``replay.WriteCosts``) what an index adds
to inserts and updates.

A scratch copy lives in ``<tmp>/dlindex-advisor-<pid>-<start>-<random>``: ``start`` is when
the owning process started (clock ticks since boot, from ``/proc/<pid>/stat``), so a pid
reused by another process does not keep a leftover alive. A run killed with ``kill -9``
cannot clean up after itself; the next run does (``remove_leftovers``), and never touches a
live owner's copy, another program's directory, or a directory holding anything but a
scratch catalog.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

from dlindex.advisor.planstats import carry, catalog_stat1, index_definitions
from dlindex.advisor.replay import WriteCosts
from dlindex.advisor.shapes import TableInfo
from dlindex.advisor.sqltext import Constant, Value, index_where, quote_identifier
from dlindex.catalog.sandbox import guarded
from dlindex.catalog.sqlite.connect import readonly_uri
from dlindex.catalog.sqlite.history_schema import SCHEMA_INDEXES
from dlindex.catalog.sqlite.virtual import is_virtual, rebuild, shadow_tables
from dlindex.pids import pid_alive, process_start

SAMPLE_ROWS = 250_000  # a table larger than this is sampled on the scratch copy (to about this many rows)
_TABLES = "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
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
        self.rows = 0  # rows (max rowid) of the largest table of the catalog
        self.sampled: tuple[str, ...] = ()  # the tables holding every sample-th row
        self.full_stats: dict[tuple[str, str | None], str] = {}  # the catalog's sqlite_stat1
        self.same_indexes: set[str] = set()  # indexes defined alike on the copy and in the catalog
        self._defs: dict[str, str] = {}  # the catalog's indexes: name -> CREATE INDEX
        try:
            self._copy(Path(catalog), sample_rows)
            self.admin = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.admin.execute("PRAGMA journal_mode = DELETE")
            self.reader = guarded(self.path)
            self.planner = guarded(self.path, cache=False)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.same_indexes = {n for n, sql in index_definitions(self.admin).items() if self._defs.get(n) == sql}
        self.stats = CopyStatistics(self.admin)
        self.writes = WriteCosts(self.admin, self.path, self.stats)
        self.carry_stats()

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
            tables = source.execute(_TABLES).fetchall()
            shadows = shadow_tables(source, tables)  # a full-text index's rowids are not row counts
            sizes = {
                name: _max_rowid(source, name) for name, sql in tables if name not in shadows and not is_virtual(sql)
            }
            largest = max(sizes.values(), default=0)
            self.full_stats, self._defs = catalog_stat1(source), index_definitions(source)
            target = sqlite3.connect(self.path)
            try:
                if largest <= sample_rows:
                    source.backup(target)
                else:
                    self.sample = -(-largest // sample_rows)
                    self.rows = largest
                    self.sampled = tuple(name for name, n in sizes.items() if n > sample_rows)
                    _sampled_copy(source, target, catalog, self.sample, sample_rows, bool(self.full_stats))
            finally:
                target.close()
        finally:
            source.close()

    # --- the schema -----------------------------------------------------------------------

    def tables(self) -> dict[str, TableInfo]:
        infos: dict[str, TableInfo] = {}
        for name, _sql in self.admin.execute(_TABLES).fetchall():
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
            # the schema's own index is the catalog's, like a key: never advice's to judge or drop
            found.append(IndexDef(name, table, None if name in SCHEMA_INDEXES else sql, cols, where, partial))
        return found

    # --- building -------------------------------------------------------------------------

    def create(self, name: str, sql: str) -> None:
        self.admin.execute(sql)
        self.admin.execute(f"ANALYZE {quote_identifier(name)}")
        self.carry_stats()

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
        self.carry_stats()

    def carry_stats(self) -> None:
        """On a sampled copy: the catalog's statistics, or the copy's scaled to its size (``planstats``)."""
        if self.sample > 1:
            carry(self.admin, self.sample, self.sampled, self.full_stats, self.same_indexes)
            self.stats.clear()


def _sampled_copy(
    source: sqlite3.Connection, target: sqlite3.Connection, catalog: Path, k: int, rows: int, analyzed: bool
) -> None:
    """The schema, small tables whole, large ones every k-th rowid; then the indexes, and statistics
    where the catalog has any (``Scratch.carry_stats`` puts the catalog's in their place)."""
    schema = source.execute(_SCHEMA).fetchall()
    # a user's full-text index (sqlite-utils enable-fts): made by its CREATE, rebuilt from the
    # sampled rows below; its shadow tables are made with it and not copied
    shadows = shadow_tables(source, [(name, sql) for kind, name, sql in schema if kind == "table"])
    for kind, name, sql in schema:
        if kind == "table" and name not in shadows:
            target.execute(sql)
    target.commit()
    target.execute("ATTACH DATABASE ? AS src", (readonly_uri(catalog),))
    for kind, name, sql in schema:
        if kind != "table" or name in shadows or is_virtual(sql):
            continue
        t, last = quote_identifier(name), _max_rowid(source, name)
        if last > rows:  # the rows whose rowid is a multiple of k, each found by its rowid: no full scan
            target.execute(
                f"WITH RECURSIVE r(i) AS (SELECT ? UNION ALL SELECT i + ? FROM r WHERE i + ? <= ?) "
                f"INSERT INTO main.{t} SELECT s.* FROM r CROSS JOIN src.{t} AS s WHERE s.rowid = r.i",
                (k, k, k, last),
            )
        else:
            target.execute(f"INSERT INTO main.{t} SELECT * FROM src.{t}")
    for kind, name, sql in schema:
        if kind == "table" and is_virtual(sql):
            rebuild(target, name)
    target.commit()
    target.execute("DETACH DATABASE src")
    for kind, _name, sql in schema:
        if kind in ("index", "trigger", "view"):
            target.execute(sql)
    if analyzed:
        target.execute("ANALYZE")
    target.commit()


def _max_rowid(conn: sqlite3.Connection, table: str) -> int:
    """The largest rowid (about the row count, cheaply); 0 for a WITHOUT ROWID table (copied whole)."""
    try:
        return int(conn.execute(f"SELECT max(rowid) FROM {quote_identifier(table)}").fetchone()[0] or 0)
    except sqlite3.OperationalError:
        return 0


PREFIX = "dlindex-advisor-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-[A-Za-z0-9_]+")
# What a scratch directory may hold: the copy and SQLite's side files.
_OURS = re.compile(r"scratch\.db(?:-journal|-wal|-shm)?")


def make_scratch_dir(base: str | os.PathLike[str] | None = None) -> Path:
    """A new private directory named after this process."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{process_start(pid)}-", dir=base))


def owner_alive(name: str) -> bool:
    """Whether the process that made scratch directory ``name`` still runs (True when unsure)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return True
    return pid_alive(int(m.group(1)), int(m.group(2)))


def remove_leftovers(base: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the scratch directories of processes that are gone; return what was removed."""
    root = Path(base if base is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not _NAME.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False) or owner_alive(entry.name):
            continue
        path = Path(entry.path)
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            names = os.listdir(path)
        except OSError:
            continue
        if not all(_OURS.fullmatch(n) and (path / n).is_file() and not (path / n).is_symlink() for n in names):
            continue  # not only a scratch catalog: not ours to delete
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


T = TypeVar("T")

_BYTES = "SELECT sum(pgsize) FROM dbstat WHERE name = ?"  # of a table or an index
_HAS_STAT1 = "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'"
# ANALYZE also writes a row with idx NULL (the table's row count) for a table without indexes
_STAT1 = "SELECT idx, stat FROM sqlite_stat1 WHERE tbl = ? AND idx IS NOT NULL ORDER BY idx"
_PARTIAL = "SELECT 1 FROM pragma_index_list(?) WHERE name = ? AND partial"


def has_stat1(conn: sqlite3.Connection) -> bool:
    """Whether ANALYZE has ever run on ``conn``'s database (``sqlite_stat1`` exists)."""
    return bool(conn.execute(_HAS_STAT1).fetchone())


class CopyStatistics:
    """Measured on the copy once each, until the indexes change (``clear``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._cache: dict[tuple[str, str], object] = {}

    def clear(self) -> None:
        self._cache.clear()

    def rows(self, table: str) -> int:
        def count() -> int:
            return int(self.conn.execute(f"SELECT count(*) FROM {quote_identifier(table)}").fetchone()[0])

        return self._cached(table, "", count)

    def distinct(self, table: str, column: str) -> int:
        def count() -> int:
            # an index's sqlite_stat1 row says it without a scan: rows / rows per value of its lead
            for idx, stat in self.conn.execute(_STAT1, (table,)).fetchall() if has_stat1(self.conn) else ():
                if self.conn.execute(_PARTIAL, (table, idx)).fetchone():
                    continue  # its counts cover only the rows of its WHERE
                if self._index_columns(idx)[:1] == (column,) and stat:
                    parts = str(stat).split()
                    if len(parts) >= 2 and int(parts[1]) > 0:
                        return max(1, int(parts[0]) // int(parts[1]))
            c, t = quote_identifier(column), quote_identifier(table)
            q = f"SELECT count(DISTINCT {c}) + max(count(*) > count({c}), 0) FROM {t}"
            return int(self.conn.execute(q).fetchone()[0] or 0)

        return self._cached(table, "distinct:" + column, count)

    def fraction(self, table: str, constant: Constant) -> float:
        def share() -> float:
            q = f"SELECT count(*) FROM {quote_identifier(table)} WHERE {quote_identifier(constant.column)} IS ?"
            return int(self.conn.execute(q, (constant.value,)).fetchone()[0]) / max(1, self.rows(table))

        return self._cached(table, f"fraction:{constant.column}={constant.value!r}", share)

    def width(self, table: str, column: str) -> float:
        def average() -> float:
            c, t = quote_identifier(column), quote_identifier(table)
            q = f"SELECT avg(coalesce(length({c}), 0)) FROM (SELECT {c} FROM {t} LIMIT 10000)"
            return float(self.conn.execute(q).fetchone()[0] or 0.0) + 1.0

        return self._cached(table, "width:" + column, average)

    def row_width(self, table: str) -> float:
        def average() -> float:
            size = self.conn.execute(_BYTES, (table,)).fetchone()[0] or 0
            return float(size) / max(1, self.rows(table))

        return self._cached(table, "row_width", average)

    def frequent_values(self, table: str, column: str) -> list[Value]:
        def top() -> list[Value]:
            c, t = quote_identifier(column), quote_identifier(table)
            q = f"SELECT {c} FROM {t} GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 2"
            return [r[0] for r in self.conn.execute(q)]

        return list(self._cached(table, "top:" + column, top))

    def index_size(self, name: str) -> int:
        return int(self.conn.execute(_BYTES, (name,)).fetchone()[0] or 0)

    def _cached(self, table: str, key: str, compute: Callable[[], T]) -> T:
        slot = (table, key)
        if slot not in self._cache:
            self._cache[slot] = compute()
        return cast(T, self._cache[slot])  # each key is always computed by the same function

    def _index_columns(self, name: str) -> tuple[str, ...]:
        return tuple(r[2] for r in self.conn.execute(f"PRAGMA index_info({quote_identifier(name)})"))
