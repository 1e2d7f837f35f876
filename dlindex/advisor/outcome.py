"""No logged read may get slower: the suggestions tried together, existing indexes tried without.

"Slower" is against two baselines: the catalog as it is, and the copy with no secondary index
at all (an existing index may already slow a statement down, and a suggestion must not be
excused by it). An index in the plan of a statement that got slower is dropped, whatever it
saves elsewhere; an existing index whose every logged user is faster without it is reported
as *slower*.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager

from dlindex.advisor.bench import Bench, Plans, more_work, slower_ms
from dlindex.advisor.findings import users
from dlindex.advisor.model import Finding, Rejected
from dlindex.advisor.plans import index_names
from dlindex.advisor.replay import Timing
from dlindex.advisor.scratch import IndexDef
from dlindex.advisor.verify import Verdict

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
