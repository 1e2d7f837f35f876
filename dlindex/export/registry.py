"""The catalog's record of the exports written from it, for loaders that look for one."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from dlindex.errors import DlindexError
from dlindex.exported.index import index_path

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_RECORD = (
    "INSERT OR REPLACE INTO exports (path, format, samples, created_at, catalog_changes) "
    "VALUES (:path, :format, :samples, :created_at, :changes)"
)
_LIST = "SELECT path, format, samples, created_at, catalog_changes FROM exports ORDER BY created_at DESC, path"
_LIST_FORMAT = (
    "SELECT path, format, samples, created_at, catalog_changes FROM exports WHERE format = :format "
    "ORDER BY created_at DESC, path"
)


@dataclass(frozen=True)
class RecordedExport:
    path: str  # absolute
    format: str
    samples: int
    created_at: str  # UTC, ISO 8601
    catalog_changes: int  # the catalog's change counter when it was written


def record_export(catalog: Catalog, out_dir: str | os.PathLike[str], fmt: str, samples: int, changes: int) -> bool:
    """Note an export that was just written (replacing an older record of the same folder).

    Bookkeeping, like the query log: it does not expire cached query results, and a catalog
    that cannot take the write (read-only, busy) leaves the export as it is: False.
    """
    params = {
        "path": os.fsdecode(os.path.abspath(out_dir)), "format": fmt, "samples": int(samples),
        "created_at": datetime.now(UTC).isoformat(timespec="microseconds"), "changes": int(changes),
    }  # fmt: skip
    try:
        with catalog.write_transaction(bookkeeping=True) as conn:
            conn.execute(_RECORD, params)
    except (DlindexError, sqlite3.Error):
        return False
    return True


def recorded_exports(catalog: Catalog, fmt: str | None = None) -> list[RecordedExport]:
    """The recorded exports (of ``fmt``) that still have their index file, newest first."""
    rows = catalog.conn.execute(_LIST if fmt is None else _LIST_FORMAT, {} if fmt is None else {"format": fmt})
    found = []
    for path, format_, samples, created, changes in rows:
        if index_path(path).is_file():
            found.append(RecordedExport(str(path), str(format_), int(samples), str(created), int(changes)))
    return found


def moved_on(catalog: Catalog, index: dict[str, object]) -> str | None:
    """A line saying the catalog changed since the export read it (index.json's ``catalog.changes``),
    with the commands that show and undo the difference; None when it has not."""
    recorded = index.get("catalog")
    state = recorded.get("changes") if isinstance(recorded, dict) else None
    if not isinstance(state, int) or isinstance(state, bool):
        return None
    now = catalog.changes()
    if now == state:
        return None
    return (
        f"the catalog has moved on since this export was written (state {state} -> {now}): "
        "`dlindex diff OUT_DIR` shows what changed, `dlindex export NEW --at OUT_DIR` writes it again exactly"
    )
