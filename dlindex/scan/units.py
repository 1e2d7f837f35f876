"""Cutting a tree into units: runs of consecutive siblings that processes walk and diff at once.

Each unit owns a contiguous range of catalog keys, so its walk merge-joins against
``ORDER BY file_path`` on that range alone.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import xxhash

from dlindex.catalog.classes import enter_folder, is_presplit
from dlindex.engines.parts import balanced_parts
from dlindex.scan.listing import KIND, TEXT, Child, WalkOptions, WalkReport, is_dir_kind, list_children, sort_text

_FILES_PER_UNIT = 2000


class Unit(NamedTuple):
    """Consecutive children of one folder, walked by one task, owning the catalog keys
    ``start <= file_path < end`` (``end`` None: to the end)."""

    folder: bytes
    prefix: str  # '' at ROOT, else 'a/b/'
    raw_prefix: bytes
    lossless: bool
    label: str | None  # None at ROOT (and in split folders): each folder below names its own label
    children: tuple[Child, ...]
    start: str
    end: str | None
    split: str | None = None  # the split folder this unit is in (pre-split trees)
    presplit: bool = False  # ROOT's folders are split folders: see dlindex.catalog.classes


def plan_units(
    root: bytes, options: WalkOptions, report: WalkReport, parallelism: int, files_per_unit: int = _FILES_PER_UNIT
) -> list[Unit]:
    """Cut the tree into units for ``parallelism`` processes.

    Links do not change the cut: files reached through links carry their (device, inode),
    and the scan keeps one path per file across units (see links.LinkedFiles).
    """
    children = list_children(root, "", options, report)
    presplit = options.split_folders and is_presplit(c[TEXT] for c in children if is_dir_kind(c[KIND]))
    units = _slices(root, "", b"", True, None, None, presplit, children, files_per_unit)
    for _ in range(2):  # few large folders: cut one level deeper so every process has work
        if len(units) >= 4 * parallelism:
            break
        deeper: list[Unit] = []
        for unit in units:
            name, text, lossless, kind = unit.children[0]
            if len(unit.children) == 1 and kind == "dir":
                prefix = unit.prefix + text + "/"
                folder = os.path.join(unit.folder, name)
                label, split = enter_folder(unit.label, unit.split, presplit, text)
                grandchildren = list_children(folder, prefix, options, report)
                deeper.extend(_slices(
                    folder, prefix, unit.raw_prefix + name + b"/", unit.lossless and lossless, label, split, presplit,
                    grandchildren, files_per_unit,
                ))  # fmt: skip
            else:
                deeper.append(unit)
        units = deeper
    return [
        unit._replace(start=unit.start if i else "", end=units[i + 1].start if i + 1 < len(units) else None)
        for i, unit in enumerate(units)
    ]


def _slices(
    folder: bytes, prefix: str, raw_prefix: bytes, lossless: bool, label: str | None, split: str | None,
    presplit: bool, children: list[Child], files_per_unit: int,
) -> list[Unit]:  # fmt: skip
    """Each folder its own unit; runs of files between folders grouped in bounded units."""
    units: list[Unit] = []
    run: list[Child] = []

    def close(members: list[Child]) -> None:
        units.append(
            Unit(folder, prefix, raw_prefix, lossless, label, tuple(members), prefix + sort_text(members[0]), None,
                 split, presplit)
        )  # fmt: skip
        members.clear()

    for child in children:
        if is_dir_kind(child[KIND]):
            if run:
                close(run)
            close([child])
        else:
            run.append(child)
            if len(run) >= files_per_unit:
                close(run)
    if run:
        close(run)
    return units


# A scan in parts plans as if for this many processes per part, whatever the machine has:
# the cut must be the same on every machine that runs a part.
_PART_PLAN_PARALLELISM = 16
_PART_FILES_PER_UNIT = 256  # finer runs than a local scan's: parts even to a few percent
_MIN_RUN = 16
_COUNT_LIMIT = 1_000_000  # entries counted under one folder unit before its weight is taken as is


class PartPlan(NamedTuple):
    """A part's units, and the digest of the whole cut (every part of one scan has the same)."""

    units: list[Unit]
    digest: str
    files: int  # entries weighed for this part (files listed, or counted under folder units)
    total: int  # the same for all parts together
    presplit: bool  # ROOT's folders are split folders (a part may have no unit to tell)


def part_units(root: bytes, options: WalkOptions, report: WalkReport, index: int, count: int) -> PartPlan:
    """Part ``index`` of ``count`` of the tree's units, balanced by files (docs/scale-out.md).

    The cut does not depend on the machine's CPUs; a folder unit weighs the entries under it
    (one listing, names only), so that parts of class folders of uneven size come out even.
    """
    units = plan_units(root, options, report, _PART_PLAN_PARALLELISM * count, _PART_FILES_PER_UNIT)
    weights = [_weight(unit) for unit in units]
    # No run of files heavier than 1/(16N) of the tree: the greedy split is then within
    # that of even, small trees included.
    limit = max(_MIN_RUN, sum(weights) // (_PART_PLAN_PARALLELISM * count))
    cut: list[Unit] = []
    cut_weights: list[int] = []
    for unit, weight in zip(units, weights, strict=True):
        pieces = _split_run(unit, limit)
        cut.extend(pieces)
        # a piece weighs its files; a unit left whole keeps its weight (no second count under a folder)
        cut_weights.extend([weight] if len(pieces) == 1 else [len(piece.children) for piece in pieces])
    units, weights = cut, cut_weights
    parts = balanced_parts(weights, count)
    digest = xxhash.xxh3_128()
    digest.update(f"{count}\n".encode())
    for unit, weight in zip(units, weights, strict=True):
        digest.update(f"{unit.start}\0{unit.end}\0{weight}\n".encode(errors="surrogateescape"))
    mine = [unit for unit, part in zip(units, parts, strict=True) if part == index]
    files = sum(w for w, part in zip(weights, parts, strict=True) if part == index)
    return PartPlan(mine, digest.hexdigest(), files, sum(weights), any(unit.presplit for unit in units))


def _split_run(unit: Unit, limit: int) -> list[Unit]:
    """A run of files longer than ``limit`` as consecutive runs, owning the same keys together."""
    if len(unit.children) <= limit or any(is_dir_kind(child[KIND]) for child in unit.children):
        return [unit]
    pieces = [unit.children[i : i + limit] for i in range(0, len(unit.children), limit)]
    starts = [unit.start] + [unit.prefix + sort_text(piece[0]) for piece in pieces[1:]]
    ends = [*starts[1:], unit.end]
    return [
        unit._replace(children=piece, start=start, end=end)
        for piece, start, end in zip(pieces, starts, ends, strict=True)
    ]


def _weight(unit: Unit) -> int:
    """Files in a run of files; entries under a folder unit, counted without stat calls."""
    total = 0
    for name, _, _, kind in unit.children:
        if is_dir_kind(kind):
            total += _count_entries(os.path.join(unit.folder, name), _COUNT_LIMIT)
        else:
            total += 1
    return max(1, total)


def _count_entries(folder: bytes, limit: int) -> int:
    """Non-folder entries under ``folder`` (links not followed), up to ``limit``."""
    count = 0
    stack = [folder]
    while stack and count < limit:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    if is_dir:
                        stack.append(entry.path)
                    else:
                        count += 1
        except OSError:
            continue  # the walk reports what it cannot list
    return count
