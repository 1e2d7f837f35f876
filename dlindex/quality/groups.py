"""Duplicate groups: exact copies by content hash, near copies by hash or embedding pairs.

A group is a connected component of the duplicate pairs (union-find), so a chain of near
copies a~b~c is one group even if a and c are further apart than the limit. Each group
keeps one member by a policy (largest, oldest, first) and the rest can be marked or dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from dlindex.errors import InputError
from dlindex.quality.hashes import Hashes, load_vectors, pack_bits
from dlindex.quality.pairs import PairChunk, Positions, check_max_distance, check_threshold, embedding_pairs, hash_pairs
from dlindex.query.rows import sample_ids
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.features.vectors import Ids

# Chosen by measurement (docs/commands/dups.md): every resized or re-encoded copy, most 5%
# crops, and no unrelated pair of 400 synthetic images (dhash, thumb).
DEFAULT_MAX_DISTANCE = 8  # bits of 64, for hash types
DEFAULT_THRESHOLD = 0.01  # cosine distance, for embedding types
# Content hashes shared by more than one row: the candidates for exact duplicates.
_SHARED_CONTENT = """SELECT id, xxh3_128 FROM image_metadata WHERE xxh3_128 IN
    (SELECT xxh3_128 FROM image_metadata WHERE xxh3_128 IS NOT NULL GROUP BY xxh3_128 HAVING count(*) > 1)
    ORDER BY xxh3_128, id"""
_SIZES = """SELECT id, width, height, bytes, mtime_ns FROM image_metadata
    WHERE id IN (SELECT value FROM json_each(?))"""
_IDS_PER_STATEMENT = 10_000
_GROUPS_PER_LOOKUP = 1000
_NEVER = float("inf")  # the mtime of a file whose mtime is unknown: kept last by --keep oldest


@dataclass(frozen=True, order=True)
class Pair:
    """Two duplicate samples by id (``a < b``); distance 0 for exact copies."""

    a: int
    b: int
    distance: float


class Keep(StrEnum):
    """Which member of a group to keep: largest (pixels, then bytes), oldest (mtime), first (id)."""

    largest = "largest"
    oldest = "oldest"
    first = "first"


@dataclass(frozen=True)
class DuplicateGroup:
    """Samples that are copies of each other: ``ids`` ascending, ``kept`` the one to keep."""

    ids: tuple[int, ...]
    kept: int
    kind: str  # "exact" (same content hash) or "near" (by a feature type)

    @property
    def rest(self) -> tuple[int, ...]:
        """The members not kept."""
        return tuple(i for i in self.ids if i != self.kept)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": len(self.ids), "kept": self.kept, "ids": list(self.ids)}


def duplicate_pairs(
    catalog: Catalog,
    *,
    feature_type: str | None = None,
    max_distance: int | None = None,
    threshold: float | None = None,
    spec: QuerySpec | None = None,
) -> Iterator[Pair]:
    """Every pair of duplicates among the samples ``spec`` selects (default: status ok).

    Args:
        feature_type: None: exact copies (same xxh3_128 content hash). A 64-bit hash type
            (dhash): at most ``max_distance`` bits apart. An embedding: cosine distance at
            most ``threshold``. Unset limits take DEFAULT_MAX_DISTANCE / DEFAULT_THRESHOLD.
    """
    if feature_type is None:
        _no_limits(max_distance, threshold)
        for members in _content_groups(catalog, spec):
            for at, a in enumerate(members):
                for b in members[at + 1 :]:
                    yield Pair(a, b, 0.0)
        return
    ids, chunks = _near_pairs(catalog, feature_type, max_distance, threshold, spec, distinct=False)
    for i, j, distance in chunks:
        for a, b, d in zip(ids[i].tolist(), ids[j].tolist(), distance.tolist(), strict=True):
            yield Pair(a, b, d)


def duplicate_groups(
    catalog: Catalog,
    *,
    feature_type: str | None = None,
    max_distance: int | None = None,
    threshold: float | None = None,
    keep: Keep | str = Keep.largest,
    spec: QuerySpec | None = None,
) -> list[DuplicateGroup]:
    """Groups of 2+ duplicates (connected components of ``duplicate_pairs``), largest first,
    then by smallest id; each keeps one member by ``keep``."""
    policy = _keep(keep)
    if feature_type is None:
        _no_limits(max_distance, threshold)
        members = _content_groups(catalog, spec)
        kind = "exact"
    else:
        ids, chunks = _near_pairs(catalog, feature_type, max_distance, threshold, spec, distinct=True)
        members = _components(ids, chunks)
        kind = "near"
    sizes = _sizes(catalog, [i for group in members for i in group])
    groups = [DuplicateGroup(tuple(group), _choose(group, policy, sizes), kind) for group in members]
    groups.sort(key=lambda g: (-len(g.ids), g.ids[0]))
    return groups


def group_rows(catalog: Catalog, groups: Iterable[DuplicateGroup]) -> Iterator[dict[str, Any]]:
    """Output rows, one per group: group (1-based), kind, size, kept, ids, paths (absolute)."""
    from dlindex.features.samples import describe

    batch: list[DuplicateGroup] = []
    number = 0
    for group in [*groups, None]:
        if group is not None:
            batch.append(group)
        if batch and (group is None or len(batch) == _GROUPS_PER_LOOKUP):
            paths = describe(catalog, (i for g in batch for i in g.ids))  # one lookup per batch of groups
            for g in batch:
                number += 1
                yield {"group": number, **g.as_dict(), "paths": [paths.get(i, (None, None))[1] for i in g.ids]}
            batch = []


def group_keys(groups: Iterable[DuplicateGroup]) -> dict[int, int]:
    """Sample id -> the smallest id of its group, for every member of ``groups``."""
    return {i: group.ids[0] for group in groups for i in group.ids}


def _keep(keep: Keep | str) -> Keep:
    try:
        return Keep(keep)
    except ValueError:
        raise InputError(f"unknown keep policy {keep!r}; choose largest, oldest or first") from None


def _no_limits(max_distance: int | None, threshold: float | None) -> None:
    if max_distance is not None or threshold is not None:
        option = "--max-distance" if max_distance is not None else "--threshold"
        raise InputError(f"{option} needs a feature type (--type dhash); exact duplicates match content only")


def _content_groups(catalog: Catalog, spec: QuerySpec | None) -> list[list[int]]:
    """Ids (ascending) of each content hash that 2+ selected samples share."""
    selected = set(sample_ids(catalog, replace(spec or QuerySpec(), columns=("id",))))
    groups: dict[str, list[int]] = {}
    for image_id, content in catalog.read(_SHARED_CONTENT):
        if image_id in selected:
            groups.setdefault(content, []).append(int(image_id))
    return [sorted(ids) for ids in groups.values() if len(ids) > 1]


def _near_pairs(
    catalog: Catalog,
    feature_type: str,
    max_distance: int | None,
    threshold: float | None,
    spec: QuerySpec | None,
    *,
    distinct: bool,
) -> tuple[Ids, Iterator[PairChunk]]:
    """(ids, pair chunks of positions into ids); ``distinct``: equal hashes are paired in a
    chain, not all with all (the same groups, without a quadratic run of identical hashes)."""
    ids, vectors, is_hash = load_vectors(catalog, feature_type, spec)
    if is_hash:
        if threshold is not None:
            raise InputError(f"feature type {feature_type!r} is a 64-bit hash: use --max-distance, not --threshold")
        k = check_max_distance(DEFAULT_MAX_DISTANCE if max_distance is None else max_distance)
        hashes = pack_bits(vectors)
        if not distinct:
            return ids, hash_pairs(hashes, k)
        unique, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
        return ids, _distinct_hash_pairs(unique, first, inverse.reshape(-1), k)
    if max_distance is not None:
        raise InputError(f"feature type {feature_type!r} is an embedding: use --threshold, not --max-distance")
    limit = check_threshold(DEFAULT_THRESHOLD if threshold is None else threshold)
    return ids, embedding_pairs(vectors, limit)


def _distinct_hash_pairs(unique: Hashes, first: Positions, inverse: Positions, k: int) -> Iterator[PairChunk]:
    # each position joined to the first position with its hash, then the distinct hashes' pairs
    positions = np.arange(inverse.size, dtype=np.intp)
    others = first[inverse] != positions
    yield first[inverse][others], positions[others], np.zeros(int(others.sum()), dtype=np.float32)
    for i, j, distance in hash_pairs(unique, k):
        a, b = first[i], first[j]
        yield np.minimum(a, b), np.maximum(a, b), distance


def _components(ids: Ids, chunks: Iterable[PairChunk]) -> list[list[int]]:
    """Connected components with 2+ members, as ascending ids."""
    parent = list(range(ids.size))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving keeps later lookups short
            x = parent[x]
        return x

    for i, j, _ in chunks:
        for a, b in zip(i.tolist(), j.tolist(), strict=True):
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    members: dict[int, list[int]] = {}
    for x in range(ids.size):  # ascending, so each group's list is too
        members.setdefault(root(x), []).append(int(ids[x]))
    return [group for group in members.values() if len(group) > 1]


def _sizes(catalog: Catalog, ids: list[int]) -> dict[int, tuple[int, int, float]]:
    """id -> (pixels, bytes, mtime_ns); -1 pixels or bytes, inf mtime where unknown."""
    found: dict[int, tuple[int, int, float]] = {}
    for start in range(0, len(ids), _IDS_PER_STATEMENT):
        chunk = json.dumps(ids[start : start + _IDS_PER_STATEMENT])
        for image_id, width, height, size, mtime_ns in catalog.read(_SIZES, (chunk,)):
            pixels = width * height if width is not None and height is not None else -1
            found[int(image_id)] = (pixels, -1 if size is None else size, _NEVER if mtime_ns is None else mtime_ns)
    return found


def _choose(group: list[int], keep: Keep, sizes: dict[int, tuple[int, int, float]]) -> int:
    unknown = (-1, -1, _NEVER)
    if keep is Keep.largest:
        return min(group, key=lambda i: (-sizes.get(i, unknown)[0], -sizes.get(i, unknown)[1], i))
    if keep is Keep.oldest:
        return min(group, key=lambda i: (sizes.get(i, unknown)[2], i))
    return min(group)
