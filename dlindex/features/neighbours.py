"""Exact k nearest neighbours over a memory-mapped matrix kept beside the catalog.

The vectors of a feature type are copied once into ``<catalog>-features/<type>.matrix``
(ids, norms, float32 rows) and memory-mapped by every later call, so a ``similar`` call
reads no BLOBs. The file is keyed by the type's ``version`` (bumped by every write to its
vectors, and by a trigger on every deletion) and ``created_at``; a stale file is rebuilt.

Search is two-phase and exact: one float32 matrix product ranks every candidate with a
proven error bound, then only rows whose bound overlaps the k-th best are re-scored in
float64 and sorted by (distance, id) -- the same answer as a float64 brute force.
"""

from __future__ import annotations

import json
import mmap
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dlindex.errors import InputError
from dlindex.features.storage import FeatureType, get_type, read_all
from dlindex.query.rows import sample_ids
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

METRICS = ("cosine", "l2")
_MAGIC = b"DLIXFEAT"
_HEADER = 512
_FORMAT = 1
_U = 2.0**-24  # float32 unit roundoff
# Norms outside this range could overflow (4|v|^2 > float32 max) or underflow (products
# below float32's normal range) in the fast path; such matrices are scored in float64.
_LARGEST, _SMALLEST = 1e18, 1e-15
_BLOCK_ELEMENTS = 1 << 23  # scores computed per block of queries: at most 32 MiB of float32
# No class (NULL): a distinct negative stand-in per row, never equal to another label or to -1.
_LABELS = "SELECT id, coalesce(label_id, -1 - id) FROM image_metadata ORDER BY id"
_KNOWN_IDS = "SELECT id FROM image_metadata WHERE id IN (SELECT value FROM json_each(?))"
_memo: dict[str, Matrix] = {}


@dataclass(frozen=True)
class Neighbour:
    """One answer: ``rank`` 1 is nearest; cosine distance is 1 - cosine similarity."""

    query: int
    rank: int
    id: int
    distance: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Matrix:
    """The vectors of one feature type as arrays (usually views of a memory-mapped file)."""

    key: dict[str, Any]
    ids: np.ndarray  # int64, ascending
    norms: np.ndarray  # float64 Euclidean norm of each row
    vectors: np.ndarray  # float32 (n, dim)
    masks: dict[tuple[Any, ...], np.ndarray | None] = field(default_factory=dict)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Row index of each id, -1 where the matrix has no vector for it."""
        if not self.ids.size:
            return np.full(ids.shape, -1, dtype=np.int64)
        at = np.searchsorted(self.ids, ids)
        at[at >= self.ids.size] = 0
        return np.where(self.ids[at] == ids, at, -1)


def matrix_path(catalog: Catalog, name: str) -> Path:
    return Path(os.fspath(catalog.path) + "-features") / f"{name}.matrix"


def _key(ftype: FeatureType) -> dict[str, Any]:
    return {
        "format": _FORMAT, "name": ftype.name, "version": ftype.version, "created_at": ftype.created_at,
        "dim": ftype.dim, "dtype": ftype.dtype,
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
        return matrix
    conn = catalog.conn
    conn.execute("BEGIN")  # one snapshot: the version read is the version of the rows read
    try:
        ftype = get_type(catalog, feature_type)
        if ftype.dim is None:
            raise InputError(f"feature type {ftype.name!r} has no vectors yet")
        ids, vectors = read_all(catalog, ftype)
    finally:
        conn.execute("COMMIT")
    vectors32 = vectors.astype(np.float32, copy=False)
    norms = np.empty(ids.size, dtype=np.float64)
    for start in range(0, ids.size, 8192):
        part = vectors32[start : start + 8192].astype(np.float64)
        norms[start : start + 8192] = np.sqrt(np.einsum("ij,ij->i", part, part))
    key = _key(ftype)
    path = matrix_path(catalog, ftype.name)
    matrix = _save(path, key, ids, norms, vectors32) or Matrix(key, ids, norms, vectors32)
    _memo[os.fspath(path)] = matrix
    return matrix


def remove_cached_matrix(catalog: Catalog, name: str) -> None:
    path = matrix_path(catalog, name)
    _memo.pop(os.fspath(path), None)
    try:
        os.unlink(path)
    except OSError:
        pass


def _layout(n: int, dim: int) -> tuple[int, int, int, int]:
    ids_at = _HEADER
    norms_at = ids_at + 8 * n
    vectors_at = -(-(norms_at + 8 * n) // 64) * 64
    return ids_at, norms_at, vectors_at, vectors_at + 4 * n * dim


def _save(path: Path, key: dict[str, Any], ids: np.ndarray, norms: np.ndarray, vectors: np.ndarray) -> Matrix | None:
    """Write the matrix file atomically and map it; None if the folder is not writable."""
    n, dim = vectors.shape
    ids_at, norms_at, vectors_at, end = _layout(n, dim)
    header = _MAGIC + json.dumps({**key, "n": n}).encode()
    assert len(header) <= _HEADER
    try:
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError:
        return None  # a read-only folder: this process keeps the matrix in memory
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.ljust(_HEADER, b" "))
            f.write(ids.astype("<i8").tobytes())
            f.write(norms.astype("<f8").tobytes())
            f.write(b"\0" * (vectors_at - norms_at - 8 * n))
            for start in range(0, n, 65536):
                f.write(np.ascontiguousarray(vectors[start : start + 65536], dtype="<f4").tobytes())
        os.replace(tmp, path)  # concurrent readers see the old file or the new one, never half
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    return _open(path, key)


def _open(path: Path, key: dict[str, Any], *, populate: bool = True) -> Matrix | None:
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER)
            if not header.startswith(_MAGIC):
                return None
            stored = json.loads(header[len(_MAGIC) :].decode())
            n = int(stored.pop("n"))
            if stored != key:
                return None
            dim = int(key["dim"])
            ids_at, norms_at, vectors_at, end = _layout(n, dim)
            if os.fstat(f.fileno()).st_size != end:
                return None
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            mapped = mmap.mmap(f.fileno(), end, flags=flags, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    ids = np.frombuffer(mapped, dtype="<i8", count=n, offset=ids_at)
    norms = np.frombuffer(mapped, dtype="<f8", count=n, offset=norms_at)
    vectors = np.frombuffer(mapped, dtype="<f4", count=n * dim, offset=vectors_at).reshape(n, dim)
    return Matrix(key, ids, norms, vectors)


def nearest(
    catalog: Catalog,
    ids: Sequence[int] | np.ndarray,
    feature_type: str,
    *,
    k: int = 10,
    metric: str = "cosine",
    other_labels: bool = False,
    spec: QuerySpec | None = None,
) -> list[list[Neighbour]]:
    """The exact ``k`` nearest neighbours of each sample in ``ids`` among the samples ``spec``
    selects (default: status ok), excluding the sample itself; ties go to the lower id.

    Args:
        other_labels: only neighbours whose label differs from the query's (hard negatives).
    """
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; choose cosine or l2")
    if k < 1:
        raise InputError(f"-k must be at least 1, not {k}")
    matrix = load_matrix(catalog, feature_type)
    queries = np.asarray(ids, dtype=np.int64).reshape(-1)
    rows = matrix.rows_of(queries)
    if (rows < 0).any():
        missing = queries[rows < 0]
        known = _known_ids(catalog, missing)
        bad = [i for i in missing.tolist() if i not in known]
        if bad:
            raise InputError(f"no sample with id {bad[0]} in the catalog")
        raise InputError(
            f"sample {int(missing[0])} has no {feature_type!r} vector; run dlindex features compute --type {feature_type}"
        )
    allowed = _candidates(catalog, matrix, spec or QuerySpec())
    labels = _labels(catalog, matrix) if other_labels else None
    found = search(matrix, rows, k, metric, allowed, labels)
    return [
        [Neighbour(int(q), rank, int(matrix.ids[r]), float(d)) for rank, (r, d) in enumerate(zip(*answer), start=1)]
        for q, answer in zip(queries, found)
    ]


def search(
    matrix: Matrix,
    query_rows: np.ndarray,
    k: int,
    metric: str,
    allowed: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each query row: (rows, distances) of its k nearest other rows, exactly."""
    vectors, norms = matrix.vectors, matrix.norms
    n, dim = vectors.shape
    # |float32 dot - exact dot| <= dim*u*|a||b| for any summation order; doubled for margin,
    # plus the few roundings of the float32 arithmetic that turns dots into distances.
    slack = np.float32(2.0 * (dim + 8) * _U)
    block = max(1, min(256, _BLOCK_ELEMENTS // max(n, 1)))
    blocked = None if allowed is None else ~allowed
    rn = norms.astype(np.float32)
    nonzero = norms[norms > 0]
    if nonzero.size and (nonzero.max() > _LARGEST or nonzero.min() < _SMALLEST):
        # float32 products could overflow or underflow, which the bound does not cover:
        # score every candidate in float64 instead (slow, and only for such data).
        return [_all_exact(vectors, row, blocked, labels, k, metric) for row in query_rows.tolist()]
    results: list[tuple[np.ndarray, np.ndarray]] = []
    for start in range(0, query_rows.size, block):
        chunk = query_rows[start : start + block]
        dots = vectors[chunk] @ vectors.T  # (b, n) float32: the one pass over the matrix
        qn = rn[chunk][:, None]
        if metric == "l2":
            approx = (rn * rn)[None, :] + qn * qn - 2.0 * dots
            bound: np.ndarray = slack * (rn[None, :] + qn) ** 2
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                approx = 1.0 - dots / (rn[None, :] * qn)
            approx[:, norms == 0] = 1.0  # cosine with a zero vector: defined as distance 1
            approx[norms[chunk] == 0, :] = 1.0
            bound = np.full((1, n), 2 * slack, dtype=np.float32)
        for i, row in enumerate(chunk):
            a = approx[i]
            if blocked is not None:
                a[blocked] = np.inf
            if labels is not None:
                a[labels == labels[row]] = np.inf
            a[row] = np.inf
            results.append(_exact_top(vectors, row, a, bound[min(i, len(bound) - 1)], k, metric))
    return results


def _exact_top(
    vectors: np.ndarray, row: int, approx: np.ndarray, bound: np.ndarray, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """Re-score in float64 every row that may belong to the top k (inf marks excluded rows)."""
    kk = min(k, int(np.count_nonzero(approx != np.inf)))
    if kk == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    best = np.argpartition(approx, kk - 1)[:kk]
    threshold = np.max(approx[best] + bound[best])  # >= the true k-th distance
    candidates = np.flatnonzero(approx - bound <= threshold)  # so every true top-k row is here
    exact = exact_distances(vectors[candidates], vectors[row], metric)
    order = np.lexsort((candidates, exact))[:kk]
    return candidates[order], exact[order]


def _all_exact(
    vectors: np.ndarray, row: int, blocked: np.ndarray | None, labels: np.ndarray | None, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    valid = np.ones(len(vectors), dtype=bool) if blocked is None else ~blocked
    if labels is not None:
        valid &= labels != labels[row]
    valid[row] = False
    candidates = np.flatnonzero(valid)
    exact = exact_distances(vectors[candidates], vectors[row], metric)
    order = np.lexsort((candidates, exact))[:k]
    return candidates[order], exact[order]


def exact_distances(rows: np.ndarray, q: np.ndarray, metric: str) -> np.ndarray:
    """Distances in float64, row by row: the definition the fast path must agree with."""
    r = np.asarray(rows, dtype=np.float64)
    v = np.asarray(q, dtype=np.float64)
    if metric == "l2":
        return np.sqrt(((r - v) ** 2).sum(axis=1))
    dots = (r * v).sum(axis=1)
    scale = np.sqrt((r * r).sum(axis=1)) * np.sqrt((v * v).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, np.clip(1.0 - dots / scale, 0.0, 2.0), 1.0)  # no -2e-16 for twins


def _candidates(catalog: Catalog, matrix: Matrix, spec: QuerySpec) -> np.ndarray | None:
    """Which rows the filters allow (None: all), memoised per catalog change in this process."""
    memo_key = ("spec", repr(replace(spec, columns=("id",))), catalog.changes())
    if memo_key in matrix.masks:
        return matrix.masks[memo_key]
    selected = np.asarray(sample_ids(catalog, replace(spec, columns=("id",))), dtype=np.int64)
    rows = matrix.rows_of(np.sort(selected))
    mask: np.ndarray | None = np.zeros(matrix.ids.size, dtype=bool)
    assert mask is not None
    mask[rows[rows >= 0]] = True
    if mask.all():
        mask = None
    _remember(matrix, memo_key, mask)
    return mask


def _labels(catalog: Catalog, matrix: Matrix) -> np.ndarray:
    memo_key = ("labels", catalog.changes())
    held = matrix.masks.get(memo_key)
    if held is not None:
        return held
    pairs = np.array(list(catalog.read(_LABELS)), dtype=np.int64).reshape(-1, 2)
    at = np.searchsorted(pairs[:, 0], matrix.ids)
    at[at >= len(pairs)] = 0
    labels = np.where(pairs[at, 0] == matrix.ids, pairs[at, 1], -1) if len(pairs) else np.full(matrix.ids.size, -1)
    _remember(matrix, memo_key, labels)
    return labels


def _remember(matrix: Matrix, key: tuple[Any, ...], value: np.ndarray | None) -> None:
    if len(matrix.masks) >= 16:
        matrix.masks.pop(next(iter(matrix.masks)))
    matrix.masks[key] = value


def _known_ids(catalog: Catalog, ids: np.ndarray) -> set[int]:
    return {int(row[0]) for row in catalog.conn.execute(_KNOWN_IDS, (json.dumps(ids.tolist()),))}
