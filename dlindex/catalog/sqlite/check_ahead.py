"""The check before a catalog file's first write, started early on a thread of its own.

Every command that writes first runs SQLite's ``quick_check`` (within a budget of ~0.1 s,
dlindex.catalog.check), so that nothing is written into a damaged file. A command that knows it
will write (``dlindex scan``) starts the check as soon as the catalog is open, on a connection
of its own: SQLite works without Python's lock, so the check runs on the other core while the
command imports and plans, and the first write only waits for its verdict (an unchanged rescan
spent a sixth of its time on the check before). The verdict is the same check's: a thread that
fails, for whatever reason, leaves no verdict, and the first write checks as before.
"""

from __future__ import annotations

import sqlite3
import threading

from dlindex.catalog.check import quick_check
from dlindex.catalog.sqlite.connect import connect_readonly


class CheckAhead:
    """``quick_check(budget_s=...)`` of the file at ``path``, running from construction on."""

    def __init__(self, path: str, budget_s: float) -> None:
        self._path = path
        self._budget_s = budget_s
        self._problems: list[str] | None = None
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # keeps an interrupt off a connection being closed
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name="dlindex-check-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            conn = connect_readonly(self._path)
            with self._lock:
                if self._cancelled:
                    conn.close()
                    return
                self._conn = conn
            try:
                self._problems = quick_check(conn, budget_s=self._budget_s)
            finally:
                with self._lock:
                    self._conn = None
                conn.close()
        except Exception:  # no verdict: the first write checks on its own connection
            self._problems = None

    def verdict(self) -> list[str] | None:
        """The problems found (``[]``: none), or None where the check gave no verdict."""
        self._thread.join()
        return None if self._cancelled else self._problems

    def cancel(self) -> None:
        """Stop the check (the command ends without writing) and wait for its thread."""
        with self._lock:
            self._cancelled = True
            if self._conn is not None:
                self._conn.interrupt()
        self._thread.join()
