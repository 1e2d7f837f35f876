"""One candidate built alone on the copy: kept if it saves reads more work than it adds to writes.

The decision is made on VM steps, which do not change from run to run (a write's changed
pages weighed in); the times are measured alongside and reported, never decide. ``Bench``
is where every step of the advice plans and times the logged reads on the copy, and
remembers those stopped at a limit.
"""

from __future__ import annotations

import sqlite3
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from dlindex.advisor.candidates import Candidate
from dlindex.advisor.replay import (
    STATEMENT_DEADLINE_S,
    STEP,
    WRITE_ROWS,
    ReplayLimit,
    Timing,
    bindable,
    deadline,
    explain,
    index_names,
    time_read,
)
from dlindex.advisor.scratch import Scratch
from dlindex.advisor.shapes import TableInfo, where_as_select
from dlindex.advisor.workload import Sample, Statement, Workload
from dlindex.query import windows

# The statements an index serves must need at most 1/this of the VM steps: a step saved is
# worth less time than a step spent, so a 10% cut in steps is often no faster at all.
MIN_STEP_SPEEDUP = 1.15


@dataclass
class Verdict:
    """What a candidate that passed did, measured alone."""

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


def verify(bench: Bench, c: Candidate) -> tuple[Verdict | None, str]:
    """Build ``c`` alone; its verdict, or None and why it is rejected."""
    scratch, info = bench.scratch, bench.tables[c.table]
    name = c.name
    columns = update_columns(bench, c)
    scratch.writes.pick_rows(c.table, info)
    # Measured right before the candidate exists, so drifting machine load cancels out.
    baseline = scratch.writes.measure(c.table, info, columns)
    scratch.create(name, c.sql(name))
    try:
        used = [fp for fp in c.fingerprints if name in index_names(bench.plan(bench.reads[fp]))]
        if not used:
            return None, "SQLite's planner does not choose it for the statements it was made for"
        after = {fp: t for fp in used if fp in bench.baseline and (t := bench.time_fp(fp)) is not None}
        size = scratch.stats.index_size(name)
        measured = scratch.writes.measure(c.table, info, columns)
    finally:
        scratch.drop(name)
    served = {fp: (bench.baseline[fp], t) for fp, t in after.items()}
    d_insert, d_update = (_delta(m, b) for m, b in zip(measured, baseline, strict=True))
    if not set(columns) & touches(c):
        d_update = Timing(0.0, 0)  # SQLite leaves an index alone when an UPDATE sets none of its columns
    write_ms, write_steps = _logged_write_cost(bench, c, d_insert, d_update)
    calls = {fp: bench.reads[fp].calls for fp in served}
    saved = sum(calls[fp] * (b.ms - a.ms) for fp, (b, a) in served.items())
    before_steps = sum(calls[fp] * b.steps for fp, (b, _) in served.items())
    after_steps = sum(calls[fp] * a.steps for fp, (_, a) in served.items())
    verdict = Verdict(
        c, served, saved, write_ms, before_steps - after_steps, write_steps, size, d_insert, d_update, columns
    )
    if not served or after_steps * MIN_STEP_SPEEDUP > before_steps:
        return None, (f"SQLite does {_ratio(after_steps, before_steps)} of the work for the statements it serves "
                      f"(needs {1 / MIN_STEP_SPEEDUP:.2f}x or less)")  # fmt: skip
    if verdict.saved_steps <= write_steps:
        return None, (f"it saves {saved:,.1f} ms ({verdict.saved_steps:,} VM steps) of logged reads but adds "
                      f"{write_ms:,.1f} ms ({write_steps:,} steps) to the logged writes")  # fmt: skip
    return verdict, ""


def update_columns(bench: Bench, c: Candidate) -> tuple[str, ...]:
    """The columns the logged updates of its table set; else its WHERE and first key column."""
    info = bench.tables[c.table]
    logged = [w for w in bench.workload.writes if w.table == c.table]
    columns = tuple(sorted({name for w in logged for col in (w.set_columns or ()) if (name := info.canonical(col))}))
    return columns or tuple(dict.fromkeys([*(w.column for w in c.where), c.key[0]]))


def touches(c: Candidate) -> set[str]:
    """The columns whose change moves an entry of ``c``'s index."""
    return set(c.columns) | {w.column for w in c.where}


def _logged_write_cost(
    bench: Bench, c: Candidate, d_insert: Timing | None, d_update: Timing | None
) -> tuple[float, int]:
    """What the index adds to the logged writes of its table (ms, steps), from the WRITE_ROWS-row measurements."""
    info = bench.tables[c.table]
    touched = touches(c)
    ms, steps = 0.0, 0
    for w in bench.workload.writes:
        if w.table != c.table:
            continue
        if w.set_columns is None:
            delta = d_insert
        else:
            delta = d_update if touched & {info.canonical(col) for col in w.set_columns} else None
        if delta is not None:
            rows = w.rows or w.calls
            ms += rows * delta.ms / WRITE_ROWS
            steps += -(-rows * delta.steps // WRITE_ROWS)
    return ms, steps


def _delta(with_index: Timing | None, without: Timing | None) -> Timing | None:
    if with_index is None or without is None:
        return None
    return Timing(max(0.0, with_index.ms - without.ms), max(0, with_index.steps - without.steps))


def _ratio(part: float, whole: float) -> str:
    return f"{part / whole:.2f}x" if whole > 0 else "all"


REGRESSION = 1.25  # after > before x this + NOISE_MS, measured twice, is a slower statement
NOISE_MS = 0.1
STEP_REGRESSION = 1.05  # so is one doing this much more work (VM steps)

Plans = Mapping[str, tuple[str, ...]]  # fingerprint ("write:" + fingerprint for a write's WHERE) -> plan


class Bench:
    """Where every step of the advice plans and times the workload's reads."""

    def __init__(self, scratch: Scratch, workload: Workload, runs: int, limit_s: float, memory: int | None) -> None:
        self.scratch = scratch
        self.workload = workload
        self.runs = runs  # timed runs per statement (median)
        self.limit_s, self.memory = limit_s, memory
        self.tables: dict[str, TableInfo] = scratch.tables()
        self.reads = {r.fingerprint: r for r in workload.reads}
        self.before: dict[str, Timing] = {}  # per call on the catalog as it is
        self.baseline: dict[str, Timing] = {}  # ... after ANALYZE, what candidates are compared with
        self.bare: dict[str, Timing] = {}  # ... with no secondary index, for reads that use a suggestion
        self.refused: dict[str, str] = {}  # fp -> why its replay was stopped

    def samples(self, r: Statement) -> tuple[Sample, ...]:
        """What dlindex runs for ``r`` on the copy as its indexes are now: ``r.seek`` where an index
        serves it as ``dlindex query`` requires, else ``r.samples``."""
        if not r.seek or not r.seek_served(explain(self.scratch.planner, r.seek[0].sql, r.seek[0].params) or ()):
            return r.samples
        # A time window: dlindex counts it through the index first (windows.choose), on the
        # copy in proportion to the sample; a wide one is walked in id order instead.
        bound = max(1, windows.PROBE // self.scratch.sample)
        probe = windows.probe_of(r.seek[0].sql, bound)
        if probe is not None and _count(self.scratch.planner, probe, r.seek[0].params) >= bound:
            return tuple(Sample(windows.walked(s.sql), s.params) for s in r.samples)
        return r.seek

    def plan(self, r: Statement) -> tuple[str, ...]:
        samples = self.samples(r)
        sample = samples[0] if samples else None
        planner = self.scratch.planner
        lines = explain(planner, sample.sql, sample.params) if sample else explain(planner, r.sql)
        return lines or ()

    def plans(self) -> dict[str, tuple[str, ...]]:
        """The plan of every logged read, and of every logged write's WHERE."""
        found = {fp: self.plan(r) for fp, r in self.reads.items()}
        for w in self.workload.writes:
            select = where_as_select(w.sql)
            if select is not None:
                found["write:" + w.fingerprint] = explain(self.scratch.planner, select) or ()
        return found

    def time(self, r: Statement, runs: int) -> Timing | None:
        """Mean over the samples of ``r`` (None: no sample, or its replay went past a limit)."""
        if r.fingerprint in self.refused:
            return None
        found: list[Timing] = []
        for s in self.samples(r):
            try:
                found.append(time_read(self.scratch.reader, s.sql, s.params, runs, self.limit_s, self.memory,
                                       counter=self.scratch.planner))  # fmt: skip
            except ReplayLimit as e:
                self.refused[r.fingerprint] = e.reason
                return None
        if not found:
            return None
        return Timing(statistics.mean(t.ms for t in found), round(statistics.mean(t.steps for t in found)))

    def time_fp(self, fp: str, runs: int | None = None) -> Timing | None:
        """``time`` of the read with fingerprint ``fp``; ``runs`` defaults to the bench's."""
        return self.time(self.reads[fp], runs or self.runs)

    def slower(self, fp: str, before: Timing, after: Timing, confirm: bool = True) -> bool:
        """More work, or a time past the noise margin that a second measurement confirms."""
        if more_work(before, after):
            return True
        if not slower_ms(before, after):
            return False
        if not confirm:
            return True
        again = self.time_fp(fp, 3 * self.runs)
        return again is not None and slower_ms(before, again)


def _count(conn: sqlite3.Connection, sql: str, params: object) -> int:
    try:
        with deadline(conn, STATEMENT_DEADLINE_S):
            return int(conn.execute(sql, bindable(sql, params)).fetchone()[0])
    except (sqlite3.Error, ValueError, OverflowError):
        return 0


def more_work(before: Timing, after: Timing) -> bool:
    """More VM steps past the margin: the same answer on every run."""
    return after.steps > before.steps * STEP_REGRESSION + STEP


def slower_ms(before: Timing, after: Timing) -> bool:
    """Slower by more than the noise margin (time alone)."""
    return after.ms > before.ms * REGRESSION + NOISE_MS
