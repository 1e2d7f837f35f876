"""A sample's rows by id, read through several connections at once (a catalog file).

Used where an index gives the ids alone and they are few: a per-label sample, a narrow time
window (dlindex.query.rows, ``PreparedQuery.picked_sql``).

A sample (``--per-label``) is a few rows of every label, spread over the whole table: at 10^8
rows each lies on a page of its own, in a file larger than memory. One connection reads those
pages one after another (32,000 pages, 3.4 s from a cold cache at 10^8 rows); eight keep eight
reads in flight, which the disk serves in about a third of the time (1.1 s). SQLite reads
without Python's lock, so threads are enough. Rows already in memory gain nothing from more
connections: the other connections are opened only when the first chunk's rows came slowly.

Every row comes from one snapshot: the caller reads the ids in a read transaction of its own
connection (``snapshot``) and keeps it open while the rows are read; another connection's
chunk is used only when that connection sees the same change counter (every dlindex write
moves it), and a chunk it cannot vouch for is read by the caller's connection, in its snapshot.
"""

from __future__ import annotations

import array
import json
import queue
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from itertools import islice
from typing import TYPE_CHECKING, Any

from dlindex.catalog.backend import SQL_ERRORS
from dlindex.query import cache

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_COUNTER = "SELECT counter FROM catalog_changes WHERE id = 1"
_FETCH = "SELECT {columns} FROM image_metadata WHERE image_metadata.id IN (SELECT value FROM json_each(:ids)) ORDER BY image_metadata.id"
READERS = 8  # reads in flight: 8 and 16 read the 10^8 sample alike (1.0-1.1 s), 32 and 64 slower
CHUNK = 1024  # ids a connection reads at once
_MIN_CHUNKS = 4  # fewer ids are read by the caller's connection alone
# The first _PROBE rows are read by the caller's connection; where they took longer than
# _SLOW_ROW_S each (read from disk; ~3-10 us from memory), the rest go to several connections.
_PROBE = 256
_SLOW_ROW_S = 50e-6


def sample_rows(
    catalog: Catalog, statement: str, picked_sql: str, params: Mapping[str, Any], columns_sql: str,
    on_done: Callable[[float, int], None] | None = None,
) -> Iterator[tuple[Any, ...]]:  # fmt: skip
    """The rows ``statement`` gives (a per-label seek or a narrow time window, in id order,
    ``columns_sql`` selected): the ids from ``picked_sql`` (the index alone, a bounded number),
    then their rows by id through several connections, all in one snapshot; logged as
    ``statement``, as ``Catalog.read`` logs it."""
    began = time.perf_counter()
    with snapshot(catalog) as counter:
        ids = sorted({row[0] for row in catalog.conn.execute(picked_sql, params)})
        first = int(params.get("offset", 0))
        ids = ids[first : first + int(params["limit"])] if "limit" in params else ids[first:]
        chunks = rows_by_id(catalog, ids, columns_sql, counter)
        seconds = time.perf_counter() - began
        yield from catalog.logged_read(statement, params, chunks, on_done=on_done, seconds=seconds)


def cached_rows(catalog: Catalog, ids: array.array[int], columns_sql: str) -> Iterator[list[tuple[Any, ...]]]:
    """A cached result's rows (dlindex.query.cache: ``ids`` in the result's order), in chunks:
    where the ids ascend (a per-label sample, a window: results in id order) by id as
    ``sample_rows`` reads them, several connections when they come from disk, in one snapshot;
    else by the catalog's connection in their own order."""
    if all(map(int.__lt__, ids, islice(ids, 1, None))):
        with snapshot(catalog) as counter:
            yield from rows_by_id(catalog, ids, columns_sql, counter)
        return
    yield from cache.fetch(catalog, ids, columns_sql)


@contextmanager
def snapshot(catalog: Catalog) -> Iterator[int]:
    """A read transaction on the catalog's own connection, for the block (or the one it is
    already in): its change counter."""
    conn = catalog.conn
    if conn.in_transaction:
        yield int(conn.execute(_COUNTER).fetchone()[0])
        return
    conn.execute("BEGIN")
    try:
        yield int(conn.execute(_COUNTER).fetchone()[0])
    finally:
        with suppress(*SQL_ERRORS):
            conn.execute("COMMIT")


def rows_by_id(
    catalog: Catalog, ids: Sequence[int], columns_sql: str, counter: int
) -> Generator[list[tuple[Any, ...]], None, None]:
    """The rows of ``ids`` (ascending, distinct), in that order and in chunks, as the catalog's
    connection sees them in its snapshot (``snapshot``, whose counter is ``counter``)."""
    sql = _FETCH.replace("{columns}", columns_sql)
    if not ids:
        return
    began = time.perf_counter()
    yield _read(catalog.conn, sql, ids[:_PROBE])
    slow = (time.perf_counter() - began) / min(len(ids), _PROBE) > _SLOW_ROW_S
    chunks = [ids[start : start + CHUNK] for start in range(_PROBE, len(ids), CHUNK)]
    # rows in memory: more connections only cost; none opened: the caller's reads every chunk
    opened = _open_readers(catalog) if slow and len(chunks) >= _MIN_CHUNKS else []
    if not opened:
        for chunk in chunks:
            yield _read(catalog.conn, sql, chunk)
        return
    readers: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for conn in opened:
        readers.put(conn)

    def read_elsewhere(chunk: Sequence[int]) -> list[tuple[Any, ...]] | None:
        conn = readers.get()
        try:
            conn.execute("BEGIN")
            try:
                if int(conn.execute(_COUNTER).fetchone()[0]) != counter:
                    return None  # a write came in between: this snapshot is not the caller's
                return _read(conn, sql, chunk)
            finally:
                conn.execute("COMMIT")
        except SQL_ERRORS:
            return None
        finally:
            readers.put(conn)

    pool = ThreadPoolExecutor(len(opened), thread_name_prefix="dlindex-fetch")
    try:
        waiting: deque[tuple[Sequence[int], Future[list[tuple[Any, ...]] | None]]] = deque()
        pending = iter(chunks)
        for chunk in pending:
            waiting.append((chunk, pool.submit(read_elsewhere, chunk)))
            if len(waiting) >= len(opened):
                break
        while waiting:
            chunk, future = waiting.popleft()
            for more in pending:  # keep every reader busy while this chunk is handed on
                waiting.append((more, pool.submit(read_elsewhere, more)))
                break
            rows = future.result()
            yield _read(catalog.conn, sql, chunk) if rows is None else rows
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for conn in opened:
            with suppress(*SQL_ERRORS):
                conn.close()


def _open_readers(catalog: Catalog) -> list[Any]:
    """Up to READERS read-only connections (fewer where the catalog refuses more)."""
    opened: list[Any] = []
    with suppress(*SQL_ERRORS):
        for _ in range(READERS):
            opened.append(catalog.connect_reader(any_thread=True))
    return opened


def _read(conn: Any, sql: str, chunk: Sequence[int]) -> list[tuple[Any, ...]]:
    return list(conn.execute(sql, {"ids": json.dumps(list(chunk))}).fetchall())
