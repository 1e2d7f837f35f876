"""Statistics of the scratch copy that candidate indexes are chosen by: rows, distinct values, widths."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar, cast

from dlindex.advisor.sqltext import Constant, Value, quote_identifier

T = TypeVar("T")

_BYTES = "SELECT sum(pgsize) FROM dbstat WHERE name = ?"  # of a table or an index
_HAS_STAT1 = "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'"
# ANALYZE also writes a row with idx NULL (the table's row count) for a table without indexes
_STAT1 = "SELECT idx, stat FROM sqlite_stat1 WHERE tbl = ? AND idx IS NOT NULL ORDER BY idx"
_PARTIAL = "SELECT 1 FROM pragma_index_list(?) WHERE name = ? AND partial"


def has_stat1(conn: sqlite3.Connection) -> bool:
    """Whether ANALYZE has ever run on ``conn``'s database (``sqlite_stat1`` exists)."""
    return bool(conn.execute(_HAS_STAT1).fetchone())


class CopyStatistics:
    """Measured on the copy once each, until the indexes change (``clear``)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._cache: dict[tuple[str, str], object] = {}

    def clear(self) -> None:
        self._cache.clear()

    def rows(self, table: str) -> int:
        def count() -> int:
            return int(self.conn.execute(f"SELECT count(*) FROM {quote_identifier(table)}").fetchone()[0])

        return self._cached(table, "", count)

    def distinct(self, table: str, column: str) -> int:
        def count() -> int:
            # an index's sqlite_stat1 row says it without a scan: rows / rows per value of its lead
            for idx, stat in self.conn.execute(_STAT1, (table,)).fetchall() if has_stat1(self.conn) else ():
                if self.conn.execute(_PARTIAL, (table, idx)).fetchone():
                    continue  # its counts cover only the rows of its WHERE
                if self._index_columns(idx)[:1] == (column,) and stat:
                    parts = str(stat).split()
                    if len(parts) >= 2 and int(parts[1]) > 0:
                        return max(1, int(parts[0]) // int(parts[1]))
            c, t = quote_identifier(column), quote_identifier(table)
            q = f"SELECT count(DISTINCT {c}) + max(count(*) > count({c}), 0) FROM {t}"
            return int(self.conn.execute(q).fetchone()[0] or 0)

        return self._cached(table, "distinct:" + column, count)

    def fraction(self, table: str, constant: Constant) -> float:
        def share() -> float:
            q = f"SELECT count(*) FROM {quote_identifier(table)} WHERE {quote_identifier(constant.column)} IS ?"
            return int(self.conn.execute(q, (constant.value,)).fetchone()[0]) / max(1, self.rows(table))

        return self._cached(table, f"fraction:{constant.column}={constant.value!r}", share)

    def width(self, table: str, column: str) -> float:
        def average() -> float:
            c, t = quote_identifier(column), quote_identifier(table)
            q = f"SELECT avg(coalesce(length({c}), 0)) FROM (SELECT {c} FROM {t} LIMIT 10000)"
            return float(self.conn.execute(q).fetchone()[0] or 0.0) + 1.0

        return self._cached(table, "width:" + column, average)

    def row_width(self, table: str) -> float:
        def average() -> float:
            size = self.conn.execute(_BYTES, (table,)).fetchone()[0] or 0
            return float(size) / max(1, self.rows(table))

        return self._cached(table, "row_width", average)

    def frequent_values(self, table: str, column: str) -> list[Value]:
        def top() -> list[Value]:
            c, t = quote_identifier(column), quote_identifier(table)
            q = f"SELECT {c} FROM {t} GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 2"
            return [r[0] for r in self.conn.execute(q)]

        return list(self._cached(table, "top:" + column, top))

    def index_size(self, name: str) -> int:
        return int(self.conn.execute(_BYTES, (name,)).fetchone()[0] or 0)

    def _cached(self, table: str, key: str, compute: Callable[[], T]) -> T:
        slot = (table, key)
        if slot not in self._cache:
            self._cache[slot] = compute()
        return cast(T, self._cache[slot])  # each key is always computed by the same function

    def _index_columns(self, name: str) -> tuple[str, ...]:
        return tuple(r[2] for r in self.conn.execute(f"PRAGMA index_info({quote_identifier(name)})"))
