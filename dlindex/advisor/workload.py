"""The workload index advice is computed from: the query log plus captured SQL files.

Statements are grouped by fingerprint. A read keeps up to a few *samples* — the template
with real parameter sets from the log's reservoir, or distinct literal statements — so it
can be explained and timed with values it really ran with. Only a statement that
``check_select`` accepts is ever explained or timed; everything else is reported
(``skipped: not a read-only SELECT``) and, if it is an INSERT, UPDATE or DELETE, counted
as write load. Nothing here runs a statement from a log.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from dlindex.advisor.shapes import NOT_READ_ONLY, check_select, write_columns
from dlindex.advisor.sqltext import PARSE_ERRORS, parse
from dlindex.catalog.fingerprint import fingerprint, table_of
from dlindex.query import per_label, windows
from dlindex.querylog.importer import MAX_STATEMENT_CHARS, LineSource, parse_statements, statement_kind

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_LOG_GROUPS = """SELECT fingerprint, kind, source, sql, count(*), sum(calls),
        sum(CASE WHEN duration_ms IS NOT NULL THEN calls ELSE 0 END), sum(duration_ms), sum(rows), max(logged_at)
    FROM query_log GROUP BY fingerprint, kind, source, sql ORDER BY fingerprint, min(id)"""
_TEMPLATE_SAMPLES = "SELECT sql, sample_params FROM query_log_templates"
_LOCK_WAIT_SQL = "BEGIN IMMEDIATE"  # how the log records time spent waiting for the write lock
MAX_SAMPLES = 3  # parameter sets (or literal variants) a read is explained and timed with
MAX_VARIANTS = 8  # literal variants analysed to tell constants from values that vary
MAX_ANALYZED_CHARS = 100_000  # a longer statement from a --log file is reported, not parsed


def on_server(catalog: Catalog) -> bool:
    """Whether ``catalog``'s backend advises with hypothetical indexes (PostgreSQL): the one place the advisor asks."""
    return catalog.backend.advisor == "hypopg"


@dataclass(frozen=True)
class Sample:
    sql: str
    params: tuple[Any, ...] | dict[str, Any] = ()


@dataclass(frozen=True)
class Statement:
    """One fingerprint of the workload: what ran, how often, how long."""

    fingerprint: str
    kind: str  # read | write
    sql: str  # a representative statement (the most called template)
    calls: int
    timed_calls: int
    total_ms: float  # over timed_calls
    rows: int
    sources: tuple[str, ...]
    samples: tuple[Sample, ...] = ()
    variants: tuple[str, ...] = ()  # distinct statement texts (literal variants), up to MAX_VARIANTS
    table: str | None = None
    set_columns: tuple[str, ...] | None = None  # UPDATE ... SET columns
    last_logged: str | None = None
    # What dlindex runs instead once an index serves it (``alternative``); the advice plans and
    # times this where it is served (``seek_served``).
    seek: tuple[Sample, ...] = ()

    def seek_served(self, plan: Sequence[str]) -> bool:
        """Whether ``plan`` (of ``seek[0]``) is served as ``dlindex query`` requires before it runs it."""
        if not self.seek:
            return False
        return (per_label.seek_served if "sample_rows" in self.seek[0].sql else windows.served)(plan)

    @property
    def mean_ms(self) -> float | None:
        return self.total_ms / self.timed_calls if self.timed_calls else None


def alternative(sample: Sample) -> Sample | None:
    """The statement ``dlindex query`` runs instead of ``sample`` where an index serves it: per-label
    sampling's SEEK form of a logged WINDOW statement, a time window closed on both sides."""
    seek = per_label.seek_of(sample.sql)
    if seek is not None:
        return Sample(seek, sample.params)
    closed = windows.closed_of(sample.sql, sample.params)
    return None if closed is None else Sample(*closed)


@dataclass(frozen=True)
class Skipped:
    source: str  # a file name, or "query_log"
    line: int | None
    reason: str
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "line": self.line, "reason": self.reason, "text": self.text}


@dataclass(frozen=True)
class Workload:
    reads: tuple[Statement, ...]
    writes: tuple[Statement, ...]
    skipped: tuple[Skipped, ...]
    lock_wait_ms: float = 0.0


@dataclass
class _Group:
    kind: str
    calls: int = 0
    timed: int = 0
    total_ms: float = 0.0
    rows: int = 0
    sources: set[str] = field(default_factory=set)
    texts: dict[str, int] = field(default_factory=dict)  # statement text -> calls
    last: str | None = None


def load_workload(conn: sqlite3.Connection, logs: Iterable[tuple[str, LineSource]] = ()) -> Workload:
    """Read the query log through ``conn`` (read-only is enough) and the captured ``(name, text)`` logs."""
    groups: dict[str, _Group] = {}
    skipped: list[Skipped] = []
    lock_wait = 0.0
    rejected: set[str] = set()
    for fp, kind, source, sql, _n, calls, timed, total, rows, last in conn.execute(_LOG_GROUPS):
        if sql == _LOCK_WAIT_SQL:
            lock_wait += float(total or 0.0)
            continue
        reason = check_select(sql) if kind == "read" else None
        if reason is not None:
            if fp not in rejected:
                rejected.add(fp)
                skipped.append(Skipped("query_log", None, reason, _shorten(sql)))
            continue
        _add(groups, fp, kind, sql, int(calls or 0), int(timed or 0), float(total or 0.0), int(rows or 0), source, last)
    for name, text in logs:
        for statement in parse_statements(text):
            if statement.too_long or len(statement.sql) > MAX_ANALYZED_CHARS:
                limit = MAX_STATEMENT_CHARS if statement.too_long else MAX_ANALYZED_CHARS
                skipped.append(
                    Skipped(name, statement.line, f"longer than {limit:,} characters", _shorten(statement.sql))
                )
                continue
            kind = statement_kind(statement.sql)
            if kind == "skip":
                continue  # transaction control: neither a query nor a hazard
            reason = check_select(statement.sql) if kind == "read" else NOT_READ_ONLY
            if kind == "write":
                reason = NOT_READ_ONLY + "; counted as write load, never run"
            if reason is not None:
                skipped.append(Skipped(name, statement.line, reason, _shorten(statement.sql)))
                if kind != "write":
                    continue
            duration = statement.duration_ms
            _add(groups, fingerprint(statement.sql), kind or "read", statement.sql, 1, int(duration is not None),
                 float(duration or 0.0), 0, "file", None)  # fmt: skip
    samples = _template_samples(conn)
    reads: list[Statement] = []
    writes: list[Statement] = []
    for fp, group in groups.items():
        (reads if group.kind == "read" else writes).append(_statement(fp, group, samples))
    order = lambda s: (-s.calls, s.fingerprint)  # noqa: E731
    return Workload(tuple(sorted(reads, key=order)), tuple(sorted(writes, key=order)), tuple(skipped), lock_wait)


def _add(groups: dict[str, _Group], fp: str, kind: str, sql: str, calls: int, timed: int, total: float, rows: int,
         source: str, last: str | None) -> None:  # fmt: skip
    group = groups.get(fp)
    if group is None:
        group = groups[fp] = _Group(kind)
    group.calls += calls
    group.timed += timed
    group.total_ms += total
    group.rows += rows
    group.sources.add(source)
    group.texts[sql] = group.texts.get(sql, 0) + calls
    if last is not None and (group.last is None or last > group.last):
        group.last = last


def _statement(fp: str, group: _Group, samples: Mapping[str, list[Any]]) -> Statement:
    texts = sorted(group.texts.items(), key=lambda item: (-item[1], item[0]))
    sql = texts[0][0]
    table, set_columns = (None, None)
    if group.kind == "write":
        table, set_columns = write_columns(sql)
        table = table or table_of(sql)
    chosen: list[Sample] = []
    for text, _calls in texts:
        params = samples.get(text)
        if params:
            # Deterministic choice among the reservoir: reruns time the same values.
            for p in sorted(params, key=lambda v: json.dumps(v, sort_keys=True))[:MAX_SAMPLES]:
                chosen.append(Sample(text, _decode(p)))
        elif not _has_parameters(text):
            chosen.append(Sample(text))
        if len(chosen) >= MAX_SAMPLES:
            break
    return Statement(
        fingerprint=fp, kind=group.kind, sql=sql, calls=group.calls, timed_calls=group.timed,
        total_ms=group.total_ms, rows=group.rows, sources=tuple(sorted(group.sources)),
        samples=tuple(chosen[:MAX_SAMPLES]), variants=tuple(t for t, _ in texts[:MAX_VARIANTS]),
        table=table, set_columns=set_columns, last_logged=group.last,
        seek=tuple(alt for s in chosen[:MAX_SAMPLES] if (alt := alternative(s)) is not None),
    )  # fmt: skip


def _template_samples(conn: sqlite3.Connection) -> dict[str, list[Any]]:
    samples: dict[str, list[Any]] = {}
    for sql, params in conn.execute(_TEMPLATE_SAMPLES):
        try:
            decoded = json.loads(params)
        except (TypeError, ValueError):
            continue
        if isinstance(decoded, list) and decoded:
            samples[sql] = decoded
    return samples


def _decode(params: Any) -> tuple[Any, ...] | dict[str, Any]:
    def value(v: Any) -> Any:
        if isinstance(v, dict) and set(v) == {"$hex"}:
            return bytes.fromhex(v["$hex"])
        return v

    if isinstance(params, dict):
        return {k: value(v) for k, v in params.items()}
    if isinstance(params, Sequence) and not isinstance(params, str):
        return tuple(value(v) for v in params)
    return ()


def _has_parameters(sql: str) -> bool:
    try:
        return any(True for e in parse(sql) for _ in e.find_all(exp.Placeholder, exp.Parameter))
    except PARSE_ERRORS:
        return True  # unparsable: no usable sample either way


def _shorten(sql: str, width: int = 120) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= width else text[: width - 1] + "…"
