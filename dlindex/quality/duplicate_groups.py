"""Duplicate groups: exact copies by content hash, near copies by hash or embedding pairs.

Near groups form around the sample the keep policy keeps (every member within the limit of
it, dlindex.quality.linkage), or with ``Grouping.connected`` as connected components of the
pairs (chains included: what splits and leak checks need). The rest of a group can be marked.
"""

from __future__ import annotations

import itertools
import json
import warnings
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from dlindex.errors import DlindexWarning, InputError
from dlindex.quality.hashes import Hashes, is_hash_type, load_vectors, plain_hashes
from dlindex.quality.linkage import around_kept, components
from dlindex.quality.pairs import PairChunk, Positions, check_max_distance, check_threshold, embedding_pairs, hash_pairs
from dlindex.quality.scratch import insert_rows, scratch_database
from dlindex.query.rows import prepare
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.features.blobs import Ids

# Chosen by measurement (docs/commands/dups.md): every resized or re-encoded copy, most 5%
# crops, and no unrelated pair of 400 synthetic images (dhash); the threshold: colorthumb on
# 100k generated images with 1,000 planted near copies (docs/benchmarks.md, bench_dups).
DEFAULT_MAX_DISTANCE = 8  # bits of 64, for hash types
DEFAULT_THRESHOLD = 0.03  # cosine distance, for embedding types (measured on colorthumb)
# Content hashes shared by more than one row: the candidates for exact duplicates.
SHARED_CONTENT = """SELECT id, xxh3_128 FROM image_metadata WHERE xxh3_128 IN
    (SELECT xxh3_128 FROM image_metadata WHERE xxh3_128 IS NOT NULL GROUP BY xxh3_128 HAVING count(*) > 1)
    ORDER BY xxh3_128, id"""
# The same, of the samples a selection (a statement of ids) holds: the database sorts and groups
# (externally, beyond its cache), and the rows come ordered by content, so a group is whole
# when the next content starts; memory holds only the groups, never every selected id.
_SHARED_SELECTED = """SELECT id, xxh3_128 FROM image_metadata WHERE xxh3_128 IN
    (SELECT xxh3_128 FROM image_metadata WHERE xxh3_128 IS NOT NULL GROUP BY xxh3_128 HAVING count(*) > 1)
    AND id IN ({selection}) ORDER BY xxh3_128, id"""
_SIZES = """SELECT id, width, height, bytes, mtime_ns FROM image_metadata
    WHERE id IN (SELECT value FROM json_each(?))"""
# Exact groups wait on disk (a scratch database) to come out largest first: memory holds a
# batch of groups, not every group of the catalog (~1M duplicate rows at 10^8: ~430 MB as lists).
_GROUP_TABLE = "CREATE TABLE exact_groups (size INTEGER NOT NULL, first INTEGER NOT NULL, ids BLOB NOT NULL)"
_ADD_GROUP = "INSERT INTO exact_groups (size, first, ids) VALUES (?, ?, ?)"
_GROUPS_IN_ORDER = "SELECT ids FROM exact_groups ORDER BY size DESC, first"
_IDS_PER_STATEMENT = 10_000
_GROUPS_PER_LOOKUP = 1000
_NEVER = float("inf")  # the mtime of a file whose mtime is unknown: kept last by --keep oldest


@dataclass(frozen=True, order=True)
class Pair:
    """Two duplicate samples by id (``a < b``); distance 0 for exact copies."""

    a: int
    b: int
    distance: float


class Grouping(StrEnum):
    """around_kept: every member is a near copy of the kept one; connected: chains of near pairs."""

    around_kept = "around-kept"
    connected = "connected"


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
        no_limits(max_distance, threshold)
        for members in _content_groups(catalog, spec):
            for at, a in enumerate(members):
                for b in members[at + 1 :]:
                    yield Pair(a, b, 0.0)
        return
    ids, chunks = _near_pairs(catalog, feature_type, max_distance, threshold, spec)
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
    grouping: Grouping | str = Grouping.around_kept,
    spec: QuerySpec | None = None,
) -> list[DuplicateGroup]:
    """Groups of 2+ duplicates, largest first, then by smallest id; each keeps one member by
    ``keep``. Near groups form by ``grouping`` (exact copies are equal, so both agree)."""
    policy = _keep(keep)
    linkage = _grouping(grouping)
    if feature_type is None:
        no_limits(max_distance, threshold)
        return list(exact_groups(catalog, keep=policy, spec=spec))  # already in this order
    ids, node_of, nodes, chunks = _near_nodes(catalog, feature_type, max_distance, threshold, spec)
    if linkage is Grouping.connected:
        members = _by_label(ids, components(nodes, chunks)[node_of])
        sizes = _sizes(catalog, [i for group in members for i in group])
        groups = [DuplicateGroup(tuple(g), _choose(g, policy, sizes), "near") for g in members]
    else:
        groups = _groups_around_kept(catalog, ids, node_of, nodes, list(chunks), policy)
    groups.sort(key=lambda g: (-len(g.ids), g.ids[0]))
    return groups


def iter_duplicate_groups(
    catalog: Catalog,
    *,
    feature_type: str | None = None,
    max_distance: int | None = None,
    threshold: float | None = None,
    keep: Keep | str = Keep.largest,
    grouping: Grouping | str = Grouping.around_kept,
    spec: QuerySpec | None = None,
) -> Iterator[DuplicateGroup]:
    """``duplicate_groups``' groups in the same order, one at a time: exact groups come from a
    sort on disk (memory does not grow with the catalog), near groups from the list."""
    if feature_type is None:  # checked now, before any output: the groups come when iterated
        no_limits(max_distance, threshold)
        _grouping(grouping)
        return exact_groups(catalog, keep=_keep(keep), spec=spec)
    return iter(duplicate_groups(
        catalog, feature_type=feature_type, max_distance=max_distance, threshold=threshold, keep=keep,
        grouping=grouping, spec=spec,
    ))  # fmt: skip


def exact_groups(
    catalog: Catalog, *, keep: Keep | str = Keep.largest, spec: QuerySpec | None = None
) -> Iterator[DuplicateGroup]:
    """Groups of exact copies, largest first, then by smallest id: the groups are sorted in a
    scratch database, then read back a batch at a time to choose each one's kept member."""
    return _sorted_groups(catalog, _content_groups(catalog, spec), _keep(keep))


def _sorted_groups(catalog: Catalog, content_groups: Iterable[list[int]], policy: Keep) -> Iterator[DuplicateGroup]:
    with scratch_database() as scratch:
        scratch.execute(_GROUP_TABLE)
        found = ((len(g), g[0], array("q", g).tobytes()) for g in content_groups)
        insert_rows(scratch, _ADD_GROUP, found)
        batch: list[list[int]] = []
        for (blob,) in itertools.chain(scratch.execute(_GROUPS_IN_ORDER), [(None,)]):  # rows read as they come
            if blob is not None:
                batch.append(array("q", blob).tolist())
            if batch and (blob is None or len(batch) == _GROUPS_PER_LOOKUP):
                sizes = _sizes(catalog, [i for group in batch for i in group])
                yield from (DuplicateGroup(tuple(g), _choose(g, policy, sizes), "exact") for g in batch)
                batch = []


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


def _grouping(grouping: Grouping | str) -> Grouping:
    try:
        return Grouping(grouping)
    except ValueError:
        raise InputError(f"unknown grouping {grouping!r}; choose around-kept or connected") from None


def no_limits(max_distance: int | None, threshold: float | None) -> None:
    if max_distance is not None or threshold is not None:
        option = "--max-distance" if max_distance is not None else "--threshold"
        raise InputError(f"{option} needs a feature type (--type dhash); exact duplicates match content only")


def _content_groups(catalog: Catalog, spec: QuerySpec | None) -> Iterator[list[int]]:
    """Ids (ascending) of each content hash that 2+ selected samples share, one group at a time
    (the selection is checked now, the rows read when iterated)."""
    selection = prepare(catalog, replace(spec or QuerySpec(), columns=("id",)))
    return _runs(catalog.read(_SHARED_SELECTED.replace("{selection}", selection.selection_sql), selection.params))


def _runs(rows: Iterable[tuple[Any, ...]]) -> Iterator[list[int]]:
    """The ids of each run of equal contents in (id, content) rows ordered by content, of 2+."""
    members: list[int] = []
    current: object = None
    for image_id, content in rows:
        if content != current:
            if len(members) > 1:
                yield members
            members, current = [], content
        members.append(int(image_id))
    if len(members) > 1:
        yield members


def _near_pairs(
    catalog: Catalog, feature_type: str, max_distance: int | None, threshold: float | None, spec: QuerySpec | None
) -> tuple[Ids, Iterator[PairChunk]]:
    """(ids, pair chunks of positions into ids): every pair, identical hashes all with all."""
    ids, vectors, is_hash = load_vectors(catalog, feature_type, spec)
    if is_hash:
        k = hash_limit(feature_type, max_distance, threshold)
        ids, hashes = informative(catalog, feature_type, ids, vectors.astype(np.uint64, copy=False), k)
        return ids, hash_pairs(hashes, k)
    return ids, embedding_pairs(vectors, embedding_limit(feature_type, max_distance, threshold))


def informative(catalog: Catalog, feature_type: str, ids: Ids, hashes: Hashes, k: int) -> tuple[Ids, Hashes]:
    """The samples whose hash says something about the picture; one warning for the others."""
    plain = plain_hashes(catalog, feature_type, hashes, k)
    if plain.any():
        warnings.warn(
            f"{int(plain.sum())} of {plain.size} images are too plain for {feature_type} (within {k} bits of a "
            "flat image's hash) and are left out of near duplicates; compare them by an embedding with --type",
            DlindexWarning,
            stacklevel=4,
        )
    return ids[~plain], hashes[~plain]


def near_limits(
    catalog: Catalog, feature_type: str, max_distance: int | None, threshold: float | None
) -> tuple[int | None, float | None]:
    """(max_distance, threshold) as duplicate search uses them for ``feature_type``: the one its
    kind takes, defaulted where unset; InputError for the other kind's limit."""
    if is_hash_type(catalog, feature_type):
        return hash_limit(feature_type, max_distance, threshold), None
    return None, embedding_limit(feature_type, max_distance, threshold)


def hash_limit(feature_type: str, max_distance: int | None, threshold: float | None) -> int:
    if threshold is not None:
        raise InputError(f"feature type {feature_type!r} is a 64-bit hash: use --max-distance, not --threshold")
    return check_max_distance(DEFAULT_MAX_DISTANCE if max_distance is None else max_distance)


def embedding_limit(feature_type: str, max_distance: int | None, threshold: float | None) -> float:
    if max_distance is not None:
        raise InputError(f"feature type {feature_type!r} is an embedding: use --threshold, not --max-distance")
    return check_threshold(DEFAULT_THRESHOLD if threshold is None else threshold)


def _near_nodes(
    catalog: Catalog, feature_type: str, max_distance: int | None, threshold: float | None, spec: QuerySpec | None
) -> tuple[Ids, Positions, int, Iterator[PairChunk]]:
    """(ids, the node of each position, the number of nodes, pair chunks of nodes): a node is
    one distinct hash value (all the samples sharing it) or, for embeddings, one sample."""
    ids, vectors, is_hash = load_vectors(catalog, feature_type, spec)
    if is_hash:
        k = hash_limit(feature_type, max_distance, threshold)
        ids, hashes = informative(catalog, feature_type, ids, vectors.astype(np.uint64, copy=False), k)
        unique, inverse = np.unique(hashes, return_inverse=True)
        return ids, inverse.reshape(-1).astype(np.intp), int(unique.size), hash_pairs(unique, k)
    limit = embedding_limit(feature_type, max_distance, threshold)
    return ids, np.arange(ids.size, dtype=np.intp), int(ids.size), embedding_pairs(vectors, limit)


def _groups_around_kept(
    catalog: Catalog, ids: Ids, node_of: Positions, nodes: int, chunks: list[PairChunk], policy: Keep
) -> list[DuplicateGroup]:
    shared = np.bincount(node_of, minlength=nodes) > 1  # identical hashes: a group without a pair
    in_pairs = np.zeros(nodes, dtype=bool)
    for i, j, _ in chunks:
        in_pairs[i] = True
        in_pairs[j] = True
    touched = np.flatnonzero((shared | in_pairs)[node_of])  # positions of samples that can be in a group
    sizes = _sizes(catalog, ids[touched].tolist())
    best_first = sorted(touched.tolist(), key=lambda x: _priority(int(ids[x]), policy, sizes))
    sample_rank = np.empty(ids.size, dtype=np.int64)
    sample_rank[best_first] = np.arange(len(best_first), dtype=np.int64)
    node_rank = np.full(nodes, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(node_rank, node_of[touched], sample_rank[touched])
    leader = around_kept(nodes, chunks, node_rank)
    alone = leader < 0
    leader[alone] = np.flatnonzero(alone)  # a node without pairs leads its own identical hashes
    kept_at = {int(node_of[x]): int(ids[x]) for x in reversed(best_first)}  # the best sample of each node
    groups: dict[int, list[int]] = {}
    for x in touched.tolist():  # ascending positions, so ascending ids
        groups.setdefault(int(leader[node_of[x]]), []).append(int(ids[x]))
    return [DuplicateGroup(tuple(g), kept_at[node], "near") for node, g in groups.items() if len(g) > 1]


def _by_label(ids: Ids, labels: Positions) -> list[list[int]]:
    members: dict[int, list[int]] = {}
    for x, label in enumerate(labels.tolist()):  # ascending, so each group's list is too
        members.setdefault(label, []).append(int(ids[x]))
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


def _priority(image_id: int, keep: Keep, sizes: dict[int, tuple[int, int, float]]) -> tuple[float, ...]:
    """Sort key of the keep policy: the sample kept first sorts first."""
    pixels, size, mtime = sizes.get(image_id, (-1, -1, _NEVER))
    if keep is Keep.largest:
        return (-pixels, -size, image_id)
    if keep is Keep.oldest:
        return (mtime, image_id)
    return (image_id,)


def _choose(group: list[int], keep: Keep, sizes: dict[int, tuple[int, int, float]]) -> int:
    return min(group, key=lambda i: _priority(i, keep, sizes))
