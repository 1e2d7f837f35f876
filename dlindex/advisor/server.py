"""``suggest_server_indexes``: index advice for a PostgreSQL catalog, from the planner's statistics, verified on a sample.

1. Workload: dlindex's query log joined with pg_stat_statements (``server_workload``); the
   heaviest reads (``top``, each at least 1% of the read time, seen at least twice) are *hot*.
2. Candidates from the hot statements, as on SQLite (``candidates``: equality, range, order,
   partial WHEREs for flags, covering columns as ``INCLUDE``), merged. A logged per-label
   window is shaped as the seek dlindex runs once an index serves it (``Statement.seek``).
3. Each candidate alone as a hypothetical index (hypopg), on the catalog with its own
   statistics (EXPLAIN only, nothing run): the planner must choose it (for a per-label read:
   every arc of its SERVER_SEEK read from the index) and the planned cost of the statements it
   serves must drop to at most 1/MIN_GAIN.
4. Verified on a sample (``server_sample``: every k-th row of tables over SAMPLE_ROWS rows, as
   temporary tables; the catalog itself when all are smaller): every logged read timed
   (EXPLAIN ANALYZE, BUFFERS), the winners built for real in one transaction, every read timed
   again, the transaction rolled back. An index no plan uses, one whose statements do not touch
   at most 1/MIN_GAIN of the buffers, and one in the plan of a read that got slower, is
   dropped; repeated until the set holds.
5. Existing indexes the server never scanned are *unused*.

Nothing but dlindex's own candidates is ever built: the comparison with Dexter's rule is a
benchmark (bench/bench_index_postgres.py, bench/dexter.py), not part of the advice.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from dlindex.advisor.candidates import Candidate, candidates_for, existing_serves, merge
from dlindex.advisor.manage import PREFIX
from dlindex.advisor.model import Advice, Effect, Finding, Rejected, Served, Suggestion
from dlindex.advisor.server_plans import (
    Hypothetical,
    Plan,
    ServerStatistics,
    Timed,
    built,
    explain,
    indexes,
    read_only,
    tables,
    time_run,
)
from dlindex.advisor.server_sample import SAMPLE_ROWS, ServerSample
from dlindex.advisor.server_workload import Run, ServerStatement, check_statistics, ensure_hypopg, load_server_workload
from dlindex.advisor.shapes import Access, analyze
from dlindex.advisor.sqltext import quote_identifier
from dlindex.advisor.workload import Skipped
from dlindex.catalog.backend import SQL_ERRORS
from dlindex.catalog.sqlite.history_schema import SCHEMA_INDEX_LIST
from dlindex.errors import InputError
from dlindex.querylog.importer import LineSource

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.catalog.postgres.connect import PgConnection

MIN_GAIN = 1.15  # planned cost, then buffers, of the statements an index serves: at most 1/1.15
MIN_SHARE = 0.01
MIN_WEIGHT_MS = 1.0
MIN_CALLS = 2  # as on SQLite: a statement seen once earns no index
RUNS = 5
SLOWER = (1.25, 0.1)  # a read is slower with more buffers and a time past 1.25x + 0.1 ms
_UNUSED = f"""SELECT s.indexrelname, s.relname, pg_get_indexdef(s.indexrelid), s.idx_scan,
        EXISTS (SELECT 1 FROM pg_constraint WHERE conindid = s.indexrelid) OR s.indexrelname IN {SCHEMA_INDEX_LIST}
    FROM pg_stat_user_indexes s WHERE s.schemaname = current_schema() ORDER BY s.relname, s.indexrelname"""
_SIZE = "SELECT pg_relation_size(to_regclass(%s))"


def index_sql(c: Candidate) -> tuple[str, str]:
    """(name, CREATE INDEX) of a candidate on PostgreSQL: covering columns as INCLUDE, a name under 64 bytes."""
    key = ", ".join(quote_identifier(k) for k in c.key)
    include = f" INCLUDE ({', '.join(quote_identifier(k) for k in c.include)})" if c.include else ""
    where = c.where_sql()
    tail = f" ({key}){include}" + (f" WHERE {where}" if where else "")
    digest = hashlib.sha1(f"{c.table}{tail}".encode()).hexdigest()[:8]
    name = PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", "_".join([c.table, *c.key[:3]]))[:40] + "_" + digest
    return name, f"CREATE INDEX {quote_identifier(name)} ON {quote_identifier(c.table)}{tail}"


def suggest_server_indexes(
    catalog: Catalog,
    logs: Iterable[tuple[str, LineSource]] = (),
    *,
    top: int = 10,
    min_share: float = MIN_SHARE,
    runs: int | None = None,
    time_limit_s: float = 10.0,
    sample_rows: int = SAMPLE_ROWS,
    progress: Callable[[str], None] | None = None,
) -> Advice:
    """Index advice for a server catalog; nothing is created but the hypopg extension, if missing
    (and, for the session's time, the temporary tables of the sample)."""
    say = progress or (lambda _line: None)
    runs = runs or RUNS
    started = time.perf_counter()
    conn = cast("PgConnection", catalog.conn)
    database, major = check_statistics(conn)
    work = load_server_workload(conn, logs)
    if not work.reads:
        raise InputError(
            f"no workload yet: neither dlindex's query log nor pg_stat_statements holds a read of database "
            f"{database}; run the workload (dlindex query, Catalog.read) first, or pass --log FILE"
        )
    ensure_hypopg(conn, major)
    infos, existing, stats = tables(conn), indexes(conn), ServerStatistics(conn)
    # read before timing anything: the advisor's own runs must not make an index look used
    scanned = conn.execute_raw(_UNUSED).fetchall()
    hypo = Hypothetical(conn)
    reads, skipped = work.reads, list(work.skipped)
    say(f"planning {len(reads)} logged reads")
    plans: dict[str, Plan] = {}
    for fp, s in reads.items():
        if s.runs:
            try:
                plans[fp] = explain(conn, s.runs[0])
            except SQL_ERRORS as e:
                skipped.append(Skipped("replay", None, f"cannot be planned ({e})", _short(s.statement.sql)))
    weights = {fp: s.statement.calls * (s.statement.mean_ms or 0.0) for fp, s in reads.items()}
    total = sum(weights.values())
    ranked = sorted(reads, key=lambda fp: (-weights[fp], fp))
    supported = [fp for fp in ranked if fp in plans and reads[fp].statement.calls >= MIN_CALLS]
    hot = [fp for fp in supported[:top] if weights[fp] >= max(min_share * total, MIN_WEIGHT_MS)]
    timed = [fp for fp in ranked if fp in plans]
    accesses = {fp: analyze(_shaped(reads[fp]), infos).accesses for fp in hot}
    candidates = merge(candidates_for(accesses, weights, infos, stats), stats)
    candidates = [c for c in candidates if not any(existing_serves(e, c, stats) for e in existing)]
    rejected: list[Rejected] = []
    winners: list[Candidate] = []
    current = dict(plans)  # plans with the hypothetical winners so far: each candidate must add to them
    hypo.reset()
    try:
        for c in candidates:
            _name, sql = index_sql(c)
            say(f"planning with hypothetical {sql}")
            reason = _hypothetical(hypo, c, sql, reads, current)
            if reason is None:
                winners.append(c)
            else:
                rejected.append(Rejected(sql, c.fingerprints, reason))
    finally:
        hypo.reset()
    sample = ServerSample(conn, infos, sample_rows)
    try:
        sample.make(run.sql for fp in timed for run in (*reads[fp].runs[:1], *reads[fp].seek[:1]))
        if sample.sample > 1:
            say(f"verifying on a sample: every {sample.sample}th row of {', '.join(sample.tables)} (temporary tables)")
        say(f"timing {len(timed)} reads on the server")
        before = _time_all(conn, reads, timed, runs, time_limit_s, skipped, sample=sample)
        say("building the winners in a transaction that is rolled back, timing every logged read")
        winners, after, sizes, note = _verify(conn, catalog.wait_s, winners, reads, timed, before, runs, time_limit_s,
                                              rejected, sample)  # fmt: skip
    finally:
        sample.drop()
    if sample.sample > 1:
        note += f"; on a sample: every {sample.sample}th row of {', '.join(sample.tables)}, times are the sample's"
    suggestions = tuple(_suggestion(c, reads, before, after, sizes) for c in winners)
    served = {fp for c in winners for fp in c.fingerprints}

    def workload_ms(after_set: Mapping[str, Timed]) -> float | None:
        if not after_set and after_set is not before:
            return None
        return round(sum(reads[fp].statement.calls * (after_set.get(fp) or before[fp]).ms for fp in before), 3)

    server = {
        "database": database,
        "workload": {"log": sum(1 for s in (*reads.values(), *work.writes.values()) if s.source != "pg_stat_statements"),
                     "pg_stat_statements": sum(1 for s in (*reads.values(), *work.writes.values()) if s.source != "log"),
                     "joined": work.joined},
        "verified": note,
        "workload_ms": {"before": workload_ms(before), "dlindex": workload_ms(after) if winners else workload_ms(before)},
    }  # fmt: skip
    statements = tuple(
        Effect(fp, "read", reads[fp].statement.sql, reads[fp].statement.calls,
               round(before[fp].ms, 3) if fp in before else None,
               round(after[fp].ms, 3) if fp in after else None, _change(fp, before, after, served))
        for fp in ranked
    ) + tuple(Effect(fp, "write", s.statement.sql, s.statement.calls, None, None, "not timed on PostgreSQL")
              for fp, s in sorted(work.writes.items()))  # fmt: skip
    return Advice(
        catalog=str(catalog.path), suggestions=suggestions, unused=tuple(_unused(scanned, {s.name for s in suggestions})),
        redundant=(), hints=(), rejected=tuple(rejected), skipped=tuple(skipped), reads=len(reads),
        writes=len(work.writes), hot=tuple(hot), read_ms=round(total, 3), sample=sample.sample,
        sampled_from=sample.rows if sample.sample > 1 else 0,
        seconds=round(time.perf_counter() - started, 2), statements=statements, server=server,
    )  # fmt: skip


def _hypothetical(hypo: Hypothetical, c: Candidate, sql: str, reads: Mapping[str, ServerStatement],
                  current: dict[str, Plan]) -> str | None:  # fmt: skip
    """None when the planner chooses ``c`` and its statements' cost drops enough (it then stays, and
    ``current`` holds the new plans); else why not (it is dropped again)."""
    oid, name = hypo.create(sql)
    cost_before = cost_after = 0.0
    new: dict[str, Plan] = {}
    for fp in c.fingerprints:
        if fp not in current:
            continue
        seek = reads[fp].seek
        plan = explain(hypo.conn, seek[0] if seek else reads[fp].runs[0])
        calls = reads[fp].statement.calls
        cost_before += calls * current[fp].cost
        if name in plan.indexes and (plan.seek_served or not seek):
            new[fp] = plan
        cost_after += calls * (plan.cost if name in plan.indexes else current[fp].cost)
    reason = None
    if not new:
        reason = "the planner does not choose it (hypothetical index)"
    elif cost_after * MIN_GAIN > cost_before:
        reason = f"planned cost {cost_before:,.0f} -> {cost_after:,.0f}: less than {MIN_GAIN}x cheaper"
    if reason is not None:
        hypo.drop(oid)
    else:
        current.update(new)
    return reason


def _time_all(conn: PgConnection, reads: Mapping[str, ServerStatement], fps: Sequence[str], runs: int,
              time_limit_s: float, skipped: list[Skipped], *, transaction: bool = True,
              sample: ServerSample | None = None) -> dict[str, Timed]:  # fmt: skip
    """Each read timed on the server with its first logged parameter set (median of ``runs``);
    on ``sample``'s tables, as ``ServerSample.scaled`` says."""
    scaled = sample.scaled if sample is not None else (lambda run: run)
    out: dict[str, Timed] = {}
    for fp in fps:
        try:
            if transaction:
                with read_only(conn, time_limit_s):
                    out[fp] = time_run(conn, scaled(_run_of(conn, reads[fp])), runs)
            else:
                conn.execute_raw("SAVEPOINT dlindex_timed")
                out[fp] = time_run(conn, scaled(_run_of(conn, reads[fp])), runs)
                conn.execute_raw("RELEASE SAVEPOINT dlindex_timed")
        except SQL_ERRORS as e:
            if not transaction:
                conn.execute_raw("ROLLBACK TO SAVEPOINT dlindex_timed")
            skipped.append(Skipped("replay", None, f"not timed ({e}); the advice goes on without it",
                                   _short(reads[fp].statement.sql)))  # fmt: skip
    return out


def _shaped(s: ServerStatement) -> str:
    """The text candidates are drawn from: a per-label read's seek (in SQLite's words, as the file
    catalog's advice shapes it), else the statement."""
    return s.statement.seek[0].sql if s.seek and s.statement.seek else s.statement.sql


def _run_of(conn: PgConnection, s: ServerStatement) -> Run:
    """What dlindex runs for ``s`` with the indexes as they are now: its seek where the plan
    reads every arc from an index (as ``dlindex query`` decides), else the logged statement."""
    if s.seek and explain(conn, s.seek[0]).seek_served:
        return s.seek[0]
    return s.runs[0]


def _verify(conn: PgConnection, wait_s: float, winners: list[Candidate], reads: Mapping[str, ServerStatement],
            fps: Sequence[str], before: Mapping[str, Timed], runs: int, time_limit_s: float,
            rejected: list[Rejected], sample: ServerSample) -> tuple[list[Candidate], dict[str, Timed], dict[str, int], str]:  # fmt: skip
    """The winners built together for real and every read timed, until no index is dropped."""
    after: dict[str, Timed] = {}
    sizes: dict[str, int] = {}
    while winners:
        ddl = {index_sql(c)[0]: (c, index_sql(c)[1]) for c in winners}
        with built(conn, [sql for _c, sql in ddl.values()], list(ddl), time_limit_s, wait_s) as visible:
            if not visible:
                return winners, {}, {}, ("planner cost only: PostgreSQL hides an index from the transaction that "
                                         "built it while recently updated rows need it (VACUUM the table first)")  # fmt: skip
            after = _time_all(conn, reads, [fp for fp in fps if fp in before], runs, time_limit_s, [],
                              transaction=False, sample=sample)  # fmt: skip
            for name in ddl:
                row = conn.execute_raw(_SIZE, (name,)).fetchone()
                sizes[name] = int(row[0]) if row and row[0] is not None else 0
        used = {n for t in after.values() for n in t.indexes}
        slower = {fp for fp, t in after.items() if t.buffers > before[fp].buffers
                  and t.ms > before[fp].ms * SLOWER[0] + SLOWER[1]}  # fmt: skip
        keep: list[Candidate] = []
        for name, (c, sql) in ddl.items():
            served = [fp for fp in c.fingerprints if fp in after and fp in before]
            work_before = sum(reads[fp].statement.calls * before[fp].buffers for fp in served)
            work_after = sum(reads[fp].statement.calls * after[fp].buffers for fp in served)
            if name not in used:
                rejected.append(Rejected(sql, c.fingerprints, "built, no logged read's plan uses it"))
            elif any(name in after[fp].indexes for fp in slower):
                rejected.append(Rejected(sql, c.fingerprints, "a logged read that uses it got slower"))
            elif served and work_after * MIN_GAIN > work_before:
                rejected.append(Rejected(sql, c.fingerprints, f"buffers {work_before:,} -> {work_after:,}: less "
                                         f"than {MIN_GAIN}x less work for the statements it serves"))  # fmt: skip
            else:
                keep.append(c)
        if len(keep) == len(winners):
            return winners, after, sizes, "timed on the server: built in a transaction, rolled back"
        winners = keep
    return [], {}, {}, "nothing to verify"


def _suggestion(c: Candidate, reads: Mapping[str, ServerStatement], before: Mapping[str, Timed],
                after: Mapping[str, Timed], sizes: Mapping[str, int]) -> Suggestion:  # fmt: skip
    name, sql = index_sql(c)
    served = tuple(
        Served(fp, reads[fp].statement.sql, reads[fp].statement.calls, round(before[fp].ms, 3),
               round(after[fp].ms, 3))
        for fp in c.fingerprints if fp in before and fp in after and name in after[fp].indexes
    )  # fmt: skip
    calls = sum(s.calls for s in served) or 1
    b = sum(s.calls * s.before_ms for s in served) / calls
    a = sum(s.calls * s.after_ms for s in served) / calls
    return Suggestion(
        name=name, table=c.table, sql=sql, columns=c.columns, where=c.where_sql(), covering=bool(c.include),
        served=served, before_ms=round(b, 3), after_ms=round(a, 3),
        saved_ms=round(sum(s.calls * (s.before_ms - s.after_ms) for s in served), 3), size_bytes=sizes.get(name, 0),
        insert_10k_ms=None, update_10k_ms=None, update_columns=(), write_cost_ms=0.0,
    )  # fmt: skip


def _change(fp: str, before: Mapping[str, Timed], after: Mapping[str, Timed], served: set[str]) -> str:
    if fp not in before:
        return "not timed"
    if fp not in after:
        return "unchanged" if fp not in served else "not timed"
    b, a = before[fp], after[fp]
    if a.indexes == b.indexes:
        return "same plan"
    if a.ms * 1.1 < b.ms:
        return "faster"
    return "slower" if a.ms > b.ms * SLOWER[0] + SLOWER[1] else "about the same"


def _unused(scanned: Sequence[Sequence[Any]], suggested: set[str]) -> list[Finding]:
    """Indexes the server had not scanned (``_UNUSED``'s rows, read before the advisor ran anything), constraints aside."""
    out = []
    for name, table, sql, scans, constraint in scanned:
        if constraint or scans or name in suggested:
            continue
        ours = str(name).startswith(PREFIX)
        out.append(Finding("unused", str(name), str(table), str(sql), "idx_scan = 0: the server has not used it "
                           "since its statistics were reset", None, ours, ours, f"DROP INDEX {quote_identifier(name)}"))  # fmt: skip
    return out


def _short(sql: str, width: int = 120) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def accesses_of(sql: str, conn: PgConnection) -> tuple[Access, ...]:
    """What ``sql`` asks of each table of the server catalog (for tests and the benchmark)."""
    return analyze(sql, tables(conn)).accesses
