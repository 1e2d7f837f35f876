"""Feature types and their vectors in the catalog: names, encoding, reads, writes, drop, export.

A vector is stored as the raw little-endian bytes of its type's dtype (float32, or
float16 on request). Every write goes through ``write_vectors``, which checks the size
against the type's dim and dtype (values are cast and checked for finiteness before);
readers check sizes too, so a vector written wrongly by another program is reported.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dlindex.errors import InputError, Interrupted
from dlindex.features import state, tempfiles
from dlindex.procs import sigterm_as_interrupt

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
# SQLite's keywords: a feature-type name must be usable anywhere without quoting.
_KEYWORDS = frozenset(
    """ABORT ACTION ADD AFTER ALL ALTER ALWAYS ANALYZE AND AS ASC ATTACH AUTOINCREMENT BEFORE BEGIN
    BETWEEN BY CASCADE CASE CAST CHECK COLLATE COLUMN COMMIT CONFLICT CONSTRAINT CREATE CROSS CURRENT
    CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP DATABASE DEFAULT DEFERRABLE DEFERRED DELETE DESC DETACH
    DISTINCT DO DROP EACH ELSE END ESCAPE EXCEPT EXCLUDE EXCLUSIVE EXISTS EXPLAIN FAIL FILTER FIRST
    FOLLOWING FOR FOREIGN FROM FULL GENERATED GLOB GROUP GROUPS HAVING IF IGNORE IMMEDIATE IN INDEX
    INDEXED INITIALLY INNER INSERT INSTEAD INTERSECT INTO IS ISNULL JOIN KEY LAST LEFT LIKE LIMIT MATCH
    MATERIALIZED NATURAL NO NOT NOTHING NOTNULL NULL NULLS OF OFFSET ON OR ORDER OTHERS OUTER OVER
    PARTITION PLAN PRAGMA PRECEDING PRIMARY QUERY RAISE RANGE RECURSIVE REFERENCES REGEXP REINDEX
    RELEASE RENAME REPLACE RESTRICT RETURNING RIGHT ROLLBACK ROW ROWS SAVEPOINT SELECT SET TABLE TEMP
    TEMPORARY THEN TIES TO TRANSACTION TRIGGER UNBOUNDED UNION UNIQUE UPDATE USING VACUUM VALUES VIEW
    VIRTUAL WHEN WHERE WINDOW WITH WITHOUT""".split()
)

_TYPE = "SELECT name, dim, dtype, extractor, version, created_at FROM feature_types WHERE name = ?"
_TYPES = "SELECT name, dim, dtype, extractor, version, created_at FROM feature_types ORDER BY name"
_CREATE_TYPE = "INSERT INTO feature_types (name, dim, dtype, extractor) VALUES (?, ?, ?, ?)"
_SET_DIM = "UPDATE feature_types SET dim = ? WHERE name = ? AND dim IS NULL"
_BUMP_VERSION = "UPDATE feature_types SET version = version + 1 WHERE name = ?"
_DROP_TYPE = "DELETE FROM feature_types WHERE name = ?"
_UPSERT_VECTOR = """INSERT INTO image_features (image_id, feature_type, vector) VALUES (?, ?, ?)
    ON CONFLICT (image_id, feature_type) DO UPDATE SET vector = excluded.vector, updated_at = CURRENT_TIMESTAMP"""
_COUNT_VECTORS = "SELECT count(*) FROM image_features WHERE feature_type = ?"
_VECTORS = "SELECT image_id, vector FROM image_features WHERE feature_type = ? ORDER BY image_id"
_VECTORS_OF = (
    "SELECT image_id, vector FROM image_features "
    "WHERE feature_type = :type AND image_id IN (SELECT value FROM json_each(:ids))"
)
_IMAGE_FEATURES = (
    "SELECT feature_type, vector, created_at, updated_at FROM image_features WHERE image_id = ? ORDER BY feature_type"
)
_IMAGE = (
    "SELECT image_metadata.id, labels.name, image_metadata.status, image_metadata.processing_status "
    "FROM image_metadata LEFT JOIN labels ON labels.id = image_metadata.label_id WHERE image_metadata.id = ?"
)
_CHUNK = 10_000


@dataclass(frozen=True)
class FeatureType:
    """One row of ``feature_types``; ``dim`` is None until the first vector is stored."""

    name: str
    dim: int | None
    dtype: str
    extractor: str
    version: int
    created_at: str

    @property
    def np_dtype(self) -> np.dtype[Any]:
        return DTYPES[self.dtype]

    @property
    def vector_bytes(self) -> int | None:
        return None if self.dim is None else self.dim * self.np_dtype.itemsize


@dataclass(frozen=True)
class FeatureTypeInfo:
    """A feature type with its counts, as ``features list`` prints it."""

    name: str
    dim: int | None
    dtype: str
    extractor: str
    vectors: int
    failed: int
    queued: int
    version: int
    created_at: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ImageFeatures:
    """The vectors and compute state of one image, as ``features show`` prints them.

    ``processing_status`` is the image's own (``dlindex mark``'s); ``failures`` and
    ``queued`` are ``features compute``'s, per type.
    """

    id: int
    label: str | None  # None: no class (a file directly under ROOT)
    status: str
    processing_status: str | None
    vectors: dict[str, dict[str, Any]]
    failures: dict[str, dict[str, Any]]
    queued: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DropResult:
    feature_type: str
    vectors: int
    failed: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExportResult:
    feature_type: str
    path: str
    vectors: int
    dim: int
    dtype: str
    bytes: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain identifier that no SQL context needs to quote."""
    if not _NAME.match(name) or name.upper() in _KEYWORDS:
        raise InputError(
            f"invalid feature type name {name!r}: use letters, digits and _ (not first), at most 64 "
            "characters, and not an SQL keyword; e.g. colorhist, resnet50_v2"
        )
    return name


def find_type(catalog: Catalog, name: str) -> FeatureType | None:
    row = catalog.conn.execute(_TYPE, (name,)).fetchone()
    return FeatureType(*row) if row else None


def get_type(catalog: Catalog, name: str) -> FeatureType:
    """The feature type ``name``; InputError listing the known types if there is none."""
    found = find_type(catalog, name)
    if found is None:
        raise InputError(unknown_type_message(catalog, name))
    return found


def unknown_type_message(catalog: Catalog, name: str) -> str:
    known = [row[0] for row in catalog.conn.execute(_TYPES)]
    if not known:
        return (
            f"unknown feature type {name!r}: the catalog has none yet; "
            f"run dlindex features compute --type {name} --extractor colorhist (or features import)"
        )
    return f"unknown feature type {name!r}; known types: {', '.join(known)}"


def create_type(conn: sqlite3.Connection, name: str, dtype: str, extractor: str, dim: int | None = None) -> None:
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; choose float32 or float16")
    conn.execute(_CREATE_TYPE, (check_name(name), dim, dtype, extractor))


def encode(value: Any, dtype: np.dtype[Any], *, allow_integers: bool = True) -> np.ndarray:
    """A 1-D little-endian vector of ``dtype`` from an array-like; ValueError says what is wrong."""
    array = np.asarray(value)
    if array.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {array.shape}")
    kind = array.dtype.kind
    if not (kind == "f" or (allow_integers and kind in "iub")):
        raise ValueError(f"expected real numbers, got dtype {array.dtype}")
    if array.size == 0:
        raise ValueError("expected a non-empty vector")
    if array.dtype == dtype:
        cast = array  # the common case: skip errstate's ~5 us per vector
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            cast = array.astype(dtype)
    if not np.isfinite(cast).all():
        raise ValueError(f"vector has NaN or infinite values (as {dtype.name})")
    return cast


def write_vectors(conn: sqlite3.Connection, ftype: FeatureType, rows: Iterable[tuple[int, bytes | memoryview]]) -> None:
    """Upsert vectors inside the caller's write transaction; bumps the type's version once."""
    name, width = ftype.name, ftype.vector_bytes
    assert width is not None, "set the type's dim before storing vectors"
    count = [0]

    def params() -> Iterator[tuple[int, str, bytes | memoryview]]:
        for image_id, blob in rows:
            if len(blob) != width:  # the one check every stored vector passes
                raise InputError(f"vector of sample {image_id} has {len(blob)} bytes; {name!r} stores {width}")
            count[0] += 1
            yield image_id, name, blob

    # The query log counts statements through a Python wrapper, a call per row (6% of a
    # million-vector import): run the statement directly and report it once.
    report = getattr(conn, "on_write", None)
    started = time.perf_counter()
    cursor = sqlite3.Connection.executemany(conn, _UPSERT_VECTOR, params())
    if report is not None and count[0]:
        report(_UPSERT_VECTOR, count[0], max(cursor.rowcount, 0), time.perf_counter() - started)
    conn.execute(_BUMP_VERSION, (name,))


def set_dim(conn: sqlite3.Connection, name: str, dim: int) -> None:
    conn.execute(_SET_DIM, (dim, name))


def feature_vectors(catalog: Catalog, ids: Sequence[int] | np.ndarray, feature_type: str) -> np.ndarray:
    """The ``(len(ids), dim)`` vectors of ``ids``, in order, as the type's dtype.

    Served from the memory-mapped matrix when it is current, else read from the catalog.

    Raises:
        InputError: unknown feature type (naming the known ones), or ids without a vector.
    """
    from dlindex.features.neighbours import cached_matrix

    ftype = get_type(catalog, feature_type)
    id_array = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ftype.dim is None:
        if id_array.size:
            raise InputError(f"feature type {ftype.name!r} has no vectors yet")
        return np.zeros((0, 0), dtype=ftype.np_dtype)
    matrix = cached_matrix(catalog, ftype)
    if matrix is not None:
        rows = matrix.rows_of(id_array)
        missing = id_array[rows < 0]
        if not missing.size:
            return matrix.vectors[rows].astype(ftype.np_dtype)
        raise InputError(_missing_message(ftype.name, missing))
    unique, inverse = np.unique(id_array, return_inverse=True)
    vectors = np.empty((unique.size, ftype.dim), dtype=ftype.np_dtype)
    found = np.zeros(unique.size, dtype=bool)
    for start in range(0, unique.size, _CHUNK):
        chunk = unique[start : start + _CHUNK]
        params = {"type": ftype.name, "ids": json.dumps(chunk.tolist())}
        pairs = sorted(catalog.read(_VECTORS_OF, params))
        _check_sizes(ftype, pairs)
        if pairs:
            at = start + np.searchsorted(chunk, [p[0] for p in pairs])
            blob = b"".join(p[1] for p in pairs)
            vectors[at] = np.frombuffer(blob, dtype=ftype.np_dtype).reshape(len(pairs), ftype.dim)
            found[at] = True
    if not found.all():
        raise InputError(_missing_message(ftype.name, unique[~found]))
    return vectors[inverse]


def _check_sizes(ftype: FeatureType, rows: Sequence[tuple[int, bytes]]) -> None:
    width = ftype.vector_bytes
    for image_id, blob in rows:
        if len(blob) != width:
            raise InputError(
                f"the {ftype.name!r} vector of sample {image_id} has {len(blob)} bytes, not {width} "
                f"(written by another program?); recompute or re-import it"
            )


def _missing_message(name: str, missing: np.ndarray) -> str:
    shown = ", ".join(str(i) for i in missing[:5].tolist())
    more = " ..." if missing.size > 5 else ""
    return (
        f"{missing.size} id(s) have no {name!r} vector: {shown}{more}; "
        f"run dlindex features compute --type {name} (or check the ids)"
    )


def read_all(catalog: Catalog, ftype: FeatureType) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of every vector of ``ftype``, ids ascending; call inside a read transaction."""
    assert ftype.dim is not None
    n = int(catalog.conn.execute(_COUNT_VECTORS, (ftype.name,)).fetchone()[0])
    ids = np.empty(n, dtype=np.int64)
    vectors = np.empty((n, ftype.dim), dtype=ftype.np_dtype)
    filled = 0
    cursor = catalog.conn.execute(_VECTORS, (ftype.name,))
    while filled < n:
        batch = cursor.fetchmany(_CHUNK)
        if not batch:
            break
        m = len(batch)
        _check_sizes(ftype, batch)
        ids[filled : filled + m] = [row[0] for row in batch]
        vectors[filled : filled + m] = np.frombuffer(b"".join(row[1] for row in batch), dtype=ftype.np_dtype).reshape(
            m, ftype.dim
        )
        filled += m
    cursor.close()
    return ids[:filled], vectors[:filled]


def list_feature_types(catalog: Catalog) -> list[FeatureTypeInfo]:
    """Every feature type with its counts of vectors, failed and queued samples."""
    infos = []
    for row in list(catalog.read(_TYPES)):
        ftype = FeatureType(*row)
        vectors = int(catalog.conn.execute(_COUNT_VECTORS, (ftype.name,)).fetchone()[0])
        states = state.counts(catalog.conn, ftype.name)
        infos.append(
            FeatureTypeInfo(
                ftype.name,
                ftype.dim,
                ftype.dtype,
                ftype.extractor,
                vectors,
                states["failed"],
                states["queued"],
                ftype.version,
                ftype.created_at,
            )
        )
    return infos


def show_features(catalog: Catalog, image_id: int, feature_type: str | None = None) -> ImageFeatures:
    """The vectors (as lists of floats) and failures of one image."""
    image = catalog.conn.execute(_IMAGE, (image_id,)).fetchone()
    if image is None:
        raise InputError(f"no sample with id {image_id} in the catalog")
    if feature_type is not None:
        get_type(catalog, feature_type)
    types = {row[0]: FeatureType(*row) for row in catalog.conn.execute(_TYPES)}
    vectors: dict[str, dict[str, Any]] = {}
    for name, blob, created_at, updated_at in catalog.read(_IMAGE_FEATURES, (image_id,)):
        if feature_type is not None and name != feature_type:
            continue
        ftype = types[name]
        values = np.frombuffer(blob, dtype=ftype.np_dtype)
        vectors[name] = {
            "dim": ftype.dim, "dtype": ftype.dtype, "vector": values.astype(np.float64).tolist(),
            "created_at": created_at, "updated_at": updated_at,
        }  # fmt: skip
    failures: dict[str, dict[str, Any]] = {}
    queued: list[str] = []
    for name, kind, error, updated_at in state.of_image(catalog, image_id):
        if feature_type is not None and name != feature_type:
            continue
        if kind == "failed":
            failures[name] = {"error": error, "failed_at": updated_at}
        else:
            queued.append(name)
    return ImageFeatures(int(image[0]), image[1], image[2], image[3], vectors, failures, queued)


def drop_feature_type(catalog: Catalog, name: str) -> DropResult:
    """Delete a feature type with all its vectors and failure records, and its cached matrix."""
    from dlindex.features.neighbours import remove_cached_matrix

    ftype = get_type(catalog, name)
    with catalog.write_transaction() as conn:
        vectors = int(conn.execute(_COUNT_VECTORS, (name,)).fetchone()[0])
        failed = state.counts(conn, name)["failed"]
        conn.execute(_DROP_TYPE, (name,))  # the vectors and states go by ON DELETE CASCADE
    remove_cached_matrix(catalog, ftype.name)
    return DropResult(name, vectors, failed)


def export_features(catalog: Catalog, name: str, out: str | os.PathLike[str]) -> ExportResult:
    """Write ``ids`` (int64) and ``vectors`` (n x dim, the type's dtype) to an .npz file, atomically."""
    started = time.perf_counter()
    ftype = get_type(catalog, name)
    target = Path(out)
    if target.suffix != ".npz":
        raise InputError(f"export writes an .npz file; name it {target.name}.npz or similar, not {target.name}")
    if not target.parent.is_dir():
        raise InputError(f"cannot write {target}: folder {target.parent} does not exist")
    if ftype.dim is None:
        ids, vectors = np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=ftype.np_dtype)
    else:
        catalog.conn.execute("BEGIN")  # one snapshot: count and rows agree
        try:
            ids, vectors = read_all(catalog, ftype)
        finally:
            catalog.conn.execute("COMMIT")
    tempfiles.remove_leftovers(target.parent)  # of exports killed before they could clean up
    restore = sigterm_as_interrupt()  # SIGTERM unwinds like Ctrl-C, through the cleanup below
    try:
        fd, tmp = tempfiles.create(target)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, ids=ids, vectors=vectors)
            os.replace(tmp, target)  # a reader never sees half a file
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except KeyboardInterrupt:
        raise Interrupted(f"features export interrupted; {target} was not written") from None
    finally:
        restore()
    return ExportResult(
        name, os.fspath(target), int(ids.size), int(ftype.dim or 0), ftype.dtype, target.stat().st_size,
        round(time.perf_counter() - started, 3),
    )  # fmt: skip
