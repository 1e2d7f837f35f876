"""Cutting a tree into units: runs of consecutive siblings that processes walk and diff at once.

Each unit owns a contiguous range of catalog keys, so its walk merge-joins against
``ORDER BY file_path`` on that range alone.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from dlindex.catalog.classes import enter_folder, is_presplit
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


def plan_units(root: bytes, options: WalkOptions, report: WalkReport, parallelism: int) -> list[Unit]:
    """Cut the tree into units for ``parallelism`` processes.

    Links do not change the cut: files reached through links carry their (device, inode),
    and the scan keeps one path per file across units (see links.LinkedFiles).
    """
    children = list_children(root, "", options, report)
    presplit = options.split_folders and is_presplit(c[TEXT] for c in children if is_dir_kind(c[KIND]))
    units = _slices(root, "", b"", True, None, None, presplit, children)
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
                    grandchildren,
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
    presplit: bool, children: list[Child],
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
            if len(run) >= _FILES_PER_UNIT:
                close(run)
    if run:
        close(run)
    return units
