"""The query log: what dlindex read and wrote, how long it took, and how SQLite planned it.

Every read that dlindex runs for a user (query, sampling, stats) and every write statement
shape (scan upserts, mark updates) is recorded in ``query_log``; ``dlindex index`` later
reads it as evidence. Recording is cheap: an entry is a tuple appended to a buffer, the
plan is explained once per template per process, and the buffer is written in one
statement per flush (with the next write transaction, after 1,000 entries or 5 s, and when
the catalog is closed). Reading, importing and clearing the log is ``logview``.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dlindex.catalog.backend import (
    CLOSED_ERRORS,
    INTEGRITY_ERRORS,
    OPERATIONAL_ERRORS,
    SQL_ERRORS,
    Connection,
    ReadConnection,
)
from dlindex.catalog.fingerprint import fingerprint, table_of
from dlindex.errors import CatalogConnectionLost, DamagedCatalogError, DlindexWarning

if TYPE_CHECKING:
    import random
    from contextlib import AbstractContextManager


_INSERT_ENTRY = """INSERT INTO query_log (kind, source, sql, fingerprint, table_name, calls, rows,
        duration_ms, plan, cached) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
_TEMPLATE = "SELECT offered, sample_params FROM query_log_templates WHERE sql = ?"
# Time spent waiting for the write lock (BEGIN IMMEDIATE), one row per flush: `dlindex stats --slow`.
LOCK_WAIT_SQL = "BEGIN IMMEDIATE"
LOCK_WAIT_MIN_S = 0.001
_INSERT_LOCK_WAIT = """INSERT INTO query_log (kind, source, sql, fingerprint, calls, rows, duration_ms, lock_wait_ms)
    VALUES ('write', 'dlindex', :sql, :fingerprint, :calls, 0, :ms, :ms)"""
_UPSERT_TEMPLATE = """INSERT INTO query_log_templates (sql, fingerprint, plan_detail, offered, sample_params)
    VALUES (:sql, :fingerprint, :plan_detail, :offered, :sample_params)
    ON CONFLICT (sql) DO UPDATE SET plan_detail = coalesce(excluded.plan_detail, query_log_templates.plan_detail),
        offered = excluded.offered, sample_params = excluded.sample_params"""
FLUSH_ENTRIES = 1000
FLUSH_SECONDS = 5.0
RESERVOIR_SIZE = 8  # sample parameter sets kept per template
_MAX_PARAMS_CHARS = 4096  # a parameter set larger than this is not worth keeping as a sample


class QueryLog:
    """An in-memory buffer of log entries for one catalog connection."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.entries: list[tuple[Any, ...]] = []  # query_log rows, ready for executemany
        self.samples: dict[str, list[Any]] = {}  # sql -> [offered since flush, reservoir...]
        self.names: dict[str, tuple[str, str | None]] = {}  # sql -> (fingerprint, table), memoised
        self.writes: dict[str, list[float]] = {}  # sql -> [calls, rows, seconds] in this transaction
        self.pending_writes: dict[str, list[float]] = {}  # committed, not yet flushed
        self.lock_waits = [0, 0.0]  # write transactions, seconds spent in BEGIN IMMEDIATE
        self.plans: dict[str, tuple[str, str]] = {}  # sql -> (plan, plan_detail), once per process
        self._rng: random.Random | None = None
        self.last_flush = time.monotonic()

    def record_read(
        self,
        conn: Connection,
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
            self.samples[sql] = [1, params] if params else [1]
        else:
            sample[0] += 1
            if not params:
                return  # a statement without parameters: nothing to sample
            if len(sample) <= RESERVOIR_SIZE:
                sample.append(params)
            else:
                slot = self.rng.randrange(sample[0])
                if slot < RESERVOIR_SIZE:
                    sample[1 + slot] = params

    @property
    def rng(self) -> random.Random:
        if self._rng is None:
            import random

            self._rng = random.Random(0)  # deterministic: tests and reruns agree
        return self._rng

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

    def record_lock_wait(self, seconds: float) -> None:
        """Count a write transaction that waited for the write lock (over 1 ms: an uncontended BEGIN takes µs)."""
        if seconds >= LOCK_WAIT_MIN_S:
            self.lock_waits[0] += 1
            self.lock_waits[1] += seconds

    def discard_writes(self) -> None:
        self.writes.clear()

    def due(self) -> bool:
        size = len(self.entries) + len(self.pending_writes)
        return size >= FLUSH_ENTRIES or bool(size and time.monotonic() - self.last_flush > FLUSH_SECONDS)

    def has_entries(self) -> bool:
        return bool(self.entries or self.pending_writes or self.lock_waits[0])

    def flush_into(self, conn: Connection) -> None:
        """Write the buffer with ``conn``, which must be inside a write transaction."""
        entries = list(self.entries)
        for sql, (calls, rows, seconds) in self.pending_writes.items():
            fp, table = self._names(sql)
            entries.append(("write", "dlindex", sql, fp, table, int(calls), int(rows), seconds * 1000.0, None, 0))
        if entries:
            conn.executemany(_INSERT_ENTRY, entries)
        if self.lock_waits[0]:
            conn.execute(_INSERT_LOCK_WAIT, {"sql": LOCK_WAIT_SQL, "fingerprint": fingerprint(LOCK_WAIT_SQL),
                                             "calls": self.lock_waits[0], "ms": self.lock_waits[1] * 1000.0})  # fmt: skip
        for sql, (offered, *sample) in self.samples.items():
            _merge_samples(
                conn, sql, self._names(sql)[0], self.plans.get(sql, ("", None))[1], offered, sample, self.rng
            )

    def flushed(self) -> None:
        self.entries = []
        self.samples = {}
        self.pending_writes = {}
        self.lock_waits = [0, 0.0]
        self.last_flush = time.monotonic()


def _merge_samples(
    conn: Connection,
    sql: str,
    fp: str,
    plan_detail: str | None,
    offered: int,
    sample: list[Any],
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


def explain_plan(conn: ReadConnection, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> tuple[str, str]:
    """(summary, detail) of ``EXPLAIN QUERY PLAN``: summary is scan, index or none."""
    try:
        lines = [str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    except SQL_ERRORS:
        return "none", ""
    return classify_plan(lines), "\n".join(lines)


def classify_plan(lines: Iterable[str]) -> str:
    """'scan' if any table is read in full, else 'index' if one is searched, else 'none'."""
    subqueries: set[str] = set()
    scanned = searched = False
    for line in lines:
        words = line.split()
        # PostgreSQL's plan lines (a server catalog): "Seq Scan on t", "Index Scan using i on t"
        if line.startswith(("Seq Scan on ", "Parallel Seq Scan on ")):
            scanned = True
            continue
        if line.startswith(("Index Scan", "Index Only Scan", "Bitmap Index Scan", "Parallel Index")):
            searched = True
            continue
        if len(words) >= 2 and words[0] in ("MATERIALIZE", "CO-ROUTINE"):
            subqueries.add(words[1])
        elif len(words) >= 2 and words[0] == "SCAN":
            # a constant row (SELECT without FROM, VALUES) reads no table
            if (
                "VIRTUAL TABLE" in line
                or words[1] in subqueries
                or words[1].startswith("(")
                or line.strip() == "SCAN CONSTANT ROW"
            ):
                continue
            if "INDEX" in line:
                searched = True  # a full pass over a (covering) index still uses one
            else:
                scanned = True
        elif words and words[0] == "SEARCH" and "USING" in line:
            searched = True
    return "scan" if scanned else "index" if searched else "none"


class _Logging(Protocol):
    """What the flush uses of a dlindex.catalog.connection.Catalog (which imports this module)."""

    querylog: QueryLog

    def busy_timeout(self, timeout_ms: int | None) -> AbstractContextManager[None]: ...
    def write_transaction(self, *, bookkeeping: bool = False) -> AbstractContextManager[Connection]: ...


def flush_catalog_log(catalog: _Logging, timeout_ms: int | None) -> None:
    """``Catalog.flush_log``: the buffered entries in one bookkeeping transaction; a busy,
    read-only or closed catalog never fails the user's work over its log."""
    log = catalog.querylog
    if not log.enabled or not log.has_entries():
        return
    try:
        with catalog.busy_timeout(timeout_ms), catalog.write_transaction(bookkeeping=True) as conn:
            log.flush_into(conn)
        log.flushed()
    except OPERATIONAL_ERRORS:
        # Busy or read-only: the log is evidence, not data. A mid-run flush keeps its entries
        # for the next try, up to a bound.
        if timeout_ms is None or len(log.entries) > 10 * FLUSH_ENTRIES:
            log.flushed()
    except (*CLOSED_ERRORS, CatalogConnectionLost):  # type: ignore[misc]
        log.flushed()  # the connection is already closed (by the server: the next command says so)
    except (*INTEGRITY_ERRORS, DamagedCatalogError) as e:  # type: ignore[misc]
        # dlindex writes only entries its own schema accepts: this schema's text was damaged.
        # The user's work is committed already; say so once rather than fail it.
        log.flushed()
        warnings.warn(
            f"the query log was not written: the catalog's schema refused it ({e}); run dlindex check",
            DlindexWarning, stacklevel=4,
        )  # fmt: skip
