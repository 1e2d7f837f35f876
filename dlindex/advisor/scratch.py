"""The scratch copy index advice is measured on, and the guarded connections that read it.

The catalog is copied with SQLite's backup API from a read-only connection (a large one is
sampled: every k-th row of its big tables); candidate indexes are built, timed and dropped
on the copy only. Statements from logs run only through ``guarded()`` connections: opened
read-only, ``PRAGMA query_only``, an authorizer that allows nothing but reading, and a
deadline that interrupts a runaway statement.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlindex.advisor.leftovers import make_scratch_dir, remove_leftovers
from dlindex.advisor.replay import STATEMENT_DEADLINE_S, STEP, Timing, _bindable, deadline

# What writing a page costs, in VM steps: a changed page is journaled and written back, which
# takes as long as some thousand instructions; with it a write's steps weigh like its time.
PAGE_STEPS = 1000
from dlindex.advisor.shapes import Constant, TableInfo, Value, parse, quote_identifier

SAMPLE_ROWS = 2_000_000  # a table larger than this is sampled on the scratch copy
WRITE_ROWS = 10_000
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_DENIED_FUNCTIONS = {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit", "sqlite_offset"}
_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
_INDEXES = "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' ORDER BY tbl_name, name"
_INDEX_SIZE = "SELECT sum(pgsize) FROM dbstat WHERE name = ?"
_TABLE_SIZE = "SELECT sum(pgsize) FROM dbstat WHERE name = ?"
# ANALYZE also writes a row with idx NULL (the table's row count) for a table without indexes
_STAT1 = "SELECT idx, stat FROM sqlite_stat1 WHERE tbl = ? AND idx IS NOT NULL ORDER BY idx"
_INDEX_STAT1 = "SELECT tbl, idx, stat FROM sqlite_stat1 WHERE idx = ?"
_RESTORE_STAT1 = "INSERT INTO sqlite_stat1 (tbl, idx, stat) VALUES (?, ?, ?)"
_PARTIAL = "SELECT 1 FROM pragma_index_list(?) WHERE name = ? AND partial"
_REFRESH = "SELECT 1 FROM sqlite_master LIMIT 1"


def _authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None, _source: str | None) -> int:
    if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master" and _source is None:
        # what SQLite asks while an eponymous virtual table (json_each) declares its columns;
        # the connection is read-only with query_only on, so nothing can be written anyway
        return sqlite3.SQLITE_OK
    if action not in _ALLOWED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def guarded(path: str | os.PathLike[str], *, cache: bool = True) -> sqlite3.Connection:
    """A read-only connection that can run nothing but reads (for statements taken from logs).

    Args:
        cache: keep prepared statements; a connection that explains must not, as a cached
            EXPLAIN keeps the plan it was prepared with after another connection adds an index.
    """
    from dlindex.catalog.sqlite import readonly_uri  # mode=ro, or immutable=1 on read-only storage

    uri = readonly_uri(path)
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30.0,
                           cached_statements=128 if cache else 0)  # fmt: skip
    conn.execute("PRAGMA query_only = 1")
    conn.set_authorizer(_authorize)
    return conn


def explain(conn: sqlite3.Connection, sql: str, params: Any = ()) -> tuple[str, ...] | None:
    """EXPLAIN QUERY PLAN lines of one read, or None if SQLite refuses it."""
    try:
        # EXPLAIN opens no read transaction, so it would not notice a schema change (an index
        # built by another connection) and plan with the old schema: a plain read reloads it.
        conn.execute(_REFRESH).fetchall()
        with deadline(conn, STATEMENT_DEADLINE_S):
            return tuple(str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, _bindable(sql, params)))
    except (sqlite3.Error, ValueError, OverflowError):
        return None


def index_names(plan: Sequence[str]) -> set[str]:
    """Indexes a plan uses by name."""
    names: set[str] = set()
    for line in plan:
        for marker in ("USING COVERING INDEX ", "USING INDEX "):
            at = line.find(marker)
            if at >= 0:
                names.add(line[at + len(marker) :].split(" ", 1)[0])
                break
    return names


def improvable(plan: Sequence[str]) -> bool:
    """The plan reads a table in full or sorts in a temporary B-tree."""
    from dlindex.catalog.recorder import classify_plan

    return classify_plan(plan) == "scan" or any("TEMP B-TREE" in line or "AUTOMATIC" in line for line in plan)


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
    """A temporary copy of the catalog (or of a sample of it) to build and time indexes on."""

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
        self._stats: dict[tuple[str, str], Any] = {}
        self._counted = 0

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
            rowid = pk[0][1] if len(pk) == 1 and str(pk[0][2]).upper() == "INTEGER" else None
            infos[name] = TableInfo.make(name, [c[1] for c in cols], rowid)
        return infos

    def indexes(self) -> list[IndexDef]:
        found: list[IndexDef] = []
        for name, table, sql in self.admin.execute(_INDEXES).fetchall():
            cols = tuple(
                r[2] for r in self.admin.execute(f"PRAGMA index_xinfo({quote_identifier(name)})") if r[5] and r[2]
            )
            where, partial = _partial_where(sql)
            found.append(IndexDef(name, table, sql, cols, where, partial))
        return found

    # --- statistics (measured on the copy) --------------------------------------------------

    def rows(self, table: str) -> int:
        return int(
            self._cached(
                table, "", lambda: self.admin.execute(f"SELECT count(*) FROM {quote_identifier(table)}").fetchone()[0]
            )
        )  # noqa: S608

    def distinct(self, table: str, column: str) -> int:
        def count() -> int:
            for idx, stat in self.admin.execute(_STAT1, (table,)).fetchall() if self._has_stat1() else ():
                if self.admin.execute(_PARTIAL, (table, idx)).fetchone():
                    continue  # its counts cover only the rows of its WHERE
                cols = self._index_columns(idx)
                if cols[:1] == (column,) and stat:
                    parts = str(stat).split()
                    if len(parts) >= 2 and int(parts[1]) > 0:
                        return max(1, int(parts[0]) // int(parts[1]))
            q = f"SELECT count(DISTINCT {quote_identifier(column)}) + max(count(*) > count({quote_identifier(column)}), 0) FROM {quote_identifier(table)}"  # noqa: S608
            return int(self.admin.execute(q).fetchone()[0] or 0)

        return int(self._cached(table, "distinct:" + column, count))

    def fraction(self, table: str, constant: Constant) -> float:
        def share() -> float:
            column = quote_identifier(constant.column)
            q = f"SELECT count(*) FROM {quote_identifier(table)} WHERE {column} IS ?"  # noqa: S608
            return int(self.admin.execute(q, (constant.value,)).fetchone()[0]) / max(1, self.rows(table))

        return float(self._cached(table, f"fraction:{constant.column}={constant.value!r}", share))

    def width(self, table: str, column: str) -> float:
        def average() -> float:
            q = f"SELECT avg(coalesce(length({quote_identifier(column)}), 0)) FROM (SELECT {quote_identifier(column)} FROM {quote_identifier(table)} LIMIT 10000)"  # noqa: S608
            return float(self.admin.execute(q).fetchone()[0] or 0.0) + 1.0

        return float(self._cached(table, "width:" + column, average))

    def row_width(self, table: str) -> float:
        def average() -> float:
            size = self.admin.execute(_TABLE_SIZE, (table,)).fetchone()[0] or 0
            return float(size) / max(1, self.rows(table))

        return float(self._cached(table, "row_width", average))

    def frequent_values(self, table: str, column: str) -> list[Value]:
        def top() -> list[Value]:
            q = f"SELECT {quote_identifier(column)} FROM {quote_identifier(table)} GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 2"  # noqa: S608
            return [r[0] for r in self.admin.execute(q)]

        return list(self._cached(table, "top:" + column, top))

    def index_size(self, name: str) -> int:
        return int(self.admin.execute(_INDEX_SIZE, (name,)).fetchone()[0] or 0)

    def _cached(self, table: str, key: str, compute: Any) -> Any:
        slot = (table, key)
        if slot not in self._stats:
            self._stats[slot] = compute()
        return self._stats[slot]

    def _has_stat1(self) -> bool:
        return bool(self.admin.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone())

    def _index_columns(self, name: str) -> tuple[str, ...]:
        return tuple(r[2] for r in self.admin.execute(f"PRAGMA index_info({quote_identifier(name)})"))

    # --- building and measuring ---------------------------------------------------------------

    def create(self, name: str, sql: str) -> None:
        self.admin.execute(sql)
        self.admin.execute(f"ANALYZE {quote_identifier(name)}")

    def drop(self, name: str) -> None:
        self.admin.execute(f"DROP INDEX IF EXISTS {quote_identifier(name)}")

    @contextmanager
    def without(self, name: str, sql: str) -> Iterator[None]:
        """The copy without index ``name`` for a while, then with it and its statistics as they were."""
        saved = self.admin.execute(_INDEX_STAT1, (name,)).fetchall() if self._has_stat1() else []
        self.drop(name)
        try:
            yield
        finally:
            self.admin.execute(sql)
            if saved:
                self.admin.executemany(_RESTORE_STAT1, saved)
                self.admin.execute("ANALYZE sqlite_schema")  # reloads the statistics without computing any
            self._stats.clear()

    def analyze(self) -> None:
        self.admin.execute("ANALYZE")

    def write_cost(
        self, table: str, info: TableInfo, columns: Sequence[str], runs: int = 3
    ) -> tuple[Timing | None, Timing | None]:
        """Fastest of ``runs``: inserting WRITE_ROWS rows, and updating ``columns`` of as many (rolled back)."""
        return (
            self._fastest(lambda counted: self._insert(table, info, counted), runs),
            self._fastest(lambda counted: self._update(table, columns, counted), runs),
        )

    def _fastest(self, run: Any, runs: int) -> Timing | None:
        times = []
        steps = [0]

        def count() -> int:
            steps[0] += STEP
            return 0

        for i in range(runs):
            self.admin.execute("BEGIN")
            if i == runs - 1:  # the count is the same every run: once is enough
                self.admin.set_progress_handler(count, STEP)
            try:
                started = time.perf_counter()
                run(i == runs - 1)
                times.append((time.perf_counter() - started) * 1000.0)
                if i == runs - 1:
                    steps[0] += PAGE_STEPS * self._journaled_pages()
            except sqlite3.Error:
                return None
            finally:
                self.admin.set_progress_handler(None, 0)
                self.admin.execute("ROLLBACK")
        return Timing(min(times), steps[0])  # the least disturbed run: other processes only ever add time

    def _journaled_pages(self) -> int:
        """Pages the open write transaction changed: each is copied to the rollback journal once."""
        try:
            size = os.path.getsize(str(self.path) + "-journal")
        except OSError:
            return 0
        page = int(self.admin.execute("PRAGMA page_size").fetchone()[0])
        return max(0, size - 512) // (page + 8)  # a header sector, then page number + page + checksum

    def _fresh(self, sql: str, counted: bool) -> str:
        """``sql``, as a statement never prepared before when its steps are counted (an exact count)."""
        if not counted:
            return sql
        self._counted += 1
        return f"{sql} /* dlindex count {self._counted} */"

    def _insert(self, table: str, info: TableInfo, counted: bool = False) -> None:
        """Copies of existing rows under new rowids, unique columns made unique again."""
        unique: set[str] = set()
        for row in self.admin.execute(f"PRAGMA index_list({quote_identifier(table)})").fetchall():
            if row[2] and row[3] != "pk":
                keys = [r[2] for r in self.admin.execute(f"PRAGMA index_info({quote_identifier(row[1])})")]
                unique.add(keys[-1])
        top = self.admin.execute(f"SELECT coalesce(max(rowid), 0) FROM {quote_identifier(table)}").fetchone()[0]  # noqa: S608
        values = []
        for column in info.columns:
            q = quote_identifier(column)
            if column == info.rowid:
                values.append(f"rowid + {int(top)}")
            elif column in unique:
                values.append(f"CASE WHEN typeof({q}) = 'text' THEN {q} || '#dlindex' ELSE {q} + {int(top) + 1} END")
            else:
                values.append(q)
        cols = ", ".join(quote_identifier(c) for c in info.columns)
        sql = (f"INSERT INTO {quote_identifier(table)} ({cols}) SELECT {', '.join(values)} FROM {quote_identifier(table)} "  # noqa: S608
               f"ORDER BY rowid LIMIT {WRITE_ROWS}")  # fmt: skip
        self.admin.execute(self._fresh(sql, counted))

    def _update(self, table: str, columns: Sequence[str], counted: bool = False) -> None:
        """Flip each column between its two most frequent values on rows spread over the table."""
        if not columns:
            return
        sets, params = [], []
        for column in columns:
            top = self.frequent_values(table, column)
            q = quote_identifier(column)
            if len(top) == 2:
                sets.append(f"{q} = CASE WHEN {q} IS ? THEN ? ELSE ? END")
                params += [top[0], top[1], top[0]]
            else:
                sets.append(f"{q} = {q}")
        t = quote_identifier(table)
        sql = f"UPDATE {t} SET {', '.join(sets)} WHERE rowid IN (SELECT rowid FROM temp.dlindex_rows)"  # noqa: S608
        self.admin.execute(self._fresh(sql, counted), params)

    def pick_rows(self, table: str) -> None:
        """The WRITE_ROWS rows, spread over ``table``, that update measurements change."""
        step = max(1, self.rows(table) // WRITE_ROWS)
        t = quote_identifier(table)
        self.admin.execute("DROP TABLE IF EXISTS temp.dlindex_rows")
        self.admin.execute(
            f"CREATE TEMP TABLE dlindex_rows AS SELECT rowid AS rowid FROM {t} WHERE rowid % {step} = 0 LIMIT {WRITE_ROWS}"
        )  # noqa: S608


def _sampled_copy(source: sqlite3.Connection, target: sqlite3.Connection, catalog: Path, k: int, rows: int) -> None:
    """The schema, small tables whole, large ones every k-th rowid; then the indexes and fresh statistics."""
    schema = source.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    for kind, _name, sql in schema:
        if kind == "table":
            target.execute(sql)
    target.commit()
    from dlindex.catalog.sqlite import readonly_uri

    target.execute("ATTACH DATABASE ? AS src", (readonly_uri(catalog),))
    for kind, name, _sql in schema:
        if kind != "table":
            continue
        t = quote_identifier(name)
        where = f" WHERE rowid % {int(k)} = 0" if _max_rowid(source, name) > rows else ""
        target.execute(f"INSERT INTO main.{t} SELECT * FROM src.{t}{where}")  # noqa: S608
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
        return int(conn.execute(f"SELECT max(rowid) FROM {quote_identifier(table)}").fetchone()[0] or 0)  # noqa: S608
    except sqlite3.OperationalError:
        return 0


def _partial_where(sql: str | None) -> tuple[tuple[Constant, ...] | None, bool]:
    """The WHERE of ``CREATE INDEX ... WHERE`` as constants, if it is only ``col = literal`` terms."""
    if not sql:
        return None, False
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    from dlindex.advisor.shapes import _conjuncts, _literal

    try:
        (statement,) = parse(sql)
    except (SqlglotError, ValueError):
        return None, " where " in sql.lower()
    where = statement.find(exp.Where)
    if where is None:
        return None, False
    constants: list[Constant] = []
    for term in _conjuncts(where.this):
        if isinstance(term, exp.EQ) and isinstance(term.this, exp.Column) and _literal(term.expression)[0]:
            constants.append(Constant(term.this.name, _literal(term.expression)[1]))
        elif isinstance(term, exp.Is) and isinstance(term.this, exp.Column) and isinstance(term.expression, exp.Null):
            constants.append(Constant(term.this.name, None))
        else:
            return (Constant("?", "?"),), True  # a WHERE we do not model: matches no candidate
    return tuple(sorted(constants, key=Constant.key)), True
