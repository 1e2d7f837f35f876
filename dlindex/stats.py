"""``stats``: what is in a catalog, in a handful of aggregate reads."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from dlindex.catalog.as_of import present_rows
from dlindex.catalog.classes import SPLITS, catalog_classes
from dlindex.catalog.connection import Catalog
from dlindex.catalog.postgres.dialect import postgres_form
from dlindex.catalog.reachable import unreachable_roots
from dlindex.catalog.sqlite.history_schema import SCHEMA_INDEX_LIST
from dlindex.query.spec import ID_SPAN

# Above this many rows (the id range) stats estimates the row figures from a sample of
# SAMPLE_ROWS rows, read as runs of _RUN neighbours: ~0.1 s at any size, within ~1% of the
# larger figures (docs/commands/stats.md); --exact counts every row in one pass.
ESTIMATE_ABOVE = 2_000_000
SAMPLE_ROWS = 1 << 16
_RUN = 16

# Every row figure in one pass: per label and split, counts under each condition stats shows.
_PASS = """SELECT label_id, split, count(*) FILTER (WHERE status = 'ok'), count(*) FILTER (WHERE status = 'corrupt'),
    count(*) FILTER (WHERE status = 'missing'), coalesce(sum(bytes) FILTER (WHERE status = 'ok'), 0),
    coalesce(sum(bytes) FILTER (WHERE status = 'corrupt'), 0), coalesce(sum(bytes) FILTER (WHERE status = 'missing'), 0),
    count(*) FILTER (WHERE status != 'missing' AND processed = 1),
    count(*) FILTER (WHERE status != 'missing' AND processed = 0),
    count(*) FILTER (WHERE status != 'missing' AND processing_status IS NULL),
    count(*) FILTER (WHERE status != 'missing' AND processing_status = 'completed'),
    count(*) FILTER (WHERE status != 'missing' AND processing_status = 'failed'),
    count(*) FILTER (WHERE status != 'missing' AND processing_status = 'queued'),
    count(*) FILTER (WHERE status != 'missing' AND excluded = 1)
    FROM {rows} GROUP BY label_id, split"""
# A sample's rows by id, gathered first: an aggregate over a past state's view (dlindex.catalog.as_of)
# would read every row of it, where the rows alone are read by primary key.
_SAMPLED = (
    "sampled AS MATERIALIZED (SELECT * FROM image_metadata WHERE image_metadata.id IN "
    "(SELECT value FROM json_each(:ids))) "
)
_LABEL_NAMES = "SELECT id, name FROM labels"
_INDEXES = postgres_form(
    "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
    f"AND name NOT LIKE 'sqlite_%' AND name NOT IN {SCHEMA_INDEX_LIST} ORDER BY tbl_name, name",
    # the same list on PostgreSQL: indexes of the catalog's schema that back no constraint
    "SELECT i.relname, t.relname, pg_get_indexdef(i.oid) FROM pg_index x "
    "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
    "WHERE t.relnamespace = current_schema()::regnamespace "
    "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid) "
    f"AND i.relname NOT IN {SCHEMA_INDEX_LIST} "
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
    labels: int  # labels with an ok image (estimated: those the sample met, a lower bound)
    classes: int  # the catalog's class list: label_id runs from 0 to classes - 1 (dlindex.catalog.classes)
    without_class: int  # ok images directly under ROOT (or a split folder): no label, no label_id
    splits: dict[str, int]  # ok images per split folder of pre-split trees
    largest_labels: list[LabelCount]
    smallest_labels: list[LabelCount]  # empty when estimated: a sample cannot tell them
    total_bytes: int
    catalog_bytes: int  # the file (and its -wal), or the server database's size
    indexes: list[dict[str, str]]
    roots: list[dict[str, Any]]
    last_scans: list[dict[str, Any]]
    catalog_backend: str = "sqlite"  # or "postgresql" (a server catalog)
    # A root that is gone or holds none of a few of its files: moved or unmounted (one line each).
    root_problems: list[str] = field(default_factory=list)
    # The row figures (all but classes, sizes on disk, indexes, roots, scans) were scaled up
    # from a sample of sampled_rows ids, not counted: catalog_stats(exact=True) counts them.
    estimated: bool = False
    sampled_rows: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def catalog_stats(
    catalog: Catalog, top: int = 5, scans: int = 5, exact: bool | None = None, sample: int | None = None
) -> CatalogStats:
    """Totals by status, processed counts, label balance, size, indexes and recent scans.

    The row figures come from one pass over the rows, or, when ``exact`` is None and the
    catalog holds more than ``ESTIMATE_ABOVE`` rows (by its id range, read from the primary
    key), from a seeded sample of about ``sample`` (SAMPLE_ROWS) rows over the id range, scaled up
    (``estimated`` True; the same catalog gives the same estimates). ``exact=False`` always
    samples, ``exact=True`` never.
    """
    read = catalog.read  # recorded in the query log, like every read dlindex runs for a user
    lo, hi = next(iter(read(ID_SPAN)))
    span = 0 if lo is None else int(hi) - int(lo) + 1
    estimate = span > ESTIMATE_ABOVE if exact is None else not exact
    size = sample or SAMPLE_ROWS
    ids = _sample_ids(int(lo or 0), span, size) if estimate and span > size else None
    scale = span / len(ids) if ids is not None else 1.0
    sums = [0] * 13
    labels: dict[int | None, int] = {}
    splits: dict[str, int] = {}
    params = {"ids": json.dumps(ids)} if ids is not None else {}
    for label_id, split, *counts in read(
        "WITH " + _SAMPLED + _PASS.replace("{rows}", "sampled")
        if ids is not None
        else _PASS.replace("{rows}", "image_metadata"),
        params,
    ):
        sums = [a + int(b) for a, b in zip(sums, counts, strict=True)]
        ok = int(counts[0])
        if ok:
            labels[label_id] = labels.get(label_id, 0) + ok
            if split is not None:
                splits[str(split)] = splits.get(str(split), 0) + ok
    n = [round(v * scale) for v in sums]
    by_status = dict(zip(("ok", "corrupt", "missing"), n[0:3], strict=True))
    bytes_by_status = dict(zip(("ok", "corrupt", "missing"), n[3:6], strict=True))
    processing = {k: v for k, v in zip(("none", "completed", "failed", "queued"), n[8:12], strict=True) if v}
    names = dict(read(_LABEL_NAMES))
    counted = sorted(
        (LabelCount(names[k], round(v * scale)) for k, v in labels.items() if k in names),
        key=lambda c: (c.images, c.label),
    )
    return CatalogStats(
        images=sum(by_status.values()),
        by_status=by_status,
        bytes_by_status=bytes_by_status,
        processed=n[6],
        unprocessed=n[7],
        processing_status=processing,
        excluded=n[12],
        labels=sum(1 for k in labels if k is not None),
        classes=len(catalog_classes(catalog)),
        without_class=round(labels.get(None, 0) * scale),
        splits={k: round(v * scale) for k, v in sorted(splits.items(), key=lambda kv: _split_order(kv[0]))},
        largest_labels=sorted(counted, key=lambda c: (-c.images, c.label))[:top],
        smallest_labels=[] if ids is not None else counted[:top],  # a sample misses the smallest
        total_bytes=bytes_by_status["ok"] + bytes_by_status["corrupt"],
        catalog_bytes=_file_size(catalog),
        catalog_backend=catalog.backend.name,
        indexes=[{"name": n, "table": t, "sql": s} for n, t, s in read(_INDEXES)],
        roots=[dict(zip(("id", "path", "added_at"), row, strict=True)) for row in read(_ROOTS)],
        last_scans=[dict(zip(_LAST_SCANS_KEYS, row, strict=True)) for row in read(_LAST_SCANS, (scans,))],
        root_problems=unreachable_roots(read, present_rows(catalog.pinned, catalog.backend.is_server)),
        estimated=ids is not None,
        sampled_rows=len(ids) if ids is not None else 0,
    )


def _sample_ids(lo: int, span: int, size: int) -> list[int]:
    """About ``size`` ids in runs of ``_RUN`` consecutive ids, one run at a seeded place in each of
    ``size // _RUN`` equal stretches of [lo, lo + span): spread over the table, a few pages a run."""
    rng = random.Random(0)
    runs = max(1, size // _RUN)
    stretch = span / runs
    ids: list[int] = []
    for k in range(runs):
        first = lo + int(k * stretch) + rng.randrange(max(1, int(stretch) - _RUN + 1))
        ids.extend(range(first, min(first + _RUN, lo + span)))
    return ids


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
