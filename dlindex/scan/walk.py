"""Walking an image tree in the catalog's own sort order, losslessly, in bytes.

The walk yields files sorted exactly as SQLite's BINARY collation sorts their stored
``file_path`` (siblings ordered by the UTF-8 bytes of their display name, a folder as
``name/``), so a scan can merge-join it against ``ORDER BY file_path`` on the catalog's
unique index and hold one folder in memory instead of the whole catalog.

The tree is cut into *units* — runs of consecutive siblings, each owning a contiguous range
of catalog keys — so that several processes can walk and diff it at once.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from dlindex.catalog.classes import enter_folder, is_presplit
from dlindex.catalog.paths import display_name  # re-exported: mark and features key names with it

DEFAULT_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
_FILES_PER_UNIT = 2000


# One folder entry: (name, text, lossless, kind). A plain tuple, not a NamedTuple: one is
# made per file on every scan, and a NamedTuple's __new__ is a Python call.
#   name      the entry's name in bytes, as the file system has it
#   text      its display name (see display_name), what the catalog stores
#   lossless  text is name decoded as UTF-8
#   kind      dir | file | link_dir | link_file (links only when followed; nothing else is listed)
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
    presplit: bool = False  # ROOT's folders are split folders: see dlindex.catalog.classes


@dataclass(frozen=True)
class WalkOptions:
    extensions: tuple[str, ...] = DEFAULT_EXTENSIONS
    hidden: bool = False
    exclude: tuple[str, ...] = ()
    follow_symlinks: bool = True
    split_folders: bool = True  # detect pre-split trees (ROOT/train/<class>/...)
    # The real path of ROOT: a link whose target lies inside it and is catalogued under its
    # own path is not followed (the file would be catalogued twice).
    root: bytes = b""

    @property
    def suffixes(self) -> frozenset[bytes]:
        """The extensions as lower-case name suffixes: b'.jpg', ..."""
        return frozenset(b"." + e.lower().lstrip(".").encode() for e in self.extensions)


# Why an entry got no row: the keys of WalkReport.skips (docs/commands/scan.md lists them).
SKIP_REASONS = (
    "hidden", "excluded", "not_image", "symlink", "broken_link", "loop", "duplicate",
    "fifo", "socket", "device", "unreadable", "vanished",
)  # fmt: skip


@dataclass
class WalkReport:
    skips: dict[str, int] = field(default_factory=dict)
    errors: list[tuple[str, str]] = field(default_factory=list)
    error_count: int = 0
    # Folders that could not be listed: their catalogued files are not declared missing.
    unlisted: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return sum(self.skips.values())

    def skip(self, reason: str, n: int = 1) -> None:
        self.skips[reason] = self.skips.get(reason, 0) + n

    def error(self, key: str, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < 1000:
            self.errors.append((key, message))

    def absorb(self, other: WalkReport) -> None:
        for reason, n in other.skips.items():
            self.skip(reason, n)
        self.error_count += other.error_count
        self.errors.extend(other.errors[: max(0, 1000 - len(self.errors))])
        self.unlisted.extend(other.unlisted)


def _is_dir_kind(kind: str) -> bool:
    return kind == "dir" or kind == "link_dir"


def sort_text(child: Child) -> str:
    """The text a child sorts by among its siblings: folders as ``name/``."""
    return child[TEXT] + "/" if _is_dir_kind(child[KIND]) else child[TEXT]


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
    keyed = []
    suffixes = options.suffixes
    skip = report.skip
    for entry in entries:
        name = entry.name
        if not options.hidden and name.startswith(b"."):
            skip("hidden")
            continue
        try:
            text, ok = name.decode(), True
            if "\\" in text:  # it may spell another name's stand-in
                text, ok = display_name(name)
        except UnicodeDecodeError:
            text, ok = display_name(name)
        if options.exclude and _excluded(prefix + text, text, options.exclude):
            skip("excluded")
            continue
        try:
            # d_type answers these without a system call; only links and odd entries need a stat.
            if entry.is_file(follow_symlinks=False):
                kind = "file"
            elif entry.is_dir(follow_symlinks=False):
                keyed.append((text + "/", (name, text, ok, "dir")))
                continue
            elif entry.is_symlink():
                link = _link_kind(folder, name, prefix + text, options)
                if link is None or link in SKIP_REASONS:
                    skip(link or "symlink")
                    continue
                kind = link
                if kind == "link_dir":
                    keyed.append((text + "/", (name, text, ok, kind)))
                    continue
            else:
                skip(special_reason(entry.stat(follow_symlinks=False).st_mode))
                continue
        except OSError as e:
            skip("vanished" if e.errno == errno.ENOENT else "unreadable")
            continue
        dot = name.rfind(b".")
        if dot >= 0 and name[dot:].lower() in suffixes:
            keyed.append((text, (name, text, ok, kind)))
        else:
            skip("not_image")
    # str order is code-point order, which is UTF-8 byte order: SQLite's BINARY collation.
    keyed.sort()  # sort keys are unique within a folder, so children are never compared
    return [child for _, child in keyed]


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


def plan_units(root: bytes, options: WalkOptions, report: WalkReport, parallelism: int) -> list[Unit]:
    """Cut the tree into units for ``parallelism`` processes.

    Links do not change the cut: files reached through links carry their (device, inode),
    and the scan keeps one path per file across units (see links.LinkedFiles).
    """
    children = list_children(root, "", options, report)
    presplit = options.split_folders and is_presplit(c[TEXT] for c in children if _is_dir_kind(c[KIND]))
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
                Unit(
                    folder,
                    prefix,
                    raw_prefix,
                    lossless,
                    label,
                    tuple(run),
                    prefix + sort_text(run[0]),
                    None,
                    split,
                    presplit,
                )
            )
            run.clear()

    for child in children:
        if _is_dir_kind(child[KIND]):
            close_run()
            units.append(
                Unit(
                    folder,
                    prefix,
                    raw_prefix,
                    lossless,
                    label,
                    (child,),
                    prefix + sort_text(child),
                    None,
                    split,
                    presplit,
                )
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
    real: bytes | None = None  # entered through a link: its real path (None: path is real)


def _open_dir(path: bytes) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return -1


# What walk_runs yields: a folder, consecutive files of it, and for files reached through a
# link their stat results (None for a run of plain files, which the consumer lstats itself).
Run = tuple[Folder, list[Child], "list[os.stat_result] | None"]


def walk_runs(unit: Unit, options: WalkOptions, report: WalkReport) -> Iterator[Run]:
    """Yield every selected regular file of a unit, in catalog order, as runs: a folder and
    the consecutive files of it that no subfolder separates (a leaf folder: all of them).

    Runs, not single files: a rescan costs a few microseconds per unchanged file, so the
    consumer's loop over a run's files, with no generator switch and no tuple per file in
    between, is a third of the work saved. Files reached through a link (a linked file, or
    anything in a linked folder) come in runs of their own with their stat results, each
    (device, inode) once per unit; a linked folder is entered once per unit, and never
    when it holds the link (``loop``). Each folder is held open while its runs are consumed,
    so that callers can stat files relative to it: two processes resolving full paths
    through the same parent folders contend in the kernel, and a rescan is mostly stat calls.
    """
    entered_links: set[bytes] = set()
    seen_files: set[tuple[int, int]] = set()
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
            linked_folder = top.real is not None
            run: list[Child] = []
            stats: list[os.stat_result] = []
            entered = None
            for child in top.children:
                kind = child[KIND]
                if kind == "file" and not linked_folder:
                    if stats:  # keep catalog order: close the run of linked files first
                        yield top, run, stats
                        run, stats = [], []
                    run.append(child)
                elif kind == "dir" or kind == "link_dir":
                    entered = child
                    break
                else:  # a linked file, or a file in a linked folder
                    st = _linked_file(top, child, report, seen_files)
                    if st is not None:
                        if run and not stats:
                            yield top, run, None
                            run = []
                        run.append(child)
                        stats.append(st)
            if run:
                yield top, run, stats or None
            if entered is None:  # the folder is done
                if top.fd >= 0:
                    os.close(top.fd)
                stack.pop()
                continue
            name, text, lossless, kind = entered
            folder = top.path + name
            key = top.prefix + text
            real = top.real + b"/" + name if top.real is not None else None
            if kind == "link_dir":
                real = os.path.realpath(folder)
                if any(frame.real == real or (frame.real is None and frame.path[:-1] == real) for frame in stack):
                    report.skip("loop")  # through links, back to a folder being walked
                    continue
                if real in entered_links:
                    report.skip("duplicate")  # a second link to a folder walked already
                    continue
                entered_links.add(real)
            listing = list_children(folder, key + "/", options, report)
            label, split = enter_folder(top.label, top.split, presplit, text)
            stack.append(
                Folder(iter(listing), folder + b"/", _open_dir(folder), key + "/", top.raw_prefix + name + b"/",
                       top.lossless and lossless, label, split, real)
            )  # fmt: skip
    finally:
        for frame in stack:  # the consumer stopped early: close the folders still open
            if frame.fd >= 0:
                os.close(frame.fd)


def _linked_file(
    top: Folder, child: Child, report: WalkReport, seen_files: set[tuple[int, int]]
) -> os.stat_result | None:
    """A file reached through a link: its stat, if it is a regular file not reached before."""
    try:
        # Relative to the open folder, like the diff's lstat: no walk of the full path.
        st = os.stat(child[0], dir_fd=top.fd) if top.fd >= 0 else os.stat(top.path + child[0])
    except OSError as e:
        report.skip("vanished" if e.errno == errno.ENOENT else "unreadable")
        if e.errno != errno.ENOENT:
            report.error(top.prefix + child[TEXT], f"cannot stat: {e.strerror or e}")
        return None
    if not stat.S_ISREG(st.st_mode):
        report.skip(special_reason(st.st_mode))
        return None
    ident = (st.st_dev, st.st_ino)
    if ident in seen_files:
        report.skip("duplicate")  # the same file reached through a second link
        return None
    seen_files.add(ident)
    return st


def _excluded(key: str, name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(name, p) for p in patterns)
