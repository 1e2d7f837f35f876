"""Files an export reads and writes: source images checked against the catalog, hashed shards.

The output folder, which appears only when complete, is ``outdir.OutputDir``.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from dlindex.export.plan import BYTES, HASH, ID, ExportError, absolute_path
from dlindex.exported.confine import NotRegularError, SizeError, kind, read_regular


class HashingFile:
    """A binary file being written, with its byte count and XXH3-128 kept as it grows."""

    def __init__(self, path: Path, buffering: int = 1 << 20) -> None:
        self.path = path
        self.file: BinaryIO = open(path, "wb", buffering=buffering)  # noqa: SIM115
        self.hasher = xxhash.xxh3_128()
        self.bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.file.write(data)
        self.hasher.update(data)
        self.bytes += len(data)

    def close(self) -> str:
        self.file.close()
        return self.hasher.hexdigest()


class RawShard:
    """A shard written with one ``writev`` per sample straight from the caller's buffers
    (no copy into a user-space buffer), hashed as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.hasher = xxhash.xxh3_128()
        self.bytes = 0

    def write(self, parts: list[bytes]) -> None:
        update = self.hasher.update
        total = 0
        for part in parts:
            update(part)
            total += len(part)
        done = os.writev(self.fd, parts)
        while done < total:  # a short write (rare): write the rest from where it stopped
            rest = memoryview(b"".join(parts))[done:]
            done += os.write(self.fd, rest)
        self.bytes += total

    def close(self) -> str:
        os.close(self.fd)
        return self.hasher.hexdigest()


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2  # <linux/falloc.h>


def drain_into(path: Path, write: Callable[[bytes], Any], chunk: int = 1 << 22) -> None:
    """Copy the file at ``path`` through ``write`` and remove it; where the file system can
    punch holes (Linux: ext4, xfs, btrfs, tmpfs), each chunk's blocks are freed once copied, so
    the copy needs no more free disk than one chunk instead of the file's whole size."""
    punch = _hole_puncher()
    with open(path, "r+b") as f:
        offset = 0
        while data := f.read(chunk):
            write(data)
            if punch is not None and not punch(f.fileno(), offset, len(data)):
                punch = None  # not on this file system: a plain copy
            offset += len(data)
    path.unlink()


def _hole_puncher() -> Callable[[int, int, int], bool] | None:
    """fallocate(PUNCH_HOLE | KEEP_SIZE) through libc, or None where there is none."""
    import ctypes
    import ctypes.util

    if not hasattr(os, "posix_fallocate"):  # not Linux or a BSD: no fallocate in libc
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE

    def punch(fd: int, offset: int, length: int) -> bool:
        return bool(fallocate(fd, mode, offset, length) == 0)

    return punch


def hash_file(path: str | os.PathLike[str] | bytes, chunk: int = 1 << 22) -> tuple[int, str]:
    """(size, XXH3-128 hex) of a file, read in large chunks."""
    hasher = xxhash.xxh3_128()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            hasher.update(view[:n])
            size += n
    return size, hasher.hexdigest()


def read_exact(path: bytes, size: int | None) -> bytes:
    """A source file's whole content, of exactly its catalogued size (when known); only a
    regular file is opened, without blocking (a FIFO swapped in never hangs the export)."""
    if size is None or size < 0:
        return read_regular(path, follow=True)
    return read_regular(path, size, exact=True, follow=True)


def packable(
    rows: Iterable[tuple[Any, ...]], roots: Mapping[int, bytes], skipped: Counter[str],
    warn: Callable[[str], None] | None = None,
) -> Iterator[tuple[Any, ...]]:  # fmt: skip
    """The rows whose source is a regular file of its catalogued size; others are counted
    in ``skipped`` by reason (``not_regular``, ``changed_size``), reported to ``warn``, never packed.
    A file that is gone stops the export, as a catalog out of date should."""
    for row in rows:
        path = absolute_path(row, roots)
        try:
            info = os.stat(path)
        except OSError as e:
            raise _unreadable(row, path, e) from None
        if not stat.S_ISREG(info.st_mode):
            skipped["not_regular"] += 1
            if warn is not None:
                warn(f"skipped {os.fsdecode(path)} (id {row[ID]}): it is {kind(info.st_mode)}, not a regular file")
        elif row[BYTES] is not None and info.st_size != row[BYTES]:
            skipped["changed_size"] += 1
            if warn is not None:
                warn(f"skipped {os.fsdecode(path)} (id {row[ID]}): {info.st_size} bytes, the catalog says {row[BYTES]}; "
                     "run dlindex scan on its root")  # fmt: skip
        else:
            yield row


def check_source(row: tuple[Any, ...], path: bytes, data: bytes) -> None:
    """Raise ExportError if the file is not what the catalog says it is."""
    expected = row[HASH]
    if (row[BYTES] is not None and len(data) != row[BYTES]) or (
        expected and xxhash.xxh3_128_hexdigest(data) != expected
    ):
        raise _changed(row, path)


def _changed(row: tuple[Any, ...], path: bytes) -> ExportError:
    return ExportError(
        f"{os.fsdecode(path)} (id {row[ID]}) changed since it was catalogued; run dlindex scan on its root, then export again"
    )


def _unreadable(row: tuple[Any, ...], path: bytes, e: OSError) -> ExportError:
    if isinstance(e, FileNotFoundError):
        return ExportError(
            f"{os.fsdecode(path)} (id {row[ID]}) is gone; run dlindex scan on its root, then export again"
        )
    return ExportError(f"cannot read {os.fsdecode(path)}: {e.strerror}")


def read_sources(
    items: Iterable[tuple[tuple[Any, ...], bytes]], threads: int = 0, window: int = 64
) -> Iterator[tuple[tuple[Any, ...], bytes, bytes]]:
    """(row, path, content) for each (row, path), in order, each checked against the catalog.

    With ``threads`` > 0 up to ``window`` files are read ahead by a thread pool: a cold page
    cache serves small random reads several times faster with many in flight.
    """
    if threads <= 0:
        for row, path in items:
            yield row, path, _read(row, path)
        return
    pending: list[tuple[tuple[Any, ...], bytes, Future[bytes]]] = []
    with ThreadPoolExecutor(threads, thread_name_prefix="dlindex-read") as pool:
        it = iter(items)
        for row, path in it:
            pending.append((row, path, pool.submit(_read, row, path)))
            if len(pending) >= window:
                r, p, fut = pending.pop(0)
                yield r, p, fut.result()
        for r, p, fut in pending:
            yield r, p, fut.result()


def _read(row: tuple[Any, ...], path: bytes) -> bytes:
    try:
        data = read_exact(path, row[BYTES])
    except (NotRegularError, SizeError):  # it was fine when packable() looked: changed meanwhile
        raise _changed(row, path) from None
    except ExportError:
        raise
    except OSError as e:
        raise _unreadable(row, path, e) from None
    check_source(row, path, data)
    return data
