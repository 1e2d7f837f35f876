"""The full catalog's planner statistics on a sampled scratch copy, so its plans are the catalog's.

SQLite plans from ``sqlite_stat1`` (this build has no STAT4): per index, its rows and, per
leading column prefix, the average rows sharing a value. ANALYZE on a copy of every k-th row
would say the table holds k times fewer rows and a label's value k times fewer: plans made
for 250,000 rows, not for 10^8. So after every ANALYZE on a sampled copy its statistics are
replaced (``carry``):

* a row the catalog itself has (same table and index: the copy's schema is the catalog's)
  is taken as it is: the full catalog's own measurement, stale or not, is what its planner uses;
* any other (a candidate index built on the copy, a table the catalog never analyzed) is the
  copy's, scaled to the full size: rows x k, and each prefix's rows per value by
  ``a x k^(1 - 1/a)`` (``estimate``): a prefix whose values are all distinct in the sample
  (a = 1) stays distinct, one with few values (a label: a = 250) has k times the rows each.

A catalog never analyzed has no statistics for its planner at all; its copy then has none
either until the advice runs ANALYZE as ``--apply`` will (``scratch.Scratch.analyze``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping

_STAT1 = "SELECT tbl, idx, stat FROM sqlite_stat1"
_HAS_STAT1 = "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'"
_INDEX_SQL = "SELECT name, coalesce(sql, '') FROM sqlite_master WHERE type = 'index'"
# bounds what ANALYZE reads of each index on a big catalog (rows examined, approximately)
ANALYSIS_LIMIT = 1000

Key = tuple[str, str | None]  # (table, index; None: the table's own row count)


def catalog_stat1(conn: sqlite3.Connection) -> dict[Key, str]:
    """The catalog's ``sqlite_stat1`` rows, keyed by (table, index); {} if never analyzed."""
    if not conn.execute(_HAS_STAT1).fetchone():
        return {}
    return {(str(t), None if i is None else str(i)): str(s) for t, i, s in conn.execute(_STAT1)}


def index_definitions(conn: sqlite3.Connection) -> dict[str, str]:
    return {str(name): str(sql) for name, sql in conn.execute(_INDEX_SQL)}


def estimate(stat: str, k: int) -> str:
    """A ``sqlite_stat1`` stat of a 1/k sample scaled to the full table (other tokens kept)."""
    words = stat.split()
    numbers: list[int] = []
    for word in words:
        if not word.isdigit():
            break
        numbers.append(int(word))
    if not numbers:
        return stat
    scaled = [numbers[0] * k]
    for a in numbers[1:]:
        scaled.append(max(1, round(a * k ** (1.0 - 1.0 / max(a, 1)))))
    return " ".join([*map(str, scaled), *words[len(numbers) :]])


def carry(
    conn: sqlite3.Connection,
    k: int,
    sampled: Iterable[str],
    full: Mapping[Key, str],
    same_indexes: Iterable[str],
) -> None:
    """Replace the copy's ``sqlite_stat1`` by the full catalog's, or by estimates scaled from it.

    Args:
        k: the copy holds every k-th row of each table in ``sampled``.
        full: the catalog's own statistics (``catalog_stat1``).
        same_indexes: indexes defined alike in the catalog and on the copy, whose rows of ``full`` hold.
    """
    if not conn.execute(_HAS_STAT1).fetchone():
        return
    tables, same = set(sampled), set(same_indexes)
    rows = conn.execute(_STAT1).fetchall()
    changed = []
    for tbl, idx, stat in rows:
        key: Key = (str(tbl), None if idx is None else str(idx))
        if key in full and (idx is None or idx in same):
            new = full[key]
        elif tbl in tables:
            new = estimate(str(stat), k)
        else:
            continue
        if new != stat:
            changed.append((new, tbl, idx))
    if changed:
        conn.executemany("UPDATE sqlite_stat1 SET stat = ? WHERE tbl = ? AND idx IS ?", changed)
        conn.execute("ANALYZE sqlite_schema")  # reloads the statistics without computing any
