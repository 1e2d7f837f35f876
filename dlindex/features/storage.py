"""Feature vectors by sample id, and the list, show, drop and export of feature types.

Types are defined in :mod:`.types`, vectors encoded and written in :mod:`.vectors`;
lookups by id use the memory-mapped matrix of :mod:`.matrix` when it is current.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import numpy.typing as npt
from numpy.lib import format as npy_format

from dlindex.engines.local import sigterm_as_interrupt
from dlindex.errors import InputError, Interrupted
from dlindex.features import compute_state, extractor_versions, tempfiles
from dlindex.features.blobs import CHUNK, COUNT_VECTORS, Ids, Vectors, decode_rows, read_all
from dlindex.features.matrix import cached_matrix, remove_cached_matrix
from dlindex.features.types import TYPES, FeatureType, all_types, get_type

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_DROP_TYPE = "DELETE FROM feature_types WHERE name = ?"
_VECTORS_OF = (
    "SELECT image_id, vector FROM image_features "
    "WHERE feature_type = :type AND image_id IN (SELECT value FROM json_each(:ids))"
)
_IDS_WITH_VECTORS = "SELECT image_id FROM image_features WHERE feature_type = :type ORDER BY image_id"
_IMAGE_FEATURES = (
    "SELECT feature_type, vector, created_at, updated_at, extractor_version FROM image_features WHERE image_id = ? "
    "ORDER BY feature_type"
)
_IMAGE = (
    "SELECT image_metadata.id, labels.name, image_metadata.status, image_metadata.processing_status "
    "FROM image_metadata LEFT JOIN labels ON labels.id = image_metadata.label_id WHERE image_metadata.id = ?"
)
# numpy's stubs leave numpy.lib.format untyped: typed here, once.
_write_array: Callable[..., None] = npy_format.write_array


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
    extractor_version: str | None = None  # the latest compute's (None: none recorded)
    stale: int = 0  # vectors another version of the extractor made
    auto: bool = False  # new and changed ok samples are queued for it (`features auto`)

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


def feature_vectors(catalog: Catalog, ids: Sequence[int] | Ids, feature_type: str) -> Vectors:
    """The ``(len(ids), dim)`` vectors of ``ids``, in order, as the type's dtype.

    Served from the memory-mapped matrix when it is current, else read from the catalog.

    Raises:
        InputError: unknown feature type (naming the known ones), or ids without a vector.
    """
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
    for start in range(0, unique.size, CHUNK):
        chunk = unique[start : start + CHUNK]
        params = {"type": ftype.name, "ids": json.dumps(chunk.tolist())}
        pairs = sorted(catalog.read(_VECTORS_OF, params))
        if pairs:
            at = start + np.searchsorted(chunk, [p[0] for p in pairs])
            vectors[at] = decode_rows(ftype, pairs)
            found[at] = True
    if not found.all():
        raise InputError(_missing_message(ftype.name, unique[~found]))
    return vectors[inverse]


def _missing_message(name: str, missing: Ids) -> str:
    shown = ", ".join(str(i) for i in missing[:5].tolist())
    more = " ..." if missing.size > 5 else ""
    return (
        f"{missing.size} id(s) have no {name!r} vector: {shown}{more}; "
        f"run dlindex features compute --type {name} (or check the ids)"
    )


def list_feature_types(catalog: Catalog) -> list[FeatureTypeInfo]:
    """Every feature type with its counts of vectors, failed and queued samples."""
    infos = []
    for ftype in all_types(catalog):
        vectors = int(catalog.conn.execute(COUNT_VECTORS, (ftype.name,)).fetchone()[0])
        states = compute_state.counts(catalog.conn, ftype.name)
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
                extractor_versions.version_text(catalog, ftype.name, ftype.extractor_version),
                extractor_versions.stale_count(catalog, ftype.name, ftype.extractor_version),
                bool(ftype.auto),
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
    types = {row[0]: FeatureType(*row) for row in catalog.conn.execute(TYPES)}
    vectors: dict[str, dict[str, Any]] = {}
    for name, blob, created_at, updated_at, made_by in catalog.read(_IMAGE_FEATURES, (image_id,)):
        if feature_type is not None and name != feature_type:
            continue
        ftype = types[name]
        values = np.frombuffer(blob, dtype=ftype.np_dtype)
        vectors[name] = {
            "dim": ftype.dim, "dtype": ftype.dtype, "vector": values.astype(np.float64).tolist(),
            "created_at": created_at, "updated_at": updated_at,
            # made by another version of the type's extractor than its latest compute ran
            "stale": ftype.extractor_version is not None and made_by != ftype.extractor_version,
        }  # fmt: skip
    failures: dict[str, dict[str, Any]] = {}
    queued: list[str] = []
    for name, kind, error, updated_at in compute_state.of_image(catalog, image_id):
        if feature_type is not None and name != feature_type:
            continue
        if kind == "failed":
            failures[name] = {"error": error, "failed_at": updated_at}
        else:
            queued.append(name)
    return ImageFeatures(int(image[0]), image[1], image[2], image[3], vectors, failures, queued)


def drop_feature_type(catalog: Catalog, name: str) -> DropResult:
    """Delete a feature type with all its vectors and failure records, and its cached matrix."""
    ftype = get_type(catalog, name)
    with catalog.write_transaction() as conn:
        vectors = int(conn.execute(COUNT_VECTORS, (name,)).fetchone()[0])
        failed = compute_state.counts(conn, name)["failed"]
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
                _write_npz(f, {"ids": ids, "vectors": vectors})
            os.replace(tmp, target)  # a reader never sees half a file
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except KeyboardInterrupt:
        raise Interrupted(f"features export interrupted; {target} was not written") from None
    finally:
        restore()
    return ExportResult(
        name, os.fspath(target), int(ids.size), int(ftype.dim or 0), ftype.dtype, target.stat().st_size,
        round(time.perf_counter() - started, 3),
    )  # fmt: skip


def _write_npz(f: BinaryIO, arrays: dict[str, npt.NDArray[Any]]) -> None:
    """What ``np.savez`` writes, with the archive closed when a write fails: np.savez leaves
    it open, and its ``__del__`` later prints a traceback (a disk full mid-file)."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                _write_array(member, array, allow_pickle=False)


def vector_ids(catalog: Catalog, feature_type: str) -> Ids:
    """The sorted ids that have a vector of ``feature_type`` (InputError: unknown type)."""
    ftype = get_type(catalog, feature_type)
    ids = [row[0] for row in catalog.conn.execute(_IDS_WITH_VECTORS, {"type": ftype.name})]
    return np.asarray(ids, dtype=np.int64)
