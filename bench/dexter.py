"""Dexter's method on the same workload, for comparison with dlindex's advice on PostgreSQL (a benchmark).

``bench_index_postgres.py`` compares dlindex's suggestions with Dexter's set; ``dexter_for``
computes that set for a server catalog from the same logged statements (dlindex's query log
joined with pg_stat_statements), with hypothetical indexes only (hypopg): nothing is built
here. The bench then builds each set itself, on its own database, to time it.

Dexter (github.com/ankane/dexter, the automatic indexer for Postgres) is re-implemented here
as its documented rule, not run: for the statements of the workload it creates a
hypothetical single-column index on every column their WHERE, JOIN and ORDER BY use, plans
each statement, then adds every two-column index of those columns (per statement and
table) and plans again. A statement keeps the hypothetical indexes of its cheaper plan when
its planner cost is at least ``MIN_COST`` and they save at least ``MIN_SAVINGS`` of it. No
partial, covering or write-aware indexes, and no timing: planner cost decides alone.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dlindex import Catalog
from dlindex.advisor.server_plans import Hypothetical, Plan, explain, indexes, tables
from dlindex.advisor.server_workload import Run, check_statistics, ensure_hypopg, load_server_workload
from dlindex.advisor.shapes import Access, analyze
from dlindex.advisor.sqltext import quote_identifier

MIN_COST = 100.0
MIN_SAVINGS = 0.5
RULE = (f"planner cost >= {MIN_COST:g} and a saving >= {MIN_SAVINGS:.0%}, single and two-column indexes of the WHERE, "
        "JOIN and ORDER BY columns")  # fmt: skip


@dataclass(frozen=True)
class DexterIndex:
    table: str
    columns: tuple[str, ...]
    fingerprints: tuple[str, ...]

    @property
    def name(self) -> str:
        return "dexter_" + "_".join((self.table, *self.columns))[:55]

    def sql(self, name: str | None = None) -> str:
        cols = ", ".join(quote_identifier(c) for c in self.columns)
        return f"CREATE INDEX {quote_identifier(name or self.name)} ON {quote_identifier(self.table)} ({cols})"


@dataclass(frozen=True)
class DexterVerdict:
    fingerprint: str
    cost_before: float
    cost_after: float
    indexes: tuple[str, ...]  # CREATE INDEX statements it keeps for this statement
    kept: bool

    def as_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "cost_before": round(self.cost_before, 2),
                "cost_after": round(self.cost_after, 2), "indexes": list(self.indexes), "kept": self.kept}  # fmt: skip


def columns_of(access: Access) -> tuple[str, ...]:
    """What Dexter indexes for one table of a statement: its WHERE, JOIN and ORDER BY columns."""
    found = [*access.equal, *(c.column for c in access.constants), *access.in_lists, *access.ranges, *access.order]
    return tuple(dict.fromkeys(found))


def dexter_advice(
    hypo: Hypothetical,
    statements: Mapping[str, tuple[Sequence[Access], Run]],
    before: Mapping[str, Plan],
    existing: Sequence[tuple[str, tuple[str, ...]]] = (),
) -> tuple[list[DexterIndex], list[DexterVerdict]]:
    """Dexter's indexes for ``statements`` (fingerprint -> accesses, the run it is planned with);
    a candidate an ``existing`` (table, columns) index already leads with is not tried, as Dexter does."""
    singles: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    pairs: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for fp, (accesses, _run) in statements.items():
        for access in accesses:
            cols = columns_of(access)
            for c in cols:
                singles.setdefault((access.table, (c,)), set()).add(fp)
            for a, b in itertools.permutations(cols, 2):
                pairs.setdefault((access.table, (a, b)), set()).add(fp)
    for batch in (singles, pairs):
        for table, cols in list(batch):
            if any(t == table and c[: len(cols)] == cols for t, c in existing):
                del batch[(table, cols)]
    rounds: list[dict[str, Plan]] = []
    names: dict[str, tuple[str, tuple[str, ...]]] = {}
    hypo.reset()
    try:
        for batch in (singles, pairs):
            for key in sorted(batch):
                table, cols = key
                names[hypo.create(DexterIndex(table, cols, ()).sql("x"))[1]] = key
            rounds.append({fp: explain(hypo.conn, run) for fp, (_a, run) in statements.items()})
    finally:
        hypo.reset()
    chosen: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    verdicts = []
    for fp in sorted(statements):
        first, second = rounds[0][fp], rounds[1][fp]
        best = second if second.cost < first.cost else first
        used = sorted(names[n] for n in best.indexes if n in names)
        cost = before[fp].cost
        kept = bool(used) and cost >= MIN_COST and best.cost <= cost * (1 - MIN_SAVINGS)
        if kept:
            for key in used:
                chosen.setdefault(key, set()).add(fp)
        ddl = tuple(DexterIndex(t, c, ()).sql() for t, c in used)
        verdicts.append(DexterVerdict(fp, cost, best.cost, ddl, kept))
    found = [DexterIndex(t, c, tuple(sorted(fps))) for (t, c), fps in sorted(chosen.items())]
    return found, verdicts


def dexter_for(url: str) -> tuple[list[DexterIndex], list[DexterVerdict]]:
    """Dexter's set for the logged reads of the server catalog at ``url``, and its verdict on each."""
    with Catalog(url, log=False) as catalog:
        conn = catalog.conn
        _database, major = check_statistics(conn)
        work = load_server_workload(conn)
        ensure_hypopg(conn, major)
        infos, existing = tables(conn), indexes(conn)
        statements: dict[str, tuple[Sequence[Access], Run]] = {}
        plans: dict[str, Plan] = {}
        for fp, s in sorted(work.reads.items()):
            if not s.runs:
                continue
            try:
                plans[fp] = explain(conn, s.runs[0])
            except sqlite3.Error:
                continue  # cannot be planned: dlindex's advice reports it as skipped
            statements[fp] = (analyze(s.statement.sql, infos).accesses, s.runs[0])
        full = [(e.table, e.columns) for e in existing if not e.partial]
        return dexter_advice(Hypothetical(conn), statements, plans, full)
