"""Replaying logged statements on the scratch copy: reads timed and planned, writes timed, under limits.

A replay is timed (median of several runs, after a warm-up) and its work is counted in
SQLite virtual-machine steps (the progress handler): the steps are the same on every run, so
advice decided on them does not change with the machine's load. A statement that runs
longer than the per-statement limit is interrupted, one that needs more than the heap limit
fails with SQLITE_NOMEM; either raises ``ReplayLimit`` and the advice reports it as skipped.

``explain`` is EXPLAIN QUERY PLAN under the same deadline; ``index_names`` and ``improvable``
say what a plan uses. ``WriteCosts`` is what an index adds to writes: inserts and updates of
``WRITE_ROWS`` rows on the copy, timed and step-counted the same way, each rolled back.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dlindex.advisor.shapes import TableInfo
from dlindex.advisor.sqltext import Value, quote_identifier
from dlindex.catalog.recorder import classify_plan


class RowCounts(Protocol):
    """A table's row count and a column's most frequent values on the copy (scratch.CopyStatistics,
    named here by shape: scratch makes WriteCosts)."""

    def rows(self, table: str) -> int: ...

    def frequent_values(self, table: str, column: str) -> list[Value]: ...


STATEMENT_DEADLINE_S = 10.0  # a replayed statement is interrupted after this long
MEMORY_LIMIT = 512 * 2**20  # and fails past this much SQLite heap (the whole process)
# EXPLAIN opens no read transaction, so it would not notice a schema change (an index built
# by another connection) and plan with the old schema: a plain read before it reloads it.
RELOAD_SCHEMA = "SELECT 1 FROM sqlite_master LIMIT 1"
STEP = 100  # the progress handler's period, in VM instructions: the resolution of a step count


_stop = [False]  # set by a signal; a replay inside SQLite notices it in the progress handler


def stop_on_signals() -> Callable[[], None]:
    """Ctrl-C and SIGTERM stop the advice, also in the middle of a replay; returns the restorer.

    An exception raised in a progress handler is swallowed by sqlite3 (the statement is just
    interrupted), so the handler also leaves a flag that the interrupted replay turns back
    into KeyboardInterrupt.
    """
    _stop[0] = False

    def handler(signum: int, frame: object) -> None:
        _stop[0] = True
        raise KeyboardInterrupt

    previous = []
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous.append((sig, signal.signal(sig, handler)))
    except ValueError:  # not the main thread: leave signals alone
        return lambda: None

    def restore() -> None:
        for sig, old in previous:
            signal.signal(sig, old)

    return restore


class StepCounter:
    """A progress handler, called every ``STEP`` VM instructions, that counts them and never stops."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self) -> int:
        self.steps += STEP
        return 0


@dataclass(frozen=True)
class Timing:
    """What one statement cost: median ms per run, and VM steps (deterministic)."""

    ms: float
    steps: int


def wall_ms(measured_ms: float, steps: int) -> float:
    """A replay's time as the clock measured it."""
    return measured_ms


# What a replay's time is taken as (measured ms, VM steps -> ms): the wall clock. The decisions
# that still weigh time (a time-only regression, the before/after report) move with the load of
# the machine; a test that must decide the same under any load puts a function of the steps here.
replay_ms: Callable[[float, int], float] = wall_ms


@contextmanager
def deadline(conn: sqlite3.Connection, seconds: float, count: StepCounter | None = None) -> Iterator[None]:
    """Interrupt whatever ``conn`` runs after ``seconds`` (sqlite3.OperationalError: interrupted).

    Args:
        count: also called every ``STEP`` VM instructions.
    """
    end = time.monotonic() + seconds
    if count is None:
        conn.set_progress_handler(lambda: int(_stop[0] or time.monotonic() > end), 10_000)
    else:
        conn.set_progress_handler(lambda: count() or int(_stop[0] or time.monotonic() > end), STEP)
    try:
        yield
    finally:
        conn.set_progress_handler(None, 0)


class ReplayLimit(Exception):
    """A logged statement ran past a replay limit (time, memory) or SQLite refused to run it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def limit_heap(conn: sqlite3.Connection, limit_bytes: int | None) -> None:
    """Cap what SQLite may allocate in this process (``PRAGMA hard_heap_limit``).

    SQLite lets the pragma only lower the limit, so it holds for the rest of the process; a
    replay past it fails with SQLITE_NOMEM, which is reported, never crashes the advice.
    """
    if limit_bytes:
        conn.execute(f"PRAGMA hard_heap_limit = {int(limit_bytes)}")


def time_read(conn: sqlite3.Connection, sql: str, params: Any, runs: int, limit_s: float = STATEMENT_DEADLINE_S,
              memory: int | None = None, counter: sqlite3.Connection | None = None) -> Timing:  # fmt: skip
    """Median ms of ``runs`` executions read to the end (after a warm-up), and its VM steps.

    Args:
        counter: a connection that keeps no prepared statements, where the steps are counted:
            a fresh statement counts from zero, so the count is exact (a cached one carries
            the progress handler's phase over from its earlier runs); default ``conn``.

    Raises:
        ReplayLimit: an execution took longer than ``limit_s`` or ran out of SQLite's heap
            (``memory`` bytes, only for the message), or SQLite refused it.
    """
    bound = bindable(sql, params)
    counted = StepCounter()

    def once(on: sqlite3.Connection, count: bool = False) -> float:
        with deadline(on, limit_s, counted if count else None):
            started = time.perf_counter()
            cursor = on.execute(sql, bound)
            while cursor.fetchmany(512):
                pass
            return (time.perf_counter() - started) * 1000.0

    def count_steps() -> None:
        on = counter or conn
        on.execute(RELOAD_SCHEMA).fetchall()  # a schema reload runs statements of its own: not counted
        once(on, count=True)

    try:
        if once(conn) > 1000.0:  # the warm-up; a slow statement gets fewer runs
            runs = min(runs, 2)
        count_steps()
        times = [once(conn) for _ in range(runs)]
    except MemoryError:
        limit = f"the {memory / 2**20:,.0f} MiB memory limit" if memory else "the memory SQLite may use"
        raise ReplayLimit(f"needed more than {limit}") from None
    except sqlite3.OperationalError as e:
        if _stop[0]:
            raise KeyboardInterrupt from None
        if "interrupted" in str(e):
            raise ReplayLimit(f"ran longer than the {limit_s:g} s limit per statement") from None
        raise ReplayLimit(f"SQLite could not run it: {e}") from None
    except (sqlite3.Error, ValueError, OverflowError) as e:
        raise ReplayLimit(f"SQLite could not run it: {e}") from None
    finally:
        conn.set_progress_handler(None, 0)
        if counter is not None:
            counter.set_progress_handler(None, 0)
    return Timing(replay_ms(statistics.median(times) if times else 0.0, counted.steps), counted.steps)


_PARAMS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?(\d*)|[:@$]([A-Za-z_]\w*)")


def bindable(sql: str, params: Any) -> Any:
    """Parameters as sqlite3 wants them; a template without a sample gets NULLs (plans only)."""
    if params:
        return params
    names: dict[str, None] = {}
    count = numbered = 0
    for m in _PARAMS.finditer(sql):
        if m.group(2):
            names[m.group(0)[1:]] = None
        elif m.group(0).startswith("?"):
            count += 1
            numbered = max(numbered, int(m.group(1) or 0))
    if names:
        return names
    return (None,) * max(count, numbered)


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


WRITE_ROWS = 10_000  # rows each measured insert and update writes
# What writing a page costs, in VM steps: a changed page is journaled and written back, which
# takes as long as some thousand instructions; with it a write's steps weigh like its time.
PAGE_STEPS = 1000


class WriteCosts:
    """Inserts and updates of WRITE_ROWS rows on the copy, each in a transaction rolled back."""

    def __init__(self, conn: sqlite3.Connection, path: Path, stats: RowCounts) -> None:
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
        return Timing(
            replay_ms(min(times), count.steps), count.steps
        )  # the least disturbed run: other processes only ever add time

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
