"""``suggest_indexes``: from the workload to verified index suggestions, on a scratch copy.

1. Weigh each read fingerprint by calls x mean duration; the heaviest (``top``, each at
   least ``min_share`` of all read time) are *hot*. Rarer statements never earn an index.
2. Derive candidates from the hot statements and merge them (``candidates``).
3. Build each candidate alone on the scratch copy: EXPLAIN QUERY PLAN must use it, the
   statements it serves are replayed with their logged parameters, and a 10,000-row insert
   and update are run with and without it. Every replay is timed and its VM steps counted
   (``replay``); the decisions use the steps, which do not change from run to run: it stays
   if SQLite does at most 1/MIN_STEP_SPEEDUP of the work for the statements it serves and the
   steps it saves the logged reads exceed those it adds to the logged writes.
4. Build the survivors together with ANALYZE (what ``--apply`` does) and replay every logged
   read: an index no statement chooses is dropped, and so is any index in the plan of a read
   that got slower than on the catalog as it is. Every statement is reported before/after.
5. Existing indexes no logged statement uses are *unused*; one whose columns lead another
   index is *redundant*; one whose users are faster without it is *slower*. Statements no
   index can help get a rewrite hint.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dlindex.advisor.candidates import Candidate, candidates_for, existing_serves, merge
from dlindex.advisor.findings import findings as _findings
from dlindex.advisor.findings import users as _users
from dlindex.advisor.hints import hints_for
from dlindex.advisor.model import Advice, Effect, Finding, Rejected, Served, Suggestion
from dlindex.advisor.replay import (
    MEMORY_LIMIT,
    STATEMENT_DEADLINE_S,
    STEP,
    ReplayLimit,
    Timing,
    limit_heap,
    stop_on_signals,
    time_read,
)
from dlindex.advisor.scratch import SAMPLE_ROWS, WRITE_ROWS, IndexDef, Scratch, explain, guarded, index_names
from dlindex.advisor.shapes import Access, Shape, TableInfo, analyze, where_as_select
from dlindex.advisor.workload import Skipped, Statement, Workload, load_workload
from dlindex.errors import Interrupted
from dlindex.querylog.importer import LineSource

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

MIN_SHARE = 0.01  # a fingerprint below 1% of the logged read time is not hot
MIN_WEIGHT_MS = 1.0  # nor is one that took less than a millisecond in all
MIN_SPEEDUP = 1.1  # a statement this much faster is "faster" in the report
# The statements an index serves must need at most 1/this of the VM steps: a step saved is
# worth less time than a step spent, so a 10% cut in steps is often no faster at all.
MIN_STEP_SPEEDUP = 1.15
RUNS = 5
HINT_SHARE = 0.002  # statements below 0.2% of the logged read time get no rewrite hint
REGRESSION = 1.25  # after > before x this + NOISE_MS, measured twice, is a slower statement
NOISE_MS = 0.1
STEP_REGRESSION = 1.05  # so is one doing this much more work (VM steps)


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

    Args:
        logs: ``(name, text or logview.file_lines(path))`` of captured SQL (as ``dlindex log import``
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
            advisor = _Advisor(scratch, workload, top, min_share, runs or RUNS, say, time_limit_s, memory_limit_bytes)
            advice = advisor.run()
    except KeyboardInterrupt:
        raise Interrupted("index advice interrupted; the catalog is unchanged and the scratch copy removed") from None
    finally:
        restore()
    return replace(advice, catalog=str(catalog.path), seconds=round(time.perf_counter() - started, 2))


@dataclass
class _Verdict:
    candidate: Candidate
    served: dict[str, tuple[Timing, Timing]]  # fp -> (before, after)
    saved_ms: float
    write_ms: float
    saved_steps: int
    write_steps: int
    size: int
    insert: Timing | None  # what the index adds to inserting / updating WRITE_ROWS rows
    update: Timing | None
    update_columns: tuple[str, ...]


def _delta(with_index: Timing | None, without: Timing | None) -> Timing | None:
    if with_index is None or without is None:
        return None
    return Timing(max(0.0, with_index.ms - without.ms), max(0, with_index.steps - without.steps))


class _Advisor:
    def __init__(self, scratch: Scratch, workload: Workload, top: int, min_share: float, runs: int,
                 say: Callable[[str], None], limit_s: float, memory: int | None) -> None:  # fmt: skip
        self.scratch = scratch
        self.workload = workload
        self.top, self.min_share, self.runs, self.say = top, min_share, runs, say
        self.limit_s, self.memory = limit_s, memory
        self.tables = scratch.tables()
        self.reads = {r.fingerprint: r for r in workload.reads}
        self.before: dict[str, Timing] = {}  # per call on the catalog as it is
        self.baseline: dict[str, Timing] = {}  # ... after ANALYZE, what candidates are compared with
        self.refused: dict[str, str] = {}  # fp -> why its replay was stopped

    # --- measuring statements ---------------------------------------------------------------

    def plan(self, r: Statement) -> tuple[str, ...]:
        sample = r.samples[0] if r.samples else None
        lines = (
            explain(self.scratch.planner, sample.sql, sample.params) if sample else explain(self.scratch.planner, r.sql)
        )
        return lines or ()

    def time(self, r: Statement, runs: int) -> Timing | None:
        """Mean over the samples of ``r`` (None: no sample, or its replay went past a limit)."""
        if r.fingerprint in self.refused:
            return None
        found: list[Timing] = []
        for s in r.samples:
            try:
                found.append(time_read(self.scratch.reader, s.sql, s.params, runs, self.limit_s, self.memory,
                                       counter=self.scratch.planner))  # fmt: skip
            except ReplayLimit as e:
                self.refused[r.fingerprint] = e.reason
                return None
        if not found:
            return None
        return Timing(statistics.mean(t.ms for t in found), round(statistics.mean(t.steps for t in found)))

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
        weights = {fp: r.calls * (r.mean_ms if r.mean_ms is not None else self.before[fp].ms if fp in self.before else 0.0)
                   for fp, r in self.reads.items()}  # fmt: skip
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
        self.say("checking the existing indexes the logged reads use")
        slower = self.slower_existing(existing, plans_before)
        # --apply runs ANALYZE: a candidate is judged against the catalog with fresh statistics,
        # so what ANALYZE alone gains is not credited to an index.
        self.scratch.analyze()
        for fp in timed_hot:
            self.baseline[fp] = self.time(self.reads[fp], self.runs) or self.before[fp]
        candidates = merge(
            candidates_for({fp: shapes[fp].accesses for fp in timed_hot}, weights, self.tables, self.scratch),
            self.scratch,
        )
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
        verdicts.sort(key=lambda v: (-v.saved_steps, v.candidate.sql()))  # steps: the same order on every run
        suggestions = [self.suggestion(v, after, plans_after) for v in verdicts]
        effects = self.effects(verdicts, plans_before, plans_after, after)
        unused, redundant = _findings(
            existing, [v.candidate for v in verdicts], plans_before, plans_after, set(hot), self.reads
        )
        flagged = {f.name for f in slower}  # "faster without it" says more than "unused once the suggestions exist"
        unused = [f for f in unused if f.name not in flagged]
        redundant = [f for f in redundant if f.name not in flagged]
        served = {fp for v in verdicts for fp in v.candidate.fingerprints if fp in v.served}
        # Rewrite hints also for rarer statements that still cost something (not for a handful of ms).
        noted = [fp for fp in ranked[: 2 * self.top] if fp not in hot and total and weights[fp] >= HINT_SHARE * total]
        hints = hints_for(hot, noted, shapes, self.reads, weights, plans_after, served, rejected,
                          {c.name: c for c in candidates}, self.scratch, self.tables)  # fmt: skip
        skipped = self.workload.skipped + tuple(
            Skipped("replay", None, f"{reason}; not timed, the advice goes on without it", _short(self.reads[fp].sql))
            for fp, reason in sorted(self.refused.items())
        )  # fmt: skip
        return Advice(
            catalog="", suggestions=tuple(suggestions), unused=tuple(unused), redundant=tuple(redundant),
            hints=tuple(hints), rejected=tuple(rejected), skipped=skipped,
            reads=len(self.reads), writes=len(self.workload.writes), hot=tuple(hot), read_ms=round(total, 3),
            sample=self.scratch.sample, seconds=0.0, lock_wait_ms=round(self.workload.lock_wait_ms, 3),
            slower=tuple(slower), statements=tuple(effects),
        )  # fmt: skip

    def verify(self, c: Candidate) -> tuple[_Verdict | None, str]:
        """Build ``c`` alone; keep it if SQLite does less work for the reads than it adds to the writes.

        The decision is made on VM steps, which do not change from run to run; the times are
        measured alongside and reported.
        """
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
            after = {
                fp: t for fp in used if fp in self.baseline and (t := self.time(self.reads[fp], self.runs)) is not None
            }
            size = self.scratch.index_size(name)
            measured = self.scratch.write_cost(c.table, self.tables[c.table], columns)
        finally:
            self.scratch.drop(name)
        served = {fp: (self.baseline[fp], t) for fp, t in after.items()}
        d_insert, d_update = (_delta(m, b) for m, b in zip(measured, baseline))
        if not set(columns) & (set(c.columns) | {w.column for w in c.where}):
            d_update = Timing(0.0, 0)  # SQLite leaves an index alone when an UPDATE sets none of its columns
        write_ms, write_steps = self.logged_write_cost(c, d_insert, d_update)
        calls = {fp: self.reads[fp].calls for fp in served}
        saved = sum(calls[fp] * (b.ms - a.ms) for fp, (b, a) in served.items())
        before_steps = sum(calls[fp] * b.steps for fp, (b, _) in served.items())
        after_steps = sum(calls[fp] * a.steps for fp, (_, a) in served.items())
        verdict = _Verdict(
            c, served, saved, write_ms, before_steps - after_steps, write_steps, size, d_insert, d_update, columns
        )
        if not served or after_steps * MIN_STEP_SPEEDUP > before_steps:
            return None, (f"SQLite does {_ratio(after_steps, before_steps)} of the work for the statements it serves "
                          f"(needs {1 / MIN_STEP_SPEEDUP:.2f}x or less)")  # fmt: skip
        if not _pays_off(saved, write_ms, verdict.saved_steps, write_steps):
            return None, (f"it saves {saved:,.1f} ms ({verdict.saved_steps:,} VM steps) of logged reads but adds "
                          f"{write_ms:,.1f} ms ({write_steps:,} steps) to the logged writes")  # fmt: skip
        return verdict, ""

    def update_columns(self, c: Candidate) -> tuple[str, ...]:
        """The columns the logged updates of its table set; else its WHERE and first key column."""
        info = self.tables[c.table]
        logged = [w for w in self.workload.writes if w.table == c.table]
        columns = tuple(
            sorted({name for w in logged for col in (w.set_columns or ()) if (name := info.canonical(col))})
        )
        return columns or tuple(dict.fromkeys([*(w.column for w in c.where), c.key[0]]))

    def logged_write_cost(self, c: Candidate, d_insert: Timing | None, d_update: Timing | None) -> tuple[float, int]:
        """What the index adds to the logged writes of its table (ms, steps), from the WRITE_ROWS-row measurements."""
        info = self.tables[c.table]
        touched = _touches(c)
        ms, steps = 0.0, 0
        for w in self.workload.writes:
            if w.table != c.table:
                continue
            rows = w.rows or w.calls
            delta = (
                d_insert
                if w.set_columns is None
                else d_update
                if touched & {info.canonical(col) for col in w.set_columns}
                else None
            )
            if delta is not None:
                ms += rows * delta.ms / WRITE_ROWS
                steps += -(-rows * delta.steps // WRITE_ROWS)
        return ms, steps

    def slower(self, fp: str, before: Timing, after: Timing, confirm: bool = True) -> bool:
        """More work, or a time past the noise margin that a second measurement confirms."""
        if after.steps > before.steps * STEP_REGRESSION + STEP:
            return True
        if after.ms <= before.ms * REGRESSION + NOISE_MS:
            return False
        if not confirm:
            return True
        again = self.time(self.reads[fp], 3 * self.runs)
        return again is not None and again.ms > before.ms * REGRESSION + NOISE_MS

    def finalize(self, verdicts: list[_Verdict], plans_before: Mapping[str, tuple[str, ...]]) -> tuple[
            list[_Verdict], dict[str, tuple[str, ...]], dict[str, Timing], list[Rejected]]:  # fmt: skip
        """Build the survivors together with ANALYZE; drop those no statement chooses or that slow one down.

        No logged read may get slower than on the catalog as it is: an index in the plan of a
        statement that got slower is dropped, whatever it saves elsewhere.
        """
        rejected: list[Rejected] = []
        for attempt in range(4):
            for v in verdicts:
                self.scratch.create(v.candidate.name, v.candidate.sql(v.candidate.name))
            self.scratch.analyze()
            plans_after = self.plans()
            after: dict[str, Timing] = {}
            blamed: dict[str, list[str]] = {}
            names = {v.candidate.name for v in verdicts}
            for fp, r in self.reads.items():
                wanted = any(fp in v.candidate.fingerprints for v in verdicts)
                if (
                    fp not in self.before
                    or not r.samples
                    or (plans_after.get(fp) == plans_before.get(fp) and not wanted)
                ):
                    continue
                measured = self.time(r, self.runs)
                if measured is None:
                    continue
                after[fp] = measured
                if self.slower(fp, self.before[fp], measured):
                    for name in sorted(index_names(plans_after.get(fp, ())) & names):
                        blamed.setdefault(name, []).append(f"{fp} {self.before[fp].ms:,.3f} -> {measured.ms:,.3f} ms")
            kept: list[_Verdict] = []
            for v in verdicts:
                name = v.candidate.name
                if not any(name in index_names(plans_after.get(fp, ())) for fp in self.reads):
                    rejected.append(Rejected(v.candidate.sql(name), v.candidate.fingerprints,
                                             "no logged statement chooses it once the other suggestions exist"))  # fmt: skip
                elif name in blamed:
                    rejected.append(Rejected(v.candidate.sql(name), v.candidate.fingerprints,
                                             "it makes logged statements slower: " + "; ".join(blamed[name])))  # fmt: skip
                else:
                    kept.append(v)
            if len(kept) == len(verdicts) or attempt == 3:
                return kept, plans_after, after, rejected
            for v in verdicts:
                self.scratch.drop(v.candidate.name)
            verdicts = kept
        raise AssertionError("unreachable")

    def slower_existing(self, existing: Sequence[IndexDef], plans: Mapping[str, tuple[str, ...]]) -> list[Finding]:
        """Existing indexes whose logged users do less work, in less time, without them (the catalog as it is)."""
        found: list[Finding] = []
        users = _users(plans)
        for e in existing:
            fps = sorted(fp for fp in users.get(e.name, ()) if fp in self.before)
            if e.constraint or not fps or e.sql is None:
                continue
            with self.scratch.without(e.name, e.sql):
                without = {fp: t for fp in fps if (t := self.time(self.reads[fp], self.runs)) is not None}
                # a time past the noise margin must hold on a second, longer measurement
                unsure = [fp for fp, t in without.items() if self.slower(fp, t, self.before[fp], confirm=False)]
                again = {fp: t for fp in unsure if (t := self.time(self.reads[fp], 3 * self.runs)) is not None}
            gains = [f"{fp} {self.before[fp].ms:,.3f} -> {t.ms:,.3f} ms" for fp, t in again.items()
                     if self.slower(fp, t, self.before[fp], confirm=False)]  # fmt: skip
            if gains and len(gains) == len(fps):
                dlindex = e.name.startswith("idx_dlindex_")
                found.append(Finding("slower", e.name, e.table, e.sql, "the logged statements that use it are faster "
                                     "without it: " + "; ".join(gains), None, dlindex, dlindex, f"DROP INDEX {e.name}"))  # fmt: skip
        return found

    def effects(self, verdicts: Sequence[_Verdict], plans_before: Mapping[str, tuple[str, ...]],
                plans_after: Mapping[str, tuple[str, ...]], after: Mapping[str, Timing]) -> list[Effect]:  # fmt: skip
        """Every logged statement before and after the accepted set (writes: per call, from WRITE_ROWS-row runs)."""
        found: list[Effect] = []
        for fp, r in self.reads.items():
            b = self.before.get(fp)
            if b is None:
                found.append(Effect(fp, "read", r.sql, r.calls, None, None, self.refused.get(fp, "not timed")))
                continue
            a = after.get(fp)
            same = plans_after.get(fp) == plans_before.get(fp)
            a = a or b
            note = ("same plan" if same and fp not in after else "faster" if a.ms * MIN_SPEEDUP < b.ms
                    else "slower" if a.ms > b.ms * REGRESSION + NOISE_MS else "about the same")  # fmt: skip
            found.append(Effect(fp, "read", r.sql, r.calls, round(b.ms, 3), round(a.ms, 3), note))
        for table in sorted({w.table for w in self.workload.writes if w.table in self.tables}):
            writes = [w for w in self.workload.writes if w.table == table]
            columns = tuple(
                sorted({c for w in writes for col in (w.set_columns or ()) if (c := self.tables[table].canonical(col))})
            )
            self.scratch.pick_rows(table)
            mine = [v.candidate for v in verdicts if v.candidate.table == table]
            with_set = self.scratch.write_cost(table, self.tables[table], columns)
            for c in mine:
                self.scratch.drop(c.name)
            without = self.scratch.write_cost(table, self.tables[table], columns) if mine else with_set
            for c in mine:
                self.scratch.create(c.name, c.sql(c.name))
            for w in writes:
                pick = 0 if w.set_columns is None else 1
                b, a = without[pick], with_set[pick]
                if w.sql.lstrip()[:6].lower() not in ("insert", "update", "replac") or b is None or a is None:
                    found.append(
                        Effect(
                            w.fingerprint,
                            "write",
                            w.sql,
                            w.calls,
                            None,
                            None,
                            "not measured (only INSERT and UPDATE are)",
                        )
                    )
                    continue
                # the measurement wrote WRITE_ROWS rows, or the whole table when it is smaller
                per_call = (w.rows or w.calls) / max(w.calls, 1) / max(1, min(WRITE_ROWS, self.scratch.rows(table)))
                sets = {self.tables[table].canonical(c) for c in w.set_columns or ()}
                touched = any(v.candidate.table == table and (w.set_columns is None or sets & _touches(v.candidate))
                              for v in verdicts)  # fmt: skip
                found.append(Effect(w.fingerprint, "write", w.sql, w.calls, round(b.ms * per_call, 4), round(a.ms * per_call, 4),
                                    "counted against the suggestions" if touched else "unchanged"))  # fmt: skip
        return found

    def suggestion(self, v: _Verdict, after: Mapping[str, Timing], plans: Mapping[str, tuple[str, ...]]) -> Suggestion:
        name = v.candidate.name
        served: list[Served] = []
        for fp in sorted(self.reads, key=lambda f: (-self.reads[f].calls, f)):
            if name in index_names(plans.get(fp, ())) and fp in after and fp in self.before:
                r = self.reads[fp]
                served.append(Served(fp, r.sql, r.calls, round(self.before[fp].ms, 3), round(after[fp].ms, 3)))
        calls = sum(s.calls for s in served) or 1
        before = sum(s.calls * s.before_ms for s in served)
        after_total = sum(s.calls * s.after_ms for s in served)
        return Suggestion(
            name=name, table=v.candidate.table, sql=v.candidate.sql(name), columns=v.candidate.columns,
            where=v.candidate.where_sql(), covering=bool(v.candidate.include), served=tuple(served),
            before_ms=round(before / calls, 3), after_ms=round(after_total / calls, 3),
            saved_ms=round(before - after_total, 3), size_bytes=v.size,
            insert_10k_ms=None if v.insert is None else round(v.insert.ms, 2),
            update_10k_ms=None if v.update is None else round(v.update.ms, 2), update_columns=v.update_columns,
            write_cost_ms=round(v.write_ms, 3),
        )  # fmt: skip


def _pays_off(saved_ms: float, write_ms: float, saved_steps: int, write_steps: int) -> bool:
    """Whether the reads gain more work than the writes lose, in VM steps (a write's changed pages
    weighed in): the same answer on every run; the times are reported, never decide."""
    return saved_steps > write_steps


def _touches(c: Candidate) -> set[str]:
    """The columns whose change moves an entry of ``c``'s index."""
    return set(c.columns) | {w.column for w in c.where}


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


def _ratio(part: float, whole: float) -> str:
    return f"{part / whole:.2f}x" if whole > 0 else "all"


def _short(sql: str, width: int = 120) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= width else text[: width - 1] + "…"
