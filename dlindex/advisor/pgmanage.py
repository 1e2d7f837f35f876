"""Applying advice to a PostgreSQL catalog, undoing it, and listing its indexes.

``CREATE INDEX CONCURRENTLY`` (and ``DROP INDEX CONCURRENTLY``): writers (``mark``, ``scan``,
``features compute``) go on while an index is built, which a plain CREATE INDEX would block
with its SHARE lock for the whole build. CONCURRENTLY cannot run inside a transaction, so
each index is its own step: built, then recorded in ``index_changes`` (one run, as on SQLite,
so ``--revert`` undoes exactly it). A build that fails leaves an INVALID index, which is
dropped before the error is reported. ``--drop-unused`` drops only indexes dlindex created
that the server has not scanned since its statistics were reset (``pg_stat_user_indexes``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

# index_changes is the same table on both backends: the same statements (the dialect rewrites them)
from dlindex.advisor.manage import _LAST_RUN, _MARK_REVERTED, _NEXT_RUN, _RECORD, _RUN_CHANGES
from dlindex.advisor.memo import State
from dlindex.advisor.model import Advice, Changes, Finding, IndexChange, IndexUsage
from dlindex.advisor.postgres import PREFIX
from dlindex.advisor.sqltext import quote_identifier
from dlindex.catalog.backend import SQL_ERRORS
from dlindex.errors import InputError
from dlindex.querylog.importer import LineSource, iter_lines

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.catalog.postgres.connect import PgConnection

_INDEX = """SELECT pg_get_indexdef(c.oid), t.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
    JOIN pg_class t ON t.oid = i.indrelid WHERE c.oid = to_regclass(%s)"""
_LIST = """SELECT s.indexrelname, s.relname, pg_get_indexdef(s.indexrelid), s.idx_scan,
        pg_relation_size(s.indexrelid), EXISTS (SELECT 1 FROM pg_constraint WHERE conindid = s.indexrelid)
    FROM pg_stat_user_indexes s WHERE s.schemaname = current_schema() ORDER BY s.relname, s.indexrelname"""
_PLANS = "SELECT sql, plan_detail FROM query_log_templates WHERE plan_detail IS NOT NULL"
_LOGGED = "SELECT sql, sum(calls), max(logged_at) FROM query_log WHERE kind = 'read' GROUP BY sql"
_USING = re.compile(r"\busing\s+(\"(?:[^\"]|\"\")*\"|\S+)\s+on\b", re.IGNORECASE)


def apply_server_advice(catalog: Catalog, advice: Advice, *, create: bool = True,
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
        changes.append(_record(catalog, run, IndexChange("create", s.name, s.table, s.sql), s.fingerprints))
    for finding in drop:
        found = _definition(conn, finding.name)
        if found is None:
            continue
        conn.execute_raw(f"DROP INDEX CONCURRENTLY IF EXISTS {quote_identifier(finding.name)}")
        changes.append(_record(catalog, run, IndexChange("drop", finding.name, found[1], found[0]), ()))
    tables = sorted({c.table for c in changes if c.action == "create"})
    for table in tables:
        conn.execute_raw(f"ANALYZE {quote_identifier(table)}")  # the planner needs statistics of the new indexes
    return Changes(run if changes else None, tuple(changes), bool(tables))


def revert_server_indexes(catalog: Catalog) -> Changes:
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


def list_server_indexes(catalog: Catalog) -> list[IndexUsage]:
    """Every index of the catalog's schema, with the logged statements whose plan uses it."""
    conn = cast("PgConnection", catalog.conn)
    users: dict[str, list[str]] = {}
    for sql, detail in catalog.conn.execute(_PLANS).fetchall():
        for m in _USING.finditer(str(detail)):
            users.setdefault(m.group(1).strip('"'), []).append(str(sql))
    logged = {str(sql): (int(calls or 0), last) for sql, calls, last in catalog.conn.execute(_LOGGED).fetchall()}
    out = []
    for name, table, sql, _scans, size, constraint in conn.execute_raw(_LIST).fetchall():
        uses = [logged[s] for s in users.get(str(name), ()) if s in logged]
        lasts = [str(u[1]) for u in uses if u[1]]
        origin = "constraint" if constraint else "dlindex" if str(name).startswith(PREFIX) else "manual"
        out.append(IndexUsage(str(name), str(table), str(sql), origin, len(uses), sum(u[0] for u in uses),
                              max(lasts) if lasts else None, int(size) if size is not None else None))  # fmt: skip
    return out


def _definition(conn: PgConnection, name: str) -> tuple[str, str] | None:
    row = conn.execute_raw(_INDEX, (quote_identifier(name),)).fetchone()
    return (str(row[0]), str(row[1])) if row else None


def _concurrently(conn: PgConnection, sql: str, name: str) -> None:
    try:
        conn.execute_raw(sql)
    except SQL_ERRORS:
        # a failed CONCURRENTLY build leaves an INVALID index behind: never keep half an index
        conn.execute_raw(f"DROP INDEX CONCURRENTLY IF EXISTS {quote_identifier(name)}")
        raise


def _record(catalog: Catalog, run: int, change: IndexChange, fingerprints: Sequence[str]) -> IndexChange:
    with catalog.write_transaction(bookkeeping=True) as tx:
        tx.execute(_RECORD, {"run": run, "action": change.action, "name": change.name, "table": change.table,
                             "sql": change.sql, "fingerprints": json.dumps(list(fingerprints))})  # fmt: skip
    return change


_SCHEMA = """SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index i
    JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace
    WHERE n.nspname = current_schema() ORDER BY 1"""
_LOG = "SELECT count(*), coalesce(max(id), 0), coalesce(sum(calls), 0) FROM query_log"
_TEMPLATES = "SELECT sql, coalesce(sample_params, '') FROM query_log_templates ORDER BY sql"


def server_state(
    catalog: Catalog, logs: Sequence[tuple[str, LineSource]], options: Mapping[str, Any]
) -> tuple[str, State]:
    """(where the memo of ``--suggest`` is kept, the state it was computed from) for a server catalog.

    The state is the schema's indexes, dlindex's query log and samples, the ``--log`` texts and the
    options; pg_stat_statements moves with every statement, the advisor's own included, so it is
    not part of it.
    """
    conn = cast("PgConnection", catalog.conn)
    schema = hashlib.sha256(json.dumps(conn.execute_raw(_SCHEMA).fetchall()).encode()).hexdigest()
    entries, last, calls = catalog.conn.execute(_LOG).fetchone()
    samples = hashlib.sha256()
    for sql, params in catalog.conn.execute(_TEMPLATES).fetchall():
        samples.update(f"{len(sql)}:{sql}{len(params)}:{params}".encode())
    inputs = hashlib.sha256(json.dumps(sorted(options.items()), default=str).encode())
    for name, source in logs:
        inputs.update(f"\0{name}\0".encode())
        for line in iter_lines(source):
            inputs.update(line.encode("utf-8", "replace") + b"\n")
    key = "/dlindex-server-catalog/" + hashlib.sha256(str(catalog.path).encode()).hexdigest()[:16]
    return key, State(schema, (int(entries), int(last), int(calls)), samples.hexdigest(), inputs.hexdigest())
