"""The query log: what dlindex read and wrote, how long it took, and how SQLite planned it.

Every read that dlindex runs for a user (query, sampling, stats) and every write statement
shape (scan upserts, mark updates) is recorded in ``query_log``; ``dlindex index`` later
reads it as evidence. Recording is cheap: an entry is a tuple appended to a buffer, the
plan is explained once per template per process, and the buffer is written in one
statement per flush (with the next write transaction, after 1,000 entries or 5 s, and when
the catalog is closed). Imported statements are stored as text and never executed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .catalog import Catalog

_INSERT_ENTRY = """INSERT INTO query_log (kind, source, sql, fingerprint, table_name, calls, rows,
        duration_ms, plan, cached) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
_TEMPLATE = "SELECT offered, sample_params FROM query_log_templates WHERE sql = ?"
_UPSERT_TEMPLATE = """INSERT INTO query_log_templates (sql, fingerprint, plan_detail, offered, sample_params)
    VALUES (:sql, :fingerprint, :plan_detail, :offered, :sample_params)
    ON CONFLICT (sql) DO UPDATE SET plan_detail = coalesce(excluded.plan_detail, plan_detail),
        offered = excluded.offered, sample_params = excluded.sample_params"""
_LOG_ROWS = """SELECT query_log.fingerprint, kind, source, query_log.sql, calls, rows, duration_ms, plan,
        cached, logged_at
    FROM query_log ORDER BY query_log.fingerprint, query_log.id"""
_TEMPLATE_PARAMS = "SELECT fingerprint, sample_params FROM query_log_templates"
_COUNT_ENTRIES = "SELECT count(*) FROM query_log"
_CLEAR_LOG = "DELETE FROM query_log"
_CLEAR_TEMPLATES = "DELETE FROM query_log_templates"

FLUSH_ENTRIES = 1000
FLUSH_SECONDS = 5.0
RESERVOIR_SIZE = 8  # sample parameter sets kept per template
_MAX_PARAMS_CHARS = 4096  # a parameter set larger than this is not worth keeping as a sample

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


class QueryLog:
    """An in-memory buffer of log entries for one catalog connection."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.entries: list[tuple[Any, ...]] = []  # query_log rows, ready for executemany
        self.samples: dict[str, list[Any]] = {}  # sql -> [offered since flush, reservoir...]
        self.names: dict[str, tuple[str, str | None]] = {}  # sql -> (fingerprint, table), memoised
        self.writes: dict[str, list[float]] = {}  # sql -> [calls, rows, seconds] in this transaction
        self.pending_writes: dict[str, list[float]] = {}  # committed, not yet flushed
        self.plans: dict[str, tuple[str, str]] = {}  # sql -> (plan, plan_detail), once per process
        self.rng = random.Random(0)  # deterministic: tests and reruns agree
        self.last_flush = time.monotonic()

    def record_read(
        self,
        conn: sqlite3.Connection,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any],
        seconds: float,
        rows: int,
        cached: bool = False,
    ) -> None:
        """Buffer one read; the plan is explained on the first sight of a template."""
        if not self.enabled:
            return
        plan = self.plans.get(sql)
        if plan is None:
            plan = self.plans[sql] = explain_plan(conn, sql, params)
        fp, table = self._names(sql)
        self.entries.append(("read", "dlindex", sql, fp, table, 1, rows, seconds * 1000.0, plan[0], int(cached)))
        # Reservoir sampling (Algorithm R) as parameters arrive; merged with the stored one on flush.
        sample = self.samples.get(sql)
        if sample is None:
            self.samples[sql] = [1, params]
        else:
            sample[0] += 1
            if len(sample) <= RESERVOIR_SIZE:
                sample.append(params)
            else:
                slot = self.rng.randrange(sample[0])
                if slot < RESERVOIR_SIZE:
                    sample[1 + slot] = params

    def _names(self, sql: str) -> tuple[str, str | None]:
        names = self.names.get(sql)
        if names is None:
            names = self.names[sql] = (fingerprint(sql), table_of(sql))
        return names

    def count_write(self, sql: str, calls: int, rows: int, seconds: float) -> None:
        """Count executions of one write statement (inside a write transaction)."""
        totals = self.writes.get(sql)
        if totals is None:
            self.writes[sql] = [calls, rows, seconds]
        else:
            totals[0] += calls
            totals[1] += rows
            totals[2] += seconds

    def commit_writes(self) -> None:
        for sql, (calls, rows, seconds) in self.writes.items():
            totals = self.pending_writes.setdefault(sql, [0, 0, 0.0])
            totals[0] += calls
            totals[1] += rows
            totals[2] += seconds
        self.writes.clear()

    def discard_writes(self) -> None:
        self.writes.clear()

    def due(self) -> bool:
        size = len(self.entries) + len(self.pending_writes)
        return size >= FLUSH_ENTRIES or bool(size and time.monotonic() - self.last_flush > FLUSH_SECONDS)

    def has_entries(self) -> bool:
        return bool(self.entries or self.pending_writes)

    def flush_into(self, conn: sqlite3.Connection) -> None:
        """Write the buffer with ``conn``, which must be inside a write transaction."""
        entries = list(self.entries)
        for sql, (calls, rows, seconds) in self.pending_writes.items():
            fp, table = self._names(sql)
            entries.append(("write", "dlindex", sql, fp, table, int(calls), int(rows), seconds * 1000.0, None, 0))
        if entries:
            conn.executemany(_INSERT_ENTRY, entries)
        for sql, (offered, *sample) in self.samples.items():
            _merge_samples(conn, sql, self._names(sql)[0], self.plans.get(sql, ("", None))[1], offered, sample, self.rng)

    def flushed(self) -> None:
        self.entries = []
        self.samples = {}
        self.pending_writes = {}
        self.last_flush = time.monotonic()


def _merge_samples(
    conn: sqlite3.Connection, sql: str, fp: str, plan_detail: str | None, offered: int, sample: list[Any],
    rng: random.Random,
) -> None:
    """Merge this process's reservoir into the stored one; each stays a uniform sample."""
    row = conn.execute(_TEMPLATE, (sql,)).fetchone()
    stored_offered, stored = (int(row[0]), json.loads(row[1])) if row else (0, [])
    fresh = [encoded for encoded in map(_jsonable, sample) if len(json.dumps(encoded)) <= _MAX_PARAMS_CHARS]
    total = stored_offered + offered
    merged: list[Any] = []
    while len(merged) < RESERVOIR_SIZE and (stored or fresh):
        # Draw from each side in proportion to how many parameter sets it stands for.
        take_fresh = bool(fresh) and (not stored or rng.random() < offered / total)
        merged.append((fresh if take_fresh else stored).pop(rng.randrange(len(fresh if take_fresh else stored))))
    conn.execute(
        _UPSERT_TEMPLATE,
        {"sql": sql, "fingerprint": fp, "plan_detail": plan_detail, "offered": total,
         "sample_params": json.dumps(merged, ensure_ascii=False)},
    )  # fmt: skip


def _jsonable(params: Sequence[Any] | Mapping[str, Any]) -> Any:
    def value(v: Any) -> Any:
        return {"$hex": v.hex()} if isinstance(v, (bytes, bytearray, memoryview)) else v

    if isinstance(params, Mapping):
        return {k: value(v) for k, v in params.items()}
    return [value(v) for v in params]


def explain_plan(conn: sqlite3.Connection, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> tuple[str, str]:
    """(summary, detail) of ``EXPLAIN QUERY PLAN``: summary is scan, index or none."""
    try:
        lines = [str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    except sqlite3.Error:
        return "none", ""
    return classify_plan(lines), "\n".join(lines)


def classify_plan(lines: Iterable[str]) -> str:
    """'scan' if any table is read in full, else 'index' if one is searched, else 'none'."""
    subqueries: set[str] = set()
    scanned = searched = False
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] in ("MATERIALIZE", "CO-ROUTINE"):
            subqueries.add(words[1])
        elif len(words) >= 2 and words[0] == "SCAN":
            if "VIRTUAL TABLE" in line or words[1] in subqueries or words[1].startswith("("):
                continue
            if "INDEX" in line:
                searched = True  # a full pass over a (covering) index still uses one
            else:
                scanned = True
        elif words and words[0] == "SEARCH" and "USING" in line:
            searched = True
    return "scan" if scanned else "index" if searched else "none"


_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r"'(?:[^']|'')*'")
_NUMBER = re.compile(r"(?<![\w.])(?:0x[0-9a-f]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?)(?![\w])", re.I)
_PARAM = re.compile(r"(?:\?\d*|[:@$][A-Za-z_]\w*)")
_IN_LIST = re.compile(r"\(\s*\?(?:\s*,\s*\?)+\s*\)")
_VALUES_LIST = re.compile(r"(values\s*\(\?\))(?:\s*,\s*\(\?\))+")
_SPACE = re.compile(r"\s+")


def normalize(sql: str) -> str:
    """The statement with literals and placeholders as ``?``, lists folded, case and space unified."""
    text = _COMMENT.sub(" ", sql)
    text = _STRING.sub("?", text)
    text = _PARAM.sub("?", text)
    text = _NUMBER.sub("?", text)
    text = _SPACE.sub(" ", text).strip().rstrip(";").strip().lower()
    text = _IN_LIST.sub("(?)", text)
    return _VALUES_LIST.sub(r"\1", text)


def fingerprint(sql: str) -> str:
    """16 hex digits grouping statements that differ only in literals, placeholders or spacing."""
    return hashlib.sha1(normalize(sql).encode()).hexdigest()[:16]


_TABLE_OF = re.compile(
    r"^\s*(?:with\b.*?\)\s*)?(?:insert(?:\s+or\s+\w+)?\s+into|replace\s+into|update(?:\s+or\s+\w+)?|delete\s+from)"
    r"\s+([\w.\"`\[\]]+)|\bfrom\s+([\w.\"`\[\]]+)",
    re.I | re.S,
)


def table_of(sql: str) -> str | None:
    """The table a write changes, or the first table a read names after FROM."""
    for match in _TABLE_OF.finditer(sql):
        name = match.group(1) or match.group(2)
        if name and name.lower() not in ("select", "json_each"):
            return name.split(".")[-1].strip('"`[]')
    return None


def statement_kind(sql: str) -> str | None:
    """'read', 'write', 'skip' (transaction control) or None (not a statement dlindex stores)."""
    words = _COMMENT.sub(" ", sql).split(None, 1)
    verb = words[0].lower() if words else ""
    if verb == "with" and _WRITE_IN_WITH.search(sql):
        return "write"
    if verb in _READ_VERBS:
        return "read"
    if verb in _WRITE_VERBS:
        return "write"
    if verb in _SKIP_VERBS:
        return "skip"
    return None


_WRITE_IN_WITH = re.compile(r"\b(?:insert\s+(?:or\s+\w+\s+)?into|replace\s+into|update\s+\S+\s+set|delete\s+from)\b", re.I)
_DURATION = re.compile(r"--\s*duration_ms\s*=\s*([0-9.]+(?:e[+-]?\d+)?)", re.I)


def parse_statements(text: str) -> Iterator[ParsedStatement]:
    """Split captured SQL into statements: ``;``-separated, or one per line when no ``;`` ends any.

    A ``-- duration_ms=N`` comment after a statement on its last line, or on its own line
    just before it, gives that statement's duration.
    """
    has_semicolons = any(_ends_statement(line) for line in text.splitlines())
    current: list[str] = []
    start = 0
    duration: float | None = None
    pending: float | None = None  # from a comment line before the next statement
    for number, line in enumerate(text.splitlines(), start=1):
        code, comment = _split_comment(line)
        found = _DURATION.search(comment) if comment else None
        if not code.strip():
            if found:
                pending = float(found.group(1))
            continue
        if not current:
            start, duration, pending = number, pending, None
        current.append(code)
        if found:
            duration = float(found.group(1))
        if not has_semicolons or code.rstrip().endswith(";"):
            sql = " ".join(part.strip() for part in current).strip().rstrip(";").strip()
            if sql:
                yield ParsedStatement(sql, start, duration)
            current = []
    if current:
        yield ParsedStatement(" ".join(part.strip() for part in current).rstrip(";").strip(), start, duration)


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
        if kind is None or kind == "skip" or ";" in _STRING.sub("", statement.sql):
            skip_count += 1
            if kind != "skip" and len(skipped) < 20:
                skipped.append((statement.line, "not a single SELECT, INSERT, UPDATE or DELETE statement"))
            continue
        rows.append(
            (kind, "import", statement.sql, fingerprint(statement.sql), table_of(statement.sql), 1, None,
             statement.duration_ms, None, 0)
        )  # fmt: skip
    conn.executemany(_INSERT_ENTRY, rows)
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
