"""Read-only connections that can run nothing but reads: how statements taken from logs are run.

Opened read-only (``mode=ro``, or ``immutable=1`` on read-only storage), with ``PRAGMA
query_only`` and an authorizer that allows nothing but reading and harmless functions.
"""

from __future__ import annotations

import os
import sqlite3

from dlindex.catalog.sqlite.connect import readonly_uri

_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_DENIED_FUNCTIONS = {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit", "sqlite_offset"}


def _authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None, source: str | None) -> int:
    if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master" and source is None:
        # what SQLite asks while an eponymous virtual table (json_each) declares its columns;
        # the connection is read-only with query_only on, so nothing can be written anyway
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() == "data_version" and arg2 is None:
        # a read FTS5 makes when a full-text table is opened (sqlite-utils' enable-fts)
        return sqlite3.SQLITE_OK
    if action not in _ALLOWED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def guarded(path: str | os.PathLike[str], *, cache: bool = True) -> sqlite3.Connection:
    """A read-only connection that can run nothing but reads (for statements taken from logs).

    Args:
        cache: keep prepared statements; a connection that explains must not, as a cached
            EXPLAIN keeps the plan it was prepared with after another connection adds an index.
    """
    conn = sqlite3.connect(readonly_uri(path), uri=True, isolation_level=None, check_same_thread=False,
                           timeout=30.0, cached_statements=128 if cache else 0)  # fmt: skip
    conn.execute("PRAGMA query_only = 1")
    conn.set_authorizer(_authorize)
    return conn
