"""Reading the query log: ranked summaries (`dlindex log show`), imports of SQL captured
elsewhere (`dlindex log import`, stored and never executed), and clearing it.

Recording lives in ``querylog``; this module is loaded only by the commands that inspect the log.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .querylog import _COMMENT, _STRING, fingerprint, table_of

if TYPE_CHECKING:
    from .catalog import Catalog

_INSERT_IMPORTED = """INSERT INTO query_log (kind, source, sql, fingerprint, table_name, calls, rows,
        duration_ms, plan, cached) VALUES (?, 'import', ?, ?, ?, 1, NULL, ?, NULL, 0)"""
_LOG_ROWS = """SELECT query_log.fingerprint, kind, source, query_log.sql, calls, rows, duration_ms, plan,
        cached, logged_at
    FROM query_log ORDER BY query_log.fingerprint, query_log.id"""
_TEMPLATE_PARAMS = "SELECT fingerprint, sample_params FROM query_log_templates"
_COUNT_ENTRIES = "SELECT count(*) FROM query_log"
_CLEAR_LOG = "DELETE FROM query_log"
_CLEAR_TEMPLATES = "DELETE FROM query_log_templates"

_WRITE_VERBS = ("insert", "update", "delete", "replace")
_READ_VERBS = ("select", "with", "values")
_SKIP_VERBS = ("begin", "commit", "end", "rollback", "savepoint", "release")


@dataclass(frozen=True)
class FingerprintStats:
    """One line of ``dlindex log show``: a fingerprint and what its statements cost."""

    fingerprint: str
    kind: str
    sql: str  # the most recent template with this fingerprint
    calls: int
    cached: int
    total_ms: float
    mean_ms: float | None
    p95_ms: float | None
    rows: int
    plan: str  # "scan", "index", "none", "unknown" or a mix such as "scan 3, index 1"
    sources: tuple[str, ...]
    sample_params: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ImportSummary:
    imported: int
    skipped: int
    skipped_lines: tuple[tuple[int, str], ...] = field(default=())  # (line, reason), first 20

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["skipped_lines"] = [{"line": n, "reason": r} for n, r in self.skipped_lines]
        return data


@dataclass(frozen=True)
class ParsedStatement:
    sql: str
    line: int  # where the statement starts in the input, 1-based
    duration_ms: float | None


def statement_kind(sql: str) -> str | None:
    """'read', 'write', 'skip' (transaction control) or None (not a statement dlindex stores)."""
    words = re.sub(_COMMENT, " ", sql).split(None, 1)
    verb = words[0].lower() if words else ""
    if verb == "with" and re.search(_WRITE_IN_WITH, sql):
        return "write"
    if verb in _READ_VERBS:
        return "read"
    if verb in _WRITE_VERBS:
        return "write"
    if verb in _SKIP_VERBS:
        return "skip"
    return None


_WRITE_IN_WITH = r"(?i)\b(?:insert\s+(?:or\s+\w+\s+)?into|replace\s+into|update\s+\S+\s+set|delete\s+from)\b"
_DURATION = r"(?i)--\s*duration_ms\s*=\s*([0-9.]+(?:e[+-]?\d+)?)"


def parse_statements(text: str) -> Iterator[ParsedStatement]:
    """Split captured SQL into statements: ``;``-separated, or one per line when no ``;`` ends any.

    Without semicolons, a line that does not begin (at its first column, outside parentheses)
    with a statement keyword continues the statement before it, so a multi-line statement
    dumped by ``set_trace_callback(print)`` stays whole. A ``-- duration_ms=N`` comment after a
    statement on its last line, or on its own line just before it, gives that statement's duration.
    """
    has_semicolons = any(_ends_statement(line) for line in text.splitlines())
    current: list[str] = []
    start = 0
    duration: float | None = None
    pending: float | None = None  # from a comment line before the next statement
    for number, line in enumerate(text.splitlines(), start=1):
        code, comment = _split_comment(line)
        found = re.search(_DURATION, comment) if comment else None
        if not code.strip():
            if found:
                pending = float(found.group(1))
            continue
        # Open parentheses continue a statement only into a subquery right after "(": a
        # garbage line with an unclosed "(" must not swallow the rest of the file.
        if (
            current
            and not has_semicolons
            and re.match(_STATEMENT_START, code)
            and (_depth(current) == 0 or not current[-1].rstrip().endswith("("))
        ):
            yield _statement(current, start, duration)
            current = []
        if not current:
            start, duration, pending = number, pending, None
        current.append(code)
        if found:
            duration = float(found.group(1))
        if has_semicolons and code.rstrip().endswith(";"):
            yield _statement(current, start, duration)
            current = []
    if current:
        yield _statement(current, start, duration)


_STATEMENT_START = (
    r"(?i)(?:select|with|values|insert|update|delete|replace|begin|commit|end|rollback|savepoint|release|pragma"
    r"|create|drop|alter|attach|detach|analyze|vacuum|reindex|explain)\b"
)


def _statement(lines: list[str], start: int, duration: float | None) -> ParsedStatement:
    return ParsedStatement(" ".join(part.strip() for part in lines).strip().rstrip(";").strip(), start, duration)


def _depth(lines: list[str]) -> int:
    text = re.sub(_STRING, "", " ".join(lines))
    return text.count("(") - text.count(")")


def _split_comment(line: str) -> tuple[str, str]:
    """(code, trailing -- comment) of one line, with quotes respected."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "-" and line.startswith("--", i):
            return line[:i], line[i:]
    return line, ""


def _ends_statement(line: str) -> bool:
    return _split_comment(line)[0].rstrip().endswith(";")


def import_statements(conn: sqlite3.Connection, statements: Iterable[ParsedStatement]) -> ImportSummary:
    """Store captured statements as ``source = 'import'`` log entries; nothing is executed.

    ``conn`` must be inside a write transaction.
    """
    rows: list[tuple[Any, ...]] = []
    skipped: list[tuple[int, str]] = []
    skip_count = 0
    for statement in statements:
        kind = statement_kind(statement.sql)
        if kind is None or kind == "skip" or ";" in re.sub(_STRING, "", statement.sql):
            skip_count += 1
            if kind != "skip" and len(skipped) < 20:
                skipped.append((statement.line, "not a single SELECT, INSERT, UPDATE or DELETE statement"))
            continue
        rows.append((kind, statement.sql, fingerprint(statement.sql), table_of(statement.sql), statement.duration_ms))
    conn.executemany(_INSERT_IMPORTED, rows)
    return ImportSummary(imported=len(rows), skipped=skip_count, skipped_lines=tuple(skipped))


def summarize(conn: sqlite3.Connection, top: int | None = 10) -> list[FingerprintStats]:
    """Fingerprints ranked by total time (then calls): the input of ``dlindex log show``."""
    samples: dict[str, list[Any]] = {}
    for fp, params in conn.execute(_TEMPLATE_PARAMS):
        samples.setdefault(fp, []).extend(json.loads(params))
    stats: list[FingerprintStats] = []
    group: list[tuple[Any, ...]] = []
    for row in conn.execute(_LOG_ROWS):
        if group and row[0] != group[0][0]:
            stats.append(_summarize_group(group, samples))
            group = []
        group.append(row)
    if group:
        stats.append(_summarize_group(group, samples))
    stats.sort(key=lambda s: (-s.total_ms, -s.calls, s.fingerprint))
    return stats if top is None else stats[:top]


def _summarize_group(group: list[tuple[Any, ...]], samples: dict[str, Any]) -> FingerprintStats:
    durations = sorted(float(r[6]) / max(int(r[4]), 1) for r in group if r[6] is not None)
    calls = sum(int(r[4]) for r in group)
    timed_calls = sum(int(r[4]) for r in group if r[6] is not None)
    total = sum(float(r[6]) for r in group if r[6] is not None)
    plans: dict[str, int] = {}
    for r in group:
        name = r[7] or ("unknown" if r[1] == "read" else "none")
        plans[name] = plans.get(name, 0) + 1
    plan = next(iter(plans)) if len(plans) == 1 else ", ".join(f"{k} {v}" for k, v in sorted(plans.items()))
    p95 = durations[min(len(durations) - 1, math.ceil(0.95 * len(durations)) - 1)] if durations else None
    return FingerprintStats(
        fingerprint=group[0][0], kind=group[-1][1], sql=group[-1][3], calls=calls,
        cached=sum(int(r[4]) for r in group if r[8]), total_ms=round(total, 3),
        mean_ms=round(total / timed_calls, 3) if timed_calls else None,
        p95_ms=round(p95, 3) if p95 is not None else None, rows=sum(int(r[5] or 0) for r in group),
        plan=plan, sources=tuple(sorted({r[2] for r in group})),
        sample_params=tuple(samples.get(group[0][0], ())),
    )  # fmt: skip


def clear(conn: sqlite3.Connection) -> int:
    """Delete every log entry and template sample; ``conn`` must be in a write transaction."""
    removed = int(conn.execute(_CLEAR_LOG).rowcount)
    conn.execute(_CLEAR_TEMPLATES)
    return removed


@dataclass(frozen=True)
class LogSummary:
    entries: int  # rows in query_log
    fingerprints: tuple[FingerprintStats, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "fingerprints": [asdict(f) for f in self.fingerprints]}


def log_summary(catalog: Catalog, top: int | None = 10) -> LogSummary:
    """The ``top`` fingerprints by total time, with calls, mean and p95 duration and plans."""
    entries = int(catalog.conn.execute(_COUNT_ENTRIES).fetchone()[0])
    return LogSummary(entries=entries, fingerprints=tuple(summarize(catalog.conn, top)))


def import_log(catalog: Catalog, text: str) -> ImportSummary:
    """Store the statements in captured SQL text (see ``parse_statements``); never run them."""
    with catalog.write_transaction(bookkeeping=True) as conn:
        return import_statements(conn, parse_statements(text))


def clear_log(catalog: Catalog) -> int:
    """Delete the whole query log; return how many entries there were."""
    catalog.querylog.flushed()  # what is buffered belongs to the log being cleared
    with catalog.write_transaction(bookkeeping=True) as conn:
        return clear(conn)
