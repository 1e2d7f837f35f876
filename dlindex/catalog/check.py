"""``dlindex check``: is a catalog whole? Integrity, schema version, orphan rows, dead scans.

The check opens the file read-only (``mode=ro``, or ``immutable=1`` on read-only storage)
and never writes, so it can look at a catalog that every other command refuses.
Recovery steps for what it finds are in ``dlindex check --help`` (and docs/reliability.md);
``--recover-to`` is dlindex.catalog.recover.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dlindex.catalog.backend import is_server_url
from dlindex.catalog.reachable import unreachable_roots
from dlindex.catalog.sqlite.migrations import (
    APPLICATION_ID,
    LATEST_VERSION,
    changed_columns,
    missing_tables,
)
from dlindex.errors import CatalogError, InputError

_MAX_LINES = 20  # integrity problems reported; SQLite's own default is 100
# quick_check(budget_s=...) checks a file of up to this size in full (~0.1 s; a test catalog always)
_WHOLE_CHECK_BYTES = 32 << 20
_PAGES = "SELECT page_count * page_size FROM pragma_page_count, pragma_page_size"
_RUNNING_SCANS = "SELECT id, pid, started_at FROM scans WHERE state = 'running' ORDER BY id"
_COUNT_IMAGES = "SELECT count(*) FROM image_metadata"


def quick_check(conn: sqlite3.Connection, *, budget_s: float | None = None) -> list[str]:
    """SQLite's ``PRAGMA quick_check`` (every page and record, no index contents), as a list
    of problems; ``[]`` when healthy, or when ``budget_s`` ran out before the end.

    A file of up to ``_WHOLE_CHECK_BYTES`` is checked in full whatever the budget. A larger one
    is checked until the budget runs out: the b-tree walk is one SQLite opcode, which a
    progress handler never interrupts (at 10^7 rows it read all 3 GB before every first write,
    1.7-3 CPU s and 5-14 s), so a thread calls ``conn.interrupt()`` from the deadline on.
    """
    if budget_s is not None and _file_bytes(conn) <= _WHOLE_CHECK_BYTES:
        budget_s = None
    with _Deadline(conn, budget_s):
        try:
            rows = _lines(conn.execute(f"PRAGMA quick_check({int(_MAX_LINES)})"))
        except sqlite3.OperationalError as e:
            if "interrupt" in str(e):
                return []  # the budget ran out: no verdict, and SQLite still checks every page it reads
            return [str(e)]
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:  # a message quoting damaged schema text
            return [str(e)]
    return [] if rows == ["ok"] else rows


def _file_bytes(conn: sqlite3.Connection) -> int:
    try:
        return int(conn.execute(_PAGES).fetchone()[0])
    except sqlite3.DatabaseError:
        return 0  # a damaged header: check it in full, which says what is wrong


class _Deadline:
    """Interrupts ``conn`` once ``budget_s`` has passed, and again every 50 ms, only while the
    block runs (a lock keeps a late call off the next statement): an interrupt that lands
    before the statement starts is dropped by SQLite, as happens when a busy machine keeps the
    statement from starting within the budget. None: no deadline."""

    def __init__(self, conn: sqlite3.Connection, budget_s: float | None) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.running = True
        self.done = threading.Event()
        self.budget_s = budget_s
        self.thread = None if budget_s is None else threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        wait = max(0.0, self.budget_s or 0.0)
        while not self.done.wait(wait):
            with self.lock:
                if not self.running:
                    return
                self.conn.interrupt()
            wait = 0.05

    def __enter__(self) -> None:
        if self.thread is not None:
            self.thread.start()

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.running = False
        self.done.set()
        if self.thread is not None:
            self.thread.join()


@dataclass(frozen=True)
class CheckReport:
    """What ``check_catalog`` found; ``healthy`` when ``problems`` is empty."""

    path: str
    schema_version: int | None
    dlindex_schema_version: int
    integrity: str  # "ok", "problems" or "not checked"
    images: int | None
    orphans: dict[str, int] = field(default_factory=dict)  # "child -> parent": rows
    interrupted_scans: tuple[int, ...] = ()
    unreachable_roots: tuple[str, ...] = ()  # roots moved or unmounted (also in problems)
    problems: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def healthy(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        lists = {name: list(getattr(self, name)) for name in ("interrupted_scans", "unreachable_roots", "problems")}
        return {**asdict(self), "healthy": self.healthy, **lists}


def check_catalog(path: str | os.PathLike[str], *, quick: bool = False) -> CheckReport:
    """Check the catalog at ``path`` without writing to it.

    Args:
        quick: ``PRAGMA quick_check`` (pages and records) instead of the full
            ``integrity_check`` (also every index entry); several times faster on large files.
    """
    if is_server_url(path):
        raise InputError(
            "dlindex check reads catalog files; a PostgreSQL catalog is kept whole by its server "
            "(check it with PostgreSQL's pg_amcheck)"
        )
    from dlindex.catalog.sqlite.connect import connect_readonly
    from dlindex.catalog.sqlite.text_schema import search_problems
    from dlindex.pids import pid_alive

    started = time.perf_counter()
    db = Path(path)
    if not db.exists():
        raise CatalogError(f"no catalog at {db}")
    if db.is_dir():
        raise CatalogError(f"{db} is a directory, not a catalog file")
    if not os.access(db, os.R_OK):
        raise CatalogError(f"cannot read catalog {db}: Permission denied")
    problems: list[str] = []

    def report(**found: Any) -> CheckReport:
        base: dict[str, Any] = dict(schema_version=None, integrity="not checked", images=None)
        base.update(found)
        return CheckReport(
            path=os.fspath(db), dlindex_schema_version=LATEST_VERSION, problems=tuple(problems),
            seconds=round(time.perf_counter() - started, 3), **base,
        )  # fmt: skip

    if db.stat().st_size == 0:
        problems.append("the file is empty (zero bytes): not a catalog; rescan to rebuild it")
        return report()
    try:
        conn = connect_readonly(db, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as e:
        _raise_if_environment(e, db)
        problems.append(f"cannot open: {e}")
        return report()
    try:
        try:
            app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
            if isinstance(e, sqlite3.Error):
                _raise_if_environment(e, db)
            problems.append(f"not a readable SQLite database: {e}")
            return report()
        if app_id != APPLICATION_ID:
            problems.append("not a dlindex catalog (SQLite application_id is not dlindex's)")
            return report(schema_version=version)
        if version > LATEST_VERSION:
            problems.append(f"schema version {version} is newer than this dlindex's {LATEST_VERSION}: upgrade dlindex")
        problems.extend(f"table {t} is missing" for t in missing_tables(tables, version))
        try:
            problems.extend(
                f"column {c} is not as dlindex made it: renamed, retyped or no longer a key"
                for c in changed_columns(conn, version)
            )
        except sqlite3.DatabaseError as e:  # a table SQLite cannot open: a virtual table whose module it lacks
            problems.append(f"cannot read the tables' columns: {e}")
        integrity = _integrity(conn, quick)
        problems.extend(f"integrity: {line}" for line in integrity)
        if not integrity and not quick:
            problems.extend(search_problems(os.fspath(db)))
        orphans = _orphans(conn)
        problems.extend(f"{n} orphan row(s) in {what}" for what, n in orphans.items())
        dead: list[int] = []
        if "scans" in tables:
            try:
                for scan_id, pid, started_at in conn.execute(_RUNNING_SCANS):
                    if not pid_alive(pid):
                        dead.append(int(scan_id))
                        problems.append(
                            f"scan {scan_id} (started {started_at}) is recorded as running but its process "
                            f"{pid} is gone: the next scan or write marks it interrupted; rerun that scan"
                        )
            except sqlite3.DatabaseError as e:
                problems.append(f"cannot read scans: {e}")
        images = None
        if "image_metadata" in tables:
            try:
                images = int(conn.execute(_COUNT_IMAGES).fetchone()[0])
            except sqlite3.DatabaseError as e:
                problems.append(f"cannot count image rows: {e}")
        unreachable: list[str] = []
        if "roots" in tables and "image_metadata" in tables:
            try:
                unreachable = unreachable_roots(conn.execute)
            except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
                problems.append(f"cannot read roots: {e}")
            problems.extend(unreachable)
        return report(
            schema_version=version, integrity="ok" if not integrity else "problems", images=images,
            orphans=orphans, interrupted_scans=tuple(dead), unreachable_roots=tuple(unreachable),
        )  # fmt: skip
    finally:
        conn.close()


def _raise_if_environment(e: sqlite3.Error, db: Path) -> None:
    """A full disk or a held lock says nothing about the file: report that, not damage."""
    from dlindex.errors import CatalogBusyError, DiskFullError
    from dlindex.faults import translate_error

    error = translate_error(e, catalog=db)
    if isinstance(error, (DiskFullError, CatalogBusyError)):
        raise error


def _integrity(conn: sqlite3.Connection, quick: bool) -> list[str]:
    if quick:
        return quick_check(conn)
    try:
        rows = _lines(conn.execute(f"PRAGMA integrity_check({int(_MAX_LINES)})"))
    except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
        return [str(e)]
    return [] if rows == ["ok"] else rows


def _lines(rows: Iterable[tuple[Any, ...]]) -> list[str]:
    """The check's messages, one per problem (SQLite packs several into a row, after a
    "*** in database main ***" heading)."""
    found = [line.strip() for (text,) in rows for line in str(text).splitlines()]
    found = [line for line in found if line and not line.startswith("*** in database")]
    return found[:_MAX_LINES] if found != ["ok"] else ["ok"]


def _orphans(conn: sqlite3.Connection) -> dict[str, int]:
    """Rows whose foreign key points at nothing (``PRAGMA foreign_key_check``): an image
    row without its root or label, a vector without its image or feature type, ..."""
    found: dict[str, int] = {}
    try:
        for table, _rowid, parent, _fk in conn.execute("PRAGMA foreign_key_check"):
            key = f"{table} -> {parent}"
            found[key] = found.get(key, 0) + 1
    except sqlite3.DatabaseError as e:
        found[f"(foreign key check failed: {e})"] = 1
    return found
