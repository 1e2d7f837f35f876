"""The duplicates report: its groups looked up in the catalog, and its page written only where it is safe.

What the page shows and how it is drawn is :mod:`dlindex.quality.page`. The page is bounded: at
most ``max_groups`` groups and ``max_members`` of each are drawn (a line says what was left out).

A report never replaces what dlindex did not write: an existing file is overwritten only
with ``overwrite=True`` and only when it starts with this module's generator marker; links,
folders and other non-regular files are refused. The page is written beside its target and
renamed into place, so a reader (or a failed run) never leaves half a page.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlindex.errors import DlindexError, InputError, Interrupted
from dlindex.faults import disk_full_error, is_disk_full
from dlindex.features import tempfiles
from dlindex.quality.page import MARKER, ReportGroup, ReportMember, write_page

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog
    from dlindex.quality.duplicate_groups import DuplicateGroup

MARKER_WINDOW = 4096  # the marker sits in the <head>, well inside the first few KB
MIN_THUMB_PX, MAX_THUMB_PX = 32, 512
DEFAULT_MAX_GROUPS = 1000
DEFAULT_MAX_MEMBERS = 50  # 160 px previews are 5-15 kB: 50,000 previews stay under ~1 GB at worst
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_PROBE_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_DETAILS = (
    "SELECT id, width, height, bytes, orientation FROM image_metadata WHERE id IN (SELECT value FROM json_each(?))"
)
_IDS_PER_STATEMENT = 5000


class ReportError(InputError):
    """The report cannot be written where asked (exists, not ours, not a regular file)."""


@dataclass(frozen=True)
class ReportSummary:
    """What was written: the page, the groups and images drawn on it, previews that failed, its size."""

    path: Path
    groups: int
    images: int
    thumbnails_failed: int
    bytes: int


class PageGroups:
    """The groups a page draws, taken from a stream of groups as it goes by: the first
    ``max_groups`` are kept, the rest only counted, so that a page of a catalog with millions of
    groups holds at most ``max_groups`` of them while the stream goes on to the command's output."""

    def __init__(self, max_groups: int | None = None) -> None:
        self.max_groups = DEFAULT_MAX_GROUPS if max_groups is None else max_groups
        self.first: list[DuplicateGroup] = []
        self.left_groups = 0
        self.left_images = 0

    def tee(self, groups: Iterable[DuplicateGroup]) -> Iterator[DuplicateGroup]:
        """``groups`` unchanged, keeping or counting each as it passes."""
        for group in groups:
            if len(self.first) < self.max_groups:
                self.first.append(group)
            else:
                self.left_groups += 1
                self.left_images += len(group.ids)
            yield group


def report_groups(
    catalog: Catalog,
    groups: Sequence[DuplicateGroup],
    *,
    max_groups: int = DEFAULT_MAX_GROUPS,
    max_members: int = DEFAULT_MAX_MEMBERS,
) -> list[ReportGroup]:
    """Report groups for ``groups``, with the catalog's details (path, size, label) looked up
    only for the members ``write_report`` draws (the first ``max_groups`` groups, up to
    ``max_members`` of each, the kept one among them); the others stay bare, counted as left out.
    """
    import json

    from dlindex.features.samples import describe

    drawn: set[int] = set()
    for group in groups[:max_groups]:
        first = group.ids[:max_members]
        drawn.update(first if group.kept in first else (*first[:-1], group.kept))
    ids = sorted(drawn)
    sizes: dict[int, tuple[int | None, int | None, int | None, int | None]] = {}
    for start in range(0, len(ids), _IDS_PER_STATEMENT):
        chunk = json.dumps(ids[start : start + _IDS_PER_STATEMENT])
        for image_id, width, height, size, orientation in catalog.read(_DETAILS, (chunk,)):
            sizes[int(image_id)] = (width, height, size, orientation)
    info = describe(catalog, ids)

    def member(i: int, kept: bool) -> ReportMember:
        label, path = info.get(i, (None, ""))
        width, height, size, orientation = sizes.get(i, (None, None, None, None))
        return ReportMember(i, path, width, height, size, kept, label, orientation)

    return [ReportGroup(g.kind, tuple(member(i, i == g.kept) for i in g.ids)) for g in groups]


def write_report(
    path: Path,
    groups: Sequence[ReportGroup],
    *,
    title: str,
    thumb_px: int = 160,
    overwrite: bool = False,
    max_groups: int = DEFAULT_MAX_GROUPS,
    max_members: int = DEFAULT_MAX_MEMBERS,
    left_out: tuple[int, int] = (0, 0),
) -> ReportSummary:
    """Write the HTML page of ``groups`` to ``path``; ReportError where that is not safe.

    Args:
        left_out: groups and images beyond ``groups`` (``PageGroups`` counted them), named in
            the page's summary.
    """
    if not MIN_THUMB_PX <= thumb_px <= MAX_THUMB_PX:
        raise InputError(f"thumbnail size must be {MIN_THUMB_PX} to {MAX_THUMB_PX} pixels, not {thumb_px}")
    if max_groups < 1 or max_members < 2:
        raise InputError(f"a report shows at least 1 group of 2 images, not {max_groups} of {max_members}")
    target = Path(path)
    check_target(target, overwrite=overwrite)
    shown = [_members_shown(g, max_members) for g in groups[:max_groups]]
    tempfiles.remove_leftovers(target.parent)  # of reports killed before they could clean up
    fd, tmp = _create_temp(target)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            failed = write_page(out, groups, shown, title=title, thumb_px=thumb_px, left_out=left_out)
        check_target(target, overwrite=overwrite)  # unchanged while we drew: still ours to replace
        os.replace(tmp, target)  # a reader never sees half a page
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, KeyboardInterrupt):
            raise Interrupted(f"report interrupted; {target} was not written") from None
        if isinstance(e, OSError):
            raise _write_error(e, target) from None
        raise
    images = sum(len(members) for _, members in shown)
    return ReportSummary(target, len(shown), images, failed, target.stat().st_size)


def check_target(path: Path, *, overwrite: bool) -> None:
    """Raise ReportError unless ``path`` is free, or (with ``overwrite``) a dlindex report."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise ReportError(f"cannot write {path}: folder {path.parent} does not exist") from None
        return
    except OSError as e:
        raise ReportError(f"cannot write {path}: {e.strerror or e}") from None
    if stat.S_ISLNK(info.st_mode):
        raise ReportError(f"{path} is a symbolic link; give the report's own path, not a link")
    if stat.S_ISDIR(info.st_mode):
        raise ReportError(f"{path} is a folder; give a file name such as {path / 'report.html'}")
    if not stat.S_ISREG(info.st_mode):
        raise ReportError(f"{path} is not a regular file (a FIFO, socket or device); not replaced")
    if not overwrite:
        raise ReportError(f"{path} exists; give --overwrite to replace an earlier report")
    if not _is_report(path):
        raise ReportError(f"{path} exists and is not a dlindex report; not overwritten, choose another name")


def _is_report(path: Path) -> bool:
    try:
        fd = os.open(path, _PROBE_FLAGS)
    except OSError:
        return False
    try:
        head = os.read(fd, MARKER_WINDOW)
    except OSError:
        return False
    finally:
        os.close(fd)
    return MARKER in head


def _create_temp(target: Path) -> tuple[int, str]:
    try:
        fd, tmp = tempfiles.create(target)
    except OSError as e:
        raise _write_error(e, target) from None
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the page from a web server or a colleague
    return fd, tmp


def _write_error(e: OSError, target: Path) -> DlindexError:
    if is_disk_full(e):
        return disk_full_error(e, paths=[target.parent])
    return ReportError(f"cannot write {target}: {e.strerror or e}")


def _members_shown(group: ReportGroup, limit: int) -> tuple[ReportGroup, tuple[ReportMember, ...]]:
    """The first ``limit`` members, with the kept one always among them."""
    members = group.members[:limit]
    kept = next((m for m in group.members if m.kept), None)
    if kept is not None and kept not in members:
        members = (*members[:-1], kept)
    return group, members
