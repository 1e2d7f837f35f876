"""``--since``/``--until``: a time window read from an index where it is narrow, in id order where it is wide.

SQLite keeps no histogram here (no STAT4), so it guesses that ``created_at >= ?`` keeps a
quarter of the rows: with ``ORDER BY id LIMIT n`` it then walks the table in id order, which
is quick for a wide window and reads every row for a narrow or empty one (``--since 1d`` on
a catalog scanned months ago: minutes at 10^8 rows). Where an index on ``created_at`` serves
the window (``dlindex index`` creates one for logged time-window reads), a bounded count
through it (at most ``PROBE`` entries) tells which window this is:

* fewer than ``PROBE`` rows (narrow): the window closed on both sides (``created_at <=
  :window_end``, the end of time when ``--until`` is not given), which SQLite reads as an
  index range and sorts: at most ``PROBE`` rows whatever the catalog's size;
* ``PROBE`` rows or more (wide): the window's terms as ``+created_at``, which no index serves,
  so the table is walked in id order: with ``--limit n`` about ``n x rows / window`` rows.

Both give the same rows in the same order as the plain statement, which is what runs where
no index serves the window (and on a server catalog, whose planner has histograms).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

PROBE = 20_000  # index entries counted at most to tell a narrow window from a wide one
SINCE = "image_metadata.created_at >= :since"  # rows.py's fragments
UNTIL = "image_metadata.created_at < :until"
END = "image_metadata.created_at <= :window_end"
END_OF_TIME = "9999-12-31 23:59:59"  # after every created_at dlindex writes ('YYYY-MM-DD HH:MM:SS')
_PROBE_SQL = "SELECT count(*) FROM (SELECT 1 FROM image_metadata WHERE {where} LIMIT {probe})"
_IDS = "SELECT image_metadata.id FROM image_metadata WHERE {where}"
_TABLE_ROOT = "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = 'image_metadata'"
# SQLite's opcodes that read a row through their cursor (P1): on the table's, a page per row.
_ROW_READS = frozenset({"Column", "Rowid", "SeekRowid", "NotExists", "Found", "NotFound", "Rewind", "Next",
                        "Prev", "Last", "SeekGE", "SeekGT", "SeekLE", "SeekLT", "RowData", "Offset"})  # fmt: skip


def closed(where: Sequence[str]) -> list[str] | None:
    """The filters with the window closed on both sides (None: no ``--since``/``--until``, or both given)."""
    if SINCE not in where and UNTIL not in where:
        return None
    if SINCE in where and UNTIL in where:
        return list(where)
    return [*where, END] if UNTIL not in where else [*where, SINCE]


def served(plan: Sequence[str]) -> bool:
    """Whether a plan reads image_metadata through an index range on created_at."""
    return any(
        line.startswith("SEARCH image_metadata USING") and "INDEX" in line and "created_at" in line for line in plan
    )


def choose(catalog: Catalog, where: list[str], params: dict[str, Any]) -> tuple[list[str], bool]:
    """The filters to run for ``where`` (rows.py's list): as given, closed, or walked (module
    docstring); and whether the window is narrow (closed: fewer than PROBE rows, counted).

    Adds ``window_end``/``since`` to ``params`` when it closes the window.
    """
    both = closed(where)
    if both is None or catalog.backend.is_server:
        return where, False
    extra = (
        {"window_end": END_OF_TIME} if END in both else {"since": "0000-01-01 00:00:00"} if SINCE not in where else {}
    )
    probe = _PROBE_SQL.replace("{where}", " AND ".join(both)).replace("{probe}", str(PROBE))
    bound = {**params, **extra}
    try:
        plan = [str(r[3]) for r in catalog.conn.execute("EXPLAIN QUERY PLAN " + probe, bound)]
        if not served(plan):
            return where, False
        (count,) = catalog.conn.execute(probe, bound).fetchone()
    except sqlite3.Error:
        return where, False
    if int(count) < PROBE:
        params.update(extra)
        return both, True
    return [("+" + w) if w in (SINCE, UNTIL) else w for w in where], False


def ids_from_index(catalog: Catalog, where: Sequence[str], params: dict[str, Any]) -> str | None:
    """A narrow window's ids, read from its ``created_at`` index alone (each entry holds its
    rowid; the partial index implies the other filters), for dlindex.query.fetch to read their
    rows by id; None where the plan would read table rows for them (another filter)."""
    sql = _IDS.replace("{where}", " AND ".join(where))
    try:
        plan = [str(r[3]) for r in catalog.conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
        program = list(catalog.conn.execute("EXPLAIN " + sql, params))
        (root,) = catalog.conn.execute(_TABLE_ROOT).fetchone()
    except sqlite3.Error:
        return None
    if len(plan) != 1 or not served(plan):
        return None
    # The plan says "USING INDEX" where the partial index implies a filter it does not hold
    # (status, excluded); the program shows whether a table row is read: the table's cursor
    # is opened for a deferred seek that only a column of the row would make.
    table = {op[2] for op in program if op[1] == "OpenRead" and op[3] == root}
    return None if any(op[1] in _ROW_READS and op[2] in table for op in program) else sql


def closed_of(sql: str, params: Any) -> tuple[str, dict[str, Any]] | None:
    """A logged plain window statement closed on both sides, with its parameters: what
    ``dlindex query`` runs for a narrow window once an index serves it; None if ``sql`` is none."""
    if not isinstance(params, dict) or "+" + SINCE in sql or "+" + UNTIL in sql or END in sql:
        return None
    has_since, has_until = SINCE in sql, UNTIL in sql
    if has_since == has_until or " FROM image_metadata WHERE " not in sql:
        return None  # neither (no window) or both (already closed)
    term, extra = (END, {"window_end": END_OF_TIME}) if has_since else (SINCE, {"since": "0000-01-01 00:00:00"})
    anchor = UNTIL if has_until else SINCE
    return sql.replace(anchor, f"{anchor} AND {term}", 1), {**params, **extra}


def walked(sql: str) -> str:
    """``sql`` with its window's terms hidden from indexes: what ``dlindex query`` runs for a wide window."""
    return sql.replace(SINCE, "+" + SINCE).replace(UNTIL, "+" + UNTIL)


_STATEMENT = re.compile(r"SELECT .+? FROM image_metadata WHERE (?P<where>.+?)(?: ORDER BY .*)?(?: LIMIT .*)?", re.S)


def probe_of(sql: str, probe: int) -> str | None:
    """The bounded count ``choose`` makes, for a window statement ``sql``: fewer than ``probe`` is narrow."""
    m = _STATEMENT.fullmatch(sql)
    if m is None:
        return None
    return _PROBE_SQL.replace("{where}", m["where"]).replace("{probe}", str(int(probe)))
