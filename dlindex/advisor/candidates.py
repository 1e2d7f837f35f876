"""Candidate indexes: derived from what hot statements ask of a table, then merged.

For one access: equality columns first, most selective first (flags last); then one range
column; then the ORDER BY columns when the index can deliver that order. Constants on
low-cardinality columns (``processed = 1``, ``status = 'ok'``) become the WHERE of a
*partial* index instead of leading a full one, and a small column list is appended so the
index *covers* the statement (SQLite 3.40 counts the partial WHERE's columns too). Then
candidates are merged: one whose key is a prefix of another's (up to the order of its
equality columns) is served by that one; partial WHEREs are relaxed to what two
candidates share, an unselective constant filtering inside the index, a selective one
joining the key. Hot statements that no index can serve get a rewrite hint (``hints_for``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from dlindex.advisor.model import Hint, Rejected
from dlindex.advisor.replay import improvable
from dlindex.advisor.scratch import IndexDef
from dlindex.advisor.shapes import Access, Shape, TableInfo
from dlindex.advisor.sqltext import Constant, quote_identifier
from dlindex.advisor.workload import Statement

LOW_CARDINALITY = 20  # at most this many distinct values: a flag or status, never a full index's lead
UNSELECTIVE = 0.5  # a relaxed constant matching at least this share of rows filters inside the index
MAX_INCLUDE = 6  # covering columns appended to a key
COVER_WIDTH = 0.5  # covering only while an entry stays under this share of the table's average row
# A partial index over at most this share of the rows covers whatever its statements read: it stays
# under that share of the table whatever the columns, and a list of the corrupt or failed samples
# (0.2% of 10^8 rows) is then read from ~20 MB of index instead of one table page per row.
SMALL_PARTIAL = 0.005


class Stats(Protocol):
    def rows(self, table: str) -> int: ...
    def distinct(self, table: str, column: str) -> int: ...
    def fraction(self, table: str, constant: Constant) -> float: ...
    def width(self, table: str, column: str) -> float: ...
    def row_width(self, table: str) -> float: ...


@dataclass(frozen=True)
class Candidate:
    table: str
    key: tuple[str, ...]
    eq: int  # how many leading key columns the statements compare for equality
    include: tuple[str, ...]  # appended for covering, order irrelevant to the statements
    where: tuple[Constant, ...]  # partial-index WHERE; () for a full index
    fingerprints: tuple[str, ...]
    weight: float
    free: bool = False  # no seek or order wanted: any index over these rows with these columns will do

    @property
    def columns(self) -> tuple[str, ...]:
        return self.key + self.include

    def where_sql(self) -> str | None:
        return " AND ".join(c.sql() for c in self.where) if self.where else None

    def sql(self, name: str | None = None) -> str:
        cols = ", ".join(quote_identifier(c) for c in self.columns)
        where = self.where_sql()
        text = f"CREATE INDEX {quote_identifier(name or self.name)} ON {quote_identifier(self.table)} ({cols})"
        return text + (f" WHERE {where}" if where else "")

    @property
    def name(self) -> str:
        """``idx_dlindex_<table>_<first columns>_<digest of the definition>``: stable across runs."""
        digest = hashlib.sha1(self.sql("x").encode()).hexdigest()[:8]
        words = "_".join([self.table, *self.key[:3]])
        return "idx_dlindex_" + re.sub(r"[^A-Za-z0-9_]", "_", words)[:48] + "_" + digest


def low_cardinality(stats: Stats, table: str, column: str) -> bool:
    return stats.distinct(table, column) <= LOW_CARDINALITY


def candidate_for(access: Access, fp: str, weight: float, info: TableInfo, stats: Stats) -> Candidate | None:
    """The index one access wants, or None when none helps (a rowid lookup, nothing to seek or order)."""
    table, rowid = access.table, info.rowid or "rowid"
    if rowid in access.equal or rowid in access.in_lists or any(c.column == rowid for c in access.constants):
        return None  # already a primary-key lookup

    def low(column: str) -> bool:
        return low_cardinality(stats, table, column)

    def selective(column: str) -> tuple[bool, int, str]:
        return (low(column), -stats.distinct(table, column), column)

    where = tuple(sorted({c for c in access.constants if low(c.column)}, key=Constant.key))
    if len({c.column for c in where}) != len(where):
        return None  # the same column equal to two constants: matches nothing
    eq = sorted({*access.equal, *(c.column for c in access.constants if not low(c.column))} - {rowid}, key=selective)
    eq += sorted(set(access.in_lists) - set(eq) - {rowid}, key=selective)
    if not where:
        while eq and low(eq[0]):
            eq.pop(0)  # never lead a full index with a flag; it can still filter as a covered column
    key = list(eq)
    ranges = [c for c in access.ranges if c not in key and c != rowid]
    chosen_range = None
    if ranges:
        chosen_range = max(ranges, key=lambda c: (c in access.bounded, stats.distinct(table, c), -ranges.index(c)))
        if not (not key and not where and low(chosen_range)):
            key.append(chosen_range)
        else:
            chosen_range = None
    deliverable = access.order and not access.order_random and not access.order_other
    if deliverable and (chosen_range is None or access.order[0] == chosen_range):
        for column in access.order:
            if column == rowid:
                if not key:
                    key.append(rowid)  # an index in rowid order; after other columns rowid is implied
                break
            if column not in key:
                key.append(column)
    if not where and key and low(key[0]):
        key = []  # an ORDER BY / GROUP BY on a flag: a full index it leads would be a promise broken
    include: list[str] = []
    needed: list[str] = []
    if access.columns is not None:
        needed = [c for c in info.columns if c in access.columns and c not in key and c != rowid]
    coverable = access.columns is not None and len(needed) <= MAX_INCLUDE
    if coverable:
        width = sum(stats.width(table, c) for c in [*key, *needed])
        coverable = width <= COVER_WIDTH * max(stats.row_width(table), 1.0)
    if not coverable and access.columns is not None and where and _share(stats, table, where) <= SMALL_PARTIAL:
        coverable = True
    free = not key
    if not key:
        if not where:
            return None
        others = [c for c in needed if c not in {w.column for w in where}]
        if coverable and others:
            key = [max(others, key=lambda c: (stats.distinct(table, c), -others.index(c)))]
        else:
            key = [where[0].column]
        needed = [c for c in needed if c not in key]
    if coverable:
        include = needed
    return Candidate(table, tuple(key), len(eq), tuple(include), where, (fp,), weight, free)


def _share(stats: Stats, table: str, where: Iterable[Constant]) -> float:
    """The share of the rows a partial index's WHERE keeps (its constants taken as independent)."""
    share = 1.0
    for constant in where:
        share *= stats.fraction(table, constant)
    return share


def merge(candidates: Iterable[Candidate], stats: Stats) -> list[Candidate]:
    """Fewest indexes serving every candidate: duplicates fold, prefixes join their longer index."""
    order = lambda c: (-c.weight, c.sql("x"))  # noqa: E731
    pool = sorted(candidates, key=order)
    while True:
        merged: list[Candidate] = []
        for candidate in pool:
            for i, existing in enumerate(merged):
                combined = combine(existing, candidate, stats)
                if combined is not None:
                    merged[i] = combined
                    break
            else:
                merged.append(candidate)
        if len(merged) == len(pool):
            return sorted(merged, key=order)
        pool = sorted(merged, key=order)


def combine(a: Candidate, b: Candidate, stats: Stats) -> Candidate | None:
    """One candidate serving both, or None."""
    if a.table != b.table:
        return None
    common = tuple(sorted(set(a.where) & set(b.where), key=Constant.key))
    if (a.where or b.where) and not common:
        return None  # never widen partial indexes into a full one
    x, y = relax(a, common, stats), relax(b, common, stats)
    for short, long in ((x, y), (y, x)):
        if serves(long, short.key, short.eq) or (short.free and set(short.columns) <= set(long.columns)):
            include = [c for c in dict.fromkeys(long.include + short.include) if c not in long.key]
            if len(include) > MAX_INCLUDE:
                include = list(long.include if long.weight >= short.weight else short.include)
                include = [c for c in include if c not in long.key]
            # only the leading columns both take in any order stay free (max let a later merge
            # reorder a range column: a per-label seek's index became path_hash-led)
            return Candidate(
                long.table, long.key, min(long.eq, short.eq), tuple(include), common,
                tuple(sorted(set(a.fingerprints) | set(b.fingerprints))), a.weight + b.weight, long.free and short.free,
            )  # fmt: skip
    return None


def relax(c: Candidate, where: tuple[Constant, ...], stats: Stats) -> Candidate:
    """``c`` with its partial WHERE reduced to ``where``; the constants dropped move into the index."""
    extra = [k for k in c.where if k not in where]
    if not extra:
        return c
    key, include, eq = list(c.key), list(c.include), c.eq
    for constant in extra:
        if constant.column in key:
            continue
        if stats.fraction(c.table, constant) >= UNSELECTIVE:
            if constant.column not in include:
                include.append(constant.column)
        else:
            key.insert(eq, constant.column)
            eq += 1
            if constant.column in include:
                include.remove(constant.column)
    return replace(c, key=tuple(key), include=tuple(include), eq=eq, where=where)


def serves(index: Candidate | IndexDef, key: Sequence[str], eq: int) -> bool:
    """Whether ``index``'s leading columns can seek and order like ``key`` (its first ``eq`` in any order)."""
    columns = index.key if isinstance(index, Candidate) else index.columns
    if len(columns) < len(key):
        return False
    return set(columns[:eq]) == set(key[:eq]) and tuple(columns[eq : len(key)]) == tuple(key[eq:])


def existing_serves(index: IndexDef, c: Candidate, stats: Stats) -> bool:
    """An existing index already does what ``c`` would: same or weaker WHERE, prefix key, covers it.

    A weaker WHERE serves only as ``c`` relaxed to it would (as ``merge`` relaxes): each constant
    the index lacks must be in it, as a key column where selective, so that a full ``(id)``
    primary key never stands for a partial ``(id) WHERE processing_status = 'failed'``.
    """
    if index.partial and (index.where is None or not set(index.where) <= set(c.where)):
        return False
    if index.table != c.table:
        return False
    c = relax(c, tuple(k for k in c.where if k in set(index.where or ())), stats)
    if not serves(index, c.key, c.eq):
        return False
    return set(c.include) <= set(index.columns) | {w.column for w in index.where or ()}


def candidates_for(
    accesses: Mapping[str, Sequence[Access]],
    weights: Mapping[str, float],
    tables: Mapping[str, TableInfo],
    stats: Stats,
) -> list[Candidate]:
    """One candidate per (fingerprint, access) that wants an index, duplicates folded."""
    found: dict[tuple[object, ...], Candidate] = {}
    for fp, items in sorted(accesses.items()):
        for access in items:
            info = tables.get(access.table)
            if info is None:
                continue
            c = candidate_for(access, fp, weights[fp], info, stats)
            if c is None:
                continue
            slot = (c.table, c.key, c.eq, c.include, c.where)
            if slot in found:
                old = found[slot]
                fps = tuple(sorted(set(old.fingerprints) | {fp}))
                found[slot] = replace(
                    old, fingerprints=fps, weight=old.weight + (weights[fp] if fp not in old.fingerprints else 0)
                )
            else:
                found[slot] = c
    return list(found.values())


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
