"""Scratch space on disk for duplicate search at size: a private temporary SQLite database.

``sqlite3.connect("")`` opens a database that lives in SQLite's page cache (2 MiB) and spills
to a temporary file when it outgrows it (SQLITE_TMPDIR, TMPDIR, /var/tmp or /tmp). On POSIX
the file is unlinked as soon as it is opened, so no exit (an error, Ctrl-C, kill -9) can leave
it behind, and its space is freed when the connection closes. Sorting in it is SQLite's
external merge sort: memory stays a few MiB whatever the number of rows.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dlindex.faults import disk_full_error, is_disk_full


def scratch_folder() -> str:
    """Where SQLite puts its temporary files (the first of these that is set)."""
    return os.environ.get("SQLITE_TMPDIR") or os.environ.get("TMPDIR") or tempfile.gettempdir()


@contextmanager
def scratch_database() -> Iterator[sqlite3.Connection]:
    """A private temporary database, closed (its file gone) on leaving; a full disk is one
    DiskFullError naming the scratch folder."""
    conn = sqlite3.connect("", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = OFF")  # scratch: nothing to roll back to
        conn.execute("PRAGMA synchronous = OFF")
        yield conn
    except sqlite3.Error as e:
        if is_disk_full(e):
            raise disk_full_error(e, paths=[scratch_folder()]) from None
        raise
    finally:
        conn.close()


def insert_rows(conn: sqlite3.Connection, statement: str, rows: Iterable[Sequence[Any]]) -> None:
    """``rows`` inserted in one transaction (a commit per row would sync and rewrite pages)."""
    conn.execute("BEGIN")
    try:
        conn.executemany(statement, rows)
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
