"""Replaying logged reads on the scratch copy, under a time and a memory limit.

A replay is timed (median of several runs, after a warm-up) and its work is counted in
SQLite virtual-machine steps (the progress handler): the steps are the same on every run, so
advice decided on them does not change with the machine's load. A statement that runs
longer than the per-statement limit is interrupted, one that needs more than the heap limit
fails with SQLITE_NOMEM; either raises ``ReplayLimit`` and the advice reports it as skipped.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

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
    return Timing(statistics.median(times) if times else 0.0, counted.steps)


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
