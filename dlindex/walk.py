"""Walking an image tree in the catalog's own sort order, losslessly, in bytes.

The walk yields files sorted exactly as SQLite's BINARY collation sorts their stored
``file_path`` (siblings ordered by the UTF-8 bytes of their display name, a folder as
``name/``), so a scan can merge-join it against ``ORDER BY file_path`` on the catalog's
unique index and hold one folder in memory instead of the whole catalog.

The tree is cut into *units* — runs of consecutive siblings, each owning a contiguous range
of catalog keys — so that several processes can walk and diff it at once.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from .classes import enter_folder, is_presplit

DEFAULT_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
_FILES_PER_UNIT = 2000


# One folder entry: (name, text, lossless, kind). A plain tuple, not a NamedTuple: one is
# made per file on every scan, and a NamedTuple's __new__ is a Python call.
#   name      the entry's name in bytes, as the file system has it
#   text      its display name (see display_name), what the catalog stores
#   lossless  text is name decoded as UTF-8
#   kind      dir | file | link_dir | link_file | link | other
Child = tuple[bytes, str, bool, str]
TEXT, KIND = 1, 3  # the fields read by position outside the hot loops


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
    presplit: bool = False  # ROOT's folders are split folders: see dlindex.classes


@dataclass(frozen=True)
class WalkOptions:
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    hidden: bool = False
    exclude: tuple[str, ...] = ()
    follow_symlinks: bool = False
    split_folders: bool = True  # detect pre-split trees (ROOT/train/<class>/...)

    @property
    def suffixes(self) -> frozenset[bytes]:
        """The extensions as lower-case name suffixes: b'.jpg', ..."""
        return frozenset(b"." + e.lower().lstrip(".").encode() for e in self.extensions)


@dataclass
class WalkReport:
    skipped: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    error_count: int = 0
    # Folders that could not be listed: their catalogued files are not declared missing.
    unlisted: list[str] = field(default_factory=list)

    def error(self, key: str, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < 1000:
            self.errors.append((key, message))

    def absorb(self, other: WalkReport) -> None:
        self.skipped += other.skipped
        self.error_count += other.error_count
        self.errors.extend(other.errors[: max(0, 1000 - len(self.errors))])
        self.unlisted.extend(other.unlisted)


def display_name(name: bytes) -> tuple[str, bool]:
    """(text, lossless): the UTF-8 name, or an escaped stand-in for a non-UTF-8 name."""
    try:
        return name.decode("utf-8"), True
    except UnicodeDecodeError:
        # Backslash escapes never contain '/', keep the sort rule intact and are readable.
        return name.decode("utf-8", "backslashreplace"), False


def _is_dir_kind(kind: str) -> bool:
    return kind == "dir" or kind == "link_dir"


def sort_text(child: Child) -> str:
    """The text a child sorts by among its siblings: folders as ``name/``."""
    return child[TEXT] + "/" if _is_dir_kind(child[KIND]) else child[TEXT]


def list_children(folder: bytes, prefix: str, options: WalkOptions, report: WalkReport) -> list[Child]:
    """A folder's subfolders and its entries with a selected extension, in catalog order;
    unreadable folders are reported."""
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError as e:
        report.error(prefix.rstrip("/") or ".", f"cannot list folder: {e.strerror or e}")
        report.unlisted.append(prefix)
        return []
    keyed = []
    suffixes = options.suffixes
    for entry in entries:
        name = entry.name
        if not options.hidden and name.startswith(b"."):
            continue
        try:
            text, ok = name.decode(), True
        except UnicodeDecodeError:
            text, ok = display_name(name)
        if options.exclude and _excluded(prefix + text, text, options.exclude):
            continue
        try:
            # d_type answers these without a system call; only links need a stat.
            if entry.is_file(follow_symlinks=False):
                kind = "file"
            elif entry.is_dir(follow_symlinks=False):
                keyed.append((text + "/", (name, text, ok, "dir")))
                continue
            elif entry.is_symlink():
                kind = "link"
                if options.follow_symlinks:
                    kind = "link_dir" if entry.is_dir() else "link_file"
                    if kind == "link_dir":
                        keyed.append((text + "/", (name, text, ok, kind)))
                        continue
            else:
                kind = "other"
        except OSError:
            kind = "other"
        dot = name.rfind(b".")
        if dot >= 0 and name[dot:].lower() in suffixes:  # anything else is not ours, not even skipped
            keyed.append((text, (name, text, ok, kind)))
    # str order is code-point order, which is UTF-8 byte order: SQLite's BINARY collation.
    keyed.sort()  # sort keys are unique within a folder, so children are never compared
    return [child for _, child in keyed]


def plan_units(root: bytes, options: WalkOptions, report: WalkReport, parallelism: int) -> list[Unit]:
    """Cut the tree into units for ``parallelism`` processes (one unit when following links,
    since a file reachable through two links must be recognised within one walk)."""
    children = list_children(root, "", options, report)
    presplit = options.split_folders and is_presplit(c[TEXT] for c in children if _is_dir_kind(c[KIND]))
    if options.follow_symlinks:
        units = [Unit(root, "", b"", True, None, tuple(children), "", None, None, presplit)]
        return units
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

    def close_run() -> None:
        if run:
            units.append(
                Unit(folder, prefix, raw_prefix, lossless, label, tuple(run), prefix + sort_text(run[0]), None, split, presplit)
            )
            run.clear()

    for child in children:
        if _is_dir_kind(child[KIND]):
            close_run()
            units.append(
                Unit(folder, prefix, raw_prefix, lossless, label, (child,), prefix + sort_text(child), None, split, presplit)
            )
        else:
            run.append(child)
            if len(run) >= _FILES_PER_UNIT:
                close_run()
    close_run()
    return units


class Folder(NamedTuple):
    """A folder being walked, with its files' run: see walk_runs."""

    children: Iterator[Child]
    path: bytes  # with a trailing slash
    fd: int  # the folder, open for stat calls relative to it (-1 if it could not be opened)
    prefix: str  # the folder's catalog key prefix, 'a/b/' ('' at ROOT)
    raw_prefix: bytes
    lossless: bool  # prefix is raw_prefix decoded as UTF-8
    label: str | None  # the label of files in it (None: no class, as directly under ROOT)
    split: str | None  # the split folder it is in (pre-split trees)


def _open_dir(path: bytes) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return -1


def walk_runs(unit: Unit, options: WalkOptions, report: WalkReport) -> Iterator[tuple[Folder, list[Child]]]:
    """Yield every selected regular file of a unit, in catalog order, as runs: a folder and
    the consecutive files of it that no subfolder separates (a leaf folder: all of them).

    Runs, not single files: a rescan costs a few microseconds per unchanged file, so the
    consumer's loop over a run's files, with no generator switch and no tuple per file in
    between, is a third of the work saved. Folders and (with --follow-symlinks) files are
    entered once by (device, inode), so symlink loops end and no file is yielded twice.
    Each folder is held open while its runs are consumed, so that callers can stat files
    relative to it: two processes resolving full paths through the same parent folders
    contend in the kernel, and a rescan is mostly stat calls.
    """
    follow = options.follow_symlinks
    visited_dirs: set[tuple[int, int]] = set()
    seen_files: set[tuple[int, int]] = set()
    if follow:
        st = os.stat(unit.folder)
        visited_dirs.add((st.st_dev, st.st_ino))
    path = unit.folder if unit.folder.endswith(b"/") else unit.folder + b"/"
    # An explicit stack of listings: no recursion limit on deep trees.
    stack = [
        Folder(iter(unit.children), path, _open_dir(path), unit.prefix, unit.raw_prefix, unit.lossless, unit.label,
               unit.split)
    ]  # fmt: skip
    presplit = unit.presplit
    try:
        while stack:
            top = stack[-1]
            run: list[Child] = []
            entered = None
            for child in top.children:
                kind = child[KIND]
                if kind == "file" and not follow:
                    run.append(child)
                elif kind == "dir" or kind == "link_dir":
                    entered = child
                    break
                elif kind == "link_file" or (kind == "file" and follow):
                    if _new_file(top, child, report, seen_files):
                        run.append(child)
                else:
                    report.skipped += 1  # a link we do not follow, a FIFO, socket or device: never opened
            if run:
                yield top, run
            if entered is None:  # the folder is done
                if top.fd >= 0:
                    os.close(top.fd)
                stack.pop()
                continue
            name, text, lossless, kind = entered
            folder = top.path + name
            key = top.prefix + text
            if follow:
                try:
                    st = os.stat(folder)
                except OSError as e:
                    report.error(key, f"cannot stat folder: {e.strerror or e}")
                    continue
                if (st.st_dev, st.st_ino) in visited_dirs:
                    report.skipped += 1  # a symlink loop, or a second link to a folder we index
                    continue
                visited_dirs.add((st.st_dev, st.st_ino))
            listing = list_children(folder, key + "/", options, report)
            label, split = enter_folder(top.label, top.split, presplit, text)
            stack.append(
                Folder(iter(listing), folder + b"/", _open_dir(folder), key + "/", top.raw_prefix + name + b"/",
                       top.lossless and lossless, label, split)
            )  # fmt: skip
    finally:
        for frame in stack:  # the consumer stopped early: close the folders still open
            if frame.fd >= 0:
                os.close(frame.fd)


def _new_file(top: Folder, child: Child, report: WalkReport, seen_files: set[tuple[int, int]]) -> bool:
    """With --follow-symlinks: a regular file, reached for the first time?"""
    name, text, _, kind = child
    key = top.prefix + text
    try:
        st = os.stat(top.path + name) if kind == "link_file" else os.lstat(top.path + name)
    except OSError as e:
        report.error(key, f"broken symlink: {e.strerror or e}" if kind == "link_file" else f"cannot stat: {e.strerror or e}")
        return False
    if not stat.S_ISREG(st.st_mode):
        report.skipped += 1
        return False
    ident = (st.st_dev, st.st_ino)
    if ident in seen_files:
        report.skipped += 1  # the same file reached through a second link
        return False
    seen_files.add(ident)
    return True


def _excluded(key: str, name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(name, p) for p in patterns)
