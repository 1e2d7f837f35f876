"""Exact k nearest neighbours over the memory-mapped matrix of a feature type.

The matrix (see :mod:`.matrix`) is built once per change of the type's vectors, so a
``similar`` call reads no BLOBs. Search is two-phase and exact: one float32 matrix product
ranks every candidate with a proven error bound, then only rows whose bound overlaps the
k-th best are re-scored in float64 and sorted by (distance, id) -- the same answer as a
float64 brute force.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.errors import InputError
from dlindex.features.blobs import Ids
from dlindex.features.matrix import Mask, Matrix, Rows, load_matrix
from dlindex.query.rows import sample_ids
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

METRICS = ("cosine", "l2")
_U = 2.0**-24  # float32 unit roundoff
# Norms outside this range could overflow (4|v|^2 > float32 max) or underflow (products
# below float32's normal range) in the fast path; such matrices are scored in float64.
_LARGEST, _SMALLEST = 1e18, 1e-15
_BLOCK_ELEMENTS = 1 << 23  # scores computed per block of queries: at most 32 MiB of float32
# No class (NULL): a distinct negative stand-in per row, never equal to another label or to -1.
_LABELS = "SELECT id, coalesce(label_id, -1 - id) FROM image_metadata ORDER BY id"
_KNOWN_IDS = "SELECT id FROM image_metadata WHERE id IN (SELECT value FROM json_each(?))"

Distances = npt.NDArray[np.float64]
Labels = npt.NDArray[np.int64]  # per matrix row: its label id, or a stand-in unique to the row
Answer = tuple[Rows, Distances]  # the k nearest rows of one query, nearest first


@dataclass(frozen=True)
class Neighbour:
    """One answer: ``rank`` 1 is nearest; cosine distance is 1 - cosine similarity."""

    query: int
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


def search(
    matrix: Matrix,
    query_rows: Rows,
    k: int,
    metric: str,
    allowed: Mask | None = None,
    labels: Labels | None = None,
) -> list[Answer]:
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
    results: list[Answer] = []
    for start in range(0, query_rows.size, block):
        chunk = query_rows[start : start + block]
        dots = vectors[chunk] @ vectors.T  # (b, n) float32: the one pass over the matrix
        qn = rn[chunk][:, None]
        if metric == "l2":
            approx = (rn * rn)[None, :] + qn * qn - 2.0 * dots
            bound: npt.NDArray[np.float32] = slack * (rn[None, :] + qn) ** 2
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
    vectors: npt.NDArray[np.float32],
    row: int,
    approx: npt.NDArray[np.float32],
    bound: npt.NDArray[np.float32],
    k: int,
    metric: str,
) -> Answer:
    """Re-score in float64 every row that may belong to the top k (inf marks excluded rows)."""
    kk = min(k, int(np.count_nonzero(approx != np.inf)))
    if kk == 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0)
    best = np.argpartition(approx, kk - 1)[:kk]
    threshold = np.max(approx[best] + bound[best])  # >= the true k-th distance
    candidates = np.flatnonzero(approx - bound <= threshold)  # so every true top-k row is here
    return _ranked(vectors, row, candidates, kk, metric)


def _all_exact(
    vectors: npt.NDArray[np.float32], row: int, blocked: Mask | None, labels: Labels | None, k: int, metric: str
) -> Answer:
    valid = np.ones(len(vectors), dtype=bool) if blocked is None else ~blocked
    if labels is not None:
        valid &= labels != labels[row]
    valid[row] = False
    return _ranked(vectors, row, np.flatnonzero(valid), k, metric)


def _ranked(vectors: npt.NDArray[np.float32], row: int, candidates: Rows, k: int, metric: str) -> Answer:
    """The k of ``candidates`` nearest to ``row`` by exact distance, ties to the lower row."""
    exact = exact_distances(vectors[candidates], vectors[row], metric)
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
    selected = np.asarray(sample_ids(catalog, replace(spec, columns=("id",))), dtype=np.int64)
    rows = matrix.rows_of(np.sort(selected))
    mask = np.zeros(matrix.ids.size, dtype=bool)
    mask[rows[rows >= 0]] = True
    allowed = None if mask.all() else mask
    _remember(matrix, memo_key, allowed)
    return allowed


def _labels(catalog: Catalog, matrix: Matrix) -> Labels:
    memo_key = ("labels", catalog.changes())
    held = matrix.masks.get(memo_key)
    if held is not None:
        return held
    pairs = np.array(list(catalog.read(_LABELS)), dtype=np.int64).reshape(-1, 2)
    at = np.searchsorted(pairs[:, 0], matrix.ids)
    at[at >= len(pairs)] = 0
    labels: Labels = (
        np.where(pairs[at, 0] == matrix.ids, pairs[at, 1], -1) if len(pairs) else np.full(matrix.ids.size, -1)
    )
    _remember(matrix, memo_key, labels)
    return labels


def _remember(matrix: Matrix, key: tuple[Any, ...], value: Mask | Labels | None) -> None:
    if len(matrix.masks) >= 16:
        matrix.masks.pop(next(iter(matrix.masks)))
    matrix.masks[key] = value


def _known_ids(catalog: Catalog, ids: Ids) -> set[int]:
    return {int(row[0]) for row in catalog.conn.execute(_KNOWN_IDS, (json.dumps(ids.tolist()),))}
