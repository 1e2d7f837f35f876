"""The query log as commands see it: ranked summaries (`dlindex log show`), imports, clearing.

Recording lives in ``catalog.recorder``, the parsing of captured SQL in ``querylog.importer``;
this module is loaded only by the commands that inspect the log.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from dlindex.catalog.backend import Connection
from dlindex.querylog.importer import ImportSummary, LineSource, import_statements, parse_statements

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_LOG_ROWS = """SELECT query_log.fingerprint, kind, source, query_log.sql, calls, rows, duration_ms, plan,
        cached, logged_at
    FROM query_log ORDER BY query_log.fingerprint, query_log.id"""
_TEMPLATE_PARAMS = "SELECT fingerprint, sample_params FROM query_log_templates"
_COUNT_ENTRIES = "SELECT count(*) FROM query_log"
_CLEAR_LOG = "DELETE FROM query_log"
_CLEAR_TEMPLATES = "DELETE FROM query_log_templates"


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


def summarize(conn: Connection, top: int | None = 10) -> list[FingerprintStats]:
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


def clear(conn: Connection) -> int:
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


def import_log(catalog: Catalog, text: LineSource) -> ImportSummary:
    """Store the statements in captured SQL text (see ``parse_statements``); never run them."""
    with catalog.write_transaction(bookkeeping=True) as conn:
        return import_statements(conn, parse_statements(text))


def clear_log(catalog: Catalog) -> int:
    """Delete the whole query log; return how many entries there were."""
    catalog.querylog.flushed()  # what is buffered belongs to the log being cleared
    with catalog.write_transaction(bookkeeping=True) as conn:
        return clear(conn)
