"""Applying advice, undoing it, and listing every index with how the logged workload uses it."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dlindex.advisor.model import Advice, Changes, Finding, IndexChange, IndexUsage
from dlindex.advisor.plans import explain, index_names
from dlindex.advisor.shapes import check_select
from dlindex.advisor.sqltext import quote_identifier
from dlindex.advisor.write_shapes import where_as_select
from dlindex.catalog.backend import Connection
from dlindex.catalog.sandbox import guarded
from dlindex.errors import InputError

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

PREFIX = "idx_dlindex_"
_NEXT_RUN = "SELECT coalesce(max(run), 0) + 1 FROM index_changes"
_RECORD = """INSERT INTO index_changes (run, action, name, table_name, sql, fingerprints)
    VALUES (:run, :action, :name, :table, :sql, :fingerprints)"""
_LAST_RUN = "SELECT max(run) FROM index_changes WHERE reverted_at IS NULL"
_RUN_CHANGES = "SELECT action, name, table_name, sql FROM index_changes WHERE run = ? ORDER BY id DESC"
_MARK_REVERTED = "UPDATE index_changes SET reverted_at = CURRENT_TIMESTAMP WHERE run = ?"
_INDEX = "SELECT sql, tbl_name FROM sqlite_master WHERE type = 'index' AND name = ?"
_ALL_INDEXES = "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' ORDER BY tbl_name, name"
_CREATED_AT = """SELECT name, max(changed_at) FROM index_changes
    WHERE action = 'create' AND reverted_at IS NULL GROUP BY name"""
_LOGGED = """SELECT kind, sql, sum(calls), max(logged_at) FROM query_log
    WHERE sql != 'BEGIN IMMEDIATE' GROUP BY kind, sql"""
_LOGGED_SINCE = "SELECT sum(calls), max(logged_at) FROM query_log WHERE sql = ? AND logged_at >= ?"
_TEMPLATE_PLANS = "SELECT sql, plan_detail FROM query_log_templates WHERE plan_detail IS NOT NULL AND plan_detail != ''"
_INDEX_SIZE = "SELECT sum(pgsize) FROM dbstat WHERE name = ?"
MAX_EXPLAINED = 1000  # logged statements explained for --list (the most called first)


def apply_advice(catalog: Catalog, advice: Advice, *, create: bool = True, drop: Sequence[Finding] = ()) -> Changes:
    """Create ``advice``'s suggestions and drop ``drop`` (dlindex's own indexes only), then ANALYZE.

    One transaction; what it did is recorded as one run for ``revert_indexes``. Indexes that
    already exist are left alone, so applying the same advice twice changes nothing.
    """
    for finding in drop:
        if not finding.dlindex:
            raise InputError(f"{finding.name} was not created by dlindex; drop it yourself: {finding.drop_sql}")
    changes: list[IndexChange] = []
    with catalog.write_transaction(bookkeeping=True) as conn:
        run = int(conn.execute(_NEXT_RUN).fetchone()[0])
        for s in advice.suggestions if create else ():
            if conn.execute(_INDEX, (s.name,)).fetchone() is not None:
                continue
            conn.execute(s.sql)
            _record(conn, run, IndexChange("create", s.name, s.table, s.sql), s.fingerprints)
            changes.append(IndexChange("create", s.name, s.table, s.sql))
        for finding in drop:
            row = conn.execute(_INDEX, (finding.name,)).fetchone()
            if row is None or row[0] is None:
                continue
            conn.execute(f"DROP INDEX {quote_identifier(finding.name)}")
            change = IndexChange("drop", finding.name, str(row[1]), str(row[0]))
            _record(conn, run, change, ())
            changes.append(change)
        analyzed = any(c.action == "create" for c in changes)
        if analyzed:
            conn.execute("ANALYZE")  # the planner needs statistics to prefer the new indexes
    return Changes(run if changes else None, tuple(changes), analyzed)


def revert_indexes(catalog: Catalog) -> Changes:
    """Undo the latest run of ``apply_advice`` not yet reverted: drop what it created, recreate what it dropped."""
    changes: list[IndexChange] = []
    with catalog.write_transaction(bookkeeping=True) as conn:
        run = conn.execute(_LAST_RUN).fetchone()[0]
        if run is None:
            return Changes(None, (), False)
        for action, name, table, sql in conn.execute(_RUN_CHANGES, (run,)).fetchall():
            current = conn.execute(_INDEX, (name,)).fetchone()
            if action == "create" and current is not None and current[0] == sql:
                conn.execute(f"DROP INDEX {quote_identifier(name)}")
                changes.append(IndexChange("drop", name, table, sql))
            elif action == "drop" and current is None:
                conn.execute(sql)
                conn.execute(f"ANALYZE {quote_identifier(name)}")
                changes.append(IndexChange("create", name, table, sql))
        conn.execute(_MARK_REVERTED, (run,))
    return Changes(int(run), tuple(changes), any(c.action == "create" for c in changes))


def list_indexes(catalog: Catalog) -> list[IndexUsage]:
    """Every index of the catalog, with how many logged statements used it and when last.

    A statement's plan is the one the log recorded for its template; statements imported
    from elsewhere are explained now on a read-only connection (never run). For an index
    dlindex created, only statements logged after its creation count.
    """
    conn = guarded(catalog.path)
    plain = guarded(catalog.path)
    plain.set_authorizer(None)  # our own reads: dbstat and the log tables
    try:
        indexes = plain.execute(_ALL_INDEXES).fetchall()
        created = dict(plain.execute(_CREATED_AT).fetchall()) if _has_table(plain, "index_changes") else {}
        plans = {sql: index_names(str(detail).splitlines()) for sql, detail in plain.execute(_TEMPLATE_PLANS)}
        logged = sorted(plain.execute(_LOGGED).fetchall(), key=lambda r: (-(r[2] or 0), r[1]))
        usage: dict[str, list[tuple[str, int, str | None]]] = {}
        for i, (kind, sql, calls, last) in enumerate(logged):
            names = plans.get(sql)
            if names is None and i < MAX_EXPLAINED:
                names = _plan_now(conn, kind, sql)
            for name in names or ():
                usage.setdefault(name, []).append((sql, int(calls or 0), last))
        result: list[IndexUsage] = []
        for name, table, sql in indexes:
            uses = usage.get(name, [])
            since = created.get(name)
            if since is not None:
                uses = [(s, *_since(plain, s, since)) for s, _, _ in uses]
                uses = [u for u in uses if u[1]]
            origin = "constraint" if sql is None else "dlindex" if name.startswith(PREFIX) else "manual"
            lasts = [u[2] for u in uses if u[2]]
            result.append(IndexUsage(
                name=name, table=table, sql=sql, origin=origin, fingerprints=len(uses),
                calls=sum(u[1] for u in uses), last_used=max(lasts) if lasts else None, size_bytes=_size(plain, name),
            ))  # fmt: skip
        return result
    finally:
        conn.close()
        plain.close()


def _record(conn: Connection, run: int, change: IndexChange, fingerprints: Sequence[str]) -> None:
    conn.execute(_RECORD, {"run": run, "action": change.action, "name": change.name, "table": change.table,
                           "sql": change.sql, "fingerprints": json.dumps(list(fingerprints))})  # fmt: skip


def _plan_now(conn: sqlite3.Connection, kind: str, sql: str) -> set[str]:
    if kind == "read":
        if check_select(sql) is not None:
            return set()
        return index_names(explain(conn, sql) or ())
    select = where_as_select(sql)
    return index_names(explain(conn, select) or ()) if select else set()


def _since(conn: sqlite3.Connection, sql: str, since: str) -> tuple[int, str | None]:
    calls, last = conn.execute(_LOGGED_SINCE, (sql, since)).fetchone()
    return int(calls or 0), last


def _size(conn: sqlite3.Connection, name: str) -> int | None:
    try:
        size = conn.execute(_INDEX_SIZE, (name,)).fetchone()[0]
    except sqlite3.Error:
        return None  # SQLite built without dbstat
    return int(size) if size is not None else None


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None
