"""Everything an export points at stays inside it, and is read only as a regular file.

One module for every reader of an export (``--verify``, ``dlindex.loader``, ``index.json``
and manifests) and for the packing of source images:

- ``resolve_inside(base, rel)``: a path from an export, resolved against its base folder
  (the export itself, its ``file_root``, or a loader's ``root=``); ``..``, NUL bytes,
  absolute paths (unless allowed and under the base) and symlinks that lead out of the base
  are refused.
- ``open_regular(path, max_bytes)``: opens without following a final symlink and without
  blocking (a FIFO put in place of a file never hangs a reader), refuses anything that is
  not a regular file, and anything larger than the size the export recorded.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from collections.abc import Iterator

import xxhash

from dlindex.exported import ExportError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_OPEN_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
MAX_INDEX_BYTES = 256 << 20  # an index.json of a million shards is ~200 MB
MAX_LINE_BYTES = 1 << 20  # one manifest row; real ones are a few hundred bytes


class ConfineError(ExportError):
    """A path in an export leads out of it, or names something that is not a regular file."""


class NotRegularError(ConfineError):
    """A FIFO, device, socket, folder or symlink where a regular file belongs."""


class SizeError(ConfineError):
    """A file larger (or smaller) than the size its export or catalog records."""


def _shown(path: bytes | str) -> str:
    return os.fsdecode(path)


def check_relative(rel: bytes, what: str = "path") -> bytes:
    """``rel`` if it is a plain relative path: no NUL, no empty, ``.`` or ``..`` parts."""
    if not rel or b"\0" in rel:
        raise ConfineError(f"{what} {_shown(rel)!r} is empty or holds a NUL byte")
    if rel.startswith(b"/"):
        raise ConfineError(f"{what} {_shown(rel)!r} is absolute; an export holds relative paths")
    parts = rel.split(b"/")
    if any(p in (b"", b".", b"..") for p in parts):
        raise ConfineError(f"{what} {_shown(rel)!r} has an empty, '.' or '..' part")
    return rel


def _inside(path: bytes, base: bytes) -> bool:
    base = base.rstrip(b"/")
    return path == base or path.startswith(base + b"/") or base == b""


def join_inside(base: bytes | str, rel: bytes | str, *, allow_absolute: bool = False, what: str = "path") -> bytes:
    """``base/rel``, checked by its text alone (cheap: no system call); ConfineError for
    ``..``, ``.``, empty parts, NUL, or an absolute ``rel`` (unless allowed and under ``base``)."""
    raw_base = os.fsencode(base) or b"/"
    raw = os.fsencode(rel)
    if not raw.startswith(b"/"):
        return raw_base.rstrip(b"/") + b"/" + check_relative(raw, what)
    if not allow_absolute:
        raise ConfineError(f"{what} {_shown(raw)!r} is absolute; this export holds relative paths")
    check_relative(raw.lstrip(b"/") or b".", what)
    if not _inside(raw, raw_base):
        raise ConfineError(f"{what} {_shown(raw)!r} is not under {_shown(raw_base)}")
    return raw


@functools.lru_cache(maxsize=64)
def _real_base(base: bytes) -> bytes:
    return os.path.realpath(base)


def real_inside(path: bytes, base: bytes | str, what: str = "path", *, folder_links: bool = False) -> bytes:
    """The real path of ``path`` (symlinks resolved); ConfineError if it is not under ``base``'s.

    Args:
        folder_links: source images: a symlinked *folder* under ``base`` may lead out of it
            (``dlindex scan`` follows folder links, as ImageFolder does, and catalogues the
            files under the path through the link); the file itself must not be a symlink
            that leads out (one put in place of a catalogued file).
    """
    real = os.path.realpath(path)
    if not _inside(real, _real_base(os.fsencode(base) or b"/")):
        parent = os.path.dirname(path)
        if (
            folder_links
            and not os.path.islink(path)
            and _inside(path, os.fsencode(base) or b"/")
            and parent
            and os.path.join(os.path.realpath(parent), os.path.basename(path)) == real
        ):
            return real  # only folders on the way are links; the file is the scan's
        raise ConfineError(f"{what} {_shown(path)!r} leads out of {_shown(base)} (to {_shown(real)})")
    return real


def resolve_inside(base: bytes | str, rel: bytes | str, *, allow_absolute: bool = False, what: str = "path") -> bytes:
    """The real path of ``rel`` under ``base``; ConfineError if it would leave ``base``.

    An absolute ``rel`` is accepted only with ``allow_absolute`` and only when it lies
    under ``base``; symlinks inside ``base`` may point anywhere inside ``base``.
    """
    return real_inside(join_inside(base, rel, allow_absolute=allow_absolute, what=what), base, what)


def open_regular(
    path: bytes | str, max_bytes: int | None = None, *, exact: bool = False, follow: bool = False
) -> tuple[int, int]:
    """(fd, size) of a regular file opened read-only; never blocks, never follows a final
    symlink unless ``follow`` (source images: a scan follows symlinks too).

    Args:
        max_bytes: refuse a file larger than this (with ``exact``: of any other size).
    """
    try:
        fd = os.open(path, _OPEN_FLAGS & ~_NOFOLLOW if follow else _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:
        if not follow and (e.errno == errno.ELOOP or os.path.islink(path)):  # the last part is a symlink
            raise NotRegularError(f"{_shown(path)} is a symbolic link; an export opens only regular files") from None
        raise ConfineError(f"cannot read {_shown(path)}: {e.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularError(f"{_shown(path)} is {kind(info.st_mode)}, not a regular file")
        if max_bytes is not None and (info.st_size > max_bytes or (exact and info.st_size != max_bytes)):
            raise SizeError(
                f"{_shown(path)} has {info.st_size} bytes; expected {'' if exact else 'at most '}{max_bytes}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def kind(mode: int) -> str:
    """What a file is, in words, from its st_mode."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link")):  # fmt: skip
        if test(mode):
            return name
    return "not a regular file" if not stat.S_ISREG(mode) else "a regular file"


def read_regular(
    path: bytes | str, max_bytes: int | None = None, *, exact: bool = False, follow: bool = False
) -> bytes:
    """A regular file's content, at most ``max_bytes`` (a file that grows meanwhile is an error)."""
    fd, size = open_regular(path, max_bytes, exact=exact, follow=follow)
    try:
        limit = size if max_bytes is None else min(size, max_bytes)
        parts = []
        got = 0
        while True:
            want = min(limit - got + 1, 1 << 24)
            chunk = os.read(fd, want)
            parts.append(chunk)
            got += len(chunk)
            if got > limit:
                raise SizeError(f"{_shown(path)} grew while being read (more than {limit} bytes)")
            if len(chunk) < want:  # a short read of a regular file is its end: no extra read() per file
                break
    finally:
        os.close(fd)
    data = b"".join(parts)
    if exact and max_bytes is not None and len(data) != max_bytes:
        raise SizeError(f"{_shown(path)} has {len(data)} bytes; expected {max_bytes}")
    return data


def hash_regular(path: bytes | str, max_bytes: int | None = None, chunk: int = 1 << 22) -> tuple[int, str]:
    """(size, XXH3-128 hex) of a regular file of at most ``max_bytes``, read in large chunks."""
    fd, size = open_regular(path, max_bytes)
    hasher = xxhash.xxh3_128()
    got = 0
    limit = size if max_bytes is None else max_bytes
    try:
        while True:
            data = os.read(fd, chunk)
            if not data:
                break
            got += len(data)
            if got > limit:
                raise SizeError(f"{_shown(path)} grew while being read (more than {limit} bytes)")
            hasher.update(data)
    finally:
        os.close(fd)
    return got, hasher.hexdigest()


def bounded_lines(path: bytes | str, max_bytes: int | None) -> Iterator[tuple[int, bytes]]:
    """(line number, line with its newline) of a regular file of at most ``max_bytes``;
    a line longer than MAX_LINE_BYTES is an error, so a file without newlines is never held whole."""
    fd, size = open_regular(path, max_bytes)
    limit = size if max_bytes is None else max_bytes
    with os.fdopen(fd, "rb", buffering=1 << 20) as f:
        got = 0
        number = 0
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            number += 1
            got += len(line)
            if got > limit:
                raise SizeError(f"{_shown(path)} grew while being read (more than {limit} bytes)")
            if len(line) > MAX_LINE_BYTES:
                raise ConfineError(f"{_shown(path)}, line {number}: longer than {MAX_LINE_BYTES} bytes")
            yield number, line


def read_listed(out_dir: str | os.PathLike[str], name: str, size: int, digest: object, *, what: str) -> bytes:
    """A file an export's index lists, read whole: inside OUT_DIR, a regular file of exactly
    ``size`` bytes with XXH3-128 ``digest``; ExportError (naming the file) for anything else."""
    shown = os.path.join(os.fsdecode(out_dir), name)
    try:
        data = read_regular(resolve_inside(os.fsencode(out_dir), name, what=what), size, exact=True)
    except ConfineError as e:
        raise ExportError(f"{shown}: {e}") from None
    except OSError as e:
        raise ExportError(f"{shown}: {e.strerror}") from None
    if xxhash.xxh3_128_hexdigest(data) != digest:
        raise ExportError(f"{shown} does not match its hash in index.json; the export was altered")
    return data
