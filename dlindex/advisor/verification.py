"""One candidate built alone on the copy: kept if it saves reads more work than it adds to writes.

The decision is made on VM steps, which do not change from run to run (a write's changed
pages weighed in); the times are measured alongside and reported, never decide.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlindex.advisor.bench import Bench
from dlindex.advisor.candidates import Candidate
from dlindex.advisor.plans import index_names
from dlindex.advisor.replay import Timing
from dlindex.advisor.write_cost import WRITE_ROWS

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
