"""Reading a ``wds`` shard's members and samples, trusting nothing its headers say.

Every header's checksum is checked; a member's size must be a plain non-negative number
that fits in what is left of the file (checked against the file's size before anything is
allocated), so a damaged, hand-edited or truncated tar is one ExportError naming the shard
and the byte where it went wrong.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from dlindex.exported import ExportError
from dlindex.exported.confine import open_regular

BLOCK = 512
# The members of a sample besides its image (the writer never gives an image one of these suffixes).
NOT_IMAGE = frozenset({"cls", "json", "npy", "txt"})
_EMPTY = bytes(BLOCK)
_OCTAL = frozenset(b"01234567")


def member_size(head: bytes, shown: str, at: int) -> int:
    """The size field of a tar header: octal digits, or GNU base-256 (never negative)."""
    field = head[124:136]
    if field[0] & 0x80:
        if field[0] == 0xFF:
            raise ExportError(f"{shown}: the member header at byte {at} has a negative size")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    digits = field.strip(b"\0 ")
    if not set(digits) <= _OCTAL:
        raise ExportError(f"{shown}: the member header at byte {at} has a size that is not a number ({field!r})")
    return int(digits or b"0", 8)


def _checksum_ok(head: bytes) -> bool:
    stored = head[148:156].strip(b"\0 ")
    if not stored or not set(stored) <= _OCTAL:
        return False
    return int(stored, 8) == sum(head[:148]) + 256 + sum(head[156:])


def iter_headers(
    path: str | os.PathLike[str] | bytes, max_bytes: int | None = None
) -> Iterator[tuple[bytes, bytes, int, Callable[[], bytes]]]:
    """(header block, name, size, read) of every member, whatever its type, in order;
    ``read()`` returns its bytes (call it before the next member, or the member is skipped)."""
    shown = os.fsdecode(os.fspath(path))
    fd, total = open_regular(os.fspath(path), max_bytes)
    with os.fdopen(fd, "rb", buffering=1 << 20) as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger read-ahead
        at = 0
        while True:
            head = f.read(BLOCK)
            if not head:
                raise ExportError(f"{shown} is truncated: it ends at byte {at} without the end-of-archive blocks")
            if len(head) < BLOCK:
                raise ExportError(f"{shown} is truncated: a header at byte {at} has only {len(head)} bytes")
            if head == _EMPTY:
                return
            if not _checksum_ok(head):
                raise ExportError(f"{shown}: the member header at byte {at} is damaged (bad checksum)")
            size = member_size(head, shown, at)
            padded = size + (-size % BLOCK)
            start = at + BLOCK
            if start + padded > total:
                raise ExportError(
                    f"{shown} is truncated: the member at byte {at} claims {size} bytes, {max(total - start, 0)} remain"
                )
            at = start + padded

            def read(size: int = size) -> bytes:
                data = f.read(size)
                if len(data) != size:
                    raise ExportError(f"{shown} is truncated: it shrank while being read")
                return data

            yield head, member_name(head), size, read
            f.seek(at)  # past the member (and its padding) whether or not it was read


def member_name(head: bytes) -> bytes:
    """A member's name: ustar's prefix and name fields joined."""
    name = head[:100].split(b"\0", 1)[0]
    if head[257:262] == b"ustar" and head[345] != 0:
        name = head[345:500].split(b"\0", 1)[0] + b"/" + name
    return name


def is_regular(head: bytes) -> bool:
    """Whether a header is a regular file's (type '0' or NUL), not a folder, link, device or pax header."""
    return head[156] in (0, 48)


def iter_members(
    path: str | os.PathLike[str] | bytes, max_bytes: int | None = None
) -> Iterator[tuple[bytes, Callable[[], bytes]]]:
    """(name, read) of each regular member, in order; ``read()`` returns its bytes (call it
    before the next member, or the member is skipped). Other members (folders, pax headers)
    are skipped."""
    for head, name, _, read in iter_headers(path, max_bytes):
        if is_regular(head):
            yield name, read


def iter_tar(
    path: str | os.PathLike[str] | bytes,
    keep: Callable[[int], bool] | None = None,
    stop: int | None = None,
    *,
    max_bytes: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples of a WebDataset tar: ``{"__key__": key, ext: bytes, ...}``, grouped by key.

    ``keep(n)`` decides whether the n-th sample of the file is read; others are seeked over.
    Reading ends before sample ``stop``.
    The tar must be a regular file of at most ``max_bytes``; a damaged or truncated one
    raises ExportError naming it.
    """
    sample: dict[str, Any] = {}
    key: bytes | None = None
    n = -1
    wanted = True
    for name, read in iter_members(path, max_bytes):
        _, dot, ext = name.rpartition(b"/")[2].partition(b".")
        member_key = name[: len(name) - len(ext) - len(dot)]
        if member_key != key:
            if sample:
                yield sample
            key, sample, n = member_key, {}, n + 1
            if stop is not None and n >= stop:
                return
            wanted = keep is None or keep(n)
            if wanted:
                sample["__key__"] = member_key.decode("utf-8", "surrogateescape")
        if wanted:
            sample[ext.decode("utf-8", "surrogateescape")] = read()
    if sample:
        yield sample
