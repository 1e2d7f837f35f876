"""Applying advice, undoing it, and listing every index with how the logged workload uses it.

A file catalog changes in one transaction. A server catalog (PostgreSQL) uses ``CREATE INDEX
CONCURRENTLY`` (and ``DROP INDEX CONCURRENTLY``): writers (``mark``, ``scan``, ``features
compute``) go on while an index is built, which a plain CREATE INDEX would block with its
SHARE lock for the whole build. CONCURRENTLY cannot run inside a transaction, so each index
is its own step: built, then recorded in ``index_changes`` (one run, as on SQLite, so
``--revert`` undoes exactly it). A build that fails leaves an INVALID index, which is
dropped before the error is reported. ``--drop-unused`` drops only indexes dlindex created
that the server has not scanned since its statistics were reset (``pg_stat_user_indexes``).
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from dlindex.advisor.model import Advice, Changes, Finding, IndexChange, IndexUsage, State, current_state
from dlindex.advisor.planstats import ANALYSIS_LIMIT
from dlindex.advisor.replay import explain, index_names
from dlindex.advisor.shapes import check_select, where_as_select
from dlindex.advisor.sqltext import quote_identifier
from dlindex.advisor.workload import on_server
from dlindex.catalog.backend import SQL_ERRORS, Connection
from dlindex.catalog.sandbox import guarded
from dlindex.catalog.sqlite.history_schema import SCHEMA_INDEX_LIST, SCHEMA_INDEXES
from dlindex.errors import InputError
from dlindex.querylog.importer import LineSource, iter_lines

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.catalog.postgres.connect import PgConnection

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
    if on_server(catalog):
        return _apply_on_server(catalog, advice, create=create, drop=drop)
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
            # the planner needs statistics to prefer the new indexes; bounded (about ANALYSIS_LIMIT
            # rows of each index examined) so that it takes moments on a catalog of 10^8 rows too
            conn.execute(f"PRAGMA analysis_limit = {ANALYSIS_LIMIT}")
            conn.execute("ANALYZE")
            conn.execute("PRAGMA analysis_limit = 0")
    return Changes(run if changes else None, tuple(changes), analyzed)


def revert_indexes(catalog: Catalog) -> Changes:
    """Undo the latest run of ``apply_advice`` not yet reverted: drop what it created, recreate what it dropped."""
    if on_server(catalog):
        return _revert_on_server(catalog)
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
                conn.execute(f"PRAGMA analysis_limit = {ANALYSIS_LIMIT}")
                conn.execute(f"ANALYZE {quote_identifier(name)}")
                conn.execute("PRAGMA analysis_limit = 0")
                changes.append(IndexChange("create", name, table, sql))
        conn.execute(_MARK_REVERTED, (run,))
    return Changes(int(run), tuple(changes), any(c.action == "create" for c in changes))


def list_indexes(catalog: Catalog) -> list[IndexUsage]:
    """Every index of the catalog, with how many logged statements used it and when last.

    A statement's plan is the one the log recorded for its template; statements imported
    from elsewhere are explained now on a read-only connection (never run). For an index
    dlindex created, only statements logged after its creation count. On a server catalog the
    indexes are those of the catalog's schema, and a statement's plan is the one the log recorded.
    """
    if on_server(catalog):
        return _list_on_server(catalog)
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
            origin = (
                "constraint"
                if sql is None or name in SCHEMA_INDEXES
                else "dlindex"
                if name.startswith(PREFIX)
                else "manual"
            )
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


def advice_state(
    catalog: Catalog, logs: Sequence[tuple[str, LineSource]], options: Mapping[str, Any]
) -> tuple[str, State]:
    """(where the memo of ``--suggest`` is kept, the state it was computed from), on either backend."""
    if on_server(catalog):
        return _server_state(catalog, logs, options)
    return str(catalog.path), current_state(catalog.path, logs, options)


# --- a server catalog (PostgreSQL) ---------------------------------------------------

_PG_INDEX = """SELECT pg_get_indexdef(c.oid), t.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
    JOIN pg_class t ON t.oid = i.indrelid WHERE c.oid = to_regclass(%s)"""
_PG_LIST = f"""SELECT s.indexrelname, s.relname, pg_get_indexdef(s.indexrelid), s.idx_scan,
        pg_relation_size(s.indexrelid), EXISTS (SELECT 1 FROM pg_constraint WHERE conindid = s.indexrelid)
        OR s.indexrelname IN {SCHEMA_INDEX_LIST}
    FROM pg_stat_user_indexes s WHERE s.schemaname = current_schema() ORDER BY s.relname, s.indexrelname"""
_PG_PLANS = "SELECT sql, plan_detail FROM query_log_templates WHERE plan_detail IS NOT NULL"
_PG_LOGGED = "SELECT sql, sum(calls), max(logged_at) FROM query_log WHERE kind = 'read' GROUP BY sql"
_USING = re.compile(r"\busing\s+(\"(?:[^\"]|\"\")*\"|\S+)\s+on\b", re.IGNORECASE)


def _apply_on_server(catalog: Catalog, advice: Advice, *, create: bool = True,
                        drop: Sequence[Finding] = ()) -> Changes:  # fmt: skip
    """Build ``advice``'s suggestions and drop ``drop`` (dlindex's own only) CONCURRENTLY, then ANALYZE."""
    for finding in drop:
        if not finding.dlindex:
            raise InputError(f"{finding.name} was not created by dlindex; drop it yourself: {finding.drop_sql}")
    conn = cast("PgConnection", catalog.conn)
    with catalog.write_transaction(bookkeeping=True) as tx:
        run = int(tx.execute(_NEXT_RUN).fetchone()[0])
    changes: list[IndexChange] = []
    for s in advice.suggestions if create else ():
        if _definition(conn, s.name) is not None:
            continue
        _concurrently(conn, s.sql.replace("CREATE INDEX ", "CREATE INDEX CONCURRENTLY ", 1), s.name)
        changes.append(_record_on_server(catalog, run, IndexChange("create", s.name, s.table, s.sql), s.fingerprints))
    for finding in drop:
        found = _definition(conn, finding.name)
        if found is None:
            continue
        conn.execute_raw(f"DROP INDEX CONCURRENTLY IF EXISTS {quote_identifier(finding.name)}")
        changes.append(_record_on_server(catalog, run, IndexChange("drop", finding.name, found[1], found[0]), ()))
    tables = sorted({c.table for c in changes if c.action == "create"})
    for table in tables:
        conn.execute_raw(f"ANALYZE {quote_identifier(table)}")  # the planner needs statistics of the new indexes
    return Changes(run if changes else None, tuple(changes), bool(tables))


def _revert_on_server(catalog: Catalog) -> Changes:
    """Undo the latest run not yet reverted: drop what it created, build again what it dropped."""
    conn = cast("PgConnection", catalog.conn)
    run = catalog.conn.execute(_LAST_RUN).fetchone()[0]
    if run is None:
        return Changes(None, (), False)
    changes: list[IndexChange] = []
    for action, name, table, sql in catalog.conn.execute(_RUN_CHANGES, (run,)).fetchall():
        current = _definition(conn, name)
        if action == "create" and current is not None:
            conn.execute_raw(f"DROP INDEX CONCURRENTLY IF EXISTS {quote_identifier(name)}")
            changes.append(IndexChange("drop", name, table, sql))
        elif action == "drop" and current is None:
            _concurrently(conn, sql.replace("CREATE INDEX ", "CREATE INDEX CONCURRENTLY ", 1), name)
            conn.execute_raw(f"ANALYZE {quote_identifier(table)}")
            changes.append(IndexChange("create", name, table, sql))
    with catalog.write_transaction(bookkeeping=True) as tx:
        tx.execute(_MARK_REVERTED, (run,))
    return Changes(int(run), tuple(changes), any(c.action == "create" for c in changes))


def _list_on_server(catalog: Catalog) -> list[IndexUsage]:
    """Every index of the catalog's schema, with the logged statements whose plan uses it."""
    conn = cast("PgConnection", catalog.conn)
    users: dict[str, list[str]] = {}
    for sql, detail in catalog.conn.execute(_PG_PLANS).fetchall():
        for m in _USING.finditer(str(detail)):
            users.setdefault(m.group(1).strip('"'), []).append(str(sql))
    logged = {str(sql): (int(calls or 0), last) for sql, calls, last in catalog.conn.execute(_PG_LOGGED).fetchall()}
    out = []
    for name, table, sql, _scans, size, constraint in conn.execute_raw(_PG_LIST).fetchall():
        uses = [logged[s] for s in users.get(str(name), ()) if s in logged]
        lasts = [str(u[1]) for u in uses if u[1]]
        origin = "constraint" if constraint else "dlindex" if str(name).startswith(PREFIX) else "manual"
        out.append(IndexUsage(str(name), str(table), str(sql), origin, len(uses), sum(u[0] for u in uses),
                              max(lasts) if lasts else None, int(size) if size is not None else None))  # fmt: skip
    return out


def _definition(conn: PgConnection, name: str) -> tuple[str, str] | None:
    row = conn.execute_raw(_PG_INDEX, (quote_identifier(name),)).fetchone()
    return (str(row[0]), str(row[1])) if row else None


def _concurrently(conn: PgConnection, sql: str, name: str) -> None:
    try:
        conn.execute_raw(sql)
    except SQL_ERRORS:
        # a failed CONCURRENTLY build leaves an INVALID index behind: never keep half an index
        conn.execute_raw(f"DROP INDEX CONCURRENTLY IF EXISTS {quote_identifier(name)}")
        raise


def _record_on_server(catalog: Catalog, run: int, change: IndexChange, fingerprints: Sequence[str]) -> IndexChange:
    with catalog.write_transaction(bookkeeping=True) as tx:
        tx.execute(_RECORD, {"run": run, "action": change.action, "name": change.name, "table": change.table,
                             "sql": change.sql, "fingerprints": json.dumps(list(fingerprints))})  # fmt: skip
    return change


_PG_SCHEMA = """SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index i
    JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace
    WHERE n.nspname = current_schema() ORDER BY 1"""
_PG_LOG = "SELECT count(*), coalesce(max(id), 0), coalesce(sum(calls), 0) FROM query_log"
_PG_TEMPLATES = "SELECT sql, coalesce(sample_params, '') FROM query_log_templates ORDER BY sql"


def _server_state(
    catalog: Catalog, logs: Sequence[tuple[str, LineSource]], options: Mapping[str, Any]
) -> tuple[str, State]:
    """(where the memo of ``--suggest`` is kept, the state it was computed from) for a server catalog.

    The state is the schema's indexes, dlindex's query log and samples, the ``--log`` texts and the
    options; pg_stat_statements moves with every statement, the advisor's own included, so it is
    not part of it.
    """
    conn = cast("PgConnection", catalog.conn)
    schema = hashlib.sha256(json.dumps(conn.execute_raw(_PG_SCHEMA).fetchall()).encode()).hexdigest()
    entries, last, calls = catalog.conn.execute(_PG_LOG).fetchone()
    samples = hashlib.sha256()
    for sql, params in catalog.conn.execute(_PG_TEMPLATES).fetchall():
        samples.update(f"{len(sql)}:{sql}{len(params)}:{params}".encode())
    inputs = hashlib.sha256(json.dumps(sorted(options.items()), default=str).encode())
    for name, source in logs:
        inputs.update(f"\0{name}\0".encode())
        for line in iter_lines(source):
            inputs.update(line.encode("utf-8", "replace") + b"\n")
    key = "/dlindex-server-catalog/" + hashlib.sha256(str(catalog.path).encode()).hexdigest()[:16]
    return key, State(schema, (int(entries), int(last), int(calls)), samples.hexdigest(), inputs.hexdigest())
