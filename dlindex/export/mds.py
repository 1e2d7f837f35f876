"""MosaicML Streaming (MDS) shards, written without the library.

Layout, as ``streaming.base.format.mds`` (version 2) reads it: each split is a folder
``{split}/`` with ``shard.{n:05d}.mds`` files and streaming's own ``index.json``, so
``StreamingDataset(local=OUT_DIR, split="train")`` reads it; the export's own index.json at
the root also carries streaming's ``version`` and ``shards`` keys (every split's shards, named
``train/shard.00000.mds``), so ``StreamingDataset(local=OUT_DIR)`` reads all splits. A shard is: the sample count
(uint32), n+1 sample offsets (uint32), the shard's config as JSON, then the samples; a sample
is the sizes (uint32) of its variable-size columns followed by every column's bytes, columns
in name order. Columns: ``id`` (int64), ``image`` (the original file bytes), ``ext``,
``key``, ``label`` (int64 class index), ``json`` (metadata), ``feature``
(``ndarray:<dtype>:<dim>``) with ``--features``, and ``text`` (str: the first text, empty
without one; every text is in ``json``'s ``texts``) with ``--texts``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xxhash

from dlindex.export.files import hash_file, read_sources
from dlindex.export.plan import ID, LABEL, Group, absolute_path
from dlindex.export.shards import Context, Features, ShardInfo, json_maker, sample_key
from dlindex.export.texts import json_fields
from dlindex.export.wds import extension
from dlindex.export.writer import ShardWriter, batches

VERSION = 2
_NUMPY_DTYPES = {"<f4": "float32", "<f8": "float64", "<f2": "float16"}


def columns(features: Features | None, texts: bool = False) -> dict[str, tuple[str, int | None]]:
    """Column name -> (MDS encoding, fixed size or None), in name order."""
    cols: dict[str, tuple[str, int | None]] = {
        "ext": ("str", None), "id": ("int", 8), "image": ("bytes", None), "json": ("json", None),
        "key": ("str", None), "label": ("int", 8),
    }  # fmt: skip
    if features is not None:
        f = features
        size = f.dim * int(f.dtype[-1])
        cols["feature"] = (f"ndarray:{_NUMPY_DTYPES[f.dtype]}:{f.dim}", size)
    if texts:
        cols["text"] = ("str", None)
    return dict(sorted(cols.items()))


def shard_config(cols: dict[str, tuple[str, int | None]], size_limit: int | None) -> dict[str, Any]:
    return {
        "column_encodings": [e for e, _ in cols.values()], "column_names": list(cols),
        "column_sizes": [s for _, s in cols.values()], "compression": None, "format": "mds",
        "hashes": [], "size_limit": size_limit, "version": VERSION,
    }  # fmt: skip


class MdsWriter(ShardWriter[bytes]):
    """Encoded samples held until their shard is full, then written as one MDS shard."""

    def __init__(self, ctx: Context, group: Group, number: int) -> None:
        super().__init__(ctx, group, number)
        cols = columns(ctx.features, ctx.texts is not None)
        self.config = json.dumps(shard_config(cols, ctx.shard_bytes), sort_keys=True).encode()
        if self.max_bytes is not None:
            self.max_bytes -= 8 + len(self.config)  # the shard's header counts against --shard-bytes
        (ctx.out / group.split).mkdir(exist_ok=True)

    def shard_file(self, k: int) -> str:
        return _shard_file(self.group.split, self.number + k)

    def seal_shard(self, path: Path, pending: list[bytes]) -> tuple[int, str]:
        data = encode_shard(pending, self.config)
        path.write_bytes(data)
        return len(data), xxhash.xxh3_128_hexdigest(data)


def write_mds(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    make = json_maker(ctx)
    index = ctx.plan.label_index
    cols = columns(ctx.features, ctx.texts is not None)
    sink = MdsWriter(ctx, group, number)
    j = 0
    for batch, vectors in batches(group, ctx):
        items = ((row, absolute_path(row, ctx.plan.roots)) for row in batch)
        for row, path, data in read_sources(items, ctx.read_threads):
            values = {
                "ext": extension(row, path).encode(), "id": struct.pack("<q", row[ID]), "image": data,
                "json": make(row).encode(), "key": sample_key(row, group, j).encode(),
                "label": struct.pack("<q", index[row[LABEL]]),
            }  # fmt: skip
            if ctx.features is not None:
                values["feature"] = vectors[row[ID]]
            if ctx.texts is not None:
                mine = ctx.texts.of(row[ID])
                values["json"] = values["json"][:-1] + json_fields(mine).encode() + b"}"
                values["text"] = mine[0].encode() if mine else b""
            sample = encode_sample(cols, values)
            sink.add(sample, len(sample) + 4)  # + its offset
            j += 1
        ctx.tick(len(batch))
    return sink.finish()


def _shard_file(split: str, number: int) -> str:
    return f"{split}/shard.{number:05d}.mds"


def shard_files(split: str, rank: int, base: int, count: int) -> list[str]:
    """A group's shard files as MdsWriter names them (merge's rule)."""
    return [_shard_file(split, base + k) for k in range(count)]


def finish_mds(
    out: Path, shards: Sequence[ShardInfo], splits: Sequence[str], *, features: Features | None,
    shard_bytes: int | None, texts: bool = False, **_: Any,
) -> tuple[list[ShardInfo], list[dict[str, Any]]]:  # fmt: skip
    """Once every group is written: streaming's index.json in each split folder."""
    files = []
    for name, data in split_index(splits, features, shard_bytes, shards, texts).items():
        (out / name).parent.mkdir(exist_ok=True)  # a split none of whose groups wrote a shard
        (out / name).write_bytes(data)
        size, digest = hash_file(out / name)
        files.append({"file": name, "bytes": size, "xxh3_128": digest})
    return list(shards), files


def extend_mds(
    staging: Path, staged: str, files: list[dict[str, Any]], delta: dict[str, Any] | None,
    shards: Sequence[ShardInfo], splits: Sequence[str], generation: int, *, features: Features | None,
    shard_bytes: int | None,
) -> tuple[list[dict[str, Any]], list[tuple[str, str]], list[tuple[str, str]]]:  # fmt: skip
    """An append's streaming indexes: each split folder's index.json for all its shards, written
    in ``staging`` to replace the export's (streaming reads a split's shards from it)."""
    kept = [f for f in files if not f["file"].endswith("/index.json")]
    written, replaced = [], []
    for name, data in split_index(splits, features, shard_bytes, shards).items():
        path = staging / "mds" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append({"file": name, "bytes": len(data), "xxh3_128": xxhash.xxh3_128_hexdigest(data)})
        replaced.append((f"{staged}/mds/{name}", name))
    return [*kept, *written], [], replaced


def streaming_keys(
    shards: Sequence[ShardInfo],
    splits: Sequence[str],
    seen: Any,
    features: Features | None,
    shard_bytes: int | None,
    texts: bool = False,
) -> tuple[int, list[dict[str, Any]]]:
    """The root index.json's ``version`` and ``shards``: all streaming reads of it (StreamingDataset(local=OUT_DIR))."""
    return VERSION, streaming_shards(features, shard_bytes, shards, texts=texts)


def encode_sample(cols: dict[str, tuple[str, int | None]], values: dict[str, bytes]) -> bytes:
    sizes = [len(values[name]) for name, (_, fixed) in cols.items() if fixed is None]
    return struct.pack(f"<{len(sizes)}I", *sizes) + b"".join(values[name] for name in cols)


def encode_shard(samples: Sequence[bytes], config_bytes: bytes) -> bytes:
    n = len(samples)
    start = 4 + 4 * (n + 1) + len(config_bytes)
    offsets = [start]
    for sample in samples:
        offsets.append(offsets[-1] + len(sample))
    return struct.pack(f"<I{n + 1}I", n, *offsets) + config_bytes + b"".join(samples)


def split_index(
    splits: Sequence[str],
    features: Features | None,
    shard_bytes: int | None,
    shards: Sequence[ShardInfo],
    texts: bool = False,
) -> dict[str, bytes]:
    """streaming's index.json for each split folder, as bytes by file name."""
    out: dict[str, bytes] = {}
    for split in splits:
        mine = [s for s in shards if s.split == split]
        entries = streaming_shards(features, shard_bytes, mine, in_split=True, texts=texts)
        out[f"{split}/index.json"] = json.dumps({"shards": entries, "version": VERSION}, sort_keys=True).encode()
    return out


def streaming_shards(
    features: Features | None,
    shard_bytes: int | None,
    shards: Sequence[ShardInfo],
    in_split: bool = False,
    texts: bool = False,
) -> list[dict[str, Any]]:
    """streaming's shard entries: basenames relative to the split folder (``in_split``), else
    to the export root (``train/shard.00000.mds``, as streaming's ``merge_index`` writes them)."""
    cols = columns(features, texts)
    entries = []
    for shard in shards:
        entry = shard_config(cols, shard_bytes)
        basename = shard.file.split("/", 1)[1] if in_split else shard.file
        entry.update(
            raw_data={"basename": basename, "bytes": shard.bytes, "hashes": {}}, samples=shard.samples, zip_data=None
        )
        entries.append(entry)
    return entries
