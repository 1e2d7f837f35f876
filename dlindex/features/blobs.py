"""Feature vectors as catalog BLOBs: encoding, size-checked writes and whole-type reads.

A vector is stored as the raw little-endian bytes of its type's dtype (float32, or
float16 on request). Every write goes through ``write_vectors``, which checks the size
against the type's dim and dtype (values are cast and checked for finiteness before);
readers check sizes too, so a vector written wrongly by another program is reported.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.errors import InputError
from dlindex.features.types import FeatureType

if TYPE_CHECKING:
    from dlindex.catalog.backend import Connection
    from dlindex.catalog.connection import Catalog

_UPSERT_VECTOR = """INSERT INTO image_features (image_id, feature_type, vector, extractor_version) VALUES (?, ?, ?, ?)
    ON CONFLICT (image_id, feature_type) DO UPDATE SET vector = excluded.vector,
    extractor_version = excluded.extractor_version, updated_at = CURRENT_TIMESTAMP"""
_BUMP_VERSION = "UPDATE feature_types SET version = version + 1 WHERE name = ?"
COUNT_VECTORS = "SELECT count(*) FROM image_features WHERE feature_type = ?"
_VECTORS = "SELECT image_id, vector FROM image_features WHERE feature_type = ? ORDER BY image_id"
CHUNK = 10_000  # rows fetched, or ids looked up, per statement

Ids = npt.NDArray[np.int64]
Vectors = npt.NDArray[np.floating[Any]]  # (n, dim), of a type's dtype


def encode(value: object, dtype: np.dtype[np.floating[Any]], *, allow_integers: bool = True) -> Vectors:
    """A 1-D little-endian vector of ``dtype`` from an array-like; ValueError says what is wrong."""
    array = np.asarray(value)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {array.shape}")
    kind = array.dtype.kind
    if not (kind == "f" or (allow_integers and kind in "iub")):
        raise ValueError(f"expected real numbers, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError("expected a non-empty vector")
    cast: Vectors
    if array.dtype == dtype:
        cast = array  # the common case: skip errstate's ~5 us per vector
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            cast = array.astype(dtype)
    if not np.isfinite(cast).all():
        raise ValueError(f"vector has NaN or infinite values (as {dtype.name})")
    return cast


def write_vectors(
    conn: Connection,
    ftype: FeatureType,
    rows: Iterable[tuple[int, bytes | memoryview]],
    extractor_version: int | None = None,
) -> None:
    """Upsert vectors inside the caller's write transaction; bumps the type's version once.
    ``extractor_version``: the id of the extractor version that made them (None: imported)."""
    name, width = ftype.name, ftype.vector_bytes
    assert width is not None, "set the type's dim before storing vectors"
    count = [0]

    def params() -> Iterator[tuple[int, str, bytes | memoryview, int | None]]:
        for image_id, blob in rows:
            if len(blob) != width:  # the one check every stored vector passes
                raise InputError(f"vector of sample {image_id} has {len(blob)} bytes; {name!r} stores {width}")
            count[0] += 1
            yield image_id, name, blob, extractor_version

    # The query log counts statements through a Python wrapper, a call per row (6% of a
    # million-vector import): run the statement directly and report it once.
    if not isinstance(conn, sqlite3.Connection):  # a server catalog reports its own writes
        conn.executemany(_UPSERT_VECTOR, params())
        conn.execute(_BUMP_VERSION, (name,))
        return
    report = getattr(conn, "on_write", None)
    started = time.perf_counter()
    cursor = sqlite3.Connection.executemany(conn, _UPSERT_VECTOR, params())
    if report is not None and count[0]:
        report(_UPSERT_VECTOR, count[0], max(cursor.rowcount, 0), time.perf_counter() - started)
    conn.execute(_BUMP_VERSION, (name,))


def check_sizes(ftype: FeatureType, rows: Sequence[tuple[int, bytes]]) -> None:
    """InputError if a stored vector is not the size its type's dim and dtype make."""
    width = ftype.vector_bytes
    for image_id, blob in rows:
        if len(blob) != width:
            raise InputError(
                f"the {ftype.name!r} vector of sample {image_id} has {len(blob)} bytes, not {width} "
                f"(written by another program?); recompute or re-import it"
            )


def decode_rows(ftype: FeatureType, rows: Sequence[tuple[int, bytes]]) -> Vectors:
    """The (len(rows), dim) vectors of (id, BLOB) rows, sizes checked."""
    assert ftype.dim is not None
    check_sizes(ftype, rows)
    blob = b"".join(row[1] for row in rows)
    return np.frombuffer(blob, dtype=ftype.np_dtype).reshape(len(rows), ftype.dim)


def read_all(catalog: Catalog, ftype: FeatureType) -> tuple[Ids, Vectors]:
    """(ids, vectors) of every vector of ``ftype``, ids ascending; call inside a read transaction."""
    assert ftype.dim is not None
    n = int(catalog.conn.execute(COUNT_VECTORS, (ftype.name,)).fetchone()[0])
    ids = np.empty(n, dtype=np.int64)
    vectors = np.empty((n, ftype.dim), dtype=ftype.np_dtype)
    filled = 0
    for batch_ids, batch in read_batches(catalog, ftype, n):
        m = batch_ids.size
        ids[filled : filled + m] = batch_ids
        vectors[filled : filled + m] = batch
        filled += m
    return ids[:filled], vectors[:filled]


def read_batches(catalog: Catalog, ftype: FeatureType, most: int) -> Iterator[tuple[Ids, Vectors]]:
    """(ids, vectors) of up to ``most`` vectors of ``ftype``, ids ascending, CHUNK rows at a time."""
    filled = 0
    cursor = catalog.conn.execute(_VECTORS, (ftype.name,))
    try:
        while filled < most:
            batch = cursor.fetchmany(min(CHUNK, most - filled))
            if not batch:
                break
            filled += len(batch)
            yield np.array([row[0] for row in batch], dtype=np.int64), decode_rows(ftype, batch)
    finally:
        cursor.close()
