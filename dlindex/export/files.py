"""Files an export reads and writes: source images checked against the catalog, hashed
shard files, and the output folder that appears only when complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import xxhash

from .plan import BYTES, HASH, ID, ExportError


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
    """A source file's whole content (one read when its catalogued size is right)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        want = (size if size is not None and size >= 0 else 1 << 16) + 1
        data = os.read(fd, want)
        if len(data) < want:
            return data
        parts = [data]
        while True:
            more = os.read(fd, 1 << 20)
            if not more:
                return b"".join(parts)
            parts.append(more)
    finally:
        os.close(fd)


def check_source(row: tuple[Any, ...], path: bytes, data: bytes) -> None:
    """Raise ExportError if the file is not what the catalog says it is."""
    expected = row[HASH]
    if (row[BYTES] is not None and len(data) != row[BYTES]) or (
        expected and xxhash.xxh3_128_hexdigest(data) != expected
    ):
        raise ExportError(
            f"{os.fsdecode(path)} (id {row[ID]}) changed since it was catalogued; "
            "run dlindex scan on its root, then export again"
        )


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
    except FileNotFoundError:
        raise ExportError(
            f"{os.fsdecode(path)} (id {row[ID]}) is gone; run dlindex scan on its root, then export again"
        ) from None
    except OSError as e:
        raise ExportError(f"cannot read {os.fsdecode(path)}: {e.strerror}") from None
    check_source(row, path, data)
    return data


class OutputDir:
    """A temporary folder next to OUT_DIR that becomes OUT_DIR only when the export is complete."""

    def __init__(self, out_dir: Path, overwrite: bool) -> None:
        self.out_dir = out_dir
        self.overwrite = overwrite
        parent = out_dir.parent
        if out_dir.exists() and not out_dir.is_dir():
            raise ExportError(f"{out_dir} exists and is not a folder")
        if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
            raise ExportError(f"{out_dir} exists and is not empty; remove it, choose another, or pass --overwrite")
        if not parent.is_dir():
            raise ExportError(f"cannot write {out_dir}: folder {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ExportError(f"cannot write {out_dir}: folder {parent} is not writable")
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=parent))

    def commit(self) -> None:
        os.chmod(self.tmp, 0o755)  # mkdtemp makes 0700; an export is meant to be shared
        old: Path | None = None
        if self.out_dir.exists():
            if any(self.out_dir.iterdir()):
                # Move the old export aside first: rename() cannot replace a non-empty folder.
                old = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", suffix=".old", dir=self.out_dir.parent))
                os.rename(self.out_dir, old / "export")
            else:
                os.rmdir(self.out_dir)
        os.rename(self.tmp, self.out_dir)  # readers see the old export or the complete new one
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
