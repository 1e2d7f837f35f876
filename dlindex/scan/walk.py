"""Walking a unit of an image tree in catalog order, losslessly, in bytes, as runs of files.

The walk yields files sorted exactly as SQLite's BINARY collation sorts their stored
``file_path`` (see dlindex.scan.listing), so a scan can merge-join it against
``ORDER BY file_path`` on the catalog's unique index and hold one folder in memory instead
of the whole catalog.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple

from dlindex.catalog.classes import enter_folder
from dlindex.scan.listing import KIND, TEXT, Child, WalkOptions, WalkReport, list_children, special_reason
from dlindex.scan.units import Unit


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
