"""The shard loop every format writer shares: cut, number, hash and record each shard it writes.

A format writer is a ``ShardWriter`` subclass that says only what is its own: how a shard
file is named (``suffix``, or ``shard_file``) and how its encoded samples become that file.
``StreamWriter`` formats (jsonl, csv, dali, wds) append each batch to a file hashed as it
grows; the others (parquet, mds) build a whole shard from its samples in ``seal_shard``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing
from itertools import islice
from pathlib import Path
from typing import Any, Generic, TypeVar

from dlindex.export.arrow_rows import arrow_source, tally_batch
from dlindex.export.files import HashingFile
from dlindex.export.plan import ID, ExportError, Group
from dlindex.export.shards import Context, ShardInfo, shard_name

P = TypeVar("P")  # one encoded sample, as the format holds it until it is written
F = TypeVar("F")  # an open shard file

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
        if ctx.texts is not None:
            ctx.texts.load([row[ID] for row in batch])
        yield batch, vectors


def fill(sink: ShardWriter[Any], group: Group, ctx: Context) -> list[ShardInfo]:
    """A group's shards through its writer's ``take``, batch by batch (csv, parquet, jsonl);
    as Arrow batches where the writer and the rows allow it (dlindex.export.arrow_rows)."""
    columnar = arrow_source(sink, group.rows)
    if columnar is not None:
        with closing(columnar):  # the driver's statement ends here, whatever stops the loop
            for rows in columnar:
                if group.tally is not None:
                    tally_batch(group.tally, group.split, group.rank, rows)
                sink.take_arrow(rows)  # type: ignore[attr-defined]  # arrow_source checked it has one
                ctx.tick(rows.num_rows)
        return sink.finish()
    for batch, vectors in batches(group, ctx):
        sink.take(batch, vectors)
        ctx.tick(len(batch))
    return sink.finish()


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


class ShardWriter(Generic[P]):
    """One group's shards: cut at ``--shard-size`` samples or before passing ``--shard-bytes``,
    numbered on from ``number``, each hashed and recorded as a ShardInfo once finished.

    ``pending`` holds the encoded samples of the open shard not yet written; ``count`` and
    ``size`` are the open shard's samples and bytes, ``first`` its first sample's position.
    """

    suffix = ""
    positional = True  # reads a row by position: a value after ROW (a tree split) is ignored

    def __init__(self, ctx: Context, group: Group, number: int) -> None:
        self.ctx, self.group, self.number = ctx, group, number
        self.max_samples, self.max_bytes = ctx.shard_size, ctx.shard_bytes
        self.shards: list[ShardInfo] = []
        self.pending: list[P] = []
        self.count = self.size = self.first = 0

    def shard_file(self, k: int) -> str:
        """The name of this group's k-th shard, relative to the export folder."""
        return shard_name(self.group.split, self.number + k, self.suffix)

    def take(self, batch: Sequence[tuple[Any, ...]], vectors: dict[int, bytes]) -> None:
        """One batch of the group's rows (and their vectors), encoded and added: the format's
        own step, so that one pass can feed the shards of several splits at once."""
        raise NotImplementedError

    def add(self, piece: P, size: int) -> None:
        """One encoded sample of ``size`` bytes; the open shard is finished first if it is full
        (never while empty: a sample larger than ``--shard-bytes`` gets a shard of its own)."""
        count = self.count
        if count and (
            (self.max_samples is not None and count >= self.max_samples)
            or (self.max_bytes is not None and self.size + size > self.max_bytes)
        ):
            self.close_shard()
        self.pending.append(piece)
        self.count += 1
        self.size += size

    def add_batch(self, pieces: Sequence[P], sizes: Iterable[int]) -> None:
        """Encoded samples in order; ``sizes`` (read lazily) matter only with ``--shard-bytes``:
        without it a batch is cut by count in slices, with no step per sample."""
        if self.max_bytes is not None:
            for piece, size in zip(pieces, sizes, strict=True):
                self.add(piece, size)
            return
        start = 0
        while start < len(pieces):
            room = len(pieces) - start
            if self.max_samples is not None:
                if self.count >= self.max_samples:
                    self.close_shard()
                room = min(room, self.max_samples - self.count)
            self.pending.extend(pieces[start : start + room])
            self.count += room
            start += room

    def slices(self, n: int) -> Iterator[tuple[int, int]]:
        """``n`` samples cut by count as ``add_batch`` cuts them (for writers that take a batch
        whole, ``take_arrow``): (start, count) of each run for the open shard, the shard before
        finished first where it is full; the run is counted once the caller has taken it."""
        start = 0
        while start < n:
            room = n - start
            if self.max_samples is not None:
                if self.count >= self.max_samples:
                    self.close_shard()
                room = min(room, self.max_samples - self.count)
            yield start, room
            self.count += room
            start += room

    def close_shard(self) -> None:
        """Finish the open shard: write it out, hash it, record it."""
        k = len(self.shards)
        name = self.shard_file(k)
        nbytes, digest = self.seal_shard(self.ctx.out / name, self.pending)
        self.shards.append(ShardInfo(name, self.group.split, self.group.rank, self.count, nbytes, digest, self.first))
        self.pending = []
        self.first += self.count
        self.count = self.size = 0

    def finish(self) -> list[ShardInfo]:
        """The group's shards, the last one finished."""
        if self.count:
            self.close_shard()
        return self.shards

    def seal_shard(self, path: Path, pending: list[P]) -> tuple[int, str]:
        """Write the rest of the shard at ``path`` from ``pending``: (its bytes, its XXH3-128)."""
        raise NotImplementedError


class StreamWriter(ShardWriter[P], Generic[P, F]):
    """A writer whose shard file grows batch by batch (``flush``), hashed as it is written."""

    def __init__(self, ctx: Context, group: Group, number: int) -> None:
        super().__init__(ctx, group, number)
        self.file: F | None = None

    def flush(self) -> None:
        """Write what the open shard holds so far (after each batch: memory stays one batch)."""
        if self.pending:
            self.write(self.opened(), self.pending)
            self.pending = []

    def opened(self) -> F:
        """The open shard's file, created on its first write."""
        if self.file is None:
            self.file = self.create(self.ctx.out / self.shard_file(len(self.shards)))
        return self.file

    def finish(self) -> list[ShardInfo]:
        if self.file is not None and not self.count:
            self.close_shard()  # opened for lines another process was to write: none came
        return super().finish()

    def seal_shard(self, path: Path, pending: list[P]) -> tuple[int, str]:
        self.flush()
        file = self.opened()
        self.file = None
        return self.seal(file)

    def create(self, path: Path) -> F:
        """A new shard file at ``path``, with whatever the format puts first."""
        raise NotImplementedError

    def write(self, file: F, pieces: list[P]) -> None:
        raise NotImplementedError

    def seal(self, file: F) -> tuple[int, str]:
        """Close ``file``, with whatever the format puts last: (its bytes, its XXH3-128)."""
        raise NotImplementedError


class FileWriter(StreamWriter[P, HashingFile]):
    """A stream writer into buffered files; ``header`` (text) starts each shard."""

    header = ""

    def create(self, path: Path) -> HashingFile:
        file = HashingFile(path)
        if self.header:
            file.write(self.header.encode("utf-8", "surrogateescape"))
        return file

    def seal(self, file: HashingFile) -> tuple[int, str]:
        digest = file.close()
        return file.bytes, digest


class TextWriter(FileWriter[str]):
    """Lines of text into shard files (jsonl, csv): a name that is not UTF-8 keeps its bytes."""

    def write(self, file: HashingFile, pieces: list[str]) -> None:
        file.write("".join(pieces).encode("utf-8", "surrogateescape"))
