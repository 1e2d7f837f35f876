"""What an index adds to writes: timed, step-counted inserts and updates on the copy, rolled back."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dlindex.advisor.copy_stats import CopyStatistics
from dlindex.advisor.replay import STEP, StepCounter, Timing
from dlindex.advisor.shapes import TableInfo
from dlindex.advisor.sqltext import quote_identifier

WRITE_ROWS = 10_000  # rows each measured insert and update writes
# What writing a page costs, in VM steps: a changed page is journaled and written back, which
# takes as long as some thousand instructions; with it a write's steps weigh like its time.
PAGE_STEPS = 1000


class WriteCosts:
    """Inserts and updates of WRITE_ROWS rows on the copy, each in a transaction rolled back."""

    def __init__(self, conn: sqlite3.Connection, path: Path, stats: CopyStatistics) -> None:
        self.conn = conn
        self.path = path  # of the copy: its rollback journal tells the pages a write changed
        self.stats = stats
        self._counted = 0

    def pick_rows(self, table: str, info: TableInfo) -> None:
        """The WRITE_ROWS rows, spread over ``table``, that update measurements change."""
        step = max(1, self.stats.rows(table) // WRITE_ROWS)
        t = quote_identifier(table)
        self.conn.execute("DROP TABLE IF EXISTS temp.dlindex_rows")
        if not info.primary_key:
            self.conn.execute(
                f"CREATE TEMP TABLE dlindex_rows AS SELECT rowid AS rowid FROM {t} WHERE rowid % {step} = 0 LIMIT {WRITE_ROWS}"
            )
            return
        key = _row_key(info)  # WITHOUT ROWID: every step-th row in key order
        self.conn.execute(
            f"CREATE TEMP TABLE dlindex_rows AS SELECT {key} FROM (SELECT {key}, row_number() OVER (ORDER BY {key}) AS n"
            f" FROM {t}) WHERE n % {step} = 0 LIMIT {WRITE_ROWS}"
        )

    def measure(
        self, table: str, info: TableInfo, columns: Sequence[str], runs: int = 3
    ) -> tuple[Timing | None, Timing | None]:
        """Fastest of ``runs``: inserting WRITE_ROWS rows, and updating ``columns`` of the picked rows."""
        return (
            self._fastest(lambda counted: self._insert(table, info, counted), runs),
            self._fastest(lambda counted: self._update(table, info, columns, counted), runs),
        )

    def _fastest(self, run: Callable[[bool], None], runs: int) -> Timing | None:
        times = []
        count = StepCounter()
        for i in range(runs):
            last = i == runs - 1  # the count is the same every run: once is enough
            self.conn.execute("BEGIN")
            if last:
                self.conn.set_progress_handler(count, STEP)
            try:
                started = time.perf_counter()
                run(last)
                times.append((time.perf_counter() - started) * 1000.0)
                if last:
                    count.steps += PAGE_STEPS * self._journaled_pages()
            except sqlite3.Error:
                return None
            finally:
                self.conn.set_progress_handler(None, 0)
                self.conn.execute("ROLLBACK")
        return Timing(min(times), count.steps)  # the least disturbed run: other processes only ever add time

    def _journaled_pages(self) -> int:
        """Pages the open write transaction changed: each is copied to the rollback journal once."""
        try:
            size = os.path.getsize(str(self.path) + "-journal")
        except OSError:
            return 0
        page = int(self.conn.execute("PRAGMA page_size").fetchone()[0])
        return max(0, size - 512) // (page + 8)  # a header sector, then page number + page + checksum

    def _fresh(self, sql: str, counted: bool) -> str:
        """``sql``, as a statement never prepared before when its steps are counted (an exact count)."""
        if not counted:
            return sql
        self._counted += 1
        return f"{sql} /* dlindex count {self._counted} */"

    def _insert(self, table: str, info: TableInfo, counted: bool = False) -> None:
        """Copies of existing rows under new rowids, unique columns made unique again."""
        unique: set[str] = set()
        for row in self.conn.execute(f"PRAGMA index_list({quote_identifier(table)})").fetchall():
            if row[2]:  # a UNIQUE constraint or index, or the key of a rowid table keyed by several columns
                keys = [r[2] for r in self.conn.execute(f"PRAGMA index_info({quote_identifier(row[1])})")]
                unique.add(keys[-1])
        t = quote_identifier(table)
        if info.primary_key:  # WITHOUT ROWID: its key made unique like a unique index's, above the largest value
            unique.add(info.primary_key[-1])
            q = quote_identifier(info.primary_key[-1])
            largest = f"SELECT coalesce(max(CASE WHEN typeof({q}) IN ('integer', 'real') THEN {q} END), 0) FROM {t}"
        else:
            largest = f"SELECT coalesce(max(rowid), 0) FROM {t}"
        top = int(self.conn.execute(largest).fetchone()[0])
        values = []
        for column in info.columns:
            q = quote_identifier(column)
            if column == info.rowid:
                values.append(f"rowid + {top}")
            elif column in unique:
                values.append(f"CASE WHEN typeof({q}) = 'text' THEN {q} || '#dlindex' ELSE {q} + {top + 1} END")
            else:
                values.append(q)
        cols = ", ".join(quote_identifier(c) for c in info.columns)
        sql = (
            f"INSERT INTO {t} ({cols}) SELECT {', '.join(values)} FROM {t} ORDER BY {_row_key(info)} LIMIT {WRITE_ROWS}"
        )
        self.conn.execute(self._fresh(sql, counted))

    def _update(self, table: str, info: TableInfo, columns: Sequence[str], counted: bool = False) -> None:
        """Flip each column between its two most frequent values on rows spread over the table."""
        if not columns:
            return
        sets: list[str] = []
        params: list[object] = []
        for column in columns:
            top = self.stats.frequent_values(table, column)
            q = quote_identifier(column)
            if len(top) == 2:
                sets.append(f"{q} = CASE WHEN {q} IS ? THEN ? ELSE ? END")
                params += [top[0], top[1], top[0]]
            else:
                sets.append(f"{q} = {q}")
        t = quote_identifier(table)
        key = _row_key(info)
        sql = f"UPDATE {t} SET {', '.join(sets)} WHERE ({key}) IN (SELECT {key} FROM temp.dlindex_rows)"
        self.conn.execute(self._fresh(sql, counted), params)


def _row_key(info: TableInfo) -> str:
    """What names a row of the table in SQL: its rowid, or a WITHOUT ROWID table's primary key."""
    return ", ".join(quote_identifier(c) for c in info.primary_key) if info.primary_key else "rowid"
