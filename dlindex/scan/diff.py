"""Diffing one unit of the tree against the catalog: what is new, changed, gone, relabelled.

Runs in worker processes with a read-only connection. The walk and the catalog rows of the
unit's key range are both in ``file_path`` order, so one merge pass classifies everything;
an unchanged file costs one ``lstat`` and nothing is written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dlindex.catalog.backend import Cursor, ReadConnection
from dlindex.query.spec import LOADER_FAILURE
from dlindex.scan.listing import Child, WalkOptions, WalkReport
from dlindex.scan.probe import Probe, stored_inode
from dlindex.scan.units import Unit
from dlindex.scan.walk import Folder, walk_runs

# Per row the merge-join reads only what tells an unchanged file (a rescan reads every row):
# its `state` is 1 for a 'missing' row, 2 for a row to probe again whatever the file's stat
# says: its verdict depends on --max-pixels (it was judged under another limit, or is above
# twice the new one), or the training loader failed to read it (its error starts with
# LOADER_FAILURE, case and all: not LIKE, which ignores case on both backends): the file may
# be back, and the writer then clears the loader's mark. 0 otherwise.
_ROWS = (
    "SELECT file_path, id, bytes, mtime_ns, CASE WHEN status = 'missing' THEN 1 WHEN "
    "(CASE WHEN pixel_limit IS NULL THEN width * height > :bomb ELSE pixel_limit != :limit END) "
    "OR (processing_status = 'failed' AND substr(error, 1, :loader_length) = :loader_failed) THEN 2 ELSE 0 END, "
    "label_id, split, inode, ctime_ns FROM image_metadata WHERE root_id = :root AND file_path >= :start"
)
_ROWS_FROM = _ROWS + " ORDER BY file_path"
_ROWS_BETWEEN = _ROWS + " AND file_path < :end ORDER BY file_path"
# What a known file's row said, for those the diff sends to be probed again (few on a rescan).
_BEFORE = (
    "SELECT id, xxh3_128, bytes, mtime_ns, status, pixel_limit FROM image_metadata "
    "WHERE id IN (SELECT value FROM json_each(:ids))"
)
_BEFORE_CHUNK = 10_000
_MISSING = 1
_FRESH = 0
_LABELS = "SELECT name, id FROM labels"


class ToProbe(NamedTuple):
    """A file the diff found new or changed, with what its row needs besides the probe."""

    path: bytes
    key: str
    label: str | None  # None: no class (a file directly under ROOT)
    raw: bytes | None
    known_id: int | None
    split: str | None = None  # the tree's split folder, on pre-split trees
    # Reached through a link: (st_dev, st_ino), so the scan keeps one path per file.
    ident: tuple[int, int] | None = None
    # What the row said of a known file: (xxh3_128, bytes, mtime_ns, status, pixel_limit); a
    # probe that finds the same is a re-read, not a change.
    before: tuple[str | None, int | None, int | None, str, int | None] | None = None


@dataclass
class UnitDiff:
    """What one unit's merge-join found; files probed by the same worker come back in ``probed``."""

    seen: int = 0
    unchanged: int = 0
    to_probe: list[ToProbe] = field(default_factory=list)
    missing: list[tuple[int, str]] = field(default_factory=list)  # (id, file_path)
    relabel: list[tuple[int, str | None, str | None]] = field(default_factory=list)  # (id, new label, new split)
    # Unchanged files reached through a link: (st_dev, st_ino, file_path, id).
    linked_unchanged: list[tuple[int, int, str, int]] = field(default_factory=list)
    linked_missing: list[int] = field(default_factory=list)  # ids of linked files with a 'missing' row
    # Unchanged rows that had no inode yet (catalogs from before schema 15): (inode, ctime_ns, id).
    identified: list[tuple[int, int, int]] = field(default_factory=list)
    probed: list[tuple[Probe, ToProbe]] = field(default_factory=list)  # probed by the same worker
    report: WalkReport = field(default_factory=WalkReport)

    # Diffs cross a process pipe. Pickle calls a Python method for every NamedTuple; plain
    # tuples it writes in C: 1.2 instead of 7.7 µs per probed file to pickle, 1.6 instead of
    # 4.0 µs to unpickle and rebuild (tuple.__new__ is C too): ~10% of a first scan's CPU.
    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["to_probe"] = [tuple(item) for item in self.to_probe]
        state["probed"] = [(tuple(probe), tuple(item)) for probe, item in self.probed]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        new = tuple.__new__
        state["to_probe"] = [new(ToProbe, item) for item in state["to_probe"]]
        state["probed"] = [(new(Probe, probe), new(ToProbe, item)) for probe, item in state["probed"]]
        self.__dict__.update(state)


@dataclass(frozen=True)
class DiffOptions:
    """How to walk and what makes an unchanged file worth probing again."""

    walk: WalkOptions
    force: bool = False
    label_overrides: dict[str, str | None] | None = None
    max_pixels: int = 89_478_485  # files judged under another limit are probed again
    # A worker probes up to this many of a unit's new/changed files itself, saving a round
    # trip through the main process; larger units are spread over all workers in batches.
    probe_inline: int = 2048


class LabelIds:
    """Label name -> id as the catalog had it; re-read when a name is not known yet."""

    def __init__(self, conn: ReadConnection) -> None:
        self.conn = conn
        self.ids: dict[str, int] = {}

    def get(self, name: str | None) -> int | None:
        """The id of label ``name`` (None: no class, or not in the catalog yet)."""
        if name is None:
            return None  # no class
        found = self.ids.get(name)
        if found is None:
            self.ids = dict(self.conn.execute(_LABELS).fetchall())
            found = self.ids.get(name)
        return found


def diff_unit(conn: ReadConnection, root_id: int, unit: Unit, options: DiffOptions, labels: LabelIds) -> UnitDiff:
    """Merge-join the unit's walk with its catalog rows, both in file_path order."""
    diff = UnitDiff()
    params = {"root": root_id, "start": unit.start, "end": unit.end, "limit": options.max_pixels,
              "bomb": 2 * options.max_pixels, "loader_failed": LOADER_FAILURE,
              "loader_length": len(LOADER_FAILURE)}  # fmt: skip
    cursor = conn.execute(_ROWS_FROM if unit.end is None else _ROWS_BETWEEN, params)
    overrides = options.label_overrides
    force = options.force
    missing, relabel, to_probe, identified = diff.missing, diff.relabel, diff.to_probe, diff.identified
    unchanged = seen = 0
    # known: (file_path, id, bytes, mtime_ns, state, label_id, split, inode, ctime_ns); the hot
    # loop stays flat.
    known = next(cursor, None)
    lstat = os.lstat
    for folder, run, stats in walk_runs(unit, options.walk, diff.report):
        prefix, fd = folder.prefix, folder.fd
        label, split = folder.label, folder.split
        label_id = None if overrides else labels.get(label)  # one lookup per run, not per file
        seen += len(run)
        if stats is not None:
            known = _diff_linked(diff, cursor, known, folder, run, stats, options, labels, label_id)
            continue
        for name, text, lossless, _ in run:
            key = prefix + text
            while known is not None and known[0] < key:
                if known[4] != _MISSING:
                    missing.append((known[1], known[0]))
                known = next(cursor, None)
            match = None
            if known is not None and known[0] == key:
                match, known = known, next(cursor, None)
                if not force and match[4] == _FRESH:
                    try:
                        st = (
                            lstat(name, dir_fd=fd) if fd >= 0 else lstat(folder.path + name)
                        )  # no walk of the full path
                    except OSError:
                        st = None  # let the probe report what is wrong with it
                    # Same size and mtime, and the same inode and ctime: a file replaced by one of
                    # the same size and mtime (cp -p, rsync -a, tar x) is read again.
                    if (
                        st is not None and st.st_size == match[2] and st.st_mtime_ns == match[3]
                        # st_ino first: stored_inode only differs from it at or above 2**63
                        and (((st.st_ino == match[7] or stored_inode(st.st_ino) == match[7])
                              and st.st_ctime_ns == match[8]) or match[7] is None)
                    ):  # fmt: skip
                        unchanged += 1
                        if match[7] is None:
                            identified.append((stored_inode(st.st_ino), st.st_ctime_ns, match[1]))
                        if overrides:
                            wanted = overrides.get(key, label)
                            if labels.get(wanted) != match[5] or split != match[6]:
                                relabel.append((match[1], wanted, split))
                        elif label_id != match[5] or split != match[6]:
                            relabel.append((match[1], label, split))
                        continue
            raw = None if lossless and folder.lossless else folder.raw_prefix + name
            file_label = overrides.get(key, label) if overrides else label
            if match is None:
                to_probe.append(ToProbe(folder.path + name, key, file_label, raw, None, split))
            else:
                to_probe.append(ToProbe(folder.path + name, key, file_label, raw, match[1], split))
    while known is not None:
        if known[4] != _MISSING:
            missing.append((known[1], known[0]))
        known = next(cursor, None)
    _add_before(conn, diff.to_probe)
    diff.seen, diff.unchanged = seen + diff.seen, unchanged + diff.unchanged
    unlisted = diff.report.unlisted
    if unlisted:  # a folder we could not read is not a folder whose files are gone
        diff.missing = [(i, p) for i, p in missing if not any(p.startswith(u) for u in unlisted)]
    return diff


def _diff_linked(
    diff: UnitDiff,
    cursor: Cursor,
    known: tuple[Any, ...] | None,
    folder: Folder,
    run: list[Child],
    stats: list[os.stat_result],
    options: DiffOptions,
    labels: LabelIds,
    label_id: int | None,
) -> tuple[Any, ...] | None:
    """The merge-join step for files reached through a link (rare: no need to be flat):
    their stat results come from the walk, and each result carries the file's identity."""
    overrides, label, split = options.label_overrides, folder.label, folder.split
    for (name, text, lossless, _), st in zip(run, stats, strict=True):
        key = folder.prefix + text
        ident = (st.st_dev, st.st_ino)
        while known is not None and known[0] < key:
            if known[4] != _MISSING:
                diff.missing.append((known[1], known[0]))
            known = next(cursor, None)
        match = None
        if known is not None and known[0] == key:
            match, known = known, next(cursor, None)
            if match[4] == _MISSING:
                diff.linked_missing.append(match[1])
            fresh = not options.force and match[4] == _FRESH
            same_file = match[7] is None or (stored_inode(st.st_ino) == match[7] and st.st_ctime_ns == match[8])
            if fresh and st.st_size == match[2] and st.st_mtime_ns == match[3] and same_file:
                diff.unchanged += 1
                if match[7] is None:
                    diff.identified.append((stored_inode(st.st_ino), st.st_ctime_ns, match[1]))
                diff.linked_unchanged.append((*ident, key, match[1]))
                wanted = overrides.get(key, label) if overrides else label
                if (labels.get(wanted) if overrides else label_id) != match[5] or split != match[6]:
                    diff.relabel.append((match[1], wanted, split))
                continue
        raw = None if lossless and folder.lossless else folder.raw_prefix + name
        file_label = overrides.get(key, label) if overrides else label
        diff.to_probe.append(
            ToProbe(folder.path + name, key, file_label, raw, match[1] if match else None, split, ident)
        )
    return known


def _add_before(conn: ReadConnection, to_probe: list[ToProbe]) -> None:
    """Fill in ``before`` of the known files among ``to_probe``: what their rows say, read by
    id in a few queries rather than in every row of the merge-join."""
    known = [i for i, item in enumerate(to_probe) if item.known_id is not None]
    for first in range(0, len(known), _BEFORE_CHUNK):
        chunk = known[first : first + _BEFORE_CHUNK]
        ids = json.dumps([to_probe[i].known_id for i in chunk])
        rows = {row[0]: tuple(row[1:]) for row in conn.execute(_BEFORE, {"ids": ids})}
        for i in chunk:
            before = rows.get(to_probe[i].known_id)
            if before is not None:
                to_probe[i] = to_probe[i]._replace(before=before)
