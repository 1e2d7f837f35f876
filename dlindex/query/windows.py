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


def choose(catalog: Catalog, where: list[str], params: dict[str, Any]) -> list[str]:
    """The filters to run for ``where`` (rows.py's list): as given, closed, or walked (module docstring).

    Adds ``window_end``/``since`` to ``params`` when it closes the window.
    """
    both = closed(where)
    if both is None or catalog.backend.is_server:
        return where
    extra = (
        {"window_end": END_OF_TIME} if END in both else {"since": "0000-01-01 00:00:00"} if SINCE not in where else {}
    )
    probe = _PROBE_SQL.replace("{where}", " AND ".join(both)).replace("{probe}", str(PROBE))
    bound = {**params, **extra}
    try:
        plan = [str(r[3]) for r in catalog.conn.execute("EXPLAIN QUERY PLAN " + probe, bound)]
        if not served(plan):
            return where
        (count,) = catalog.conn.execute(probe, bound).fetchone()
    except sqlite3.Error:
        return where
    if int(count) < PROBE:
        params.update(extra)
        return both
    return [("+" + w) if w in (SINCE, UNTIL) else w for w in where]


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
