"""The vectors of a feature type for duplicate search: 64-bit hashes packed, or embeddings as is.

The built-in ``dhash`` type stores 64 float32 values of 0 or 1; packed into one ``uint64``
each (bit i = element i) they compare by XOR and popcount, 32 times smaller than floats.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from dlindex.errors import InputError
from dlindex.features.blobs import COUNT_VECTORS, Ids
from dlindex.features.matrix import Matrix, load_matrix
from dlindex.features.types import find_type, unknown_type_message
from dlindex.query.rows import query_rows
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

HASH_BITS = 64
BUILTIN_HASHES = ("dhash",)  # built-in extractors whose vectors are 64-bit hashes
# The hash of a picture with no gradient: dhash sets a bit only where a pixel is brighter than
# its neighbour, so a flat image (a blank canvas, a small drawing on white) hashes to nearly 0.
FLAT_HASH = {"dhash": 0}

Hashes = npt.NDArray[np.uint64]
Embeddings = npt.NDArray[np.float32]
_BLOCK_ROWS = 1 << 15  # matrix rows read at once: 8 MiB of dhash floats
_RELEASE_EVERY = 8  # blocks read between drops of the matrix pages read (Matrix.release)
_ID_BLOCK = 1 << 20  # selected ids matched against the matrix at once: ~40 MB of temporaries


def load_vectors(
    catalog: Catalog, feature_type: str, spec: QuerySpec | None = None
) -> tuple[Ids, Embeddings | Hashes, bool]:
    """(ids ascending, vectors, is a 64-bit 0/1 hash) of the samples ``spec`` selects (default:
    status ok) that have a ``feature_type`` vector: float32 rows, or for a hash type the hashes
    packed (``pack_bits``), read from the matrix a block at a time (8 bytes a sample, not 256).

    InputError for an unknown type or one without vectors, saying how to compute them.
    """
    ftype = find_type(catalog, feature_type)
    if ftype is None:
        if feature_type in BUILTIN_HASHES:
            raise InputError(
                f"no {feature_type!r} vectors: compute it first: "
                f"dlindex features compute --type {feature_type} --extractor {feature_type}"
            )
        raise InputError(unknown_type_message(catalog, feature_type))
    count = int(catalog.conn.execute(COUNT_VECTORS, (feature_type,)).fetchone()[0])
    if ftype.dim is None or count == 0:
        raise InputError(
            f"feature type {feature_type!r} has no vectors: compute it first: dlindex features compute --type {feature_type}"
        )
    matrix = load_matrix(catalog, feature_type)
    is_hash = _holds_hashes(ftype.dim, matrix)
    rows = selected_rows(catalog, matrix, spec)
    ids = matrix.ids[rows].astype(np.int64)
    if not is_hash:
        return ids, np.asarray(matrix.vectors[rows], dtype=np.float32), False
    hashes = np.empty(rows.size, dtype=np.uint64)
    for block, at in enumerate(range(0, rows.size, _BLOCK_ROWS)):
        hashes[at : at + _BLOCK_ROWS] = pack_bits(matrix.vectors[rows[at : at + _BLOCK_ROWS]])
        if block % _RELEASE_EVERY == _RELEASE_EVERY - 1:
            matrix.release()
    matrix.release()
    return ids, hashes, True


def selected_rows(catalog: Catalog, matrix: Matrix, spec: QuerySpec | None = None) -> npt.NDArray[np.intp]:
    """The matrix rows of the samples ``spec`` selects (default: status ok) that have a vector,
    ascending (so by id): the selection is read and matched a block of ids at a time, so memory
    follows the matrix, not the catalog (all 10^8 ids of a catalog took ~3 GB to match 10^7 vectors)."""
    rows = iter(query_rows(catalog, replace(spec or QuerySpec(), columns=("id",))))
    found: list[npt.NDArray[np.intp]] = []
    while (block := np.fromiter((row["id"] for row in islice(rows, _ID_BLOCK)), dtype=np.int64)).size:
        at = matrix.rows_of(block)
        found.append(at[at >= 0])
    out = np.concatenate(found) if found else np.empty(0, dtype=np.intp)
    out.sort()  # the matrix's ids ascend: its rows in order are ids in order
    return out


def is_hash_type(catalog: Catalog, feature_type: str) -> bool:
    """Whether the type's vectors are 64-bit 0/1 hashes (compared in bits) rather than embeddings."""
    ftype = find_type(catalog, feature_type)
    if ftype is None or ftype.dim is None:
        return feature_type in BUILTIN_HASHES
    return _holds_hashes(ftype.dim, load_matrix(catalog, feature_type))


def _holds_hashes(dim: int | None, matrix: Matrix) -> bool:
    """Whether every value is 0 or 1, checked a block at a time (remembered per matrix)."""
    if dim != HASH_BITS:
        return False
    held = matrix.masks.get(("holds-hashes",))
    if held is not None:
        return bool(held)
    vectors = matrix.vectors
    found = True
    for block, at in enumerate(range(0, len(vectors), _BLOCK_ROWS)):
        part = vectors[at : at + _BLOCK_ROWS]
        if not ((part == 0.0) | (part == 1.0)).all():
            found = False
            break
        if block % _RELEASE_EVERY == _RELEASE_EVERY - 1:
            matrix.release()
    matrix.release()
    matrix.masks[("holds-hashes",)] = np.array(found)
    return found


def load_hashes(catalog: Catalog, feature_type: str, spec: QuerySpec | None = None) -> tuple[Ids, Hashes]:
    """(ids ascending, uint64 hashes) of the samples ``spec`` selects (default: status ok).

    InputError if the type is unknown, has no vectors, or is not a 64-bit 0/1 hash.
    """
    ids, hashes, is_hash = load_vectors(catalog, feature_type, spec)
    if not is_hash:
        raise InputError(f"feature type {feature_type!r} is an embedding, not a 64-bit 0/1 hash: use --threshold")
    return ids, hashes.astype(np.uint64, copy=False)


def plain_hashes(catalog: Catalog, feature_type: str, hashes: Hashes, max_distance: int) -> npt.NDArray[np.bool_]:
    """Which hashes are within ``max_distance`` bits of a flat image's: they say nothing about
    the picture, only that it is mostly one colour, so any two are "near" (a page of unrelated
    clip art on white, all 0-8 bits apart). Only for the built-in hash extractors."""
    ftype = find_type(catalog, feature_type)
    flat = None if ftype is None else FLAT_HASH.get(ftype.extractor)
    if flat is None:
        return np.zeros(hashes.size, dtype=bool)
    plain: npt.NDArray[np.bool_] = popcount(hashes ^ np.uint64(flat)) <= max_distance  # 1 byte a hash, not 64
    return plain


def pack_bits(bits: npt.ArrayLike) -> Hashes:
    """(n, 64) values of 0/1 as n uint64, bit i = column i."""
    array = np.asarray(bits)
    assert array.ndim == 2 and array.shape[1] == HASH_BITS
    packed = np.packbits(array.astype(np.uint8), axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8").reshape(-1).astype(np.uint64)


_BYTE_BITS = np.array([bin(b).count("1") for b in range(256)], dtype=np.uint8)


def popcount(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint8]:
    """Set bits of each uint64."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2
        counted: npt.NDArray[np.uint8] = np.bitwise_count(x)
        return counted
    as_bytes = np.ascontiguousarray(x).view(np.uint8).reshape(-1, 8)
    summed: npt.NDArray[np.uint8] = _BYTE_BITS[as_bytes].sum(axis=1, dtype=np.uint8)
    return summed
