"""Manifest shards: one row per sample (SAMPLE_KEYS) as jsonl, csv or parquet."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from dlindex.export import halves
from dlindex.export.files import HashingFile, hash_file
from dlindex.export.plan import BYTES, FILE, FORMAT, HASH, HEIGHT, ID, LABEL, WIDTH, ExportError, Group, sample_path
from dlindex.export.shards import (
    TEXT_KEYS,
    Context,
    Cutter,
    ShardInfo,
    json_maker,
    path_text,
    shard_name,
    shown_path,
    vector_list,
)

_BATCH = 4096


def batches(group: Group, ctx: Context) -> Iterator[tuple[Sequence[tuple[Any, ...]], dict[int, bytes]]]:
    """A group's rows in batches (counted in its tally), with their feature vectors when asked."""
    rows = iter(group.rows)
    while True:
        batch = list(islice(rows, _BATCH))
        if not batch:
            return
        if group.tally is not None:
            group.tally.add(group.split, group.rank, batch)
        vectors: dict[int, bytes] = {}
        if ctx.features is not None:
            vectors = ctx.features.fetch([row[ID] for row in batch])
            missing = [row[ID] for row in batch if row[ID] not in vectors]
            if missing:
                raise ExportError(_missing_message(group, ctx, missing, rows))
        yield batch, vectors


def _missing_message(group: Group, ctx: Context, missing: list[int], rest: Iterator[tuple[Any, ...]]) -> str:
    """The export stops here anyway: count every sample of the group that lacks a vector, not
    only those of the first batch that has one missing."""
    assert ctx.features is not None
    first = missing[0]
    lacking = set(missing)
    while batch := [row[ID] for row in islice(rest, _BATCH)]:
        found = ctx.features.fetch(batch)
        lacking.update(i for i in batch if i not in found)
    where = "" if len(ctx.plan.groups) == 1 else f" in split {group.split!r}, rank {group.rank}"
    return (
        f"{len(lacking)} sample(s){where} have no {ctx.features.name!r} features (id {first} first); "
        "compute them first (dlindex features)"
    )


def jsonl_lines(ctx: Context) -> Callable[[Sequence[tuple[Any, ...]], dict[int, bytes]], list[str]]:
    """A function from a batch of rows (and their vectors) to its jsonl lines."""
    make = json_maker(ctx)
    feature = ctx.features
    texts = {k: os.fsdecode(p) for k, p in ctx.prefixes.items() if _is_utf8(p)}
    quote = json.encoder.encode_basestring
    names = ctx.plan.labels
    parts = {i: f'"label":{quote(names[k])},"label_id":{k}' for i, k in ctx.plan.label_index.items()}

    def lines(batch: Sequence[tuple[Any, ...]], vectors: dict[int, bytes]) -> list[str]:
        if feature is not None:
            return [
                make(row)[:-1] + ',"feature":' + json.dumps(vector_list(vectors[row[ID]], feature.dtype)) + "}\n"
                for row in batch
            ]
        # The common row (UTF-8 name under a UTF-8 root, no NULLs) inline: this loop is the
        # whole cost of a million-row manifest next to SQLite's own.
        out: list[str] = []
        append = out.append
        for row in batch:
            ident, root, name, raw, label, width, height, fmt, size, digest = row
            prefix = texts.get(root)
            if (prefix is None or raw is not None or fmt is None or digest is None or width is None
                    or height is None or size is None):  # fmt: skip
                append(make(row) + "\n")
            else:
                append(
                    f'{{"id":{ident},"path":{quote(prefix + name)},{parts[label]},"width":{width},'
                    f'"height":{height},"format":"{fmt}","bytes":{size},"xxh3_128":"{digest}","path_b64":""}}\n'
                )
        return out

    return lines


def write_jsonl(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    """One JSON object per line, valid UTF-8; a path that is not UTF-8 keeps its bytes in path_b64."""
    lines = jsonl_lines(ctx)
    sink = _TextShards(ctx, group, number, ".jsonl")
    upper = None
    if ctx.upper is not None and ctx.shard_size is None and ctx.shard_bytes is None and ctx.features is None:
        upper = halves.start(ctx, group)  # the upper half, written by a second process meanwhile
    try:
        for batch, vectors in batches(group, ctx):
            sink.add(lines(batch, vectors))
            ctx.tick(len(batch))
        if upper is not None:
            count = upper.finish(group)
            sink.append_file(upper.part, count)
            ctx.tick(count)
    except BaseException:
        if upper is not None and upper.process.is_alive():
            upper.kill()
        raise
    return sink.finish()


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


class _TextShards:
    """Lines of text into shard files, cut by sample count or by bytes."""

    def __init__(self, ctx: Context, group: Group, number: int, suffix: str, header: str = "") -> None:
        self.ctx, self.group, self.number, self.suffix, self.header = ctx, group, number, suffix, header
        self.cut = Cutter(ctx.shard_size, ctx.shard_bytes)
        self.shards: list[ShardInfo] = []
        self.out: HashingFile | None = None
        self.count = self.size = self.first = 0

    def _open(self) -> HashingFile:
        name = shard_name(self.group.split, self.number + len(self.shards), self.suffix)
        self.out = HashingFile(self.ctx.out / name)
        self.first += self.count
        self.count = self.size = 0
        if self.header:
            self.out.write(self.header.encode())
        return self.out

    def _close(self) -> None:
        assert self.out is not None
        self.shards.append(_close(self.out, self.group, self.count, self.first))
        self.out = None

    def add(self, lines: list[str]) -> None:
        if self.ctx.shard_bytes is None:
            start = 0
            while start < len(lines):
                out = self.out or self._open()
                room = len(lines) - start
                if self.ctx.shard_size is not None:
                    room = min(room, self.ctx.shard_size - self.count)
                out.write("".join(lines[start : start + room]).encode("utf-8", "surrogateescape"))
                self.count += room
                start += room
                if self.ctx.shard_size is not None and self.count >= self.ctx.shard_size:
                    self._close()
            return
        pending: list[str] = []
        for text in lines:
            size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogateescape"))
            if self.out is not None and self.cut.full(self.count, self.size, size):
                self.out.write("".join(pending).encode("utf-8", "surrogateescape"))
                pending = []
                self._close()
            if self.out is None:
                self._open()
            pending.append(text)
            self.count += 1
            self.size += size
        if pending and self.out is not None:
            self.out.write("".join(pending).encode("utf-8", "surrogateescape"))

    def append_file(self, path: Path, count: int) -> None:
        """Append text another process wrote (``count`` samples) to the current shard."""
        out = self.out or self._open()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                out.write(chunk)
        self.count += count
        path.unlink()

    def finish(self) -> list[ShardInfo]:
        if self.out is not None:
            self._close()
        return self.shards


def write_csv(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    """A header line (TEXT_KEYS), then one row per sample, valid UTF-8; a path that is not
    UTF-8 keeps its bytes in path_b64."""
    index, names = ctx.plan.label_index, ctx.plan.labels
    header = list(TEXT_KEYS) + (["feature"] if ctx.features is not None else [])
    cut = Cutter(ctx.shard_size, ctx.shard_bytes)
    shards: list[ShardInfo] = []
    out: HashingFile | None = None
    count = size = first = 0
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")

    def flush() -> None:
        assert out is not None
        out.write(text.getvalue().encode("utf-8", "surrogateescape"))
        text.seek(0)
        text.truncate()

    for batch, vectors in batches(group, ctx):
        for row in batch:
            k = index[row[LABEL]]
            path, b64 = shown_path(sample_path(row, ctx.prefixes))
            values = [row[ID], path, names[k], k, row[WIDTH], row[HEIGHT], row[FORMAT], row[BYTES], row[HASH], b64]
            if ctx.features is not None:
                values.append(json.dumps(vector_list(vectors[row[ID]], ctx.features.dtype)))
            row_bytes = sum(len(str(v)) for v in values) + len(values)
            if out is not None and cut.full(count, size, row_bytes):
                flush()
                shards.append(_close(out, group, count, first))
                out = None
            if out is None:
                out = HashingFile(ctx.out / shard_name(group.split, number + len(shards), ".csv"))
                first += count
                count = size = 0
                writer.writerow(header)
            writer.writerow(["" if v is None else v for v in values])
            count += 1
            size += row_bytes
        if out is not None:
            flush()
        ctx.tick(len(batch))
    if out is not None:
        shards.append(_close(out, group, count, first))
    return shards


def write_parquet(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    """Columns SAMPLE_KEYS plus ``path_bytes`` (the exact name where it is not UTF-8, else null)."""
    pa, pq = _pyarrow()
    index, names = ctx.plan.label_index, ctx.plan.labels
    cut = Cutter(ctx.shard_size, ctx.shard_bytes)
    shards: list[ShardInfo] = []
    chunk: list[tuple[tuple[Any, ...], bytes | None]] = []
    size = first = 0

    def flush() -> None:
        nonlocal chunk, size, first
        paths = [path_text(row, ctx) for row, _ in chunk]
        exact = [os.fsencode(p) if not _is_text(p) else None for p in paths]
        shown = [p if e is None else e.decode("utf-8", "backslashreplace") for p, e in zip(paths, exact)]
        columns: dict[str, Any] = {
            "id": pa.array([r[ID] for r, _ in chunk], pa.int64()),
            "path": pa.array(shown, pa.string()),
            "label": pa.array([names[index[r[LABEL]]] for r, _ in chunk], pa.string()),
            "label_id": pa.array([index[r[LABEL]] for r, _ in chunk], pa.int32()),
            "width": pa.array([r[WIDTH] for r, _ in chunk], pa.int32()),
            "height": pa.array([r[HEIGHT] for r, _ in chunk], pa.int32()),
            "format": pa.array([r[FORMAT] for r, _ in chunk], pa.string()),
            "bytes": pa.array([r[BYTES] for r, _ in chunk], pa.int64()),
            "xxh3_128": pa.array([r[HASH] for r, _ in chunk], pa.string()),
            "path_bytes": pa.array(exact, pa.binary()),
        }
        if ctx.features is not None:
            values = [v for _, blob in chunk for v in vector_list(blob or b"", ctx.features.dtype)]
            flat = pa.array(values, pa.float64() if ctx.features.dtype == "<f8" else pa.float32())
            columns["feature"] = pa.FixedSizeListArray.from_arrays(flat, ctx.features.dim)
        name = shard_name(group.split, number + len(shards), ".parquet")
        path = ctx.out / name
        pq.write_table(pa.table(columns), path, compression="zstd")
        nbytes, digest = hash_file(path)
        shards.append(ShardInfo(name, group.split, group.rank, len(chunk), nbytes, digest, first))
        first += len(chunk)
        chunk, size = [], 0

    for batch, vectors in batches(group, ctx):
        for row in batch:
            row_bytes = 48 + len(row[FILE]) + len(row[HASH] or "")
            if cut.full(len(chunk), size, row_bytes):
                flush()
            chunk.append((row, vectors.get(row[ID])))
            size += row_bytes
        ctx.tick(len(batch))
    if chunk:
        flush()
    return shards


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ExportError("--format parquet needs pyarrow: pip install 'dlindex[export]'") from None
    return pa, pq


def _close(out: HashingFile, group: Group, count: int, first: int) -> ShardInfo:
    digest = out.close()
    return ShardInfo(out.path.name, group.split, group.rank, count, out.bytes, digest, first)


def _is_text(path: str) -> bool:
    try:
        path.encode()
    except UnicodeEncodeError:
        return False
    return True
