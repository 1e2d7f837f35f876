"""Listing one folder in catalog order: which entries are images, folders or followed links.

Entries come sorted exactly as SQLite's BINARY collation sorts their stored ``file_path``
(siblings ordered by the UTF-8 bytes of their display name, a folder as ``name/``); every
entry that gets no row is counted by its skip reason.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter
from typing import Final

from dlindex.catalog.paths import display_name

DEFAULT_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")


# One folder entry: (name, text, lossless, kind). A plain tuple, not a NamedTuple: one is
# made per file on every scan, and a NamedTuple's __new__ is a Python call.
#   name      the entry's name in bytes, as the file system has it
#   text      its display name (see display_name), what the catalog stores
#   lossless  text is name decoded as UTF-8
#   kind      dir | file | link_dir | link_file (links only when followed; nothing else is listed)
Child = tuple[bytes, str, bool, str]
TEXT: Final = 1  # the fields read by position outside the hot loops
KIND: Final = 3


@dataclass(frozen=True)
class WalkOptions:
    """Which entries the walk selects, and whether it follows links and detects split folders."""

    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    hidden: bool = False
    exclude: tuple[str, ...] = ()
    follow_symlinks: bool = True
    split_folders: bool = True  # detect pre-split trees (ROOT/train/<class>/...)
    # The real path of ROOT: a link whose target lies inside it and is catalogued under its
    # own path is not followed (the file would be catalogued twice).
    root: bytes = b""

    @cached_property
    def suffixes(self) -> frozenset[bytes]:
        """The extensions as lower-case name suffixes: b'.jpg', ... (worked out once per options)"""
        return frozenset(b"." + e.lower().lstrip(".").encode() for e in self.extensions)


# Why an entry got no row: the keys of WalkReport.skips (docs/commands/scan.md lists them).
SKIP_REASONS = (
    "hidden", "excluded", "not_image", "symlink", "broken_link", "loop", "duplicate",
    "fifo", "socket", "device", "unreadable", "vanished",
)  # fmt: skip


@dataclass
class WalkReport:
    """What the walk passed over: skips by reason, errors (the first 1000), unlisted folders."""

    skips: dict[str, int] = field(default_factory=dict)
    errors: list[tuple[str, str]] = field(default_factory=list)
    error_count: int = 0
    # Folders that could not be listed: their catalogued files are not declared missing.
    unlisted: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """Entries skipped, all reasons together."""
        return sum(self.skips.values())

    def skip(self, reason: str, n: int = 1) -> None:
        """Count ``n`` entries skipped for ``reason`` (one of SKIP_REASONS)."""
        self.skips[reason] = self.skips.get(reason, 0) + n

    def error(self, key: str, message: str) -> None:
        """Count an error; keep its path and message among the first 1000."""
        self.error_count += 1
        if len(self.errors) < 1000:
            self.errors.append((key, message))

    def absorb(self, other: WalkReport) -> None:
        """Add another unit's report to this one."""
        for reason, n in other.skips.items():
            self.skip(reason, n)
        self.error_count += other.error_count
        self.errors.extend(other.errors[: max(0, 1000 - len(self.errors))])
        self.unlisted.extend(other.unlisted)


def is_dir_kind(kind: str) -> bool:
    """A folder, or a followed link to one."""
    return kind == "dir" or kind == "link_dir"


def sort_text(child: Child) -> str:
    """The text a child sorts by among its siblings: folders as ``name/``."""
    return child[TEXT] + "/" if is_dir_kind(child[KIND]) else child[TEXT]


def list_children(folder: bytes, prefix: str, options: WalkOptions, report: WalkReport) -> list[Child]:
    """A folder's subfolders and its entries with a selected extension, in catalog order.

    Every other entry is counted in ``report.skips`` by reason (a skipped folder once, not
    its contents); an unreadable folder is reported as an error.
    """
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError as e:
        report.error(prefix.rstrip("/") or ".", f"cannot list folder: {e.strerror or e}")
        report.skip("unreadable")
        report.unlisted.append(prefix)
        return []
    files: list[Child] = []  # files and followed links to files
    folders: list[tuple[str, Child]] = []  # (sort text, child): folders sort as ``name/``
    suffixes, hidden, exclude = options.suffixes, options.hidden, options.exclude
    skip = report.skip
    for entry in entries:
        name = entry.name
        if not hidden and name.startswith(b"."):
            skip("hidden")
            continue
        try:
            text, ok = name.decode(), True
            if "\\" in text:  # it may spell another name's stand-in
                text, ok = display_name(name)
        except UnicodeDecodeError:
            text, ok = display_name(name)
        if exclude and _excluded(prefix + text, text, exclude):
            skip("excluded")
            continue
        try:
            # d_type answers these without a system call; only links and odd entries need a stat.
            if entry.is_file(follow_symlinks=False):
                kind = "file"
            elif entry.is_dir(follow_symlinks=False):
                folders.append((text + "/", (name, text, ok, "dir")))
                continue
            elif entry.is_symlink():
                link = _link_kind(folder, name, prefix + text, options)
                if link is None or link in SKIP_REASONS:
                    skip(link or "symlink")
                    continue
                kind = link
                if kind == "link_dir":
                    folders.append((text + "/", (name, text, ok, kind)))
                    continue
            else:
                skip(special_reason(entry.stat(follow_symlinks=False).st_mode))
                continue
        except OSError as e:
            skip("vanished" if e.errno == errno.ENOENT else "unreadable")
            continue
        dot = name.rfind(b".")
        if dot >= 0 and name[dot:].lower() in suffixes:
            files.append((name, text, ok, kind))
        else:
            skip("not_image")
    # str order is code-point order, which is UTF-8 byte order: SQLite's BINARY collation.
    # Sort keys are unique within a folder, so children are never compared.
    if not folders:  # a leaf folder (most of them): files sort by their text
        files.sort(key=_BY_TEXT)
        return files
    keyed = [(child[TEXT], child) for child in files] + folders
    keyed.sort()
    return [child for _, child in keyed]


_BY_TEXT = itemgetter(TEXT)


def special_reason(mode: int) -> str:
    """The skip reason of a file system entry that is neither a regular file nor a folder."""
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"  # character or block device (or a type this platform adds)


def _link_kind(folder: bytes, name: bytes, key: str, options: WalkOptions) -> str | None:
    """What to do with a symbolic link: follow it as ``link_dir``/``link_file``, or the
    reason it is skipped (None: not following links).

    A link whose target lies inside ROOT and is catalogued under its own path there is a
    ``duplicate`` (or a ``loop`` when the target holds the link), so each file keeps one
    key: its real path. A target outside ROOT (or one the walk does not select) is entered
    through the link and catalogued under the link's path, as ImageFolder names it.
    """
    if not options.follow_symlinks:
        return None
    path = os.path.join(folder, name)
    try:
        st = os.stat(path)
    except OSError as e:
        return "broken_link" if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR) else "unreadable"
    is_dir = stat.S_ISDIR(st.st_mode)
    if not is_dir and not stat.S_ISREG(st.st_mode):
        return special_reason(st.st_mode)
    target = os.path.realpath(path)
    if is_dir:
        here = os.path.realpath(folder)
        if target == here or here.startswith(target + b"/"):
            return "loop"  # the link leads back to a folder that holds it
    root = options.root
    if is_dir and target == root:
        return "loop"  # ROOT holds every link
    if root and target.startswith(root + b"/") and _walk_selects(target[len(root) + 1 :], is_dir, options):
        return "duplicate"
    return "link_dir" if is_dir else "link_file"


def _walk_selects(relative: bytes, is_dir: bool, options: WalkOptions) -> bool:
    """Would the walk itself reach this real path (no links in it) relative to ROOT?"""
    prefix = ""
    parts = relative.split(b"/")
    for part in parts:
        if not options.hidden and part.startswith(b"."):
            return False
        text = display_name(part)[0]
        if options.exclude and _excluded(prefix + text, text, options.exclude):
            return False
        prefix += text + "/"
    if is_dir:
        return True
    dot = parts[-1].rfind(b".")
    return dot >= 0 and parts[-1][dot:].lower() in options.suffixes


def _excluded(key: str, name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(name, p) for p in patterns)
