"""The advice's report: each logged statement before and after, and whom each suggestion serves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dlindex.advisor.bench import Bench, Plans, slower_ms
from dlindex.advisor.model import Effect, Served, Suggestion
from dlindex.advisor.plans import index_names
from dlindex.advisor.replay import Timing
from dlindex.advisor.verify import Verdict, touches
from dlindex.advisor.workload import Statement
from dlindex.advisor.write_cost import WRITE_ROWS

MIN_SPEEDUP = 1.1  # a statement this much faster is "faster" in the report


def effects(
    bench: Bench, verdicts: Sequence[Verdict], plans_before: Plans, plans_after: Plans, after: Mapping[str, Timing]
) -> list[Effect]:
    """Every logged statement before and after the accepted set (writes: per call, from WRITE_ROWS-row runs)."""
    found: list[Effect] = []
    for fp, r in bench.reads.items():
        b = bench.before.get(fp)
        if b is None:
            found.append(Effect(fp, "read", r.sql, r.calls, None, None, bench.refused.get(fp, "not timed")))
            continue
        a = after.get(fp) or b
        if plans_after.get(fp) == plans_before.get(fp) and fp not in after:
            note = "same plan"
        else:
            note = "faster" if a.ms * MIN_SPEEDUP < b.ms else "slower" if slower_ms(b, a) else "about the same"
        found.append(Effect(fp, "read", r.sql, r.calls, round(b.ms, 3), round(a.ms, 3), note))
    for table in sorted({w.table for w in bench.workload.writes if w.table in bench.tables}):
        found += _write_effects(bench, table, verdicts)
    return found


def _write_effects(bench: Bench, table: str, verdicts: Sequence[Verdict]) -> list[Effect]:
    """The logged writes of ``table``, measured with and without the suggestions on it."""
    scratch, info = bench.scratch, bench.tables[table]
    writes = [w for w in bench.workload.writes if w.table == table]
    columns = tuple(sorted({c for w in writes for col in (w.set_columns or ()) if (c := info.canonical(col))}))
    scratch.writes.pick_rows(table, info)
    mine = [v.candidate for v in verdicts if v.candidate.table == table]
    with_set = scratch.writes.measure(table, info, columns)
    for candidate in mine:
        scratch.drop(candidate.name)
    without = scratch.writes.measure(table, info, columns) if mine else with_set
    for candidate in mine:
        scratch.create(candidate.name, candidate.sql(candidate.name))
    found: list[Effect] = []
    for w in writes:
        pick = 0 if w.set_columns is None else 1
        b, a = without[pick], with_set[pick]
        if w.sql.lstrip()[:6].lower() not in ("insert", "update", "replac") or b is None or a is None:
            found.append(Effect(w.fingerprint, "write", w.sql, w.calls, None, None,
                                "not measured (only INSERT and UPDATE are)"))  # fmt: skip
            continue
        found.append(_write_effect(bench, w, b, a, verdicts))
    return found


def _write_effect(bench: Bench, w: Statement, b: Timing, a: Timing, verdicts: Sequence[Verdict]) -> Effect:
    table = w.table
    assert table is not None  # only writes of a known table are measured
    # the measurement wrote WRITE_ROWS rows, or the whole table when it is smaller
    per_call = (w.rows or w.calls) / max(w.calls, 1) / max(1, min(WRITE_ROWS, bench.scratch.stats.rows(table)))
    sets = {bench.tables[table].canonical(c) for c in w.set_columns or ()}
    touched = any(v.candidate.table == table and (w.set_columns is None or sets & touches(v.candidate))
                  for v in verdicts)  # fmt: skip
    change = "counted against the suggestions" if touched else "unchanged"
    return Effect(w.fingerprint, "write", w.sql, w.calls, round(b.ms * per_call, 4), round(a.ms * per_call, 4), change)


def suggestion(bench: Bench, v: Verdict, after: Mapping[str, Timing], plans: Plans) -> Suggestion:
    """What ``v`` is reported as: its index, the statements it serves, before and after, and its costs."""
    name = v.candidate.name
    served: list[Served] = []
    for fp in sorted(bench.reads, key=lambda f: (-bench.reads[f].calls, f)):
        if name in index_names(plans.get(fp, ())) and fp in after and fp in bench.before:
            r = bench.reads[fp]
            served.append(Served(fp, r.sql, r.calls, round(bench.before[fp].ms, 3), round(after[fp].ms, 3)))
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
