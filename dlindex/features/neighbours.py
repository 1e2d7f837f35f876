"""Exact k nearest neighbours over the memory-mapped matrix of a feature type.

The matrix (see :mod:`.matrix`) is built once per change of the type's vectors, so a
``similar`` call reads no BLOBs. Search is two-phase and exact: one float32 matrix product
ranks every candidate with a proven error bound, then only rows whose bound overlaps the
k-th best are re-scored in float64 and sorted by (distance, id) -- the same answer as a
float64 brute force.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.errors import InputError
from dlindex.features.blobs import Ids
from dlindex.features.matrix import Mask, Matrix, Rows, load_matrix
from dlindex.query.rows import query_rows as selected_rows
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

METRICS = ("cosine", "l2")
_U = 2.0**-24  # float32 unit roundoff
# Norms outside this range could overflow (4|v|^2 > float32 max) or underflow (products
# below float32's normal range) in the fast path; such matrices are scored in float64.
_LARGEST, _SMALLEST = 1e18, 1e-15
_BLOCK_ELEMENTS = 1 << 23  # scores computed per block of queries: at most 32 MiB of float32
# A matrix larger than this is read 64 MiB of rows at a time, its pages dropped after each
# block, so resident memory stays bounded; a smaller one stays mapped whole, as it was read.
# (At 512 MiB a 10^7-row catalog's dhash matrix, 272 MB, stayed resident whole: it was most
# of the command's peak.) Paged, a block of queries is as many as 32 MiB of scores allows
# against one 64 MiB block of rows, so a batch of queries passes over the file fewer times.
_RESIDENT_BYTES = 64 << 20
_COLUMN_BYTES = 64 << 20
# No class (NULL): a distinct negative stand-in per row, never equal to another label or to -1.
_LABELS = "SELECT id, coalesce(label_id, -1 - id) FROM image_metadata ORDER BY id"
_KNOWN_IDS = "SELECT id FROM image_metadata WHERE id IN (SELECT value FROM json_each(?))"
# Selected ids and (id, label) pairs are read from the catalog this many at a time and mapped
# onto the matrix's rows, so memory holds a row mask (1 byte a vector), not every selected id.
_ID_CHUNK = 1 << 16

Distances = npt.NDArray[np.float64]
Labels = npt.NDArray[np.int64]  # per matrix row: its label id, or a stand-in unique to the row
Answer = tuple[Rows, Distances]  # the k nearest rows of one query, nearest first


@dataclass(frozen=True)
class Neighbour:
    """One answer: ``rank`` 1 is nearest; cosine distance is 1 - cosine similarity."""

    query: int | str  # the query sample's id, or the text of similar --to-text
    rank: int
    id: int
    distance: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def nearest(
    catalog: Catalog,
    ids: Sequence[int] | Ids,
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
        [
            Neighbour(int(q), rank, int(matrix.ids[r]), float(d))
            for rank, (r, d) in enumerate(zip(*answer, strict=True), start=1)
        ]
        for q, answer in zip(queries, found, strict=True)
    ]


def nearest_to(
    catalog: Catalog,
    queries: npt.NDArray[np.float32],
    names: Sequence[int | str],
    feature_type: str,
    *,
    k: int = 10,
    metric: str = "cosine",
    spec: QuerySpec | None = None,
) -> list[list[Neighbour]]:
    """The exact ``k`` nearest samples to each of the vectors ``queries`` (named ``names`` in
    the answers) among those ``spec`` selects; as ``nearest``, but the queries are no samples."""
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}; choose cosine or l2")
    if k < 1:
        raise InputError(f"-k must be at least 1, not {k}")
    matrix = load_matrix(catalog, feature_type)
    dim = matrix.vectors.shape[1]
    if queries.ndim != 2 or queries.shape[1] != dim:
        raise InputError(f"the query vector has {queries.shape[-1]} values; {feature_type!r} has dim {dim}")
    allowed = _candidates(catalog, matrix, spec or QuerySpec())
    rows = np.full(len(queries), -1, dtype=np.intp)
    found = search(matrix, rows, k, metric, allowed, None, queries.astype(np.float32))
    return [
        [
            Neighbour(name, rank, int(matrix.ids[r]), float(d))
            for rank, (r, d) in enumerate(zip(*answer, strict=True), 1)
        ]
        for name, answer in zip(names, found, strict=True)
    ]


def search(
    matrix: Matrix,
    query_rows: Rows,
    k: int,
    metric: str,
    allowed: Mask | None = None,
    labels: Labels | None = None,
    vectors_in: npt.NDArray[np.float32] | None = None,
) -> list[Answer]:
    """For each query row: (rows, distances) of its k nearest other rows, exactly. With
    ``vectors_in`` (one query vector per ``query_rows`` entry, each -1: no row of the matrix),
    the nearest rows to those vectors instead (``similar --to-text``).

    The matrix is read a block of rows at a time (at most _BLOCK_ELEMENTS scores held), each
    query keeping only the rows that may still belong to its top k (``_Pool``), so memory does
    not grow with the matrix; the pages read are dropped after each block (``Matrix.release``).
    """
    vectors, norms = matrix.vectors, matrix.norms
    n, dim = vectors.shape
    # |float32 dot - exact dot| <= dim*u*|a||b| for any summation order; doubled for margin,
    # plus the few roundings of the float32 arithmetic that turns dots into distances.
    slack = np.float32(2.0 * (dim + 8) * _U)
    paged = vectors.nbytes > _RESIDENT_BYTES
    span = min(n, max(1, _COLUMN_BYTES // max(1, vectors.itemsize * dim))) if paged else n
    block = max(1, min(256, _BLOCK_ELEMENTS // max(span, 1)))
    columns = max(1, _BLOCK_ELEMENTS // block)
    if paged:
        columns = min(columns, span)
    blocked = None if allowed is None else ~allowed
    least, most = _norm_range(norms, columns)
    if vectors_in is None:
        query_norms = norms
    else:
        query_norms = np.sqrt((vectors_in.astype(np.float64) ** 2).sum(axis=1))
        q_least, q_most = _norm_range(query_norms, query_norms.size or 1)
        least, most = min(least, q_least), max(most, q_most)
    if paged:  # the ids and norms read so far (the selection's rows, the range): 16 bytes a row
        matrix.release()
    if most > _LARGEST or least < _SMALLEST:
        # float32 products could overflow or underflow, which the bound does not cover:
        # score every candidate in float64 instead (slow, and only for such data).
        return [
            _all_exact(vectors, row, _query(vectors, vectors_in, row, i), blocked, labels, k, metric)
            for i, row in enumerate(query_rows.tolist())
        ]
    results: list[Answer] = []
    for start in range(0, query_rows.size, block):
        chunk = query_rows[start : start + block]
        queries = vectors[chunk] if vectors_in is None else vectors_in[start : start + block]
        chunk_norms = norms[chunk] if vectors_in is None else query_norms[start : start + block]
        qn = chunk_norms.astype(np.float32)[:, None]
        pools = [_Pool() for _ in range(chunk.size)]
        for c0 in range(0, n, columns):
            c1 = min(n, c0 + columns)
            rn = norms[c0:c1].astype(np.float32)
            dots = queries @ vectors[c0:c1].T  # (b, columns) float32: one pass over the matrix in all
            if metric == "l2":
                approx = (rn * rn)[None, :] + qn * qn - 2.0 * dots
                bound: npt.NDArray[np.float32] = slack * (rn[None, :] + qn) ** 2
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    approx = 1.0 - dots / (rn[None, :] * qn)
                approx[:, norms[c0:c1] == 0] = 1.0  # cosine with a zero vector: defined as distance 1
                approx[chunk_norms == 0, :] = 1.0
                bound = np.full((1, c1 - c0), 2 * slack, dtype=np.float32)
            for i, row in enumerate(chunk.tolist()):
                a = approx[i]
                if blocked is not None:
                    a[blocked[c0:c1]] = np.inf
                if labels is not None:
                    a[labels[c0:c1] == labels[row]] = np.inf
                if c0 <= row < c1:
                    a[row - c0] = np.inf
                pools[i].add(a, bound[min(i, len(bound) - 1)], c0, k)
            if paged:
                matrix.release()
        results += [pool.ranked(vectors, queries[i], k, metric) for i, pool in enumerate(pools)]
    return results


def _norm_range(norms: npt.NDArray[np.float64], step: int) -> tuple[float, float]:
    """(smallest, largest) non-zero norm, a block at a time; (inf, 0) if every norm is 0."""
    least, most = np.inf, 0.0
    for at in range(0, norms.size, step):
        part = norms[at : at + step]
        nonzero = part[part > 0]
        if nonzero.size:
            least, most = min(least, float(nonzero.min())), max(most, float(nonzero.max()))
    return least, most


class _Pool:
    """One query's rows that may belong to its top k, as blocks of the matrix go by.

    A row is kept while approx - bound <= the threshold: max(approx + bound) over the k rows of
    smallest approx seen so far (any k rows' bound the true k-th distance from above), which
    only falls; so at the end the pool holds every row whose bound overlaps the final
    threshold, the candidates a one-pass search would re-score, and the answer is the same.
    """

    def __init__(self) -> None:
        self.rows = np.zeros(0, dtype=np.intp)
        self.approx = np.zeros(0, dtype=np.float32)
        self.bound = np.zeros(0, dtype=np.float32)
        self.valid = 0  # rows not excluded (inf), over every block seen
        self.threshold = np.inf

    def add(self, approx: npt.NDArray[np.float32], bound: npt.NDArray[np.float32], offset: int, k: int) -> None:
        finite = approx != np.inf
        self.valid += int(np.count_nonzero(finite))
        keep = np.flatnonzero(finite & (approx - bound <= self.threshold))
        self.rows = np.concatenate((self.rows, keep + offset))
        self.approx = np.concatenate((self.approx, approx[keep]))
        self.bound = np.concatenate((self.bound, np.broadcast_to(bound, approx.shape)[keep]))
        if self.rows.size >= k:
            best = np.argpartition(self.approx, k - 1)[:k]
            self.threshold = float(np.max(self.approx[best] + self.bound[best]))
            close = self.approx - self.bound <= self.threshold
            self.rows, self.approx, self.bound = self.rows[close], self.approx[close], self.bound[close]

    def ranked(self, vectors: npt.NDArray[np.float32], query: npt.NDArray[np.float32], k: int, metric: str) -> Answer:
        """Re-score in float64 every row that may belong to the top k."""
        kk = min(k, self.valid)
        if kk == 0:
            return np.zeros(0, dtype=np.intp), np.zeros(0)
        best = np.argpartition(self.approx, kk - 1)[:kk]
        threshold = np.max(self.approx[best] + self.bound[best])  # >= the true k-th distance
        candidates = self.rows[self.approx - self.bound <= threshold]  # so every true top-k row is here
        return _ranked(vectors, query, np.sort(candidates), kk, metric)


def _query(
    vectors: npt.NDArray[np.float32], vectors_in: npt.NDArray[np.float32] | None, row: int, i: int
) -> npt.NDArray[np.float32]:
    query: npt.NDArray[np.float32] = vectors[row] if vectors_in is None else vectors_in[i]
    return query


def _all_exact(
    vectors: npt.NDArray[np.float32], row: int, query: npt.NDArray[np.float32], blocked: Mask | None,
    labels: Labels | None, k: int, metric: str,
) -> Answer:  # fmt: skip
    valid = np.ones(len(vectors), dtype=bool) if blocked is None else ~blocked
    if labels is not None:
        valid &= labels != labels[row]
    if row >= 0:
        valid[row] = False
    return _ranked(vectors, query, np.flatnonzero(valid), k, metric)


def _ranked(
    vectors: npt.NDArray[np.float32], query: npt.NDArray[np.float32], candidates: Rows, k: int, metric: str
) -> Answer:
    """The k of ``candidates`` nearest to ``query`` by exact distance, ties to the lower row."""
    exact = exact_distances(vectors[candidates], query, metric)
    order = np.lexsort((candidates, exact))[:k]
    return candidates[order], exact[order]


def exact_distances(rows: npt.ArrayLike, q: npt.ArrayLike, metric: str) -> Distances:
    """Distances in float64, row by row: the definition the fast path must agree with."""
    r = np.asarray(rows, dtype=np.float64)
    v = np.asarray(q, dtype=np.float64)
    if metric == "l2":
        l2: Distances = np.sqrt(((r - v) ** 2).sum(axis=1))
        return l2
    dots = (r * v).sum(axis=1)
    scale = np.sqrt((r * r).sum(axis=1)) * np.sqrt((v * v).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        distances: Distances = np.where(scale > 0, np.clip(1.0 - dots / scale, 0.0, 2.0), 1.0)  # no -2e-16 for twins
    return distances


def _candidates(catalog: Catalog, matrix: Matrix, spec: QuerySpec) -> Mask | None:
    """Which rows the filters allow (None: all), memoised per catalog change in this process."""
    memo_key = ("spec", repr(replace(spec, columns=("id",))), catalog.changes())
    if memo_key in matrix.masks:
        return matrix.masks[memo_key]
    selected = (row["id"] for row in selected_rows(catalog, replace(spec, columns=("id",))))
    mask = np.zeros(matrix.ids.size, dtype=bool)
    for chunk in _chunks(selected, 1):
        rows = matrix.rows_of(np.sort(chunk[:, 0]))
        mask[rows[rows >= 0]] = True
    allowed = None if mask.all() else mask
    _remember(matrix, memo_key, allowed)
    return allowed


def _labels(catalog: Catalog, matrix: Matrix) -> Labels:
    memo_key = ("labels", catalog.changes())
    held = matrix.masks.get(memo_key)
    if held is not None:
        return held
    labels: Labels = np.full(matrix.ids.size, -1, dtype=np.int64)  # -1: a row with no catalog row
    for pairs in _chunks(catalog.read(_LABELS), 2):
        rows = matrix.rows_of(pairs[:, 0])
        found = rows >= 0
        labels[rows[found]] = pairs[found, 1]
    _remember(matrix, memo_key, labels)
    return labels


def _chunks(rows: Iterable[Any], width: int) -> Iterator[npt.NDArray[np.int64]]:
    """``rows`` (ints, or tuples of ``width`` ints) as (m, width) int64 arrays of at most _ID_CHUNK rows."""
    it = iter(rows) if width == 1 else (x for row in rows for x in row)
    while True:
        part = np.fromiter(itertools.islice(it, _ID_CHUNK * width), dtype=np.int64)
        if not part.size:
            return
        yield part.reshape(-1, width)


def _remember(matrix: Matrix, key: tuple[Any, ...], value: Mask | Labels | None) -> None:
    if len(matrix.masks) >= 16:
        matrix.masks.pop(next(iter(matrix.masks)))
    matrix.masks[key] = value


def _known_ids(catalog: Catalog, ids: Ids) -> set[int]:
    return {int(row[0]) for row in catalog.conn.execute(_KNOWN_IDS, (json.dumps(ids.tolist()),))}
