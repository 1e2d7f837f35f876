"""``dlindex diff A B``: what differs between two states of the catalog, row by row.

Only rows that changed between the two states are read: the live rows written since the older
one (an index on ``valid_from``) and the history rows that ended or began between them (keyed by
the state that ended them), never the whole catalog. Each such row is read as it stood at both
states (dlindex.catalog.as_of) and compared column group by column group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlindex.catalog.paths import root_path

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

# What a change is called, and the columns that make it (a row can have several).
KINDS: dict[str, tuple[str, ...]] = {
    "content": ("xxh3_128", "bytes", "width", "height", "format", "mode", "orientation"),
    "relabelled": ("label",),
    "split": ("split",),
    "status": ("status", "error"),
    "flags": ("processed", "processing_status", "excluded"),
    "moved": ("root_id", "file_path"),
}
ORDER = ("added", "removed", *KINDS)
_SHOWN = tuple(dict.fromkeys(c for cols in KINDS.values() for c in cols))
_ROW = (*(c for c in _SHOWN if c != "label"), "label_id", "file_path_bytes")

# Rows whose state differs somewhere in (lo, hi]: a live row written then (by its index), or a
# history row that ended or began then (by its key: those that ended after lo).
_CANDIDATES = """SELECT id FROM image_metadata WHERE valid_from > :lo AND valid_from <= :hi
    UNION SELECT id FROM image_history WHERE valid_to > :lo AND (valid_to <= :hi OR valid_from > :lo AND valid_from <= :hi)"""
# Of the candidates, those that were in the catalog at state :at: a row that changed after it
# has a history row that began by then and ended after it; one unchanged since is no candidate.
_EXISTED = "SELECT id FROM image_history WHERE valid_to > :at AND valid_from <= :at"
# Each candidate as it stood at state :a (side 0) and at :b (side 1), one stream in id order: at
# most one row per side. (A join of the two states on id is what SQLite runs as a nested scan.)
_STATE = """SELECT {side}, {cols} FROM image_metadata WHERE id IN (SELECT id FROM cand)
        AND (valid_from IS NULL OR valid_from <= :{s})
    UNION ALL SELECT {side}, {cols} FROM image_history WHERE id IN (SELECT id FROM cand)
        AND valid_from <= :{s} AND valid_to > :{s}"""
_LABELS = """SELECT id, name FROM labels WHERE valid_from IS NULL OR valid_from <= :{s}
    UNION ALL SELECT id, name FROM label_history WHERE valid_from <= :{s} AND valid_to > :{s}"""
_ROOTS = "SELECT id, path, path_bytes FROM roots"


def _diff_sql() -> str:
    cols = ", ".join(("id", *_ROW))
    return (
        f"WITH cand AS MATERIALIZED ({_CANDIDATES}) {_STATE.format(side=0, cols=cols, s='a')} "
        f"UNION ALL {_STATE.format(side=1, cols=cols, s='b')} ORDER BY 2, 1"
    )


@dataclass(frozen=True)
class RowChange:
    """One sample that differs: its kinds of change and each changed column as [before, after]."""

    id: int
    path: str
    kinds: tuple[str, ...]
    changed: dict[str, list[Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "changes": list(self.kinds), **self.changed}


@dataclass
class DiffCounts:
    """How many samples changed in each way between two states (a sample may count in several)."""

    before: int
    after: int
    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ORDER, 0))
    samples: int = 0

    def add(self, change: RowChange) -> None:
        self.samples += 1
        for kind in change.kinds:
            self.by_kind[kind] += 1

    def as_dict(self) -> dict[str, Any]:
        return {"from_state": self.before, "to_state": self.after, "samples": self.samples, **self.by_kind}


def changed_between(catalog: Catalog, before: int, after: int) -> tuple[list[int], list[int]]:
    """The ids of the samples whose row changed somewhere between the two states (a superset of
    those ``diff_states`` yields: a row changed and changed back is here too), in id order; and
    those of them that were in the catalog at ``before`` (the others were added since)."""
    params = {"lo": min(before, after), "hi": max(before, after)}
    changed = sorted(int(i) for (i,) in catalog.read(_CANDIDATES, params))
    existed = sorted(int(i) for (i,) in catalog.read(_EXISTED, {"at": before}))
    return changed, existed


def diff_states(catalog: Catalog, before: int, after: int) -> Iterator[RowChange]:
    """Every sample whose row differs between states ``before`` and ``after``, in id order;
    an unchanged sample is never read (bounded by the changes, not the catalog)."""
    roots = {int(i): root_path(p, b) for i, p, b in catalog.read(_ROOTS)}
    params = {"lo": min(before, after), "hi": max(before, after), "a": before, "b": after}
    names = [dict(catalog.read(_LABELS.format(s=side), params)) for side in ("a", "b")]
    current: int | None = None
    sides: list[dict[str, Any] | None] = [None, None]
    for row in catalog.read(_diff_sql(), params):
        side, sample = int(row[0]), int(row[1])
        if sample != current:
            if current is not None:
                yield from _compared(current, sides, roots)
            current, sides = sample, [None, None]
        values = dict(zip(_ROW, row[2:], strict=True))
        values["label"] = names[side].get(values["label_id"])
        sides[side] = values
    if current is not None:
        yield from _compared(current, sides, roots)


def _compared(sample: int, sides: list[dict[str, Any] | None], roots: dict[int, bytes]) -> Iterator[RowChange]:
    """The change of one sample between its two states, if it changed (and did not change back)."""
    a, b = sides
    if a is not None and b is not None:
        changed = {c: [a[c], b[c]] for c in _SHOWN if a[c] != b[c]}
        kinds = tuple(k for k, cols in KINDS.items() if any(c in changed for c in cols))
        if kinds:
            yield RowChange(sample, _path(roots, b), kinds, changed)
    elif b is not None:
        yield RowChange(sample, _path(roots, b), ("added",), {})
    elif a is not None:
        yield RowChange(sample, _path(roots, a), ("removed",), {})
    # neither: added and removed again between the two states


def _path(roots: dict[int, bytes], row: dict[str, Any]) -> str:
    base = roots.get(int(row["root_id"])) if row["root_id"] is not None else None
    rel = bytes(row["file_path_bytes"]) if row["file_path_bytes"] is not None else os.fsencode(str(row["file_path"]))
    if base is None:
        return os.fsdecode(rel)
    return os.fsdecode(base.rstrip(b"/") + b"/" + rel)
