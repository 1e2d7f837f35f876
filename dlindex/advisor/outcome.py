"""What the advice does: no logged read slower, findings on existing indexes, each statement before/after.

The suggestions are tried together and existing indexes without (``together``,
``slower_existing``). "Slower" is against two baselines: the catalog as it is, and the copy
with no secondary index at all (an existing index may already slow a statement down, and a
suggestion must not be excused by it). An index in the plan of a statement that got slower
is dropped, whatever it saves elsewhere; an existing index whose every logged user is faster
without it is reported as *slower*. ``findings()`` reports existing indexes no logged
statement uses (*unused*) and those whose columns lead a better index (*redundant*);
``flag_led`` those led by a flag or status column. ``effects()`` is the report: each logged
statement before and after, and ``suggestion()`` whom each suggestion serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from dlindex.advisor.candidates import LOW_CARDINALITY, Candidate, Stats
from dlindex.advisor.model import Effect, Finding, Rejected, Served, Suggestion
from dlindex.advisor.replay import WRITE_ROWS, Timing, index_names
from dlindex.advisor.scratch import IndexDef
from dlindex.advisor.verification import Bench, Plans, Verdict, more_work, slower_ms, touches
from dlindex.advisor.workload import Statement

ATTEMPTS = 4  # rounds of building the survivors together and dropping what fails


def together(
    bench: Bench, verdicts: list[Verdict], plans_before: Plans
) -> tuple[list[Verdict], dict[str, tuple[str, ...]], dict[str, Timing], list[Rejected]]:
    """Build the survivors together with ANALYZE; drop those no statement chooses or that slow one down.

    Returns the kept verdicts (built on the copy), the plans and times with them, and the rejected.
    """
    rejected: list[Rejected] = []
    for attempt in range(ATTEMPTS):
        for v in verdicts:
            bench.scratch.create(v.candidate.name, v.candidate.sql(v.candidate.name))
        # judged as the advice leaves the catalog: without the existing indexes it makes redundant
        gone = superseded(bench.scratch.indexes(), verdicts)
        with _without(bench, gone):
            bench.scratch.analyze()
            plans_after = bench.plans()
            after, blamed = _replay_changed(bench, verdicts, plans_before, plans_after, gone)
        bench.scratch.analyze()
        kept: list[Verdict] = []
        for v in verdicts:
            name = v.candidate.name
            if not any(name in index_names(plans_after.get(fp, ())) for fp in bench.reads):
                reason = "no logged statement chooses it once the other suggestions exist"
            elif name in blamed:
                reason = "it makes logged statements slower: " + "; ".join(blamed[name])
            else:
                kept.append(v)
                continue
            rejected.append(Rejected(v.candidate.sql(name), v.candidate.fingerprints, reason))
        if len(kept) == len(verdicts) or attempt == ATTEMPTS - 1:
            return kept, plans_after, after, rejected
        for v in verdicts:
            bench.scratch.drop(v.candidate.name)
        verdicts = kept
    raise AssertionError("unreachable")


def _replay_changed(
    bench: Bench, verdicts: Sequence[Verdict], plans_before: Plans, plans_after: Plans, gone: Sequence[IndexDef]
) -> tuple[dict[str, Timing], dict[str, list[str]]]:
    """Times of the reads whose plan changed or that a suggestion was made for; who slowed which down.

    More VM steps than a baseline decides at once (steps do not change with the machine's
    load); a time past the noise margin only when measured again side by side (``_confirm``).
    """
    after: dict[str, Timing] = {}
    names = {v.candidate.name for v in verdicts}
    for fp, r in bench.reads.items():
        wanted = any(fp in v.candidate.fingerprints for v in verdicts)
        if fp not in bench.before or not r.samples or (plans_after.get(fp) == plans_before.get(fp) and not wanted):
            continue
        measured = bench.time(r, bench.runs)
        if measured is not None:
            after[fp] = measured
    # only a read whose plan uses a suggestion can blame one: those are timed with no index too
    bare_needed = [fp for fp in after if fp not in bench.bare and index_names(plans_after.get(fp, ())) & names]
    if bare_needed:
        with no_secondary_indexes(bench):
            bench.bare.update({fp: t for fp in bare_needed if (t := bench.time_fp(fp)) is not None})
    why: dict[str, str] = {}
    suspects: list[str] = []
    for fp, measured in after.items():
        before, bare = bench.before[fp], bench.bare.get(fp)
        if more_work(before, measured):
            why[fp] = f"{fp} {before.steps:,} -> {measured.steps:,} VM steps"
        elif bare is not None and more_work(bare, measured):
            why[fp] = f"{fp} {bare.steps:,} VM steps with no index -> {measured.steps:,}"
        elif slower_ms(before, measured) or (bare is not None and slower_ms(bare, measured)):
            suspects.append(fp)
    why.update(_confirm(bench, suspects, verdicts, gone))
    blamed: dict[str, list[str]] = {}
    for fp in sorted(why):
        for name in sorted(index_names(plans_after.get(fp, ())) & names):
            blamed.setdefault(name, []).append(why[fp])
    return after, blamed


def _confirm(bench: Bench, fps: Sequence[str], verdicts: Sequence[Verdict], gone: Sequence[IndexDef]) -> dict[str, str]:
    """The reads still slower, in time, when the advice, the catalog as it is and no index are timed again in turn.

    Timed one right after the other, three times as often: a load that came or went since the
    first measurements weighs on all three alike.
    """
    if not fps:
        return {}
    scratch, runs = bench.scratch, 3 * bench.runs
    now = {fp: t for fp in fps if (t := bench.time_fp(fp, runs)) is not None}
    for v in verdicts:
        scratch.drop(v.candidate.name)
    for e in gone:
        assert e.sql is not None
        scratch.create(e.name, e.sql)
    try:
        as_is = {fp: t for fp in now if (t := bench.time_fp(fp, runs)) is not None}
    finally:
        for e in gone:
            scratch.drop(e.name)
        for v in verdicts:
            scratch.create(v.candidate.name, v.candidate.sql(v.candidate.name))
    with no_secondary_indexes(bench):
        bare = {fp: t for fp in now if (t := bench.time_fp(fp, runs)) is not None}
    found: dict[str, str] = {}
    for fp, t in now.items():
        if fp in as_is and slower_ms(as_is[fp], t):
            found[fp] = f"{fp} {as_is[fp].ms:,.3f} -> {t.ms:,.3f} ms"
        elif fp in bare and slower_ms(bare[fp], t):
            found[fp] = f"{fp} {bare[fp].ms:,.3f} ms with no index -> {t.ms:,.3f} ms"
    return found


def slower_existing(bench: Bench, existing: Sequence[IndexDef], plans: Plans) -> list[Finding]:
    """Existing indexes whose logged users do less work, in less time, without them (the catalog as it is)."""
    found: list[Finding] = []
    used_by = users(plans)
    for e in existing:
        fps = sorted(fp for fp in used_by.get(e.name, ()) if fp in bench.before)
        if e.constraint or not fps or e.sql is None:
            continue
        with bench.scratch.without(e.name, e.sql):
            without = {fp: t for fp in fps if (t := bench.time_fp(fp)) is not None}
            # a time past the noise margin must hold on a second, longer measurement
            unsure = [fp for fp, t in without.items() if bench.slower(fp, t, bench.before[fp], confirm=False)]
            again = {fp: t for fp in unsure if (t := bench.time_fp(fp, 3 * bench.runs)) is not None}
        # ... compared with the index timed again right after, so that a change of load cancels out
        with_it = {fp: t for fp in again if (t := bench.time_fp(fp, 3 * bench.runs)) is not None}
        gains = [f"{fp} {with_it[fp].ms:,.3f} -> {t.ms:,.3f} ms" for fp, t in again.items()
                 if fp in with_it and bench.slower(fp, t, with_it[fp], confirm=False)]  # fmt: skip
        if gains and len(gains) == len(fps):
            dlindex = e.name.startswith("idx_dlindex_")
            reason = "the logged statements that use it are faster without it: " + "; ".join(gains)
            found.append(
                Finding("slower", e.name, e.table, e.sql, reason, None, dlindex, dlindex, f"DROP INDEX {e.name}")
            )
    return found


def no_secondary_indexes(bench: Bench) -> AbstractContextManager[None]:
    """The scratch copy without any index but those of PRIMARY KEY / UNIQUE, then as it was."""
    return _without(bench, [e for e in bench.scratch.indexes() if e.sql is not None])


def superseded(existing: Sequence[IndexDef], verdicts: Sequence[Verdict]) -> list[IndexDef]:
    """Existing full indexes whose columns lead a full suggestion: the advice reports them redundant."""
    return [e for e in existing if e.sql is not None and not e.partial and e.name not in {v.candidate.name for v in verdicts}
            and any(c.table == e.table and not c.where and tuple(c.columns[: len(e.columns)]) == e.columns
                    for c in (v.candidate for v in verdicts))]  # fmt: skip


@contextmanager
def _without(bench: Bench, indexes: Sequence[IndexDef]) -> Iterator[None]:
    with ExitStack() as stack:
        for e in indexes:
            assert e.sql is not None  # never a constraint's
            stack.enter_context(bench.scratch.without(e.name, e.sql))
        yield


def findings(
    existing: Sequence[IndexDef], kept: Sequence[Candidate], before: Mapping[str, tuple[str, ...]],
    after: Mapping[str, tuple[str, ...]], hot: set[str], reads: Mapping[str, Statement],
) -> tuple[list[Finding], list[Finding]]:  # fmt: skip
    """Existing indexes no logged statement uses, and those whose columns lead a better index."""
    unused: list[Finding] = []
    redundant: list[Finding] = []
    users_before, users_after = users(before), users(after)
    others = [(e.name, e.table, e.columns, where_key(e.where, e.partial)) for e in existing]
    others += [(c.name, c.table, c.columns, frozenset(w.sql() for w in c.where)) for c in kept]
    for e in existing:
        if e.constraint:
            continue
        dlindex = e.name.startswith("idx_dlindex_")
        used_before, used_after = users_before.get(e.name, set()), users_after.get(e.name, set())
        mine = where_key(e.where, e.partial)
        better = reason = None
        strict = False
        for name, table, columns, where in others:
            if name == e.name or table != e.table or tuple(columns[: len(e.columns)]) != e.columns:
                continue
            if not where or where == mine:
                strict = True
                better = name
                reason = (
                    f"duplicate of {name}"
                    if len(columns) == len(e.columns) and where == mine
                    else f"its columns lead {name}"
                )
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


def where_key(where: Iterable[Any] | None, partial: bool) -> frozenset[str]:
    if not partial:
        return frozenset()
    return frozenset(c.sql() for c in where or ()) or frozenset({"?"})


def users(plans: Mapping[str, tuple[str, ...]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for fp, plan in plans.items():
        for name in index_names(plan):
            found.setdefault(name, set()).add(fp)
    return found


def flag_led(existing: Sequence[IndexDef], stats: Stats) -> list[Finding]:
    """Full indexes whose first column is a flag or status (few distinct values), used or not.

    Each value of such a column matches a large share of the rows, so the index mostly costs
    writes and space; a partial index (``WHERE processed = 0``) serves the rare value for less.
    """
    found: list[Finding] = []
    for e in existing:
        if e.constraint or e.partial or not e.columns:
            continue
        distinct = stats.distinct(e.table, e.columns[0])
        if distinct > LOW_CARDINALITY:
            continue
        dlindex = e.name.startswith("idx_dlindex_")
        reason = (f"a full index led by {e.columns[0]}, which has {distinct} distinct value(s): each matches a large "
                  f"share of the rows; a partial index (WHERE {e.columns[0]} = <the rare value>) serves the rare "
                  "value for a fraction of the size and write cost")  # fmt: skip
        found.append(Finding("low_cardinality", e.name, e.table, e.sql or "", reason, None, dlindex, dlindex,
                             f"DROP INDEX {e.name}"))  # fmt: skip
    return found


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
