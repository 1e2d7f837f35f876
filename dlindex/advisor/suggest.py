"""``suggest_indexes``: from the workload to verified index suggestions, on a scratch copy.

1. Weigh each read fingerprint by calls x mean duration; the heaviest (``top``, each at
   least ``min_share`` of all read time and ``MIN_WEIGHT_MS``, seen at least ``MIN_CALLS``
   times) are *hot*. Rarer statements never earn an index: one seen once may never return.
2. Derive candidates from the hot statements and merge them (``candidates``).
3. Build each candidate alone on the scratch copy (``verification.verify``): EXPLAIN QUERY PLAN must use
   it, the statements it serves are replayed with their logged parameters, a 10,000-row insert
   and update are run with and without it. Every replay is timed and its VM steps counted
   (``replay``); the decisions use the steps, which do not change from run to run: it stays
   if SQLite does at most 1/MIN_STEP_SPEEDUP of the work for the statements it serves and the
   steps it saves the logged reads exceed those it adds to the logged writes.
4. Build the survivors together with ANALYZE (what ``--apply`` does) and replay every logged
   read: an index no statement chooses is dropped, and so is any index in the plan of a read
   that got slower than on the catalog as it is or than on the copy with no secondary index
   at all (``outcome.together``). Every statement is reported before/after (``outcome.effects``).
5. Existing indexes no logged statement uses are *unused*; one whose columns lead another
   index is *redundant* (``outcome.findings``); one whose users are faster without it is *slower*;
   a full one led by a flag or status column is *low_cardinality*.
   Statements no index can help get a rewrite hint (``candidates.hints_for``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from dlindex.advisor.candidates import candidates_for, existing_serves, hints_for, low_cardinality, merge
from dlindex.advisor.model import Advice, Rejected
from dlindex.advisor.outcome import effects, findings, flag_led, slower_existing, suggestion, together
from dlindex.advisor.replay import MEMORY_LIMIT, STATEMENT_DEADLINE_S, limit_heap, stop_on_signals
from dlindex.advisor.scratch import SAMPLE_ROWS, Scratch
from dlindex.advisor.shapes import Access, Shape, TableInfo, analyze
from dlindex.advisor.verification import Bench, Verdict, verify
from dlindex.advisor.workload import Skipped, Statement, load_workload, on_server
from dlindex.catalog.sandbox import guarded
from dlindex.errors import Interrupted
from dlindex.querylog.importer import LineSource

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

MIN_SHARE = 0.01  # a fingerprint below 1% of the logged read time is not hot
MIN_WEIGHT_MS = 1.0  # nor is one that took less than a millisecond in all
MIN_CALLS = 2  # nor one seen only once: an ad-hoc statement earns no index that every write then pays for
RUNS = 5
HINT_SHARE = 0.002  # statements below 0.2% of the logged read time get no rewrite hint


def suggest_indexes(
    catalog: Catalog,
    logs: Iterable[tuple[str, LineSource]] = (),
    *,
    top: int = 10,
    min_share: float = MIN_SHARE,
    runs: int | None = None,
    sample_rows: int = SAMPLE_ROWS,
    time_limit_s: float = STATEMENT_DEADLINE_S,
    memory_limit_bytes: int | None = MEMORY_LIMIT,
    progress: Callable[[str], None] | None = None,
) -> Advice:
    """Verified index suggestions for the logged workload; the catalog is only read.

    On a server catalog (PostgreSQL) this is ``server.suggest_server_indexes``: judged with
    hypothetical indexes on the catalog, verified on the server (on temporary tables holding a
    sample of the tables over ``sample_rows``); ``memory_limit_bytes`` applies to SQLite only.

    Args:
        logs: ``(name, text or querylog.importer.file_lines(path))`` of captured SQL (as ``dlindex log import``
            reads it), never run.
        top: how many of the heaviest read fingerprints may earn an index.
        runs: timed runs per statement (median); default ``RUNS``.
        sample_rows: tables larger than this are sampled on the scratch copy.
        time_limit_s: a replayed statement is interrupted after this long and reported as skipped.
        memory_limit_bytes: SQLite's heap limit while replaying (``PRAGMA hard_heap_limit``; it
            holds for the rest of the process, as SQLite only lets it be lowered); None: no limit.
        progress: called with a short line before each step.

    Raises:
        Interrupted: Ctrl-C or SIGTERM; the scratch copy is removed, the catalog is unchanged.
    """
    if on_server(catalog):
        from dlindex.advisor.server import suggest_server_indexes

        return suggest_server_indexes(catalog, logs, top=top, min_share=min_share, runs=runs,
                                      time_limit_s=time_limit_s, sample_rows=sample_rows, progress=progress)  # fmt: skip
    say = progress or (lambda _line: None)
    started = time.perf_counter()
    restore = stop_on_signals()
    try:
        source = guarded(catalog.path)
        try:
            workload = load_workload(source, logs)
        finally:
            source.close()
        say("copying the catalog to a scratch file")
        with Scratch(catalog.path, sample_rows) as scratch:
            limit_heap(scratch.admin, memory_limit_bytes)
            bench = Bench(scratch, workload, runs or RUNS, time_limit_s, memory_limit_bytes)
            advice = _advise(bench, top, min_share, say)
    except KeyboardInterrupt:
        raise Interrupted("index advice interrupted; the catalog is unchanged and the scratch copy removed") from None
    finally:
        restore()
    return replace(advice, catalog=str(catalog.path), seconds=round(time.perf_counter() - started, 2))


def _advise(bench: Bench, top: int, min_share: float, say: Callable[[str], None]) -> Advice:
    """Steps 1 to 5 of the module docstring, on the bench's scratch copy."""
    scratch, reads = bench.scratch, bench.reads
    existing = scratch.indexes()
    say(f"planning {len(reads)} logged reads")
    plans_before = bench.plans()
    shapes = {fp: _combined_shape(r, bench.tables, lambda t, c: low_cardinality(scratch.stats, t, c))
              for fp, r in reads.items()}  # fmt: skip
    for fp, r in reads.items():
        if r.mean_ms is None and r.samples:
            _time_before(bench, fp, 3)
    weights = {fp: r.calls * (r.mean_ms if r.mean_ms is not None else bench.before[fp].ms if fp in bench.before else 0.0)
               for fp, r in reads.items()}  # fmt: skip
    total = sum(weights.values())
    ranked = sorted(reads, key=lambda fp: (-weights[fp], fp))
    supported = [fp for fp in ranked if reads[fp].calls >= MIN_CALLS]
    hot = [fp for fp in supported[:top] if weights[fp] >= max(min_share * total, MIN_WEIGHT_MS)]
    say(f"timing {len(hot)} hot statements")
    for fp in ranked[: 3 * top]:
        if fp not in bench.before and reads[fp].samples:
            _time_before(bench, fp, bench.runs if fp in hot else 3)
    timed_hot = [fp for fp in hot if fp in bench.before]
    say("checking the existing indexes the logged reads use")
    slower = slower_existing(bench, existing, plans_before)
    # --apply runs ANALYZE: a candidate is judged against the catalog with fresh statistics,
    # so what ANALYZE alone gains is not credited to an index.
    scratch.analyze()
    for fp in timed_hot:
        bench.baseline[fp] = bench.time_fp(fp) or bench.before[fp]
    candidates = merge(
        candidates_for({fp: shapes[fp].accesses for fp in timed_hot}, weights, bench.tables, scratch.stats),
        scratch.stats,
    )
    rejected: list[Rejected] = []
    verdicts: list[Verdict] = []
    # An index that exists already (one --apply made, say) is not suggested again.
    for c in (c for c in candidates if not any(existing_serves(e, c, scratch.stats) for e in existing)):
        say(f"verifying {c.sql()}")
        verdict, reason = verify(bench, c)
        if verdict is not None:
            verdicts.append(verdict)
        else:
            rejected.append(Rejected(c.sql(c.name), c.fingerprints, reason))
    say("re-planning every logged read with the suggested indexes and ANALYZE")
    verdicts, plans_after, after, more = together(bench, verdicts, plans_before)
    rejected += more
    verdicts.sort(key=lambda v: (-v.saved_steps, v.candidate.sql()))  # steps: the same order on every run
    unused, redundant = findings(existing, [v.candidate for v in verdicts], plans_before, plans_after, set(hot), reads)
    flagged = {f.name for f in slower}  # "faster without it" says more than "unused once the suggestions exist"
    served = {fp for v in verdicts for fp in v.candidate.fingerprints if fp in v.served}
    # Rewrite hints also for rarer statements that still cost something (not for a handful of ms).
    noted = [fp for fp in ranked[: 2 * top] if fp not in hot and total and weights[fp] >= HINT_SHARE * total]
    hints = hints_for(hot, noted, shapes, reads, weights, plans_after, served, rejected,
                      {c.name: c for c in candidates}, scratch.stats, bench.tables)  # fmt: skip
    skipped = bench.workload.skipped + tuple(
        Skipped("replay", None, f"{reason}; not timed, the advice goes on without it", _short(reads[fp].sql))
        for fp, reason in sorted(bench.refused.items())
    )  # fmt: skip
    return Advice(
        catalog="", suggestions=tuple(suggestion(bench, v, after, plans_after) for v in verdicts),
        unused=tuple(f for f in unused if f.name not in flagged),
        redundant=tuple(f for f in redundant if f.name not in flagged),
        hints=tuple(hints), rejected=tuple(rejected), skipped=skipped,
        reads=len(reads), writes=len(bench.workload.writes), hot=tuple(hot), read_ms=round(total, 3),
        sample=scratch.sample, sampled_from=scratch.rows, seconds=0.0, lock_wait_ms=round(bench.workload.lock_wait_ms, 3),
        slower=tuple(slower), statements=tuple(effects(bench, verdicts, plans_before, plans_after, after)),
        low_cardinality=tuple(flag_led(existing, scratch.stats)),
    )  # fmt: skip


def _time_before(bench: Bench, fp: str, runs: int) -> None:
    """Time read ``fp`` on the catalog as it is (before anything is analyzed or built)."""
    measured = bench.time_fp(fp, runs)
    if measured is not None:
        bench.before[fp] = measured


def _combined_shape(
    r: Statement, tables: Mapping[str, TableInfo], low: Callable[[str, str], bool] = lambda _t, _c: False
) -> Shape:
    """The shape of a fingerprint: a literal that differs between its statements is a value, not a constant,
    except on a flag or status column (``low``): there the most called statement's literal stays a constant.

    ``status = 'corrupt'`` and ``status = 'missing'`` are one fingerprint; as a value, status would
    lead an index that SQLite then also reads for the common value (``status = 'ok'``, most rows),
    making those reads slower. Kept, it gives the partial index for the list most often asked for.

    A read that dlindex runs in another form where an index serves it (``Statement.seek``)
    is shaped as that form: that is the statement an index is wanted for.
    """
    texts = tuple(dict.fromkeys(s.sql for s in r.seek)) or r.variants or (r.sql,)
    shapes = [analyze(text, tables) for text in texts]
    first = shapes[0]
    if len(shapes) == 1 or any(len(s.accesses) != len(first.accesses) for s in shapes):
        return first
    accesses: list[Access] = []
    for i, access in enumerate(first.accesses):
        common = set(access.constants)
        for s in shapes[1:]:
            common &= set(s.accesses[i].constants)
        common |= {c for c in access.constants if low(access.table, c.column)}
        varying = tuple(dict.fromkeys(c.column for c in access.constants if c not in common))
        accesses.append(replace(access, constants=tuple(c for c in access.constants if c in common),
                                equal=tuple(dict.fromkeys(access.equal + varying))))  # fmt: skip
    return Shape(tuple(accesses), first.notes)


def _short(sql: str, width: int = 120) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= width else text[: width - 1] + "…"
