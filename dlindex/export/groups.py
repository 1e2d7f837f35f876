"""Group-aware splits: near-duplicate groups or a user's attribute kept whole in one split.

A group's split is a pure function of something that does not move as the catalog grows:
a near-duplicate group takes the content-hash point of its smallest id (ids only grow, so a
group keeps its anchor when new copies join, and a sample in no group keeps the split it has
without grouping); an ``--group-by`` group takes the XXH3-64 of its value. The one limit: a
new image that bridges two groups merges them, and the group whose anchor is no longer the
smallest moves with the other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import xxhash

from dlindex.errors import did_you_mean
from dlindex.export.plan import EXTRA, HASH, ID, ExportError, content_point

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

NEAR_DUPS = "near-dups"
GROUP_MODES = (NEAR_DUPS,)
DEFAULT_GROUP_TYPE = "dhash"
# What features compute would extract: ok samples with no vector and no recorded failure.
_MISSING = """SELECT count(*) FROM image_metadata WHERE status = 'ok'
    AND id NOT IN (SELECT image_id FROM image_features WHERE feature_type = :type)
    AND id NOT IN (SELECT image_id FROM feature_state WHERE feature_type = :type AND state = 'failed')"""
_HASHES = "SELECT id, xxh3_128 FROM image_metadata WHERE id IN (SELECT value FROM json_each(?))"
_IDS_PER_STATEMENT = 10_000
_OK_SAMPLES = "SELECT count(*) FROM image_metadata WHERE status = 'ok'"
# Groups of one attribute and the largest's size, counted by the database (its sort spills to
# disk), so no map of the catalog's samples is built here.
_VALUE_GROUPS = """SELECT count(*), coalesce(max(n), 0) FROM
    (SELECT count(*) AS n FROM sample_attributes WHERE name = ? GROUP BY value) AS sizes"""


@dataclass(frozen=True)
class Grouping:
    """How an export keeps samples together: ``mode`` near-dups (by ``feature_type``) or by ``column``."""

    mode: str  # "near-dups" or "column"
    feature_type: str | None = None
    max_distance: int | None = None
    threshold: float | None = None
    column: str | None = None

    def describe(self, groups: int) -> dict[str, Any]:
        """What index.json records under options.group."""
        if self.mode == "column":
            return {"mode": "column", "column": self.column, "groups": groups}
        return {
            "mode": self.mode, "type": self.feature_type, "max_distance": self.max_distance,
            "threshold": self.threshold, "groups": groups,
        }  # fmt: skip


def check_grouping(
    group: str | None,
    group_by: str | None,
    group_type: str | None,
    max_distance: int | None,
    threshold: float | None,
    fractions: bool,
) -> Grouping | None:
    """The grouping asked for, or None; ExportError for a combination that makes no sense."""
    tuning = {"--group-type": group_type, "--group-max-distance": max_distance, "--group-threshold": threshold}
    if group is None and group_by is None:
        given = [name for name, value in tuning.items() if value is not None]
        if given:
            raise ExportError(f"{given[0]} tunes --group near-dups; add --group near-dups")
        return None
    if group is not None and group_by is not None:
        raise ExportError("give --group near-dups or --group-by COLUMN, not both")
    if not fractions:
        option = "--group" if group is not None else "--group-by"
        raise ExportError(
            f"{option} needs fractions to split by: add --split NAME=FRACTION,... (e.g. train=0.8,val=0.2)"
        )
    if group_by is not None:
        from dlindex.scan.labels import check_attribute_name

        if any(value is not None for value in tuning.values()):
            raise ExportError(
                "--group-type, --group-max-distance and --group-threshold tune --group near-dups, not --group-by"
            )
        return Grouping("column", column=check_attribute_name(group_by, "--group-by"))
    if group not in GROUP_MODES:
        raise ExportError(
            f"--group {group!r}: choose {', '.join(GROUP_MODES)} (or --group-by COLUMN for your own groups)"
        )
    feature_type = group_type or DEFAULT_GROUP_TYPE
    if max_distance is None and threshold is None and feature_type == DEFAULT_GROUP_TYPE:
        from dlindex.quality.duplicate_groups import DEFAULT_MAX_DISTANCE

        max_distance = DEFAULT_MAX_DISTANCE  # recorded as used, like `dups --type dhash`
    return Grouping(NEAR_DUPS, feature_type, max_distance, threshold)


def ensure_hashes(catalog: Catalog, grouping: Grouping, note: Callable[[str], None]) -> None:
    """Compute the built-in dhash for the samples that have none yet, saying so first."""
    from dlindex.features.types import find_type

    if grouping.mode != NEAR_DUPS or grouping.feature_type != DEFAULT_GROUP_TYPE:
        return
    missing = int(catalog.conn.execute(_MISSING, {"type": DEFAULT_GROUP_TYPE}).fetchone()[0])
    existing = find_type(catalog, DEFAULT_GROUP_TYPE)
    if not missing and existing is not None:
        return
    from dlindex.features.pipeline import ComputeOptions, compute_features

    note(
        f"computing {DEFAULT_GROUP_TYPE} for {missing} sample(s) first "
        f"(as dlindex features compute --type {DEFAULT_GROUP_TYPE} --extractor {DEFAULT_GROUP_TYPE} would)"
    )
    extractor = None if existing is not None else DEFAULT_GROUP_TYPE
    from dlindex.query.spec import QuerySpec

    every_ok = QuerySpec(excluded=None)  # the groups take in excluded samples too
    compute_features(catalog, DEFAULT_GROUP_TYPE, every_ok, options=ComputeOptions(extractor=extractor))


LARGE_GROUP_SHARE = 0.05  # a group above this share of the samples can move a split's fraction visibly


@dataclass(frozen=True)
class GroupPoints:
    """Sample id -> the 64-bit point its split is chosen by, for grouped samples; the others
    keep their own content-hash point. For ``--group-by``, a function of a row carrying its
    value at EXTRA (select_rows's ``group_column``) instead: nothing held per sample."""

    points: dict[int, int] | Callable[[tuple[Any, ...]], int]
    groups: int
    largest: int = 0  # samples in the largest group
    grouping: Grouping | None = None  # as used: the near-dups limit the type's kind took, defaults filled in


def group_points(catalog: Catalog, grouping: Grouping) -> GroupPoints:
    """The points of every grouped sample of the catalog (all of it, so a sample's split does
    not depend on an export's filters)."""
    if grouping.mode == "column":
        from dlindex.scan.labels import attribute_names

        assert grouping.column is not None
        names = attribute_names(catalog)
        if grouping.column not in names:
            known = ", ".join(names) if names else "none (add columns to a scan --labels CSV)"
            raise ExportError(
                f"--group-by {grouping.column}: no sample has that attribute{did_you_mean(grouping.column, names)}; "
                f"known: {known}"
            )
        ((groups, largest),) = list(catalog.read(_VALUE_GROUPS, (grouping.column,)))
        return GroupPoints(attribute_point, int(groups), int(largest), grouping)
    from dlindex.quality.duplicate_groups import duplicate_groups, near_limits
    from dlindex.query.spec import QuerySpec

    assert grouping.feature_type is not None
    every_ok = QuerySpec(excluded=None)  # excluded copies too: a sample's split must not depend on `mark --exclude`
    near = duplicate_groups(
        catalog, feature_type=grouping.feature_type, max_distance=grouping.max_distance,
        threshold=grouping.threshold, keep="first", grouping="connected", spec=every_ok,
    )  # fmt: skip  # connected: no chain of near copies may cross a split
    exact = duplicate_groups(catalog, keep="first", spec=every_ok)
    members = merged_groups(g.ids for g in (*near, *exact))
    anchors = {i: group[0] for group in members for i in group}
    anchor_points = content_points(catalog, sorted({group[0] for group in members}))
    largest = max(map(len, members), default=0)
    max_distance, threshold = near_limits(catalog, grouping.feature_type, grouping.max_distance, grouping.threshold)
    used = replace(grouping, max_distance=max_distance, threshold=threshold)
    points = {i: anchor_points[a] for i, a in anchors.items() if a in anchor_points}
    return GroupPoints(points, len(members), largest, used)


def large_group_note(catalog: Catalog, points: GroupPoints) -> str | None:
    """One line when a single group is big enough to move the split fractions noticeably."""
    samples = int(catalog.conn.execute(_OK_SAMPLES).fetchone()[0])
    if samples <= 0 or points.largest <= LARGE_GROUP_SHARE * samples:
        return None
    return (
        f"the largest group holds {points.largest} of {samples} samples ({points.largest / samples:.0%}); it goes "
        "to one split, so the fractions can be off by that much (a smaller --group-max-distance or an "
        "embedding --group-type makes smaller groups)"
    )


def merged_groups(groups: Iterable[Iterable[int]]) -> list[list[int]]:
    """Overlapping groups of ids merged (union-find), each ascending, by smallest id."""
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for group in groups:
        ids = list(group)
        for other in ids[1:]:
            a, b = root(ids[0]), root(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
        if ids:
            root(ids[0])
    merged: dict[int, list[int]] = {}
    for x in sorted(parent):
        merged.setdefault(root(x), []).append(x)
    return [merged[k] for k in sorted(merged)]


def content_points(catalog: Catalog, ids: list[int]) -> dict[int, int]:
    """id -> the point its content hash gives (the top 64 bits of its XXH3-128)."""
    found: dict[int, int] = {}
    for start in range(0, len(ids), _IDS_PER_STATEMENT):
        chunk = json.dumps(ids[start : start + _IDS_PER_STATEMENT])
        for image_id, digest in catalog.read(_HASHES, (chunk,)):
            row: list[Any] = [None] * (max(ID, HASH) + 1)
            row[ID], row[HASH] = int(image_id), digest
            found[int(image_id)] = content_point(tuple(row))
    return found


def attribute_point(row: tuple[Any, ...]) -> int:
    """The point of a row carrying its --group-by value at EXTRA: its value's, else (no value)
    its own content hash's."""
    value = row[EXTRA]
    return content_point(row) if value is None else value_point(value)


def value_point(value: str) -> int:
    """The point of an attribute value: XXH3-64 of its UTF-8 bytes."""
    return int(xxhash.xxh3_64_intdigest(value.encode("utf-8", "surrogatepass")))
