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

DEFAULT_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
_FILES_PER_UNIT = 2000


# What walk_unit yields per file, a plain tuple (a NamedTuple's __new__ is a Python call per
# file, about a tenth of an unchanged rescan's cost per file):
#   key     display path relative to the root, '/'-separated: the catalog's file_path
#   raw     the relative path's bytes when the name is not valid UTF-8, else None
#   path    absolute path to open
#   label   the file's label
#   name    the file's name in its folder ...
#   dir_fd  ... and that folder, open while the walk is at this file (-1: not open)
WalkedFile = tuple[str, bytes | None, bytes, str, bytes, int]


class Child(NamedTuple):
    """One folder entry, picklable: kind is dir | file | link_dir | link_file | link | other."""

    name: bytes
    text: str
    lossless: bool
    kind: str


class Unit(NamedTuple):
    """Consecutive children of one folder, walked by one task, owning the catalog keys
    ``start <= file_path < end`` (``end`` None: to the end)."""

    folder: bytes
    prefix: str  # '' at ROOT, else 'a/b/'
    raw_prefix: bytes
    lossless: bool
    label: str | None  # None at ROOT: each first-level folder names its own label
    children: tuple[Child, ...]
    start: str
    end: str | None


@dataclass(frozen=True)
class WalkOptions:
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    hidden: bool = False
    exclude: tuple[str, ...] = ()
    follow_symlinks: bool = False


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
    return child.text + "/" if _is_dir_kind(child.kind) else child.text


def list_children(folder: bytes, prefix: str, options: WalkOptions, report: WalkReport) -> list[Child]:
    """A folder's selected entries in catalog order; unreadable folders are reported."""
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError as e:
        report.error(prefix.rstrip("/") or ".", f"cannot list folder: {e.strerror or e}")
        report.unlisted.append(prefix)
        return []
    keyed = []
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
                kind = "dir"
            elif entry.is_symlink():
                kind = "link"
                if options.follow_symlinks:
                    kind = "link_dir" if entry.is_dir() else "link_file"
            else:
                kind = "other"
        except OSError:
            kind = "other"
        keyed.append((text + "/" if kind == "dir" or kind == "link_dir" else text, Child(name, text, ok, kind)))
    # str order is code-point order, which is UTF-8 byte order: SQLite's BINARY collation.
    keyed.sort()  # sort keys are unique within a folder, so Child is never compared
    return [child for _, child in keyed]


def plan_units(root: bytes, options: WalkOptions, report: WalkReport, parallelism: int) -> list[Unit]:
    """Cut the tree into units for ``parallelism`` processes (one unit when following links,
    since a file reachable through two links must be recognised within one walk)."""
    children = list_children(root, "", options, report)
    if options.follow_symlinks:
        units = [Unit(root, "", b"", True, None, tuple(children), "", None)]
        return units
    units = _slices(root, "", b"", True, None, children)
    for _ in range(2):  # few large folders: cut one level deeper so every process has work
        if len(units) >= 4 * parallelism:
            break
        deeper: list[Unit] = []
        for unit in units:
            child = unit.children[0]
            if len(unit.children) == 1 and child.kind == "dir":
                prefix = unit.prefix + child.text + "/"
                folder = os.path.join(unit.folder, child.name)
                label = unit.label if unit.label is not None else child.text
                grandchildren = list_children(folder, prefix, options, report)
                deeper.extend(
                    _slices(folder, prefix, unit.raw_prefix + child.name + b"/",
                            unit.lossless and child.lossless, label, grandchildren)
                )  # fmt: skip
            else:
                deeper.append(unit)
        units = deeper
    return [
        unit._replace(start=unit.start if i else "", end=units[i + 1].start if i + 1 < len(units) else None)
        for i, unit in enumerate(units)
    ]


def _slices(
    folder: bytes, prefix: str, raw_prefix: bytes, lossless: bool, label: str | None, children: list[Child]
) -> list[Unit]:
    """Each folder its own unit; runs of files between folders grouped in bounded units."""
    units: list[Unit] = []
    run: list[Child] = []

    def close_run() -> None:
        if run:
            units.append(Unit(folder, prefix, raw_prefix, lossless, label, tuple(run), prefix + sort_text(run[0]), None))
            run.clear()

    for child in children:
        if _is_dir_kind(child.kind):
            close_run()
            units.append(Unit(folder, prefix, raw_prefix, lossless, label, (child,), prefix + sort_text(child), None))
        else:
            run.append(child)
            if len(run) >= _FILES_PER_UNIT:
                close_run()
    close_run()
    return units


class _Frame(NamedTuple):
    children: Iterator[Child]
    folder: bytes  # with a trailing slash
    fd: int  # the folder, open for stat calls relative to it (-1 if it could not be opened)
    prefix: str
    raw_prefix: bytes
    lossless: bool
    label: str | None


def _open_dir(path: bytes) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return -1


def walk_unit(unit: Unit, options: WalkOptions, report: WalkReport) -> Iterator[WalkedFile]:
    """Yield every selected regular file of a unit, in catalog order.

    Folders and (with --follow-symlinks) files are entered once by (device, inode), so
    symlink loops end and no file is yielded twice. Each folder is held open while its
    files are yielded, so that callers can stat them relative to it: two processes
    resolving full paths through the same parent folders contend in the kernel, and a
    rescan is mostly stat calls.
    """
    exts = {b"." + e.lower().lstrip(".").encode() for e in options.extensions}
    follow = options.follow_symlinks
    visited_dirs: set[tuple[int, int]] = set()
    seen_files: set[tuple[int, int]] = set()
    if follow:
        st = os.stat(unit.folder)
        visited_dirs.add((st.st_dev, st.st_ino))
    folder = unit.folder if unit.folder.endswith(b"/") else unit.folder + b"/"
    # An explicit stack of listings: no recursion limit on deep trees.
    stack = [
        _Frame(iter(unit.children), folder, _open_dir(folder), unit.prefix, unit.raw_prefix, unit.lossless, unit.label)
    ]
    try:
        while stack:
            top = stack[-1]
            child = next(top.children, None)
            if child is None:
                if top.fd >= 0:
                    os.close(top.fd)
                stack.pop()
                continue
            key = top.prefix + child.text
            path = top.folder + child.name
            kind = child.kind
            if kind == "dir" or kind == "link_dir":
                if follow:
                    try:
                        st = os.stat(path)
                    except OSError as e:
                        report.error(key, f"cannot stat folder: {e.strerror or e}")
                        continue
                    if (st.st_dev, st.st_ino) in visited_dirs:
                        report.skipped += 1  # a symlink loop, or a second link to a folder we index
                        continue
                    visited_dirs.add((st.st_dev, st.st_ino))
                listing = list_children(path, key + "/", options, report)
                label = top.label if top.label is not None else child.text
                raw = top.raw_prefix + child.name + b"/"
                lossless = top.lossless and child.lossless
                stack.append(_Frame(iter(listing), path + b"/", _open_dir(path), key + "/", raw, lossless, label))
                continue
            name = child.name
            dot = name.rfind(b".")
            if dot < 0 or name[dot:].lower() not in exts:
                continue
            if kind == "link_file":
                try:
                    st = os.stat(path)
                except OSError as e:
                    report.error(key, f"broken symlink: {e.strerror or e}")
                    continue
                if not stat.S_ISREG(st.st_mode):
                    report.skipped += 1
                    continue
            elif kind != "file":
                report.skipped += 1  # a link we do not follow, a FIFO, socket or device: never opened
                continue
            elif follow:
                try:
                    st = os.lstat(path)
                except OSError as e:
                    report.error(key, f"cannot stat: {e.strerror or e}")
                    continue
            if follow:
                ident = (st.st_dev, st.st_ino)
                if ident in seen_files:
                    report.skipped += 1  # the same file reached through a second link
                    continue
                seen_files.add(ident)
            lossless = top.lossless and child.lossless
            yield (
                key,
                None if lossless else top.raw_prefix + name,
                path,
                top.label if top.label is not None else "",
                name,
                top.fd,
            )
    finally:
        for frame in stack:  # the consumer stopped early: close the folders still open
            if frame.fd >= 0:
                os.close(frame.fd)


def _excluded(key: str, name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(name, p) for p in patterns)
