"""The workload of a server catalog: pg_stat_statements joined with dlindex's query log.

``pg_stat_statements`` knows every statement the server ran for the catalog's database,
from any client, with calls and time, but with its values replaced by ``$1``, ``$2``.
dlindex's ``query_log`` knows its own reads with real parameter sets (the reservoir of
``query_log_templates``), which PostgreSQL 15 needs to EXPLAIN a statement at all (it has no
``EXPLAIN (GENERIC_PLAN)``). The two are joined by a *server fingerprint*: a log template is
rewritten as PostgreSQL runs it (``dlindex.catalog.dialect.translate``), a server statement loses the
``DECLARE ... CURSOR ... FOR`` that dlindex's streamed reads run under, and in both
placeholders (``$1``, ``%s``, ``%(name)s``) and literals become ``?`` and their casts are
dropped before ``dlindex.catalog.fingerprint`` hashes the text. A statement the log holds is weighed
by the log's calls and durations (a read through a held cursor is executed when the cursor
is materialised, which pg_stat_statements does not credit to the DECLARE); a statement only
the server saw is weighed by its calls and ``total_exec_time`` and can be explained and
timed only when it has no placeholders.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from dlindex.advisor.shapes import check_select, write_columns
from dlindex.advisor.workload import Skipped, Statement, load_workload
from dlindex.catalog.backend import SQL_ERRORS
from dlindex.catalog.fingerprint import fingerprint, table_of
from dlindex.catalog.postgres.dialect import server_statement, translate
from dlindex.errors import InputError
from dlindex.query import per_label
from dlindex.querylog.importer import LineSource

if TYPE_CHECKING:
    from dlindex.catalog.postgres.connect import PgConnection

_PRELOAD = (
    "SELECT current_setting('shared_preload_libraries'), current_database(), current_setting('server_version_num')"
)
_HAS_EXTENSION = "SELECT 1 FROM pg_extension WHERE extname = %s"
_AVAILABLE = "SELECT 1 FROM pg_available_extensions WHERE name = %s"
_CREATE_HYPOPG = "CREATE EXTENSION IF NOT EXISTS hypopg"
_STATEMENTS = """SELECT s.query, sum(s.calls)::bigint, sum(s.total_exec_time)::float8, sum(s.rows)::bigint
    FROM pg_stat_statements s WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
    GROUP BY s.query"""
_TABLES = """SELECT table_name FROM information_schema.tables
    WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"""
OWN = "/* dlindex index */"  # marks the advisor's own statements, which pg_stat_statements also records
_DECLARE = re.compile(
    r"^\s*DECLARE\s+(?:\"(?:[^\"]|\"\")*\"|\w+)\s+(?:(?:BINARY|INSENSITIVE|ASENSITIVE|NO\s+SCROLL|SCROLL)\s+)*"
    r"CURSOR\s+(?:WITH(?:OUT)?\s+HOLD\s+)?FOR\s+",
    re.IGNORECASE,
)
_PLACEHOLDER = re.compile(r"\$\d+|%\(\w+\)s|%s")
_TYPE_SLOT = re.compile(r"\{t\d+\}")  # dialect.translate's slot for a JSON array's element type
_CAST = re.compile(r"(\?)\s*::\s*\w+(?:\s*\[\])?")
_SERVER_ONLY = re.compile(r"\$\d+")
# dlindex's own bookkeeping: never a workload that earns an index
OWN_TABLES = frozenset({"query_log", "query_log_templates", "catalog_changes", "query_cache", "index_changes",
                        "dlindex_schema"})  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One way to run a read on the server: PostgreSQL text and psycopg parameters."""

    sql: str
    params: tuple[Any, ...] | dict[str, Any]


@dataclass(frozen=True)
class ServerStatement:
    """A statement of the workload, with how the server saw it."""

    statement: Statement  # sql: dlindex's text (SQLite dialect) or the server's, placeholders as ?
    runs: tuple[Run, ...]  # empty: cannot be explained (placeholders without sample values)
    server_calls: int  # from pg_stat_statements (0: not seen there)
    server_ms: float
    source: str  # log | pg_stat_statements | both
    # per-label sampling's SERVER_SEEK form of a logged window statement: what dlindex runs
    # instead where an index serves it (``dlindex.query.per_label``); the advice plans it
    seek: tuple[Run, ...] = ()


@dataclass(frozen=True)
class ServerWorkload:
    reads: dict[str, ServerStatement]
    writes: dict[str, ServerStatement]
    skipped: tuple[Skipped, ...]
    database: str
    joined: int  # fingerprints found in both the log and pg_stat_statements


def server_fingerprint(text: str) -> str:
    """The fingerprint a statement has on the server: cursor wrapper, placeholders and casts gone."""
    text = _TYPE_SLOT.sub("text", _DECLARE.sub("", text))
    text = _CAST.sub(r"\1", _PLACEHOLDER.sub("?", text)).replace("%%", "%")
    return fingerprint(text)


def check_statistics(conn: PgConnection) -> tuple[str, int]:
    """(database, server major version); InputError when pg_stat_statements cannot be read."""
    preload, database, version = conn.execute_raw(_PRELOAD).fetchone() or ("", "", "0")
    major = int(version) // 10000
    libraries = {name.strip().strip('"') for name in str(preload).split(",")}
    if "pg_stat_statements" not in libraries:
        raise InputError(
            "dlindex index on PostgreSQL reads pg_stat_statements, which the server does not load: add "
            "shared_preload_libraries = 'pg_stat_statements' to postgresql.conf and restart it; nothing was changed"
        )
    if conn.execute_raw(_HAS_EXTENSION, ("pg_stat_statements",)).fetchone() is None:
        raise InputError(
            f"the pg_stat_statements extension does not exist in database {database}: run "
            "CREATE EXTENSION pg_stat_statements there (as a superuser); nothing was changed"
        )
    return str(database), major


def ensure_hypopg(conn: PgConnection, major: int) -> None:
    """Create the hypopg extension if the server has it; InputError naming the package if not."""
    if conn.execute_raw(_HAS_EXTENSION, ("hypopg",)).fetchone() is not None:
        return
    if conn.execute_raw(_AVAILABLE, ("hypopg",)).fetchone() is None:
        raise InputError(
            f"dlindex index on PostgreSQL judges candidates with hypothetical indexes, and hypopg is not installed "
            f"on the server: apt-get install postgresql-{major}-hypopg (Debian, Ubuntu); nothing was changed"
        )
    try:
        conn.execute_raw(_CREATE_HYPOPG)
    except SQL_ERRORS as e:
        raise InputError(
            f"cannot create the hypopg extension ({e}): run CREATE EXTENSION hypopg as a superuser; nothing was changed"
        ) from None


def load_server_workload(conn: PgConnection, logs: Iterable[tuple[str, LineSource]] = ()) -> ServerWorkload:
    """dlindex's query log (and ``--log`` files) joined with pg_stat_statements by server fingerprint."""
    database = str(conn.execute_raw("SELECT current_database()").fetchone()[0])  # type: ignore[index]
    log = load_workload(cast(sqlite3.Connection, conn), logs)
    tables = {str(r[0]) for r in conn.execute_raw(_TABLES).fetchall()} - OWN_TABLES
    by_server: dict[str, tuple[str, ServerStatement]] = {}  # server fingerprint -> (log fp, statement)
    for s in (*log.reads, *log.writes):
        runs = tuple(_run(sample.sql, sample.params) for sample in s.samples) if s.kind == "read" else ()
        seek = tuple(_run(alt, sample.params) for sample in s.samples
                     if s.kind == "read" and (alt := per_label.seek_of(sample.sql, server=True)) is not None)  # fmt: skip
        by_server[_log_fingerprint(s)] = (s.fingerprint, ServerStatement(s, runs, 0, 0.0, "log", seek))
    merged: dict[str, tuple[str, ServerStatement]] = {}
    joined: set[str] = set()
    for text, calls, total_ms, rows in conn.execute_raw(_STATEMENTS).fetchall():
        seen = _server_statement(str(text), int(calls or 0), float(total_ms or 0.0), int(rows or 0), tables)
        if seen is None:
            continue
        key = server_fingerprint(str(text))
        if key in by_server:
            fp, known = by_server[key]
            joined.add(fp)
            by_server[key] = (fp, replace(known, server_calls=known.server_calls + seen.server_calls,
                                          server_ms=known.server_ms + seen.server_ms, source="both"))  # fmt: skip
        elif key in merged:
            fp, known = merged[key]
            st = known.statement
            merged[key] = (fp, replace(known, statement=replace(st, calls=st.calls + seen.statement.calls,
                                       timed_calls=st.timed_calls + seen.statement.timed_calls,
                                       total_ms=st.total_ms + seen.statement.total_ms),
                                       server_calls=known.server_calls + seen.server_calls,
                                       server_ms=known.server_ms + seen.server_ms))  # fmt: skip
        else:
            merged[key] = (seen.statement.fingerprint, seen)
    reads: dict[str, ServerStatement] = {}
    writes: dict[str, ServerStatement] = {}
    for fp, seen in (*by_server.values(), *merged.values()):
        (reads if seen.statement.kind == "read" else writes)[fp] = seen
    skipped = list(log.skipped)
    for seen in reads.values():
        if not seen.runs and seen.source == "pg_stat_statements":
            skipped.append(Skipped("pg_stat_statements", None, "placeholders without sample values: PostgreSQL 15 "
                                   "cannot plan it (run it through dlindex, or dlindex log import it with values)",
                                   _short(seen.statement.sql)))  # fmt: skip
    return ServerWorkload(reads, writes, tuple(skipped), database, len(joined))


def _log_fingerprint(s: Statement) -> str:
    text = translate(s.sql).text
    return server_fingerprint(text)


def _run(sql: str, params: tuple[Any, ...] | dict[str, Any]) -> Run:
    text, bound = server_statement(sql, params)
    return Run(text, dict(bound) if isinstance(bound, Mapping) else tuple(bound))


def _server_statement(text: str, calls: int, total_ms: float, rows: int, tables: set[str]) -> ServerStatement | None:
    """A statement pg_stat_statements saw, when it is a read or write of the catalog's tables."""
    body = _DECLARE.sub("", text).strip()
    head = body[:12].upper()
    if not head.startswith(("SELECT", "WITH", "INSERT", "UPDATE", "DELETE")) or "hypopg" in body or OWN in body:
        return None
    table = table_of(body)
    if table is None or table not in tables:
        return None
    plain = _CAST.sub(r"\1", _SERVER_ONLY.sub("?", body))
    kind = "read" if head.startswith(("SELECT", "WITH")) else "write"
    if kind == "read" and check_select(plain) is not None:
        return None
    set_columns = write_columns(plain)[1] if kind == "write" else None
    st = Statement(fingerprint=fingerprint(plain), kind=kind, sql=plain, calls=calls, timed_calls=calls,
                   total_ms=total_ms, rows=rows, sources=("pg_stat_statements",), variants=(plain,),
                   table=table, set_columns=set_columns)  # fmt: skip
    runs = (Run(body.replace("%", "%%"), ()),) if kind == "read" and not _SERVER_ONLY.search(body) else ()
    return ServerStatement(st, runs, calls, total_ms, "pg_stat_statements")


def _short(sql: str, width: int = 120) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= width else text[: width - 1] + "…"
