"""Telling unchanged folders at ``find``'s speed: a rescan's fast path, where GNU find exists.

An unchanged rescan costs per file a listing, an ``lstat`` and a catalog row, each made into
Python objects (~5 µs of CPU against find's ~1.6 µs). Here GNU find, a compiled loop over the
same system calls, prints one line per file of the units that are whole folders (size, mtime
and ctime to the nanosecond, inode, path); SQLite prints each catalog row of the unit in the
same format; Python compares the two sets of lines in C. A unit whose sets are equal, whose
rows need no probe again and carry the unit's label and split, is unchanged file by file
under the merge-join's own test (dlindex.scan.diff): it is counted, not walked, and its
skipped entries are counted by reason from find's lines. Every other unit goes through the
ordinary walk, and so do all of them on any surprise (find missing or not GNU's, a message
on its stderr, a link to follow, a name the catalog spells otherwise than the file system,
a time before 1970, more than a folder's worth of lines): the fast path only ever says
"unchanged" where the walk would say it of every file, so results are the same either way.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import Any, NamedTuple

from dlindex.catalog.backend import SQL_ERRORS
from dlindex.catalog.classes import enter_folder
from dlindex.catalog.connection import Catalog
from dlindex.query.spec import LOADER_FAILURE
from dlindex.scan.diff import DiffOptions
from dlindex.scan.digests import UnitDigests, unit_digest
from dlindex.scan.listing import WalkOptions
from dlindex.scan.units import Unit

# One line per catalog row, as find prints its file (see _FILE below); '!' for a row the walk
# would not pass as unchanged whatever the file says (its `state` in diff._ROWS, another label
# or split, a name with a backslash, which may stand for other bytes, a time before 1970, no
# inode yet), and NULL columns make '!' too. Times print as find's %T@: seconds, '.', the
# nanoseconds in 9 digits and a 0.
_LINES = (
    "SELECT group_concat(CASE WHEN (CASE WHEN status = 'missing' THEN 1 WHEN "
    "(CASE WHEN pixel_limit IS NULL THEN width * height > :bomb ELSE pixel_limit != :limit END) "
    "OR (processing_status = 'failed' AND substr(error, 1, :loader_length) = :loader_failed) THEN 2 ELSE 0 END) = 0 "
    "AND label_id IS :label AND split IS :split AND instr(file_path, '\\') = 0 AND bytes >= 0 AND mtime_ns >= 0 "
    "AND inode >= 0 AND ctime_ns >= 0 THEN printf('%d %d.%09d0 %d %d.%09d0 ./%s', bytes, mtime_ns / 1000000000, "
    "mtime_ns % 1000000000, inode, ctime_ns / 1000000000, ctime_ns % 1000000000, file_path) ELSE '!' END, char(0)) "
    "FROM image_metadata WHERE root_id = :root AND file_path >= :start"
)
_LINES_BETWEEN = _LINES + " AND file_path < :end"
_ANY_ROW = "SELECT 1 FROM image_metadata WHERE root_id = :root LIMIT 1"
# Units a rescan answered from memory (dlindex.scan.digests): two finds pay where most are.
_REMEMBERED = "SELECT count(*) FROM scan_digests WHERE root_id = ? AND files >= 0"
_LABELS = "SELECT name, id FROM labels"

# What find prints: per regular file its line (unique: it holds the path), the extension is
# checked here (a -name test per file would cost find 50% more); per folder '/' and its depth
# (a unit's folder itself: '/0', which starts the unit's lines); per other entry '?' and its
# type (%y). Hidden entries are told by '/.' in a unit's lines (then the walk counts them).
_FILE = "%s %T@ %i %C@ %p\\0"
_MARK = b"\0/0\0"
_SKIPS = {b"?l": "symlink", b"?p": "fifo", b"?s": "socket", b"?b": "device", b"?c": "device", b"?D": "device"}
_EXTENSION = re.compile(rb"\.[a-z0-9]+")
_SEGMENT_LIMIT = 64 << 20  # a unit printing more than this is walked (bounded memory)
_READ = 1 << 20
_ARGV_LIMIT = 512 << 10  # bytes of start points in one find command


class Quick(NamedTuple):
    """What the fast path found: the units still to walk, and what it counted of the others."""

    units: list[Unit]
    files: int  # files of the units found unchanged (each one seen and unchanged)
    skips: dict[str, int]  # entries of those units skipped, by reason
    recalled: int = 0  # units of those answered by their digest (dlindex.scan.digests), rows unread


@functools.cache
def gnu_find() -> str | None:
    """The path of GNU find, or None (none on PATH, or another find: BSD's, busybox's)."""
    path = shutil.which("find")
    if path is None:
        return None
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, timeout=10, env={**os.environ, "LC_ALL": "C"}, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path if version.startswith(b"find (GNU findutils)") else None


class Started:
    """find running over the units that are whole folders (``start_finds``); closed once read."""

    def __init__(self, folders: list[Unit], finds: _Finds, errors: Any) -> None:
        self.folders, self.finds, self.errors = folders, finds, errors

    def close(self) -> None:
        """Stop the finds if they still run (a scan that failed before reading them)."""
        self.finds.close()
        self.errors.close()


def start_finds(
    catalog: Catalog, root: bytes, root_id: int, units: Sequence[Unit], options: DiffOptions
) -> Started | None:
    """Start find over the units that are whole folders, None where the fast path does not
    apply. It only reads the catalog, so a rescan starts find before its first write, which
    waits for the catalog's check: find's stat calls run meanwhile."""
    walk = options.walk
    if options.force or options.label_overrides or walk.exclude or catalog.backend.name != "sqlite":
        return None
    if not all(_EXTENSION.fullmatch(suffix) for suffix in walk.suffixes):
        return None  # an inner dot or non-ASCII: "ends with" would not be listing's last-dot rule
    find = gnu_find()
    if find is None:
        return None
    try:
        if catalog.conn.execute(_ANY_ROW, {"root": root_id}).fetchone() is None:
            return None  # a first scan: every file is new
        remembered = int(catalog.conn.execute(_REMEMBERED, (root_id,)).fetchone()[0])
    except SQL_ERRORS:
        return None  # the walk reads the catalog, and reports what it finds, after the check
    folders = [unit for unit in units if _label(unit) is not None]
    if not folders or sum(len(unit.raw_prefix) + len(unit.children[0][0]) + 3 for unit in folders) > _ARGV_LIMIT:
        return None
    starts = [b"./" + unit.raw_prefix + unit.children[0][0] for unit in folders]
    # Two finds halve find's time but leave the comparison of the second half to run alone:
    # worth it where most units are answered from memory, not on a first rescan.
    two_finds = _cpus() > 1 and 2 * remembered >= len(folders)
    errors = tempfile.TemporaryFile()  # noqa: SIM115  # closed by Started.close()
    finds = _Finds(find, root, starts, errors, two_finds)
    if not finds.started:
        finds.close()
        errors.close()
        return None
    return Started(folders, finds, errors)


def skip_unchanged(
    catalog: Catalog, root_id: int, units: Sequence[Unit], options: DiffOptions, started: Started
) -> Quick | None:
    """The units that are not whole unchanged folders, and counts for those that are, from the
    finds ``start_finds`` started over them; None where something surprised the fast path (then
    every unit is walked). The finds are closed either way."""
    try:
        return _count_clean(catalog, root_id, units, options, started)
    finally:
        started.close()


def _count_clean(
    catalog: Catalog, root_id: int, units: Sequence[Unit], options: DiffOptions, started: Started
) -> Quick | None:
    walk, folders, finds = options.walk, started.folders, started.finds
    label_ids = dict(catalog.conn.execute(_LABELS).fetchall())
    suffixes = tuple(walk.suffixes)
    params = {"root": root_id, "limit": options.max_pixels, "bomb": 2 * options.max_pixels,
              "loader_failed": LOADER_FAILURE, "loader_length": len(LOADER_FAILURE)}  # fmt: skip
    clean: set[int] = set()
    files = 0
    skips: dict[str, int] = {}
    recalled = 0
    digests = UnitDigests(os.fspath(catalog.path), root_id, [(unit.start, unit.end) for unit in folders])
    flags = {"hidden": walk.hidden, "follow_symlinks": walk.follow_symlinks, "suffixes": sorted(suffixes)}
    with digests:
        try:
            pieces = finds.segments()  # one piece a folder, or _Surprise once a part's count is off
            for index, (unit, segment) in enumerate(zip(folders, pieces, strict=False)):
                if segment is None:
                    continue
                label, split = _label(unit) or (None, None)
                bound = {**params, "start": unit.start, "end": unit.end, "label": label_ids.get(label), "split": split}
                digest = unit_digest(segment, {**bound, **flags}) if digests.usable else b""
                found = digests.recall(unit.start, unit.end, digest)
                if found is not None:
                    recalled += 1
                else:
                    sql = _LINES if unit.end is None else _LINES_BETWEEN
                    found = _compare(segment, catalog.conn.execute(sql, bound).fetchone()[0], walk, suffixes)
                    if found is not None:
                        digests.remember(unit.start, unit.end, digest, found)
                if found is not None:
                    clean.add(index)
                    files += found[0]
                    for reason, n in found[1].items():
                        skips[reason] = skips.get(reason, 0) + n
            next(pieces, None)  # past the last piece: the last part's count is checked
        except _Surprise:
            return None
        if not finds.succeeded():
            return None
        started.errors.seek(0)
        if started.errors.read(1):
            return None  # an unreadable folder, a file gone meanwhile...: the walk reports them
        digests.commit()
    kept = {id(unit) for index, unit in enumerate(folders) if index in clean}
    return Quick([unit for unit in units if id(unit) not in kept], files, skips, recalled)


class _Surprise(Exception):
    """find printed what the fast path does not expect: every unit is walked."""


class _Finds:
    """find over the units' folders, in one process or (``split``) two: the first half's lines
    come through a pipe and are compared as they come, while the second find writes the other
    half's to a temporary file, read once it is done (find's stat calls are most of a rescan's
    time once the units are answered from memory). Both write their messages to ``errors``."""

    _EXPRESSION = ("(", "-type", "d", "-printf", "/%d\\0", ")", "-o", "(", "-type", "f", "-printf", _FILE, ")",
                   "-o", "-printf", "?%y\\0")  # fmt: skip

    def __init__(self, find: str, root: bytes, starts: list[bytes], errors: Any, split: bool) -> None:
        cut = len(starts) // 2 if split and len(starts) > 1 else len(starts)
        self.parts = [part for part in (starts[:cut], starts[cut:]) if part]
        self.spill: Any = None
        self.processes: list[subprocess.Popen[bytes]] = []
        env = {**os.environ, "LC_ALL": "C"}
        try:
            if len(self.parts) > 1:
                self.spill = tempfile.TemporaryFile()  # noqa: SIM115  # closed by close()
            for at, part in enumerate(self.parts):
                out = subprocess.PIPE if at == 0 else self.spill
                self.processes.append(
                    subprocess.Popen([find, *part, *self._EXPRESSION], cwd=root, stdout=out, stderr=errors, env=env)
                )
                if at == 0 and self.processes[0].stdout is not None:
                    _widen_pipe(self.processes[0].stdout.fileno())  # find runs ahead until it is read
        except OSError:
            self.close()

    @property
    def started(self) -> bool:
        return len(self.processes) == len(self.parts)

    def segments(self) -> Iterator[bytes | None]:
        """Each folder's lines in the order of ``starts`` (quick._segments' pieces)."""
        for at, part in enumerate(self.parts):
            if at == 0:
                stdout = self.processes[0].stdout
                assert stdout is not None
                fd = stdout.fileno()
            else:
                if self.processes[at].wait() != 0:
                    raise _Surprise
                self.spill.seek(0)
                fd = self.spill.fileno()
            pieces = _segments(fd)
            if next(pieces, None) != b"":
                raise _Surprise
            count = 0
            for piece in pieces:
                count += 1
                if count > len(part):
                    raise _Surprise
                yield piece
            if count != len(part):
                raise _Surprise

    def succeeded(self) -> bool:
        """Whether every find exited 0 (the pipe read to its end)."""
        return all(process.wait() == 0 for process in self.processes)

    def __enter__(self) -> _Finds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            if process.stdout is not None:
                process.stdout.close()
            process.wait()
        if self.spill is not None:
            self.spill.close()


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _label(unit: Unit) -> tuple[str, str | None] | None:
    """(label, split) of every file of a unit that is one folder, or None (not one folder, or
    the files under it have different labels: a split folder, or ROOT's own files)."""
    if len(unit.children) != 1 or unit.children[0][3] != "dir":
        return None
    label, split = enter_folder(unit.label, unit.split, unit.presplit, unit.children[0][1])
    return None if label is None else (label, split)


def _compare(
    segment: bytes, rows: str | None, walk: WalkOptions, suffixes: tuple[bytes, ...]
) -> tuple[int, dict[str, int]] | None:
    """(files, skips by reason) of a unit whose find lines and catalog lines are the same set;
    None if they differ, or something in the unit needs the walk."""
    if not walk.hidden and b"/." in segment:
        return None  # a hidden entry: find entered it, the walk counts it once
    lines = segment.split(b"\0")
    lines.pop()  # after the last \0
    found = set(lines)
    depth = 1
    while b"/%d" % depth in found:  # the folders' lines: a folder at depth d has one at each above
        found.discard(b"/%d" % depth)
        depth += 1
    skips: dict[str, int] = {}
    if segment.startswith(b"?") or b"\0?" in segment:
        for line in [line for line in found if line[:1] == b"?"]:
            found.discard(line)
            reason = _SKIPS.get(line)
            if reason is None or (reason == "symlink" and walk.follow_symlinks):
                return None  # a link to follow, or a type find could not tell
            skips[reason] = lines.count(line)
    try:
        catalogued = rows.encode().split(b"\0") if rows is not None else []
    except UnicodeEncodeError:
        return None
    # Every regular file has its line; the walk selects those with an extension (ASCII case
    # ignored, as listing does). Usually all of them are images: one check of the whole set.
    images = found
    if not all(map(bytes.endswith, map(bytes.lower, found), repeat(suffixes))):
        images = {line for line in found if line.lower().endswith(suffixes)}
        skips["not_image"] = len(found) - len(images)
    if len(catalogued) != len(images) or not images.issuperset(catalogued):
        return None
    return len(images), skips


def _segments(fd: int) -> Iterator[bytes | None]:
    """find's output cut at each unit's '/0' line: what came before the first (nothing), then
    each unit's lines, each ending in \\0 (None for a unit printing more than the limit)."""
    pending = bytearray(b"\0")
    searched = 0
    skipping = False
    while True:
        at = pending.find(_MARK, searched)
        if at < 0:
            chunk = os.read(fd, _READ)
            if not chunk:
                yield None if skipping else bytes(pending[1:])
                return
            if skipping or len(pending) > _SEGMENT_LIMIT:
                skipping = True
                del pending[: len(pending) - 3]  # keep what a marker may start with
            searched = max(0, len(pending) - 3)
            pending += chunk
            continue
        yield None if skipping else bytes(pending[1 : at + 1])
        skipping = False
        del pending[: at + 3]  # keep the marker's last \0: it starts the next search
        searched = 0


def _widen_pipe(fd: int) -> None:
    """Let find run up to 1 MiB ahead of us (Linux; elsewhere the default pipe)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass
