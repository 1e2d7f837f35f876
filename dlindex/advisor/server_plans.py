"""Plans and timings on the server: the schema, statistics, hypothetical indexes and timed runs.

Costs come from ``EXPLAIN (FORMAT JSON)`` with and without hypopg's hypothetical indexes
(visible to this session only, never built). Timings come from ``EXPLAIN (ANALYZE, BUFFERS,
FORMAT JSON)``: the server's execution time and the buffers it touched (shared hits and
reads, the same on every run of the same plan over the same data, so decisions use them as
the SQLite advisor uses virtual-machine steps). Reads before any index run in a READ ONLY
transaction; indexes being verified are built in a transaction that is then switched to
read only, timed in, and rolled back.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlindex.advisor.scratch import IndexDef
from dlindex.advisor.server_workload import OWN
from dlindex.advisor.shapes import TableInfo
from dlindex.advisor.sqltext import Constant, index_where, quote_identifier
from dlindex.catalog.sqlite.history_schema import SCHEMA_INDEX_LIST
from dlindex.query import per_label

if TYPE_CHECKING:
    from dlindex.advisor.server_workload import Run
    from dlindex.catalog.postgres.connect import PgConnection

_COLUMNS = """SELECT table_name, column_name FROM information_schema.columns
    WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"""
_INDEXES = f"""SELECT c.relname, t.relname, pg_get_indexdef(i.indexrelid),
        ARRAY(SELECT a.attname::text FROM unnest(i.indkey[:i.indnatts - 1]) WITH ORDINALITY k(n, o)
              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o),
        pg_get_expr(i.indpred, i.indrelid), EXISTS (SELECT 1 FROM pg_constraint WHERE conindid = i.indexrelid)
        OR c.relname IN {SCHEMA_INDEX_LIST}
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
    JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = current_schema() ORDER BY t.relname, c.relname"""
_ROWS = "SELECT reltuples::float8 FROM pg_class WHERE oid = to_regclass(%s)"
_STATS = """SELECT attname, n_distinct::float8, null_frac::float8, avg_width, most_common_vals::text,
        most_common_freqs::float8[] FROM pg_stats WHERE schemaname = current_schema() AND tablename = %s"""
_CHECK_XMIN = "SELECT bool_or(indcheckxmin) FROM pg_index WHERE indexrelid = ANY(%s::regclass[])"
SAMPLE = 100_000  # rows read to estimate what pg_stats does not know (a table never analyzed)


def tables(conn: PgConnection) -> dict[str, TableInfo]:
    """Every table of the catalog's schema; no rowid (PostgreSQL has none: ``id`` is a column)."""
    found: dict[str, list[str]] = {}
    for table, column in conn.execute_raw(_COLUMNS).fetchall():
        found.setdefault(str(table), []).append(str(column))
    return {t: TableInfo.make(t, cols, None) for t, cols in found.items()}


def indexes(conn: PgConnection) -> list[IndexDef]:
    """Every index of the schema; a constraint's (primary key, unique) has ``sql`` None, as in SQLite."""
    out = []
    for name, table, sql, columns, predicate, constraint in conn.execute_raw(_INDEXES).fetchall():
        where: tuple[Constant, ...] | None = None
        if predicate:
            plain = re.sub(r"::[\w ]+(?:\[\])?", "", str(predicate))
            where, _ = index_where(f"CREATE INDEX x ON t (a) WHERE {plain}")
        out.append(IndexDef(str(name), str(table), None if constraint else str(sql), tuple(columns or ()), where,
                            predicate is not None))  # fmt: skip
    return out


class ServerStatistics:
    """What candidates are chosen by (``candidates.Stats``), from pg_stats, else from a sample of rows."""

    def __init__(self, conn: PgConnection) -> None:
        self.conn = conn
        self._rows: dict[str, int] = {}
        self._columns: dict[str, dict[str, tuple[float, float, int, list[str], list[float]]]] = {}
        self._sampled: dict[tuple[str, str, str], float] = {}

    def rows(self, table: str) -> int:
        if table not in self._rows:
            row = self.conn.execute_raw(_ROWS, (quote_identifier(table),)).fetchone()
            n = float(row[0]) if row and row[0] is not None else -1.0
            if n < 0:  # never vacuumed or analyzed
                n = float(self._one(f"SELECT count(*) FROM {quote_identifier(table)}"))
            self._rows[table] = int(n)
        return self._rows[table]

    def _stats(self, table: str) -> dict[str, tuple[float, float, int, list[str], list[float]]]:
        if table not in self._columns:
            found = {}
            for name, nd, null_frac, width, mcv, freqs in self.conn.execute_raw(_STATS, (table,)).fetchall():
                values = _array_text(mcv) if mcv else []
                found[str(name)] = (float(nd), float(null_frac), int(width or 8), values, list(freqs or []))
            self._columns[table] = found
        return self._columns[table]

    def distinct(self, table: str, column: str) -> int:
        st = self._stats(table).get(column)
        if st is None:
            q = quote_identifier(column)
            sql = f"SELECT count(DISTINCT {q}) FROM (SELECT {q} FROM {quote_identifier(table)} LIMIT {SAMPLE}) s"
            return int(self._sample(table, column, "distinct", sql))
        nd = st[0]
        return max(1, int(-nd * self.rows(table)) if nd < 0 else int(nd))

    def fraction(self, table: str, constant: Constant) -> float:
        st = self._stats(table).get(constant.column)
        if st is not None:
            if constant.value is None:
                return st[1]
            for value, freq in zip(st[3], st[4], strict=False):
                if value == str(constant.value):
                    return freq
            if len(st[3]) >= self.distinct(table, constant.column):
                return 0.0
        q = quote_identifier(constant.column)
        test = f"{q} IS NULL" if constant.value is None else f"{constant.sql()}"
        sql = (f"SELECT coalesce(avg(CASE WHEN {test} THEN 1.0 ELSE 0.0 END), 0)::float8 "
               f"FROM (SELECT {q} FROM {quote_identifier(table)} LIMIT {SAMPLE}) s")  # fmt: skip
        return float(self._sample(table, constant.column, repr(constant.value), sql))

    def width(self, table: str, column: str) -> float:
        st = self._stats(table).get(column)
        return float(st[2]) if st is not None else 8.0

    def row_width(self, table: str) -> float:
        return 24.0 + sum(s[2] for s in self._stats(table).values()) if self._stats(table) else 100.0

    def _sample(self, table: str, column: str, what: str, sql: str) -> float:
        key = (table, column, what)
        if key not in self._sampled:
            self._sampled[key] = float(self._one(sql))
        return self._sampled[key]

    def _one(self, sql: str) -> Any:
        row = self.conn.execute_raw(OWN + " " + sql.replace("%", "%%"), ()).fetchone()
        return row[0] if row else 0


def _array_text(text: str) -> list[str]:
    """The elements of a PostgreSQL array literal (``{a,"b c",NULL}``) as text."""
    inner = text.strip()[1:-1]
    return [m.group(1).replace('\\"', '"') if m.group(1) is not None else m.group(2)
            for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|([^,]+)', inner)]  # fmt: skip


@dataclass(frozen=True)
class Plan:
    cost: float
    indexes: frozenset[str]
    seek_served: bool = False  # a SERVER_SEEK statement's every arc read from a (label_id, path_hash) index


@dataclass(frozen=True)
class Timed:
    ms: float  # median execution time on the server
    buffers: (
        int  # shared and local (temporary tables') buffers hit or read: the work, the same on every run of one plan
    )
    indexes: frozenset[str]


def explain(conn: PgConnection, run: Run) -> Plan:
    """The planner's cost of ``run`` and the indexes its plan uses (hypothetical ones included)."""
    row = conn.execute_raw(f"EXPLAIN (FORMAT JSON) {run.sql}", run.params).fetchone()
    plan = _plan(row)
    return Plan(float(plan["Total Cost"]), frozenset(_index_names(plan)), per_label.server_served(plan))


def time_run(conn: PgConnection, run: Run, runs: int) -> Timed:
    """``run`` executed ``runs`` times under EXPLAIN ANALYZE (plus one warm-up); the median."""
    times, buffers, names = [], [], frozenset[str]()
    for i in range(runs + 1):
        row = conn.execute_raw(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {run.sql}", run.params).fetchone()
        data = row[0] if row else [{}]
        data = json.loads(data) if isinstance(data, str) else data
        plan = data[0]["Plan"]
        if i:
            times.append(float(data[0].get("Execution Time", 0.0)))
            buffers.append(
                sum(
                    int(plan.get(f"{kind} {what} Blocks", 0))
                    for kind in ("Shared", "Local")
                    for what in ("Hit", "Read")
                )
            )  # fmt: skip  (local: a sample's temporary tables)
        names = frozenset(_index_names(plan))
    return Timed(statistics.median(times), int(statistics.median(buffers)), names)


def _plan(row: Any) -> dict[str, Any]:
    data = row[0] if row else [{}]
    data = json.loads(data) if isinstance(data, str) else data
    plan: dict[str, Any] = data[0]["Plan"]
    return plan


def _index_names(plan: dict[str, Any]) -> Iterator[str]:
    if "Index Name" in plan:
        yield str(plan["Index Name"])
    for child in plan.get("Plans", ()):
        yield from _index_names(child)


class Hypothetical:
    """hypopg's hypothetical indexes on one connection: created, planned with, reset."""

    def __init__(self, conn: PgConnection) -> None:
        self.conn = conn
        self.reset()

    def create(self, sql: str) -> tuple[int, str]:
        """(oid, the name plans show) of a new hypothetical index."""
        row = self.conn.execute_raw("SELECT indexrelid, indexname FROM hypopg_create_index(%s)", (sql,)).fetchone()
        assert row is not None
        return int(row[0]), str(row[1])

    def drop(self, oid: int) -> None:
        self.conn.execute_raw("SELECT hypopg_drop_index(%s)", (oid,))

    def reset(self) -> None:
        self.conn.execute_raw("SELECT hypopg_reset()")


@contextmanager
def read_only(conn: PgConnection, time_limit_s: float) -> Iterator[None]:
    """A READ ONLY transaction with a statement timeout, always rolled back."""
    conn.execute_raw("BEGIN TRANSACTION READ ONLY")
    try:
        conn.execute_raw(f"SET LOCAL statement_timeout = {int(time_limit_s * 1000)}")  # an int, not input
        yield
    finally:
        conn.rollback_quietly()


@contextmanager
def built(conn: PgConnection, ddl: Sequence[str], names: Sequence[str], time_limit_s: float,
          lock_wait_s: float) -> Iterator[bool]:  # fmt: skip
    """The indexes ``ddl`` built in a transaction that is then read only and rolled back.

    Yields whether this transaction can use them: PostgreSQL hides an index from the
    transaction that built it when it found broken HOT chains (``pg_index.indcheckxmin``).
    CREATE INDEX holds a SHARE lock on its table until the rollback: writers wait meanwhile.
    """
    conn.execute_raw("BEGIN")
    try:
        conn.execute_raw(f"SET LOCAL lock_timeout = {int(lock_wait_s * 1000)}")
        conn.execute_raw(f"SET LOCAL statement_timeout = {int(max(time_limit_s, 60.0) * 1000)}")
        for sql in ddl:
            conn.execute_raw(sql)
        hidden = names and conn.execute_raw(_CHECK_XMIN, (list(names),)).fetchone()
        conn.execute_raw("SET LOCAL transaction_read_only = on")
        conn.execute_raw(f"SET LOCAL statement_timeout = {int(time_limit_s * 1000)}")
        yield not (hidden and hidden[0])
    finally:
        conn.rollback_quietly()


def is_timeout(e: Exception) -> bool:
    return "statement timeout" in str(e) or "canceling statement" in str(e)
