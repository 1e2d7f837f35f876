"""``stats``: what is in a catalog, in a handful of aggregate reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dlindex.catalog.classes import SPLITS, catalog_classes
from dlindex.catalog.connection import Catalog
from dlindex.catalog.postgres.dialect import postgres_form
from dlindex.catalog.reachable import unreachable_roots

_BY_STATUS = "SELECT status, count(*), coalesce(sum(bytes), 0) FROM image_metadata GROUP BY status"
_PROCESSED = "SELECT processed, count(*) FROM image_metadata WHERE status != 'missing' GROUP BY processed"
_PROCESSING = (
    "SELECT coalesce(processing_status, 'none'), count(*) FROM image_metadata "
    "WHERE status != 'missing' GROUP BY processing_status"
)
_EXCLUDED = "SELECT count(*) FROM image_metadata WHERE excluded = 1 AND status != 'missing'"
_LABEL_COUNTS = """SELECT labels.name, counts.n FROM (
        SELECT label_id, count(*) AS n FROM image_metadata WHERE status = 'ok' GROUP BY label_id
    ) AS counts JOIN labels ON labels.id = counts.label_id
    ORDER BY counts.n {direction}, labels.name LIMIT ?"""
_LARGEST_LABELS = _LABEL_COUNTS.format(direction="DESC")
_SMALLEST_LABELS = _LABEL_COUNTS.format(direction="ASC")
_LABEL_TOTAL = "SELECT count(DISTINCT label_id) FROM image_metadata WHERE status = 'ok'"
_WITHOUT_CLASS = "SELECT count(*) FROM image_metadata WHERE status = 'ok' AND label_id IS NULL"
_SPLITS = "SELECT split, count(*) FROM image_metadata WHERE status = 'ok' AND split IS NOT NULL GROUP BY split"
_INDEXES = postgres_form(
    "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
    "AND name NOT LIKE 'sqlite_%' ORDER BY tbl_name, name",
    # the same list on PostgreSQL: indexes of the catalog's schema that back no constraint
    "SELECT i.relname, t.relname, pg_get_indexdef(i.oid) FROM pg_index x "
    "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
    "WHERE t.relnamespace = current_schema()::regnamespace "
    "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid) "
    "ORDER BY t.relname, i.relname",
)
_ROOTS = "SELECT id, path, added_at FROM roots ORDER BY id"
_LAST_SCANS = """SELECT scans.id, roots.path AS root, state, started_at, finished_at, seen, new, changed,
        unchanged, missing, corrupt, skipped, errors, seconds
    FROM scans JOIN roots ON roots.id = scans.root_id ORDER BY scans.id DESC LIMIT ?"""
_LAST_SCANS_KEYS = ("id", "root", "state", "started_at", "finished_at", "seen", "new", "changed",
                    "unchanged", "missing", "corrupt", "skipped", "errors", "seconds")  # fmt: skip


@dataclass(frozen=True)
class LabelCount:
    label: str
    images: int


@dataclass(frozen=True)
class CatalogStats:
    images: int
    by_status: dict[str, int]
    bytes_by_status: dict[str, int]
    processed: int
    unprocessed: int
    processing_status: dict[str, int]
    excluded: int  # set aside by mark --exclude: no selection reads them (not counting missing rows)
    labels: int  # labels with an ok image
    classes: int  # the catalog's class list: label_id runs from 0 to classes - 1 (dlindex.catalog.classes)
    without_class: int  # ok images directly under ROOT (or a split folder): no label, no label_id
    splits: dict[str, int]  # ok images per split folder of pre-split trees
    largest_labels: list[LabelCount]
    smallest_labels: list[LabelCount]
    total_bytes: int
    catalog_bytes: int  # the file (and its -wal), or the server database's size
    indexes: list[dict[str, str]]
    roots: list[dict[str, Any]]
    last_scans: list[dict[str, Any]]
    catalog_backend: str = "sqlite"  # or "postgresql" (a server catalog)
    # A root that is gone or holds none of a few of its files: moved or unmounted (one line each).
    root_problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def catalog_stats(catalog: Catalog, top: int = 5, scans: int = 5) -> CatalogStats:
    """Totals by status, processed counts, label balance, size, indexes and recent scans."""
    read = catalog.read  # recorded in the query log, like every read dlindex runs for a user
    by_status: dict[str, int] = {"ok": 0, "corrupt": 0, "missing": 0}
    bytes_by_status: dict[str, int] = {"ok": 0, "corrupt": 0, "missing": 0}
    for status, count, size in read(_BY_STATUS):
        by_status[status] = count
        bytes_by_status[status] = size
    processed_counts = dict(read(_PROCESSED))
    return CatalogStats(
        images=sum(by_status.values()),
        by_status=by_status,
        bytes_by_status=bytes_by_status,
        processed=processed_counts.get(1, 0),
        unprocessed=processed_counts.get(0, 0),
        processing_status=dict(read(_PROCESSING)),
        excluded=int(next(iter(read(_EXCLUDED)))[0]),
        labels=int(next(iter(read(_LABEL_TOTAL)))[0]),
        classes=len(catalog_classes(catalog)),
        without_class=int(next(iter(read(_WITHOUT_CLASS)))[0]),
        splits=dict(sorted(((str(s), int(n)) for s, n in read(_SPLITS)), key=lambda kv: _split_order(kv[0]))),
        largest_labels=[LabelCount(*row) for row in read(_LARGEST_LABELS, (top,))],
        smallest_labels=[LabelCount(*row) for row in read(_SMALLEST_LABELS, (top,))],
        total_bytes=bytes_by_status["ok"] + bytes_by_status["corrupt"],
        catalog_bytes=_file_size(catalog),
        catalog_backend=catalog.backend.name,
        indexes=[{"name": n, "table": t, "sql": s} for n, t, s in read(_INDEXES)],
        roots=[dict(zip(("id", "path", "added_at"), row, strict=True)) for row in read(_ROOTS)],
        last_scans=[dict(zip(_LAST_SCANS_KEYS, row, strict=True)) for row in read(_LAST_SCANS, (scans,))],
        root_problems=unreachable_roots(read),
    )


def _split_order(split: str) -> tuple[int, str]:
    return (SPLITS.index(split) if split in SPLITS else len(SPLITS), split)


def _file_size(catalog: Catalog) -> int:
    return catalog.backend.size_bytes(catalog.conn)


_SLOW = """SELECT fingerprint, sql, sum(calls), sum(duration_ms), max(logged_at) FROM query_log
    WHERE kind = 'read' AND duration_ms IS NOT NULL AND calls > 0 GROUP BY fingerprint, sql"""
_SAMPLE_PARAMS = "SELECT sample_params FROM query_log_templates WHERE sql = ?"
_LOCK_WAITS = """SELECT coalesce(sum(calls), 0), coalesce(sum(lock_wait_ms), 0.0) FROM query_log
    WHERE lock_wait_ms IS NOT NULL"""


@dataclass(frozen=True)
class SlowQuery:
    fingerprint: str
    sql: str  # its most called statement
    calls: int
    mean_ms: float
    total_ms: float
    last_logged: str | None
    plan: tuple[str, ...]  # EXPLAIN QUERY PLAN now; empty if it is not a read-only SELECT


@dataclass(frozen=True)
class SlowReport:
    queries: list[SlowQuery]
    lock_wait_transactions: int  # write transactions that waited for the write lock
    lock_wait_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def slow_queries(catalog: Catalog, top: int = 5) -> SlowReport:
    """The read fingerprints with the highest mean duration, each with its current plan, and lock waits.

    Plans come from ``EXPLAIN QUERY PLAN`` on a read-only connection, for read-only SELECTs
    only (with a logged parameter sample); nothing from the log is executed.
    """
    import json

    from dlindex.advisor.replay import explain
    from dlindex.advisor.shapes import check_select
    from dlindex.catalog.sandbox import guarded

    conn = guarded(catalog.path)
    plain = guarded(catalog.path)
    plain.set_authorizer(None)  # reading the log tables is our own query
    try:
        groups: dict[str, list[Any]] = {}
        for fp, sql, calls, total, last in plain.execute(_SLOW):
            group = groups.setdefault(fp, [sql, 0, 0, 0.0, None])
            if calls > group[2]:
                group[0], group[2] = sql, calls
            group[1] += calls
            group[3] += total
            group[4] = max(filter(None, (group[4], last)), default=None)
        ranked = sorted(groups.items(), key=lambda item: (-item[1][3] / item[1][1], item[0]))[:top]
        queries = []
        for fp, (sql, calls, _most, total, last) in ranked:
            plan: tuple[str, ...] = ()
            if check_select(sql) is None:
                row = plain.execute(_SAMPLE_PARAMS, (sql,)).fetchone()
                samples = json.loads(row[0]) if row and row[0] else []
                params = sorted(samples, key=lambda v: json.dumps(v, sort_keys=True))[0] if samples else ()
                plan = explain(conn, sql, params) or ()
            queries.append(SlowQuery(fp, sql, int(calls), round(total / calls, 3), round(total, 3), last, plan))
        waited, wait_ms = plain.execute(_LOCK_WAITS).fetchone()
        return SlowReport(queries, int(waited), round(float(wait_ms), 3))
    finally:
        conn.close()
        plain.close()
