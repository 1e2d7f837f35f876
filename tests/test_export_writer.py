"""ShardWriter: where shards are cut, how they are numbered, and what each ShardInfo records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xxhash

from dlindex.export.plan import Group
from dlindex.export.shards import Context
from dlindex.export.writer import FileWriter, ShardWriter


class _Lines(FileWriter[bytes]):
    suffix = ".txt"

    def write(self, file: Any, pieces: list[bytes]) -> None:
        file.write(b"".join(pieces))


class _Whole(ShardWriter[bytes]):
    suffix = ".bin"

    def seal_shard(self, path: Path, pending: list[bytes]) -> tuple[int, str]:
        data = b"".join(pending)
        path.write_bytes(data)
        return len(data), xxhash.xxh3_128_hexdigest(data)


def _context(out: Path, shard_size: int | None = None, shard_bytes: int | None = None) -> Context:
    return Context(plan=None, out=out, shard_size=shard_size, shard_bytes=shard_bytes)  # type: ignore[arg-type]


def test_cut_by_count_in_batches(tmp_path: Path) -> None:
    writer = _Lines(_context(tmp_path, shard_size=3), Group("train", 0, ()), 5)
    for batch in ([b"a\n", b"b\n"], [b"c\n", b"d\n", b"e\n", b"f\n", b"g\n"]):
        writer.add_batch(batch, ())
        writer.flush()
    shards = writer.finish()
    assert [(s.file, s.samples, s.first) for s in shards] == [
        ("train-000005.txt", 3, 0), ("train-000006.txt", 3, 3), ("train-000007.txt", 1, 6),
    ]  # fmt: skip
    assert (tmp_path / "train-000006.txt").read_bytes() == b"d\ne\nf\n"
    for s in shards:
        data = (tmp_path / s.file).read_bytes()
        assert (s.bytes, s.xxh3_128) == (len(data), xxhash.xxh3_128_hexdigest(data))


def test_cut_by_bytes_gives_an_oversized_sample_its_own_shard(tmp_path: Path) -> None:
    writer = _Whole(_context(tmp_path, shard_bytes=4), Group("val", 1, ()), 0)
    pieces = [b"ab", b"cd", b"e", b"0123456789", b"f"]
    writer.add_batch(pieces, map(len, pieces))
    shards = writer.finish()
    assert [(tmp_path / s.file).read_bytes() for s in shards] == [b"abcd", b"e", b"0123456789", b"f"]
    assert [(s.split, s.rank, s.first) for s in shards] == [("val", 1, 0), ("val", 1, 2), ("val", 1, 3), ("val", 1, 4)]


def test_nothing_added_writes_nothing(tmp_path: Path) -> None:
    assert _Lines(_context(tmp_path), Group("train", 0, ()), 0).finish() == []
    assert list(tmp_path.iterdir()) == []
