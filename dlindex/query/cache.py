"""The query-result cache: a result's ids, keyed by its statement, parameters and the change counter.

Every dlindex write transaction moves the catalog's change counter, so an entry stored under
an older counter is never used again (it is deleted when the next entry is stored). A hit
is answered by primary-key lookups of the stored ids, in the stored order.
"""

from __future__ import annotations

import array
import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dlindex.catalog.backend import OPERATIONAL_ERRORS

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_LOOKUP = "SELECT ids FROM query_cache WHERE key = :key AND changes = :changes"
_EXPIRE = (
    "DELETE FROM query_cache WHERE changes != :changes "
    "OR key NOT IN (SELECT key FROM query_cache ORDER BY created_at DESC, rowid DESC LIMIT :keep)"
)
_STORE = "INSERT OR REPLACE INTO query_cache (key, changes, ids, rows) VALUES (:key, :changes, :ids, :rows)"
_FETCH = (
    "SELECT {columns} FROM json_each(:ids) AS cached JOIN image_metadata "
    "ON image_metadata.id = cached.value ORDER BY cached.key"
)

# A hit costs a primary-key lookup per row, about 1.5 us: a result is stored only when its
# query took at least twice that (a sort, or many more rows read than returned), and when
# it is small enough to keep (MAX_ROWS ids of 8 bytes).
MAX_ROWS = 100_000
FETCH_S = 1.5e-6
MIN_SPEEDUP = 2.0
_KEEP = 64
_CHUNK = 10_000
_STORE_TIMEOUT_MS = 100


def cache_key(selection_sql: str, params: Mapping[str, Any]) -> str:
    # The exact template, not the log's fingerprint: `processed = 1` and `processed = 0`
    # share a fingerprint but not a result.
    text = json.dumps([selection_sql, sorted(params.items())], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def lookup(catalog: Catalog, key: str, changes: int) -> array.array[int] | None:
    """The ids stored for ``key`` under the current change counter, or None."""
    row = catalog.conn.execute(_LOOKUP, {"key": key, "changes": changes}).fetchone()
    if row is None:
        return None
    ids = array.array("q")
    ids.frombytes(row[0])
    return ids


def worth_storing(seconds: float, rows: int) -> bool:
    """Whether a result that took ``seconds`` inside SQLite is cheaper to fetch by id."""
    return rows <= MAX_ROWS and seconds >= MIN_SPEEDUP * FETCH_S * rows


def store(catalog: Catalog, key: str, changes: int, ids: list[int]) -> None:
    """Keep ``ids`` for ``key``; a busy or read-only catalog just skips it."""
    blob = array.array("q", ids).tobytes()
    try:
        with catalog.busy_timeout(_STORE_TIMEOUT_MS), catalog.write_transaction(bookkeeping=True) as tx:
            tx.execute(_EXPIRE, {"changes": changes, "keep": _KEEP})
            tx.execute(_STORE, {"key": key, "changes": changes, "ids": blob, "rows": len(ids)})
    except OPERATIONAL_ERRORS:
        pass  # a cache is an optimisation, never a reason to fail


def fetch(catalog: Catalog, ids: array.array[int], columns_sql: str) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``ids`` in their order, ``columns_sql`` selected, in chunks."""
    sql = _FETCH.replace("{columns}", columns_sql)
    for start in range(0, len(ids), _CHUNK):
        yield catalog.conn.execute(sql, {"ids": json.dumps(ids[start : start + _CHUNK].tolist())}).fetchall()
