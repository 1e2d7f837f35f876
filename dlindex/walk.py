"""Walking an image tree in the catalog's own sort order, losslessly, in bytes.

The walk yields files sorted exactly as SQLite's BINARY collation sorts their stored
``file_path`` (siblings ordered by their UTF-8 display name, a folder as ``name/``), so a
rescan can merge-join it against ``ORDER BY file_path`` on the catalog's unique index and
hold only one directory in memory instead of the whole catalog.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

DEFAULT_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")


class WalkedFile(NamedTuple):
    key: str  # display path relative to the root, '/'-separated: the catalog's file_path
    raw: bytes | None  # the relative path's bytes when the name is not valid UTF-8
    path: bytes  # absolute path to open
    label: str
    stat: os.stat_result | None  # filled only when asked for (rescans) or when following links


@dataclass
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
    directories: int = 0
    # Folders that could not be listed: their catalogued files are not declared missing.
    unlisted: list[str] = field(default_factory=list)

    def error(self, key: str, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < 1000:
            self.errors.append((key, message))


def display_name(name: bytes) -> tuple[str, bool]:
    """(text, lossless): the UTF-8 name, or an escaped stand-in for a non-UTF-8 name."""
    try:
        return name.decode("utf-8"), True
    except UnicodeDecodeError:
        # Backslash escapes never contain '/', keep the sort rule intact and are readable.
        return name.decode("utf-8", "backslashreplace"), False


def walk_tree(
    root: bytes,
    options: WalkOptions,
    report: WalkReport,
    stat_files: bool = False,
) -> Iterator[WalkedFile]:
    """Yield every selected regular file under ``root`` in catalog order.

    Args:
        stat_files: stat each file (rescans compare size and mtime against the catalog);
            a first scan leaves that to the worker's fstat.
    """
    exts = {b"." + e.lower().lstrip(".").encode() for e in options.extensions}
    root_st = os.stat(root)
    visited_dirs = {(root_st.st_dev, root_st.st_ino)}
    seen_files: set[tuple[int, int]] = set()
    # An explicit stack of sorted directory listings: no recursion limit on deep trees.
    stack = [_Listing(iter(_list_dir(root, "", options, report)), "", b"", True, None)]
    while stack:
        top = stack[-1]
        child = next(top.children, None)
        if child is None:
            stack.pop()
            continue
        sort_key, text, name_ok, entry = child
        key = top.prefix + text
        if options.exclude and _excluded(key, text, options.exclude):
            continue
        raw_key = top.raw_prefix + entry.name
        lossless = top.lossless and name_ok
        label = top.label if top.label is not None else ("" if not sort_key.endswith(b"/") else text)
        if sort_key.endswith(b"/"):
            if entry.is_symlink() and not options.follow_symlinks:
                report.skipped += 1
                continue
            try:
                st = entry.stat(follow_symlinks=options.follow_symlinks)
            except OSError as e:
                report.error(key, f"cannot stat folder: {e.strerror or e}")
                continue
            ident = (st.st_dev, st.st_ino)
            if ident in visited_dirs:
                report.skipped += 1  # a symlink loop, or a second link to a folder we index
                continue
            visited_dirs.add(ident)
            listing = _list_dir(entry.path, key, options, report)
            stack.append(_Listing(iter(listing), key + "/", raw_key + b"/", lossless, label))
            continue
        dot = entry.name.rfind(b".")
        if dot < 0 or entry.name[dot:].lower() not in exts:
            continue
        file_stat = _file_stat(entry, key, options, report, stat_files)
        if file_stat is False:
            continue
        if options.follow_symlinks:
            assert isinstance(file_stat, os.stat_result)
            ident = (file_stat.st_dev, file_stat.st_ino)
            if ident in seen_files:
                report.skipped += 1  # the same file reached through a second link
                continue
            seen_files.add(ident)
        yield WalkedFile(key, None if lossless else raw_key, entry.path, label, file_stat or None)


class _Listing(NamedTuple):
    children: Iterator[tuple[bytes, str, bool, os.DirEntry[bytes]]]
    prefix: str
    raw_prefix: bytes
    lossless: bool
    label: str | None


def _list_dir(
    abs_dir: bytes, key: str, options: WalkOptions, report: WalkReport
) -> list[tuple[bytes, str, bool, os.DirEntry[bytes]]]:
    report.directories += 1
    try:
        with os.scandir(abs_dir) as it:
            entries = list(it)
    except OSError as e:
        report.error(key or ".", f"cannot list folder: {e.strerror or e}")
        report.unlisted.append(key + "/" if key else "")
        return []
    children = []
    for entry in entries:
        if not options.hidden and entry.name.startswith(b"."):
            continue
        text, ok = display_name(entry.name)
        try:
            is_dir = entry.is_dir(follow_symlinks=options.follow_symlinks)
        except OSError:
            is_dir = False
        children.append(((text + "/" if is_dir else text).encode(), text, ok, entry))
    children.sort(key=lambda child: child[0])
    return children


def _file_stat(
    entry: os.DirEntry[bytes], key: str, options: WalkOptions, report: WalkReport, stat_files: bool
) -> os.stat_result | None | bool:
    """The file's stat (or None when not needed); False when the entry is not indexed."""
    if entry.is_symlink():
        if not options.follow_symlinks:
            report.skipped += 1
            return False
        try:
            st = entry.stat(follow_symlinks=True)
        except OSError as e:
            report.error(key, f"broken symlink: {e.strerror or e}")
            return False
    elif not entry.is_file(follow_symlinks=False):
        report.skipped += 1  # FIFO, socket, device: never opened
        return False
    elif options.follow_symlinks or stat_files:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as e:
            report.error(key, f"cannot stat: {e.strerror or e}")
            return False
    else:
        return None
    if not stat.S_ISREG(st.st_mode):
        report.skipped += 1
        return False
    return st


def _excluded(key: str, name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(name, p) for p in patterns)
