"""Leaks: exact and near-duplicate pairs whose two samples are in different splits.

The pairs are ``dlindex dups``' pairs (content hash; a 64-bit hash within K bits; an
embedding within a cosine distance), searched only among the samples of the assignment and
kept where the two splits differ. Everything runs on position arrays in chunks from the
pair iterators; only the leaks themselves become Python objects, as they are written out.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dlindex.quality.duplicate_groups import SHARED_CONTENT, embedding_limit, hash_limit, informative, no_limits
from dlindex.quality.hashes import load_vectors
from dlindex.quality.pairs import embedding_pairs, equal_runs, hash_pairs
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.export.assignment import Assignment

Positions = npt.NDArray[np.intp]
# An export keeps the samples it was written with, whatever their status became since
# (or whether mark --exclude set them aside after).
_EVERY_STATUS = QuerySpec(status=("ok", "corrupt", "missing"), excluded=None, columns=("id",))


@dataclass(frozen=True)
class Leak:
    """Two copies in different splits: ids ``a < b``, each one's split; distance 0 for exact copies."""

    a: int
    b: int
    split_a: str
    split_b: str
    distance: float
    kind: str  # "exact" (same content hash) or "near" (by a feature type)

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "split_a": self.split_a, "split_b": self.split_b,
                "distance": self.distance, "kind": self.kind}  # fmt: skip


@dataclass(frozen=True)
class LeakSummary:
    """The leaks between two splits (in the assignment's split order): pairs, and the
    distinct samples of each split that have a copy in the other."""

    split_a: str
    split_b: str
    pairs: int
    exact: int
    near: int
    samples_a: int
    samples_b: int

    def as_dict(self) -> dict[str, Any]:
        return {"split_a": self.split_a, "split_b": self.split_b, "pairs": self.pairs, "exact": self.exact,
                "near": self.near, "samples_a": self.samples_a, "samples_b": self.samples_b}  # fmt: skip


class LeakSearch:
    """The leaks of one assignment: iterate it (once) for the pairs, then read ``summaries``.

    Every input check runs when it is made (``leak_pairs``), before a pair is found, so a
    command prints an error or its results, never half of them and then an error.
    """

    def __init__(
        self,
        catalog: Catalog,
        assignment: Assignment,
        feature_type: str | None,
        max_distance: int | None,
        threshold: float | None,
    ) -> None:
        self.assignment = assignment
        self.feature_type = feature_type
        n = assignment.ids.size
        self._content = assignment.content if assignment.content is not None else _content_codes(catalog, assignment)
        self._near: Iterator[tuple[Positions, Positions, npt.NDArray[np.float32]]] | None = None
        self.without_vector = 0  # samples of the assignment with no vector of the type
        if feature_type is None:
            no_limits(max_distance, threshold)
        else:
            self._near, self.without_vector = _near_chunks(catalog, assignment, feature_type, max_distance, threshold)
        splits = len(assignment.splits)
        self._pairs = np.zeros((splits, splits, 2), dtype=np.int64)  # [low code, high code, exact/near]
        self._involved: dict[tuple[int, int], npt.NDArray[np.bool_]] = {}
        self._n = n
        self._done = False

    def chunks(self) -> Iterator[tuple[Positions, Positions, npt.NDArray[np.float32], str]]:
        """(i, j, distance, kind) of the leaks, as positions into ``assignment.ids`` (i < j)."""
        if self._done:
            raise RuntimeError("a LeakSearch runs once; make another with leak_pairs")
        self._done = True
        codes = self.assignment.codes
        content = self._content
        sorted_positions = np.flatnonzero(content >= 0)
        by_content = sorted_positions[np.argsort(content[sorted_positions], kind="stable")]
        for p, q in equal_runs(content[by_content].astype(np.uint64)):
            i, j = by_content[p], by_content[q]
            i, j = np.minimum(i, j), np.maximum(i, j)
            cross = codes[i] != codes[j]
            if cross.any():
                yield self._count(i[cross], j[cross], np.zeros(int(cross.sum()), np.float32), "exact")
        for i, j, distance in self._near or ():
            # a pair of identical files is already listed as exact
            cross = (codes[i] != codes[j]) & ((content[i] != content[j]) | (content[i] < 0))
            if cross.any():
                yield self._count(i[cross], j[cross], distance[cross], "near")

    def __iter__(self) -> Iterator[Leak]:
        ids, codes, names = self.assignment.ids, self.assignment.codes, self.assignment.splits
        for i, j, distance, kind in self.chunks():
            for a, b, ca, cb, d in zip(ids[i].tolist(), ids[j].tolist(), codes[i].tolist(), codes[j].tolist(),
                                       distance.tolist(), strict=True):  # fmt: skip
                yield Leak(a, b, names[ca], names[cb], d, kind)

    @property
    def summaries(self) -> list[LeakSummary]:
        """One per pair of splits (zero counts too), as counted so far: complete once iterated."""
        names, codes = self.assignment.splits, self.assignment.codes
        out = []
        for low in range(len(names)):
            for high in range(low + 1, len(names)):
                exact, near = (int(x) for x in self._pairs[low, high])
                involved = self._involved.get((low, high))
                side_a = side_b = 0
                if involved is not None:
                    side_a = int((involved & (codes == low)).sum())
                    side_b = int((involved & (codes == high)).sum())
                out.append(LeakSummary(names[low], names[high], exact + near, exact, near, side_a, side_b))
        return out

    def _count(
        self, i: Positions, j: Positions, distance: npt.NDArray[np.float32], kind: str
    ) -> tuple[Positions, Positions, npt.NDArray[np.float32], str]:
        ci, cj = self.assignment.codes[i], self.assignment.codes[j]
        low, high = np.minimum(ci, cj).astype(np.intp), np.maximum(ci, cj).astype(np.intp)
        splits = len(self.assignment.splits)
        per = np.bincount(low * splits + high, minlength=splits * splits).reshape(splits, splits)
        self._pairs[:, :, 0 if kind == "exact" else 1] += per
        keys = np.unique(low * splits + high)
        for key in keys.tolist():
            mine = low * splits + high == key
            involved = self._involved.setdefault(divmod(key, splits), np.zeros(self._n, dtype=bool))
            involved[i[mine]] = True
            involved[j[mine]] = True
        return i, j, distance, kind


def leak_pairs(
    catalog: Catalog,
    assignment: Assignment,
    *,
    feature_type: str | None = None,
    max_distance: int | None = None,
    threshold: float | None = None,
) -> LeakSearch:
    """The duplicate pairs of ``assignment`` that cross its splits.

    Args:
        feature_type: None: exact copies only (same xxh3_128). A 64-bit hash type (dhash):
            exact copies and pairs at most ``max_distance`` bits apart. An embedding: exact
            copies and pairs within cosine distance ``threshold``. Unset limits take
            dups' DEFAULT_MAX_DISTANCE / DEFAULT_THRESHOLD.
    """
    return LeakSearch(catalog, assignment, feature_type, max_distance, threshold)


def _content_codes(catalog: Catalog, assignment: Assignment) -> npt.NDArray[np.int64]:
    """Per assignment position: a number shared by the samples with the same content whose
    content another sample shares, -1 for the rest."""
    ids = assignment.ids
    codes = np.full(ids.size, -1, dtype=np.int64)
    if not ids.size:
        return codes
    found_ids, groups = array("q"), array("q")  # 8 bytes a row of a shared content
    previous, number = None, -1
    for image_id, content in catalog.read(SHARED_CONTENT):  # ordered by content: equal ones are neighbours
        if content != previous:
            previous, number = content, number + 1
        found_ids.append(image_id)
        groups.append(number)
    found = np.frombuffer(found_ids, dtype=np.int64) if found_ids else np.zeros(0, dtype=np.int64)
    group = np.frombuffer(groups, dtype=np.int64) if groups else np.zeros(0, dtype=np.int64)
    at = np.minimum(np.searchsorted(ids, found), ids.size - 1)
    present = ids[at] == found
    codes[at[present]] = group[present]
    return codes


def _near_chunks(
    catalog: Catalog, assignment: Assignment, feature_type: str, max_distance: int | None, threshold: float | None
) -> tuple[Iterator[tuple[Positions, Positions, npt.NDArray[np.float32]]], int]:
    """(pair chunks as assignment positions, samples without a vector), the limits checked
    first; dups' rules: plain hashes are left out of near pairs (with its one warning)."""
    vector_ids, vectors, is_hash = load_vectors(catalog, feature_type, _EVERY_STATUS)
    if is_hash:
        k = hash_limit(feature_type, max_distance, threshold)
    else:
        limit = embedding_limit(feature_type, max_distance, threshold)
    ids = assignment.ids
    at = np.minimum(np.searchsorted(ids, vector_ids), max(ids.size - 1, 0))
    assigned = (ids[at] == vector_ids) if ids.size else np.zeros(vector_ids.size, dtype=bool)
    without = int(ids.size - assigned.sum())
    vector_ids, vectors = vector_ids[assigned], vectors[assigned]
    if is_hash:
        vector_ids, hashes = informative(catalog, feature_type, vector_ids, vectors.astype(np.uint64, copy=False), k)
        pairs = hash_pairs(hashes, k)
    else:
        pairs = embedding_pairs(vectors, limit)
    where = np.searchsorted(ids, vector_ids).astype(np.intp)  # ascending: both id lists are
    return ((where[i], where[j], d) for i, j, d in pairs), without
