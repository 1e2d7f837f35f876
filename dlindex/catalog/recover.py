"""``dlindex check --recover-to``: every row SQLite can still read from a damaged catalog, copied
into a new file with dlindex's schema, then checked (dlindex.catalog.check)."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlindex.catalog.check import CheckReport, check_catalog
from dlindex.catalog.sqlite.migrations import APPLICATION_ID, LATEST_VERSION, apply_migrations, latest_columns
from dlindex.catalog.sqlite.virtual import is_virtual, rebuild, shadow_tables
from dlindex.errors import CatalogError

# What a rescan remembered of unchanged folders (dlindex.scan.digests) vouches for rows as they
# were; a damaged file's may not be: the recovered catalog compares every folder once again.
_NOT_RECOVERED = frozenset({"scan_digests"})


@dataclass(frozen=True)
class RecoverReport:
    """What ``recover_catalog`` copied: rows per table, and the tables it could not read whole."""

    source: str
    target: str
    rows: dict[str, int]
    incomplete: tuple[str, ...]
    check: CheckReport

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "rows": self.rows,
                "incomplete": list(self.incomplete), "check": self.check.as_dict()}  # fmt: skip


_SCHEMA = "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"


def recover_catalog(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> RecoverReport:
    """Copy every row SQLite can still read from a damaged catalog into a new file ``target``.

    Each table is read by rowid upwards until the first unreadable page, then downwards
    from the end to it (the sqlite3 shell's ``.dump`` does the same): rows on damaged
    pages are lost, the rest keep their ids. The new file gets dlindex's schema version
    and is checked; ``target`` must not exist (nothing is overwritten).
    """
    from dlindex.catalog.sqlite.connect import PAGE_SIZE, connect_readonly

    src, dst = Path(source), Path(target)
    if dst.exists() or Path(os.fspath(dst) + "-wal").exists():
        raise CatalogError(f"{dst} already exists; give a new file to recover into")
    if not src.is_file():
        raise CatalogError(f"no catalog at {src}")
    tmp = dst.with_name(f".{dst.name}.recovering")
    conn = connect_readonly(src, isolation_level=None)
    rows: dict[str, int] = {}
    incomplete: list[str] = []
    try:
        try:
            app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            schema = conn.execute(_SCHEMA).fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
            raise CatalogError(
                f"cannot read the schema of {src} ({e}): rescan the image tree into a new catalog"
            ) from None
        if app_id != APPLICATION_ID:
            raise CatalogError(f"{src} is not a dlindex catalog")
        tmp.unlink(missing_ok=True)
        out = sqlite3.connect(tmp, isolation_level=None)
        try:
            out.execute(f"PRAGMA page_size = {int(PAGE_SIZE)}")
            # A catalog of this dlindex's version gets dlindex's own schema, not the source's
            # text: a damaged CREATE statement can rename a column and still parse.
            own = set(latest_columns()) if version == LATEST_VERSION else set()
            if own:
                apply_migrations(out)
            out.execute("BEGIN")
            # a user's full-text index: its CREATE makes its shadow tables, whose rows are its
            # own (never copied through it: that would index them twice), then it is rebuilt
            shadows = shadow_tables(conn, [(name, sql) for kind, name, _t, sql in schema if kind == "table"])
            for kind, name, _table, sql in schema:
                if kind == "table" and name not in own and name not in shadows:
                    try:
                        out.execute(sql)
                    except sqlite3.OperationalError:
                        if not is_virtual(sql):
                            raise
                        incomplete.append(name)  # a virtual table whose module this SQLite lacks
            for kind, name, _table, sql in schema:
                if kind == "table" and name not in _NOT_RECOVERED and not is_virtual(sql):
                    rows[name], whole = _copy_rows(conn, out, name)
                    if not whole:
                        incomplete.append(name)
            for name in (name for kind, name, _table, sql in schema if kind == "table" and is_virtual(sql)):
                rebuild(out, name)
            made = {str(n) for (n,) in out.execute("SELECT name FROM sqlite_master")}
            for kind, name, _table, sql in schema:
                if kind in ("index", "trigger", "view") and name not in made:
                    if kind == "trigger" and any(gone in sql for gone in incomplete if gone not in rows):
                        incomplete.append(name)  # it writes to a virtual table left out: every write would fail
                        continue
                    try:
                        out.execute(sql)
                    except sqlite3.Error:  # a damaged definition of the source's own: left out
                        incomplete.append(name)
            # PRAGMA takes no parameters: both are integers read above.
            out.execute(f"PRAGMA application_id = {int(app_id)}")
            out.execute(f"PRAGMA user_version = {int(version)}")
            out.execute("COMMIT")
        finally:
            out.close()
    finally:
        conn.close()
    os.replace(tmp, dst)
    return RecoverReport(os.fspath(src), os.fspath(dst), rows, tuple(incomplete), check_catalog(dst))


def _copy_rows(src: sqlite3.Connection, out: sqlite3.Connection, table: str) -> tuple[int, bool]:
    t = _quote(table)
    try:
        names = [str(r[1]) for r in src.execute(f"PRAGMA table_info({t})")]
        info = out.execute(f"PRAGMA table_info({t})").fetchall()
        targets = [str(r[1]) for r in info]
        if len(targets) != len(names):  # by name; the same count: by position (a damaged name keeps its place)
            names = [n for n in names if n in targets]
            targets = names
        values = [_quote(n) for n in names]
        try:
            src.execute(f"SELECT rowid FROM {t} LIMIT 0")
            orders: tuple[str, ...] = (" ORDER BY rowid", " ORDER BY rowid DESC")
            keys = [r for r in info if r[5]]
            if len(keys) == 1 and str(keys[0][2]).upper() == "INTEGER" and keys[0][1] in targets:
                # the id is the rowid, whatever a damaged schema text now calls or types it
                values[targets.index(keys[0][1])] = "rowid"
        except sqlite3.OperationalError:
            orders = ("",)  # WITHOUT ROWID: one pass in key order
        columns = ", ".join(values)
    except sqlite3.DatabaseError:
        return 0, False
    insert = (
        f"INSERT OR IGNORE INTO {t} ({', '.join(_quote(n) for n in targets)}) VALUES ({', '.join('?' * len(names))})"
    )
    copied, whole = 0, True
    for order in orders:
        try:
            for row in src.execute(f"SELECT {columns} FROM {t}{order}"):
                copied += out.execute(insert, row).rowcount
            break
        except (sqlite3.DatabaseError, UnicodeDecodeError):
            whole = False  # the other direction reaches the rows after the damage
    return copied, whole


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
