"""Findings on existing indexes: unused ones, those whose columns lead a better index, those led by a flag."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dlindex.advisor.candidates import LOW_CARDINALITY, Candidate, Stats
from dlindex.advisor.model import Finding
from dlindex.advisor.plans import index_names
from dlindex.advisor.scratch import IndexDef
from dlindex.advisor.workload import Statement


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
