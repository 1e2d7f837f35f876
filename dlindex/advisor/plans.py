"""Query plans of logged reads: EXPLAIN QUERY PLAN under a deadline, and what a plan says."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from dlindex.advisor.replay import RELOAD_SCHEMA, STATEMENT_DEADLINE_S, bindable, deadline
from dlindex.catalog.recorder import classify_plan


def explain(conn: sqlite3.Connection, sql: str, params: Any = ()) -> tuple[str, ...] | None:
    """EXPLAIN QUERY PLAN lines of one read, or None if SQLite refuses it."""
    try:
        conn.execute(RELOAD_SCHEMA).fetchall()
        with deadline(conn, STATEMENT_DEADLINE_S):
            return tuple(str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, bindable(sql, params)))
    except (sqlite3.Error, ValueError, OverflowError):
        return None


def index_names(plan: Sequence[str]) -> set[str]:
    """Indexes a plan uses by name."""
    names: set[str] = set()
    for line in plan:
        for marker in ("USING COVERING INDEX ", "USING INDEX "):
            at = line.find(marker)
            if at >= 0:
                names.add(line[at + len(marker) :].split(" ", 1)[0])
                break
    return names


def improvable(plan: Sequence[str]) -> bool:
    """The plan reads a table in full or sorts in a temporary B-tree."""
    return classify_plan(plan) == "scan" or any("TEMP B-TREE" in line or "AUTOMATIC" in line for line in plan)
