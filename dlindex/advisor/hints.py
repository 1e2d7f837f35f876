"""Rewrite hints for hot statements that no index serves."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from dlindex.advisor.candidates import Candidate, Stats, low_cardinality
from dlindex.advisor.model import Hint, Rejected
from dlindex.advisor.plans import improvable
from dlindex.advisor.shapes import Shape, TableInfo
from dlindex.advisor.workload import Statement


def hints_for(
    hot: Sequence[str], rarer: Sequence[str], shapes: Mapping[str, Shape], reads: Mapping[str, Statement],
    weights: Mapping[str, float],
    plans: Mapping[str, tuple[str, ...]], served: Iterable[str], rejected: Sequence[Rejected],
    candidates: Mapping[str, Candidate], stats: Stats, tables: Mapping[str, TableInfo],
) -> list[Hint]:  # fmt: skip
    """One hint per hot fingerprint that still scans or sorts with every suggestion in place.

    ``rarer`` statements (not hot, yet not negligible) get only the hints read off their text.
    """
    done = set(served)
    hints: list[Hint] = []
    for fp in [*hot, *rarer]:
        is_hot = fp in hot
        plan = plans.get(fp, ())
        r = reads[fp]
        whole_random = any(a.order_random and not a.filtered for a in shapes[fp].accesses)
        if not whole_random and (fp in done or (plan and not improvable(plan))):
            continue
        texts: list[str] = []
        if not r.samples and is_hot:
            texts.append("no parameter values were logged with it, so it cannot be timed")
        for access in shapes[fp].accesses:
            info = tables.get(access.table)
            rowid = (info.rowid if info else None) or "rowid"
            table = access.table
            if access.order_random and not access.filtered:
                texts.append(
                    f"ORDER BY random() reads and sorts all {stats.rows(table):,} rows of {table} to keep a few, and no "
                    f"index can avoid that; draw ids instead: WHERE {rowid} IN (SELECT abs(random()) % "
                    f"(SELECT max({rowid}) FROM {table}) + 1 FROM {table} LIMIT 2 * N) LIMIT N, or shuffle an id list once"
                )  # fmt: skip
            for column in access.equal:
                if low_cardinality(stats, table, column) and column != rowid:
                    texts.append(f"{column} (a few distinct values) is compared with a parameter; compare it with a "
                                 f"constant ({column} = 1) so a partial index can serve it")  # fmt: skip
            open_ranges = [c for c in access.ranges if c not in access.bounded]
            if open_ranges and access.order and access.order[0] not in access.ranges:
                column = open_ranges[0]
                texts.append(
                    f"without STAT4 statistics SQLite assumes the open range on {column} keeps a quarter of the rows and "
                    f"prefers reading {table} in ORDER BY {access.order[0]} order; bound it on both sides "
                    f"({column} >= ? AND {column} < ?) or ORDER BY {column} so an index on {column} serves it"
                )  # fmt: skip
        texts += shapes[fp].notes
        texts += [f"no index pays off: {x.reason}" for x in rejected if fp in x.fingerprints]
        if not texts and plan and improvable(plan) and is_hot:
            tables_read = ", ".join(sorted({a.table for a in shapes[fp].accesses}))
            if tables_read and not any(fp in c.fingerprints for c in candidates.values()):
                texts.append(f"it reads every row of {tables_read} and no index makes that cheaper; "
                             "if it runs this often, keep its result instead of asking again")  # fmt: skip
        if texts:
            hints.append(Hint(fp, r.sql, r.calls, None if r.mean_ms is None else round(r.mean_ms, 3),
                              "; ".join(dict.fromkeys(texts))))  # fmt: skip
    hints.sort(key=lambda h: (-weights.get(h.fingerprint, 0.0), h.fingerprint))
    return hints
