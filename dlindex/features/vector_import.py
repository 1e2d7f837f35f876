"""``features import``: vectors computed elsewhere, from .npy (+ ids file), .npz, Parquet or JSONL.

Everything is read and checked first -- shape, dtype, finiteness, duplicate keys -- and
only then written, in one transaction: an import stores all of its vectors or none of them.
Unknown sample ids are caught by the foreign key while writing, which rolls it all back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.catalog.backend import INTEGRITY_ERRORS
from dlindex.catalog.paths import AMBIGUOUS, NO_ROOT, UNKNOWN, path_key, resolve_paths, root_prefixes
from dlindex.catalog.versions import command_text
from dlindex.errors import CatalogError, InputError
from dlindex.features.blobs import Ids, write_vectors
from dlindex.features.readers import DEFAULT_MAX_BYTES, read_import_file
from dlindex.features.types import DTYPES, check_dtype, check_name, create_type, find_type, set_dim

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

_ALL_IDS = "SELECT id FROM image_metadata ORDER BY id"
_SAMPLES = "SELECT count(*) FROM image_metadata"
_CHUNK = 65_536
# Below this, WAL's second write of the pages costs well under a second: not worth taking
# the catalog from other processes for.
_ROLLBACK_MIN_BYTES = 64 << 20

_Floats = npt.NDArray[np.floating[Any]]  # (n, dim) vectors as read, of any float dtype


@dataclass(frozen=True)
class ImportSummary:
    feature_type: str
    file: str
    created: bool
    imported: int
    dim: int
    dtype: str
    bytes: int
    seconds: float
    mb_per_s: float
    journal: str  # "rollback" when the import had the catalog to itself, else "wal"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def import_features(
    catalog: Catalog,
    feature_type: str,
    file: str | os.PathLike[str],
    *,
    ids_file: str | os.PathLike[str] | None = None,
    column: str = "vector",
    dtype: str | None = None,
    concurrent: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ImportSummary:
    """Store the vectors in ``file`` as ``feature_type``; all of them, or (InputError) none.

    Args:
        ids_file: for .npy only: the sample ids, one per line (text) or an integer .npy.
        column: the vector column of Parquet and JSONL files.
        dtype: float32 (default) or float16, for a new feature type.
        concurrent: keep the catalog in WAL mode even for a large import, so that other
            processes can open and read it meanwhile. Otherwise an import of 64 MiB or more
            that finds no other connection switches to a rollback journal for its
            transaction and writes its pages once instead of twice (2.6x faster for 2 GB);
            a process that opens the catalog meanwhile waits for it.
        max_bytes: refuse a file whose arrays would take more memory than this to read
            (an ``.npy`` of vectors is memory-mapped and needs only a consistent header).

    Raises:
        InputError: a bad file (checked before it is loaded), or a type that
            ``features compute`` made (imports go into types of their own).
    """
    started = time.perf_counter()
    name = check_name(feature_type)
    if dtype is not None:
        check_dtype(dtype)
    existing = find_type(catalog, name)
    if existing is not None and existing.extractor != "import":
        raise InputError(
            f"feature type {name!r} is computed by extractor {existing.extractor!r}; "
            f"import into a type of its own (e.g. --type {name[:57]}_import)"
        )
    if existing is not None and dtype is not None and dtype != existing.dtype:
        raise InputError(f"feature type {name!r} stores {existing.dtype}, not {dtype}")
    path = Path(file)
    # Each vector needs a sample of its own: a file claiming more is refused from its header,
    # before its arrays are inflated or decoded.
    samples = int(catalog.conn.execute(_SAMPLES).fetchone()[0])  # bookkeeping: not in the query log
    loaded = read_import_file(path, ids_file, column, max_bytes, max_rows=samples)
    keys, vectors = loaded.keys, loaded.vectors  # keys: ids, or paths (a list) to resolve
    if vectors.ndim != 2:
        raise InputError(f"{path}: vectors must be a 2-D array (n x dim), not shape {vectors.shape}")
    if vectors.dtype.kind != "f":
        raise InputError(f"{path}: vectors have dtype {vectors.dtype}; expected float16, float32 or float64")
    n, dim = vectors.shape
    if n == 0 or dim == 0:
        raise InputError(f"{path} holds no vectors (shape {vectors.shape})")
    if len(keys) != n:
        raise InputError(f"{path}: {len(keys)} ids for {n} vectors")
    if existing is not None and existing.dim is not None and existing.dim != dim:
        raise InputError(f"{path}: vectors have dim {dim}; feature type {name!r} has dim {existing.dim}")
    ids = _resolve_paths(catalog, keys, path) if isinstance(keys, list) else np.asarray(keys, dtype=np.int64)
    _check_unique(ids, path)
    target = DTYPES[existing.dtype if existing else (dtype or "float32")]
    _check_finite(vectors, ids, target, path)
    size = n * dim * target.itemsize
    with ExitStack() as stack:
        stack.enter_context(catalog.backend.page_cache(catalog.conn, size))
        rollback = False
        if size >= _ROLLBACK_MIN_BYTES and not concurrent:
            rollback = stack.enter_context(catalog.rollback_journal())
        version = stack.enter_context(catalog.versioned(command_text("features import", name, os.fspath(path))))
        version.keep, version.summary = True, {"vectors": n}  # vectors have no history: kept by name
        conn = stack.enter_context(catalog.write_transaction())
        if existing is None:
            create_type(conn, name, target.name, "import", dim)
        elif existing.dim is None:
            set_dim(conn, name, dim)
        ftype = find_type(catalog, name)
        assert ftype is not None
        if existing is None and (ftype.extractor != "import" or ftype.dim != dim):
            raise InputError(f"feature type {name!r} was made meanwhile by another process; nothing was imported")
        try:
            write_vectors(conn, ftype, _rows(ids, vectors, target))
        except INTEGRITY_ERRORS as e:
            # image_id's foreign key caught an id the catalog lacks: name them all, and the
            # transaction rolls back. (Checking first cost 0.5-0.9 s of a 20 s import.)
            _check_known(catalog, ids, path)
            raise CatalogError(f"cannot import {path}: {e}; nothing was imported") from None
    seconds = time.perf_counter() - started
    return ImportSummary(
        name, os.fspath(path), existing is None, n, dim, target.name, size, round(seconds, 3),
        round(size / seconds / 1e6, 1) if seconds > 0 else 0.0, "rollback" if rollback else "wal",
    )  # fmt: skip


def _rows(ids: Ids, vectors: _Floats, dtype: np.dtype[np.floating[Any]]) -> Iterator[tuple[int, memoryview]]:
    width = vectors.shape[1] * dtype.itemsize
    for start in range(0, len(ids), _CHUNK):
        block = np.ascontiguousarray(vectors[start : start + _CHUNK], dtype=dtype)
        raw = block.data.cast("B")  # the bytes of each row, sliced without copying
        for j, image_id in enumerate(ids[start : start + _CHUNK].tolist()):
            yield image_id, raw[j * width : (j + 1) * width]


def _resolve_paths(catalog: Catalog, paths: list[str], source: Path) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Sample ids of paths: absolute, or relative to their root (unambiguous across roots)."""
    raws = [os.fsencode(text) for text in paths]
    prefixes = root_prefixes(catalog.conn)
    for text, raw in zip(paths, raws, strict=True):
        if path_key(raw, prefixes)[0] == NO_ROOT:
            raise InputError(f"{source}: {text!r} is under no scanned root")
    ids = np.asarray(resolve_paths(catalog, raws), dtype=np.int64)
    ambiguous = np.flatnonzero(ids == AMBIGUOUS)
    if ambiguous.size:
        raise InputError(
            f"{source}: {paths[int(ambiguous[0])]!r} matches files under several roots; use the absolute path"
        )
    unknown = [p for p, i in zip(paths, ids.tolist(), strict=True) if i == UNKNOWN]
    if unknown:
        shown = ", ".join(repr(p) for p in unknown[:5])
        raise InputError(f"{source}: {len(unknown)} path(s) not in the catalog: {shown}; nothing was imported")
    return ids


def _check_unique(ids: Ids, source: Path) -> None:
    ordered = np.sort(ids)
    dup = ordered[1:][ordered[1:] == ordered[:-1]]
    if dup.size:
        raise InputError(f"{source}: id {int(dup[0])} appears more than once; nothing was imported")


def _check_known(catalog: Catalog, ids: Ids, source: Path) -> None:
    ordered = np.sort(ids)
    known = np.fromiter((row[0] for row in catalog.read(_ALL_IDS)), dtype=np.int64)
    at = np.searchsorted(known, ordered)
    at[at >= known.size] = 0
    unknown = ordered[known[at] != ordered] if known.size else ordered
    if unknown.size:
        shown = ", ".join(str(i) for i in unknown[:10].tolist())
        more = " ..." if unknown.size > 10 else ""
        raise InputError(f"{source}: {unknown.size} unknown id(s): {shown}{more}; nothing was imported")


def _check_finite(vectors: _Floats, ids: Ids, dtype: np.dtype[np.floating[Any]], source: Path) -> None:
    for start in range(0, len(vectors), _CHUNK):
        with np.errstate(over="ignore", invalid="ignore"):
            block = np.asarray(vectors[start : start + _CHUNK]).astype(dtype, copy=False)
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            row = start + int(np.argmin(finite))
            raise InputError(
                f"{source}: row {row + 1} (id {int(ids[row])}) has NaN or infinite values as {dtype.name}; "
                "nothing was imported"
            )
