"""The logged reads on the scratch copy: planned and timed, with those stopped at a limit remembered."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from dlindex.advisor.plans import explain
from dlindex.advisor.replay import STEP, ReplayLimit, Timing, time_read
from dlindex.advisor.scratch import Scratch
from dlindex.advisor.shapes import TableInfo
from dlindex.advisor.workload import Statement, Workload
from dlindex.advisor.write_shapes import where_as_select

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

    def plan(self, r: Statement) -> tuple[str, ...]:
        sample = r.samples[0] if r.samples else None
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


def more_work(before: Timing, after: Timing) -> bool:
    """More VM steps past the margin: the same answer on every run."""
    return after.steps > before.steps * STEP_REGRESSION + STEP


def slower_ms(before: Timing, after: Timing) -> bool:
    """Slower by more than the noise margin (time alone)."""
    return after.ms > before.ms * REGRESSION + NOISE_MS
