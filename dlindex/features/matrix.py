"""The memory-mapped matrix of a feature type's vectors, cached in a file beside the catalog.

The vectors of a feature type are copied once into ``<catalog>-features/<type>.matrix``
(ids, norms, float32 rows) and memory-mapped by every later call, so a ``similar`` call
or a ``feature_vectors`` lookup reads no BLOBs. The file is keyed by the type's
``version`` (bumped by every write to its vectors, and by a trigger on every deletion),
``created_at`` and the extractor version of its latest compute; an out-of-date file is rebuilt.
The header also holds how many vectors an older extractor version made: a search over them
says so (one warning), once per command.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.errors import DlindexWarning, InputError
from dlindex.faults import disk_full_error, is_disk_full
from dlindex.features.blobs import COUNT_VECTORS, Ids, read_all, read_batches
from dlindex.features.extractor_versions import stale_count, stale_warning
from dlindex.features.types import FeatureType, get_type

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_MAGIC = b"DLIXFEAT"
_HEADER = 512
_FORMAT = 1
# Files up to this size are faulted in whole when mapped (a search reads every page); larger
# ones page in as read, and a pass over them drops what it read (``Matrix.release``), so a
# process's resident memory stays bounded whatever the matrix's size.
_POPULATE_BYTES = 64 << 20  # as neighbours._RESIDENT_BYTES: a larger one is never held whole
_memo: dict[str, Matrix] = {}  # matrix file -> the matrix this process holds of it

Rows = npt.NDArray[np.intp]  # row indices into a matrix, -1 where there is none
Mask = npt.NDArray[np.bool_]


@dataclass
class Matrix:
    """The vectors of one feature type as arrays (usually views of a memory-mapped file)."""

    key: dict[str, Any]
    ids: Ids  # ascending
    norms: npt.NDArray[np.float64]  # Euclidean norm of each row
    vectors: npt.NDArray[np.float32]  # (n, dim)
    # what searches derived from this matrix (row masks, labels), by what they depend on
    masks: dict[tuple[Any, ...], npt.NDArray[Any] | None] = field(default_factory=dict)
    mapped: mmap.mmap | None = None  # the file's mapping, when the arrays are views of one
    stale: int = 0  # rows made by another extractor version than the type's latest compute ran

    def release(self) -> None:
        """Drop the pages of the file read so far from this process (they stay in the page
        cache): a pass over a matrix larger than memory keeps resident memory bounded."""
        if self.mapped is not None and hasattr(mmap, "MADV_DONTNEED"):
            self.mapped.madvise(mmap.MADV_DONTNEED)

    def rows_of(self, ids: Ids) -> Rows:
        """Row index of each id, -1 where the matrix has no vector for it."""
        if not self.ids.size:
            return np.full(ids.shape, -1, dtype=np.intp)
        at = np.searchsorted(self.ids, ids)
        at[at >= self.ids.size] = 0
        return np.where(self.ids[at] == ids, at, -1)


def matrix_path(catalog: Catalog, name: str) -> Path:
    """Beside the catalog file; for a server catalog, in this machine's cache folder."""
    return catalog.backend.features_dir(catalog.conn) / f"{name}.matrix"


def _key(ftype: FeatureType) -> dict[str, Any]:
    return {
        "format": _FORMAT, "name": ftype.name, "version": ftype.version, "created_at": ftype.created_at,
        "dim": ftype.dim, "dtype": ftype.dtype, "extractor_version": ftype.extractor_version,
    }  # fmt: skip


def cached_matrix(catalog: Catalog, ftype: FeatureType, *, populate: bool = False) -> Matrix | None:
    """The current matrix of ``ftype`` if this process or the file beside the catalog has one.

    Args:
        populate: fault every page in now (a search reads them all; a lookup only a few).
    """
    key = _key(ftype)
    path = matrix_path(catalog, ftype.name)
    held = _memo.get(os.fspath(path))
    if held is not None and held.key == key:
        return held
    matrix = _open(path, key, populate=populate)
    if matrix is not None:
        _memo[os.fspath(path)] = matrix
    return matrix


def load_matrix(catalog: Catalog, feature_type: str) -> Matrix:
    """The current matrix of a feature type, built from the catalog (and saved) if stale."""
    ftype = get_type(catalog, feature_type)
    matrix = cached_matrix(catalog, ftype, populate=True) if ftype.dim is not None else None
    if matrix is not None:
        return _said_stale(ftype, matrix)
    conn = catalog.conn
    conn.execute("BEGIN")  # one snapshot: the version read is the version of the rows read
    try:
        ftype = get_type(catalog, feature_type)
        if ftype.dim is None:
            raise InputError(f"feature type {ftype.name!r} has no vectors yet")
        key = _key(ftype)
        path = matrix_path(catalog, ftype.name)
        matrix = _write(catalog, ftype, path, key)  # streamed to the file: memory does not grow with n
        if matrix is None:  # a read-only folder: this process keeps the matrix in memory
            ids, vectors = read_all(catalog, ftype)
            vectors32 = vectors.astype(np.float32, copy=False)
            matrix = Matrix(
                key, ids, _norms(vectors32), vectors32, stale=stale_count(catalog, ftype.name, ftype.extractor_version)
            )
    finally:
        conn.execute("COMMIT")
    _memo[os.fspath(path)] = matrix
    return _said_stale(ftype, matrix)


def _said_stale(ftype: FeatureType, matrix: Matrix) -> Matrix:
    """The matrix, after a warning if some of its rows are stale (a search compares them anyway)."""
    if matrix.stale:
        warnings.warn(stale_warning(ftype.name, matrix.stale, int(matrix.ids.size)), DlindexWarning, stacklevel=3)
    return matrix


def _norms(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    norms = np.empty(len(vectors), dtype=np.float64)
    for start in range(0, len(vectors), 8192):
        part = vectors[start : start + 8192].astype(np.float64)
        norms[start : start + 8192] = np.sqrt(np.einsum("ij,ij->i", part, part))
    return norms


def remove_cached_matrix(catalog: Catalog, name: str) -> None:
    path = matrix_path(catalog, name)
    _memo.pop(os.fspath(path), None)
    with contextlib.suppress(OSError):
        os.unlink(path)


def _layout(n: int, dim: int) -> tuple[int, int, int, int]:
    ids_at = _HEADER
    norms_at = ids_at + 8 * n
    vectors_at = -(-(norms_at + 8 * n) // 64) * 64
    return ids_at, norms_at, vectors_at, vectors_at + 4 * n * dim


def _write(catalog: Catalog, ftype: FeatureType, path: Path, key: dict[str, Any]) -> Matrix | None:
    """Write the matrix file from the catalog a batch at a time, atomically, and map it;
    None if the folder is not writable. Call inside the read transaction that read ``key``."""
    n = int(catalog.conn.execute(COUNT_VECTORS, (ftype.name,)).fetchone()[0])
    dim = int(key["dim"])
    ids_at, norms_at, vectors_at, end = _layout(n, dim)
    header = (
        _MAGIC
        + json.dumps({**key, "n": n, "stale": stale_count(catalog, ftype.name, ftype.extractor_version)}).encode()
    )
    assert len(header) <= _HEADER
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a server catalog's: ~/.cache/dlindex/<identity>/features
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.ljust(_HEADER, b" "))
            f.truncate(end)
            filled = 0
            for ids, vectors in read_batches(catalog, ftype, n):
                rows = np.ascontiguousarray(vectors, dtype="<f4")
                os.pwrite(f.fileno(), ids.astype("<i8").tobytes(), ids_at + 8 * filled)
                os.pwrite(f.fileno(), _norms(rows).astype("<f8").tobytes(), norms_at + 8 * filled)
                os.pwrite(f.fileno(), rows.tobytes(), vectors_at + 4 * dim * filled)
                filled += ids.size
            if filled != n:  # cannot happen inside one snapshot; never leave a file that says n rows
                raise OSError(f"read {filled} of {n} vectors")
        os.replace(tmp, path)  # concurrent readers see the old file or the new one, never half
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if is_disk_full(e):
            raise disk_full_error(e, paths=[path.parent]) from None
        if isinstance(e, OSError):
            return None
        raise
    return _open(path, key)


def _open(path: Path, key: dict[str, Any], *, populate: bool = True) -> Matrix | None:
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER)
            if not header.startswith(_MAGIC):
                return None
            stored = json.loads(header[len(_MAGIC) :].decode())
            n = int(stored.pop("n"))
            stale = int(stored.pop("stale", 0))
            if stored != key:
                return None
            dim = int(key["dim"])
            ids_at, norms_at, vectors_at, end = _layout(n, dim)
            if os.fstat(f.fileno()).st_size != end:
                return None
            populate = populate and end <= _POPULATE_BYTES
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            mapped = mmap.mmap(f.fileno(), end, flags=flags, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    ids = np.frombuffer(mapped, dtype=np.dtype("<i8"), count=n, offset=ids_at)
    norms = np.frombuffer(mapped, dtype=np.dtype("<f8"), count=n, offset=norms_at)
    vectors = np.frombuffer(mapped, dtype=np.dtype("<f4"), count=n * dim, offset=vectors_at).reshape(n, dim)
    return Matrix(key, ids, norms, vectors, mapped=mapped, stale=stale)
