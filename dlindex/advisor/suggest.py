"""``suggest_indexes``: from the workload to verified index suggestions, on a scratch copy.

1. Weigh each read fingerprint by calls x mean duration; the heaviest (``top``, each at
   least ``min_share`` of all read time) are *hot*. Rarer statements never earn an index.
2. Derive candidates from the hot statements and merge them (``candidates``).
3. Build each candidate alone on the scratch copy: EXPLAIN QUERY PLAN must use it, the
   statements it serves are timed with their logged parameters (median of several runs),
   and a 10,000-row insert and update are timed with and without it. It stays if the time
   it saves over the logged workload exceeds the time it adds to the logged writes, and the
   statements it serves get at least ``MIN_SPEEDUP`` faster.
4. Build the survivors together with ANALYZE (what ``--apply`` does), re-plan every logged
   read: an index no statement chooses is dropped, and so is one that makes a logged
   statement slower by more than it saves.
5. Existing indexes no logged statement uses are *unused*; one whose columns lead another
   index is *redundant*. Statements no index can help get a rewrite hint.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .candidates import Candidate, candidates_for, existing_serves, merge
from .hints import hints_for
from .model import Advice, Finding, Rejected, Served, Suggestion
from .scratch import SAMPLE_ROWS, WRITE_ROWS, IndexDef, Scratch, explain, guarded, index_names, time_read
from .shapes import Access, Shape, TableInfo, analyze, where_as_select
from .workload import Statement, Workload, load_workload

if TYPE_CHECKING:
    from ..catalog import Catalog

MIN_SHARE = 0.01  # a fingerprint below 1% of the logged read time is not hot
MIN_WEIGHT_MS = 1.0  # nor is one that took less than a millisecond in all
MIN_SPEEDUP = 1.1  # the statements an index serves must get at least this much faster
RUNS = 5
HINT_SHARE = 0.002  # statements below 0.2% of the logged read time get no rewrite hint
REGRESSION = 1.25  # after > before x this (+ 0.1 ms) is a slower statement


def suggest_indexes(
    catalog: Catalog,
    logs: Iterable[tuple[str, str]] = (),
    *,
    top: int = 10,
    min_share: float = MIN_SHARE,
    runs: int | None = None,
    sample_rows: int = SAMPLE_ROWS,
    progress: Callable[[str], None] | None = None,
) -> Advice:
    """Verified index suggestions for the logged workload; the catalog is only read.

    Args:
        logs: ``(name, text)`` of captured SQL (as ``dlindex log import`` reads it), never run.
        top: how many of the heaviest read fingerprints may earn an index.
        runs: timed runs per statement (median); default ``RUNS``.
        sample_rows: tables larger than this are sampled on the scratch copy.
        progress: called with a short line before each step.
    """
    say = progress or (lambda _line: None)
    started = time.perf_counter()
    source = guarded(catalog.path)
    try:
        workload = load_workload(source, logs)
    finally:
        source.close()
    say("copying the catalog to a scratch file")
    with Scratch(catalog.path, sample_rows) as scratch:
        advice = _Advisor(scratch, workload, top, min_share, runs or RUNS, say).run()
    return replace(advice, catalog=str(catalog.path), seconds=round(time.perf_counter() - started, 2))


@dataclass
class _Verdict:
    candidate: Candidate
    served: dict[str, tuple[float, float]]  # fp -> (before, after) ms
    saved_ms: float
    write_ms: float
    size: int
    insert_ms: float | None
    update_ms: float | None
    update_columns: tuple[str, ...]


class _Advisor:
    def __init__(self, scratch: Scratch, workload: Workload, top: int, min_share: float, runs: int,
                 say: Callable[[str], None]) -> None:  # fmt: skip
        self.scratch = scratch
        self.workload = workload
        self.top, self.min_share, self.runs, self.say = top, min_share, runs, say
        self.tables = scratch.tables()
        self.reads = {r.fingerprint: r for r in workload.reads}
        self.before: dict[str, float] = {}  # ms per call on the catalog as it is
        self.baseline: dict[str, float] = {}  # ... after ANALYZE, what candidates are compared with

    # --- measuring statements ---------------------------------------------------------------

    def plan(self, r: Statement) -> tuple[str, ...]:
        sample = r.samples[0] if r.samples else None
        lines = explain(self.scratch.planner, sample.sql, sample.params) if sample else explain(self.scratch.planner, r.sql)
        return lines or ()

    def time(self, r: Statement, runs: int) -> float | None:
        times = [t for s in r.samples if (t := time_read(self.scratch.reader, s.sql, s.params, runs)) is not None]
        return statistics.mean(times) if times else None

    def plans(self) -> dict[str, tuple[str, ...]]:
        found = {fp: self.plan(r) for fp, r in self.reads.items()}
        for w in self.workload.writes:
            select = where_as_select(w.sql)
            if select is not None:
                found["write:" + w.fingerprint] = explain(self.scratch.planner, select) or ()
        return found

    # --- the steps ----------------------------------------------------------------------------

    def run(self) -> Advice:
        existing = self.scratch.indexes()
        self.say(f"planning {len(self.reads)} logged reads")
        plans_before = self.plans()
        shapes = {fp: _combined_shape(r, self.tables) for fp, r in self.reads.items()}
        for fp, r in self.reads.items():
            if r.mean_ms is None and r.samples:
                measured = self.time(r, 3)
                if measured is not None:
                    self.before[fp] = measured
        weights = {fp: r.calls * (r.mean_ms if r.mean_ms is not None else self.before.get(fp, 0.0)) for fp, r in self.reads.items()}
        total = sum(weights.values())
        ranked = sorted(self.reads, key=lambda fp: (-weights[fp], fp))
        hot = [fp for fp in ranked[: self.top] if weights[fp] >= max(self.min_share * total, MIN_WEIGHT_MS)]
        self.say(f"timing {len(hot)} hot statements")
        for fp in ranked[: 3 * self.top]:
            if fp not in self.before and self.reads[fp].samples:
                measured = self.time(self.reads[fp], self.runs if fp in hot else 3)
                if measured is not None:
                    self.before[fp] = measured
        timed_hot = [fp for fp in hot if fp in self.before]
        # --apply runs ANALYZE: a candidate is judged against the catalog with fresh statistics,
        # so what ANALYZE alone gains is not credited to an index.
        self.scratch.analyze()
        for fp in timed_hot:
            self.baseline[fp] = self.time(self.reads[fp], self.runs) or self.before[fp]
        candidates = merge(candidates_for({fp: shapes[fp].accesses for fp in timed_hot}, weights, self.tables, self.scratch), self.scratch)
        rejected: list[Rejected] = []
        # An index that exists already (one --apply made, say) is not suggested again.
        to_test = [c for c in candidates if not any(existing_serves(e, c) for e in existing)]
        verdicts: list[_Verdict] = []
        for c in to_test:
            self.say(f"verifying {c.sql()}")
            verdict, reason = self.verify(c)
            if verdict is not None:
                verdicts.append(verdict)
            else:
                rejected.append(Rejected(c.sql(c.name), c.fingerprints, reason))
        self.say("re-planning every logged read with the suggested indexes and ANALYZE")
        verdicts, plans_after, after, more = self.finalize(verdicts, plans_before)
        rejected += more
        suggestions = [self.suggestion(v, after, plans_after) for v in verdicts]
        unused, redundant = _findings(existing, [v.candidate for v in verdicts], plans_before, plans_after, set(hot), self.reads)
        served = {fp for v in verdicts for fp in v.candidate.fingerprints if fp in v.served}
        # Rewrite hints also for rarer statements that still cost something (not for a handful of ms).
        noted = [fp for fp in ranked[: 2 * self.top] if fp not in hot and total and weights[fp] >= HINT_SHARE * total]
        hints = hints_for(hot, noted, shapes, self.reads, weights, plans_after, served, rejected,
                          {c.name: c for c in candidates}, self.scratch, self.tables)  # fmt: skip
        return Advice(
            catalog="", suggestions=tuple(suggestions), unused=tuple(unused), redundant=tuple(redundant),
            hints=tuple(hints), rejected=tuple(rejected), skipped=self.workload.skipped,
            reads=len(self.reads), writes=len(self.workload.writes), hot=tuple(hot), read_ms=round(total, 3),
            sample=self.scratch.sample, seconds=0.0, lock_wait_ms=round(self.workload.lock_wait_ms, 3),
        )  # fmt: skip

    def verify(self, c: Candidate) -> tuple[_Verdict | None, str]:
        name = c.name
        columns = self.update_columns(c)
        self.scratch.pick_rows(c.table)
        # Measured right before the candidate exists, so drifting machine load cancels out.
        baseline = self.scratch.write_cost(c.table, self.tables[c.table], columns)
        self.scratch.create(name, c.sql(name))
        try:
            used = [fp for fp in c.fingerprints if name in index_names(self.plan(self.reads[fp]))]
            if not used:
                return None, "SQLite's planner does not choose it for the statements it was made for"
            after = {fp: t for fp in used if (t := self.time(self.reads[fp], self.runs)) is not None}
            ratio = sum(self.reads[fp].calls * self.baseline[fp] for fp in after) / max(
                sum(self.reads[fp].calls * t for fp, t in after.items()), 1e-9)
            close = 0.9 <= ratio < 1.5  # near the threshold: more runs, so reruns agree
            if close:
                after = {fp: t for fp in after if (t := self.time(self.reads[fp], 3 * self.runs)) is not None}
            size = self.scratch.index_size(name)
            measured = self.scratch.write_cost(c.table, self.tables[c.table], columns)
        finally:
            self.scratch.drop(name)
        if close:
            for fp in after:
                self.baseline[fp] = self.time(self.reads[fp], 3 * self.runs) or self.baseline[fp]
        served = {fp: (self.baseline[fp], t) for fp, t in after.items()}
        d_insert, d_update = (None if m is None or b is None else max(0.0, m - b) for m, b in zip(measured, baseline))
        if not set(columns) & (set(c.columns) | {w.column for w in c.where}):
            d_update = 0.0  # SQLite leaves an index alone when an UPDATE sets none of its columns
        write_ms = self.logged_write_cost(c, d_insert, d_update)
        saved = sum(self.reads[fp].calls * (b - a) for fp, (b, a) in served.items())
        before = sum(self.reads[fp].calls * b for fp, (b, _) in served.items())
        after_total = sum(self.reads[fp].calls * a for fp, (_, a) in served.items())
        verdict = _Verdict(c, served, saved, write_ms, size, d_insert, d_update, columns)
        if not served or after_total * MIN_SPEEDUP > before:
            return None, f"the statements it serves get only {_ratio(before, after_total)} faster"
        if saved <= write_ms:
            return None, f"it saves {saved:,.1f} ms of logged reads but adds {write_ms:,.1f} ms to the logged writes"
        return verdict, ""

    def update_columns(self, c: Candidate) -> tuple[str, ...]:
        """The columns the logged updates of its table set; else its WHERE and first key column."""
        info = self.tables[c.table]
        logged = [w for w in self.workload.writes if w.table == c.table]
        columns = tuple(sorted({name for w in logged for col in (w.set_columns or ()) if (name := info.canonical(col))}))
        return columns or tuple(dict.fromkeys([*(w.column for w in c.where), c.key[0]]))

    def logged_write_cost(self, c: Candidate, d_insert: float | None, d_update: float | None) -> float:
        """What the index adds to the logged writes of its table (ms), from the 10,000-row measurements."""
        info = self.tables[c.table]
        touched = set(c.columns) | {w.column for w in c.where}
        cost = 0.0
        for w in self.workload.writes:
            if w.table != c.table:
                continue
            rows = w.rows or w.calls
            if w.set_columns is None:
                cost += rows * (d_insert or 0.0) / WRITE_ROWS
            elif touched & {info.canonical(col) for col in w.set_columns}:
                cost += rows * (d_update or 0.0) / WRITE_ROWS
        return cost

    def finalize(self, verdicts: list[_Verdict], plans_before: Mapping[str, tuple[str, ...]]) -> tuple[
            list[_Verdict], dict[str, tuple[str, ...]], dict[str, float], list[Rejected]]:  # fmt: skip
        """Build the survivors together with ANALYZE; drop those no statement chooses or that slow one down.

        The final set stays built on the scratch copy, so the findings see its plans.
        """
        rejected: list[Rejected] = []
        for attempt in range(3):
            for v in verdicts:
                self.scratch.create(v.candidate.name, v.candidate.sql(v.candidate.name))
            self.scratch.analyze()
            plans_after = self.plans()
            after: dict[str, float] = {}
            penalties: dict[str, float] = {}
            for fp, r in self.reads.items():
                wanted = any(fp in v.candidate.fingerprints for v in verdicts)
                if fp not in self.before or not r.samples or (plans_after.get(fp) == plans_before.get(fp) and not wanted):
                    continue
                measured = self.time(r, self.runs)
                if measured is None:
                    continue
                after[fp] = measured
                if measured > self.before[fp] * REGRESSION + 0.1:
                    for name in index_names(plans_after.get(fp, ())):
                        penalties[name] = penalties.get(name, 0.0) + r.calls * (measured - self.before[fp])
            kept: list[_Verdict] = []
            for v in verdicts:
                name = v.candidate.name
                if not any(name in index_names(plans_after.get(fp, ())) for fp in self.reads):
                    rejected.append(Rejected(v.candidate.sql(name), v.candidate.fingerprints,
                                             "no logged statement chooses it once the other suggestions exist"))  # fmt: skip
                elif penalties.get(name, 0.0) and v.saved_ms - penalties[name] <= v.write_ms:
                    rejected.append(Rejected(v.candidate.sql(name), v.candidate.fingerprints,
                                             f"it makes other logged statements {penalties[name]:,.1f} ms slower"))  # fmt: skip
                else:
                    kept.append(v)
            if len(kept) == len(verdicts) or attempt == 2:
                return kept, plans_after, after, rejected
            for v in verdicts:
                self.scratch.drop(v.candidate.name)
            verdicts = kept
        raise AssertionError("unreachable")

    def suggestion(self, v: _Verdict, after: Mapping[str, float], plans: Mapping[str, tuple[str, ...]]) -> Suggestion:
        name = v.candidate.name
        served: list[Served] = []
        for fp in sorted(self.reads, key=lambda f: (-self.reads[f].calls, f)):
            if name in index_names(plans.get(fp, ())) and fp in after and fp in self.before:
                r = self.reads[fp]
                served.append(Served(fp, r.sql, r.calls, round(self.before[fp], 3), round(after[fp], 3)))
        calls = sum(s.calls for s in served) or 1
        before = sum(s.calls * s.before_ms for s in served)
        after_total = sum(s.calls * s.after_ms for s in served)
        return Suggestion(
            name=name, table=v.candidate.table, sql=v.candidate.sql(name), columns=v.candidate.columns,
            where=v.candidate.where_sql(), covering=bool(v.candidate.include), served=tuple(served),
            before_ms=round(before / calls, 3), after_ms=round(after_total / calls, 3),
            saved_ms=round(before - after_total, 3), size_bytes=v.size,
            insert_10k_ms=None if v.insert_ms is None else round(v.insert_ms, 2),
            update_10k_ms=None if v.update_ms is None else round(v.update_ms, 2), update_columns=v.update_columns,
            write_cost_ms=round(v.write_ms, 3),
        )  # fmt: skip


def _combined_shape(r: Statement, tables: Mapping[str, TableInfo]) -> Shape:
    """The shape of a fingerprint: a literal that differs between its statements is a value, not a constant."""
    shapes = [analyze(text, tables) for text in (r.variants or (r.sql,))]
    first = shapes[0]
    if len(shapes) == 1 or any(len(s.accesses) != len(first.accesses) for s in shapes):
        return first
    accesses: list[Access] = []
    for i, access in enumerate(first.accesses):
        common = set(access.constants)
        for s in shapes[1:]:
            common &= set(s.accesses[i].constants)
        varying = tuple(dict.fromkeys(c.column for c in access.constants if c not in common))
        accesses.append(replace(access, constants=tuple(c for c in access.constants if c in common),
                                equal=tuple(dict.fromkeys(access.equal + varying))))  # fmt: skip
    return Shape(tuple(accesses), first.notes)


def _findings(
    existing: Sequence[IndexDef], kept: Sequence[Candidate], before: Mapping[str, tuple[str, ...]],
    after: Mapping[str, tuple[str, ...]], hot: set[str], reads: Mapping[str, Statement],
) -> tuple[list[Finding], list[Finding]]:  # fmt: skip
    """Existing indexes no logged statement uses, and those whose columns lead a better index."""
    unused: list[Finding] = []
    redundant: list[Finding] = []
    users_before, users_after = _users(before), _users(after)
    others = [(e.name, e.table, e.columns, _where_key(e.where, e.partial)) for e in existing]
    others += [(c.name, c.table, c.columns, frozenset(w.sql() for w in c.where)) for c in kept]
    for e in existing:
        if e.constraint:
            continue
        dlindex = e.name.startswith("idx_dlindex_")
        used_before, used_after = users_before.get(e.name, set()), users_after.get(e.name, set())
        mine = _where_key(e.where, e.partial)
        better = reason = None
        strict = False
        for name, table, columns, where in others:
            if name == e.name or table != e.table or tuple(columns[: len(e.columns)]) != e.columns:
                continue
            if not where or where == mine:
                strict = True
                better = name
                reason = f"duplicate of {name}" if len(columns) == len(e.columns) and where == mine else f"its columns lead {name}"
                break
            hot_users = {fp for fp in used_before if fp in hot}
            if hot_users and all(name in index_names(after.get(fp, ())) for fp in hot_users):
                rest = used_after
                calls = sum(reads[fp].calls for fp in rest if fp in reads)
                tail = f"; still chosen by {len(rest)} rarer statement(s), {calls:,} call(s)" if rest else ""
                better = name
                reason = f"its columns lead {name} (WHERE {' AND '.join(sorted(where))}), which serves the hot statements that used it{tail}"
                break
        drop = f"DROP INDEX {e.name}"
        if better is not None and reason is not None:
            redundant.append(Finding("redundant", e.name, e.table, e.sql or "", reason, better, dlindex,
                                     dlindex and (strict or not used_after), drop))  # fmt: skip
        elif not used_before:
            unused.append(Finding("unused", e.name, e.table, e.sql or "", "no logged statement's plan uses it",
                                  None, dlindex, dlindex, drop))  # fmt: skip
        elif kept and not used_after:
            unused.append(Finding("unused", e.name, e.table, e.sql or "",
                                  "no logged statement's plan uses it once the suggestions exist", None, dlindex, dlindex, drop))  # fmt: skip
    return unused, redundant


def _where_key(where: Iterable[Any] | None, partial: bool) -> frozenset[str]:
    if not partial:
        return frozenset()
    return frozenset(c.sql() for c in where or ()) or frozenset({"?"})


def _users(plans: Mapping[str, tuple[str, ...]]) -> dict[str, set[str]]:
    users: dict[str, set[str]] = {}
    for fp, plan in plans.items():
        for name in index_names(plan):
            users.setdefault(name, set()).add(fp)
    return users


def _ratio(before: float, after: float) -> str:
    return f"{before / after:.2f}x" if after > 0 else "no"
