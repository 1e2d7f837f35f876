"""A user's virtual tables in a catalog file, for the code that copies a catalog table by table.

sqlite-utils' ``enable-fts`` (or anyone's ``CREATE VIRTUAL TABLE ... USING fts5``) adds a
virtual table and the *shadow* tables its module keeps its data in (``T_data``, ``T_idx``,
``T_config``...). ``CREATE VIRTUAL TABLE`` makes the shadow tables itself, so a copy must not
create them again; a full-text index's rows are its shadow tables' rows, so a copy reads them
there and never through the virtual table (which would index every row a second time).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from contextlib import suppress

_LIST = "SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'shadow'"


def is_virtual(sql: str | None) -> bool:
    """Whether a ``sqlite_master`` statement makes a virtual table."""
    return bool(sql) and " ".join(str(sql).split()[:3]).upper() == "CREATE VIRTUAL TABLE"


def shadow_tables(conn: sqlite3.Connection, tables: Iterable[tuple[str, str | None]]) -> frozenset[str]:
    """The shadow tables among ``tables`` ((name, CREATE statement) of a catalog's tables): as
    SQLite lists them; where it cannot (before 3.37, or a schema it cannot read), every table
    named after a virtual table with a suffix, as SQLite names them."""
    listed = list(tables)
    with suppress(sqlite3.Error):
        return frozenset(str(name) for (name,) in conn.execute(_LIST))
    virtual = [name + "_" for name, sql in listed if is_virtual(sql)]
    return frozenset(name for name, sql in listed if not is_virtual(sql) and name.startswith(tuple(virtual or ["\0"])))


def rebuild(conn: sqlite3.Connection, name: str) -> None:
    """Rebuild a full-text index made empty in a sampled copy from its content table (FTS4 and
    FTS5 with ``content=``); any other virtual table is left as it was made."""
    quoted = '"' + name.replace('"', '""') + '"'
    with suppress(sqlite3.Error):
        conn.execute(f"INSERT INTO {quoted}({quoted}) VALUES ('rebuild')")
