"""WebDataset shards: ``{split}-{shard:06d}.tar`` with ``{key}.{ext}``, ``{key}.cls``, ``{key}.json``.

Shard k of a split belongs to rank ``k % world_size`` and every rank has the same number of
shards, at least ``workers`` (when it has that many samples), so webdataset's own
``split_by_node`` (``urls[rank::world_size]``) over the sorted shard list gives each rank
exactly its share, and ``split_by_worker`` never leaves a DataLoader worker without a shard.

Headers are built here rather than with ``tarfile`` (about 10x cheaper per member, which
matters at millions of members) and are fully fixed: ustar, mode 0644, uid/gid 0, empty
owner names, mtime 0, members in sample order, so the same export is the same bytes. Member
names are ``{key}.{ext}`` with a key made of digits from the sample id: never absolute, never
``..``, never the (possibly hostile or non-UTF-8) original name; that goes in the ``.json``.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dlindex.export.files import RawShard, read_sources
from dlindex.export.plan import FORMAT, ID, LABEL, ExportError, Group, absolute_path
from dlindex.export.shards import Context, ShardInfo, json_maker, sample_key, shard_name
from dlindex.export.texts import json_fields
from dlindex.export.writer import StreamWriter, batches
from dlindex.exported.ids import IDS_FILE, ids_name, write_wds_ids
from dlindex.exported.tar import NOT_IMAGE

BLOCK = 512
_ZEROS = bytes(BLOCK * 2)
# Pillow format -> the extension webdataset and HF datasets decode as an image.
EXTENSIONS = {
    "JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff", "MPO": "jpg",
    "JPEG2000": "jp2", "DIB": "bmp",
}  # fmt: skip
# The image member suffixes, in the order of the ``to_tuple`` spec index.json prints.
IMAGE_KEYS = ("jpg", "png", "webp", "gif", "bmp", "tiff")
# Member suffixes a sample's other members use: an image never takes one of these.
_RESERVED = NOT_IMAGE | {"bin"}


def _template() -> tuple[bytes, bytes, int]:
    head = bytearray(BLOCK)
    head[100:108] = b"0000644\0"  # mode
    head[108:116] = b"0000000\0"  # uid
    head[116:124] = b"0000000\0"  # gid
    head[136:148] = b"00000000000\0"  # mtime: 0, no wall clock in a shard
    head[148:156] = b" " * 8  # checksum field counts as spaces while summing
    head[156:157] = b"0"  # regular file
    head[257:265] = b"ustar\x0000"
    # The parts around the name (0:100), size (124:136) and checksum (148:156) fields.
    return bytes(head[100:124]), bytes(head[136:148]), sum(head)


_MID, _MTIME, _BASE_SUM = _template()
_TAIL = bytes([ord("0")]) + bytes(100) + b"ustar\x0000" + bytes(BLOCK - 265)


def header(name: bytes, size: int) -> bytes:
    """A ustar header for a regular file ``name`` (< 100 bytes) of ``size`` bytes."""
    if len(name) >= 100 or size >= 8**11:
        raise ExportError(f"tar member {name!r} of {size} bytes does not fit a ustar header")
    size_field = b"%011o\0" % size
    checksum = _BASE_SUM + sum(name) + sum(size_field)
    return b"".join((name.ljust(100, b"\0"), _MID, size_field, _MTIME, b"%06o\0 " % checksum, _TAIL))


def extension(row: tuple[Any, ...], path: bytes) -> str:
    """The image member's suffix: from its Pillow format (what decoders go by), never from a name
    that could say ``cls`` or ``json``; ``bin`` when the format is unknown."""
    fmt = row[FORMAT] or ""
    ext = EXTENSIONS.get(fmt)
    if ext is None:
        low = fmt.lower()
        ext = low if low.isascii() and low.isalnum() and len(low) <= 8 and low not in _RESERVED else "bin"
    return ext


_JSON_TYPES = {"id": "int64", "path": "string", "label": "string", "label_id": "int64", "width": "int64",
               "height": "int64", "format": "string", "bytes": "int64", "xxh3_128": "string", "path_b64": "string"}  # fmt: skip
_NUMPY = {"<f4": "float32", "<f8": "float64", "<f2": "float16"}


def hf_features(extensions: Iterable[str], features: Any = None, texts: bool = False) -> dict[str, Any]:
    """HF ``datasets.Features.to_dict()`` of this export's samples, for
    ``load_dataset("webdataset", ..., features=Features.from_dict(...))``: with it HF does not
    guess the columns from the first samples (where an all-JPEG start would drop the png column)."""
    used = set(extensions)
    out: dict[str, Any] = {key: {"_type": "Image"} for key in image_key_spec(used).split(";") if key in used}
    out["cls"] = {"dtype": "int64", "_type": "Value"}
    out["json"] = {k: {"dtype": t, "_type": "Value"} for k, t in _JSON_TYPES.items()}
    if texts:  # export --texts: the caption member, and every text in the metadata
        out["txt"] = {"dtype": "string", "_type": "Value"}
        out["json"]["text"] = {"dtype": "string", "_type": "Value"}
        out["json"]["texts"] = {"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"}
    if features is not None:
        out["npy"] = {"feature": {"dtype": _NUMPY[features.dtype], "_type": "Value"}, "_type": "List"}
    out["__key__"] = {"dtype": "string", "_type": "Value"}
    out["__url__"] = {"dtype": "string", "_type": "Value"}
    return out


def image_key_spec(extensions: Iterable[str]) -> str:
    """The ``to_tuple`` key that reads every image member: the common suffixes, then any others used."""
    extra = sorted(set(extensions) - set(IMAGE_KEYS))
    return ";".join((*IMAGE_KEYS, *extra))


class WdsWriter(StreamWriter[list[bytes], RawShard]):
    """Tar shards written one ``writev`` per sample, named as parts until ``arrange`` numbers them."""

    def shard_file(self, k: int) -> str:
        return _part_name(self.group.split, self.group.rank, k)

    def create(self, path: Path) -> RawShard:
        return RawShard(path)

    def write(self, file: RawShard, pieces: list[list[bytes]]) -> None:
        for parts in pieces:
            file.write(parts)

    def seal(self, file: RawShard) -> tuple[int, str]:
        file.write([_ZEROS])  # end-of-archive: two zero blocks
        digest = file.close()
        return file.bytes, digest


def write_wds(ctx: Context, group: Group, number: int) -> list[ShardInfo]:
    index = ctx.plan.label_index
    roots = ctx.plan.roots
    feature = ctx.features
    texts = ctx.texts
    make = json_maker(ctx)
    sink = WdsWriter(ctx, group, number)
    j = 0
    for batch, vectors in batches(group, ctx):
        items = ((row, absolute_path(row, roots)) for row in batch)
        for row, path, data in read_sources(items, ctx.read_threads):
            key = sample_key(row, group, j).encode()
            # Three buffers a sample: the image header, the image, and everything after it.
            made = make(row)
            if texts is not None:
                mine = texts.of(row[ID])
                made = made[:-1] + json_fields(mine) + "}"
            meta = made.encode()
            tail = [_pad(len(data)), header(key + b".cls", len(cls := b"%d" % index[row[LABEL]])), cls, _pad(len(cls)),
                    header(key + b".json", len(meta)), meta, _pad(len(meta))]  # fmt: skip
            if feature is not None:
                vector = npy(vectors[row[ID]], feature.dtype, feature.dim)
                tail += [header(key + b".npy", len(vector)), vector, _pad(len(vector))]
            if texts is not None:  # the caption as img2dataset writes it: UTF-8, empty without one
                caption = mine[0].encode() if mine else b""
                tail += [header(key + b".txt", len(caption)), caption, _pad(len(caption))]
            ext = extension(row, path)
            ctx.seen.add(ext)
            parts = [header(key + b"." + ext.encode(), len(data)), data, b"".join(tail)]
            sink.add(parts, BLOCK + len(data) + len(parts[2]))
            sink.flush()  # now: a batch of images would not fit in memory
            j += 1
        ctx.tick(len(batch))
    return sink.finish()


def _part_name(split: str, rank: int, k: int) -> str:
    return f".{split}.{rank}.{k:06d}.part"  # renamed by arrange() once all ranks are written


def part_names(split: str, rank: int, base: int, count: int) -> list[str]:
    """A group's shard files as WdsWriter names them, before ``finish_wds`` (merge's rule)."""
    return [_part_name(split, rank, k) for k in range(count)]


def finish_wds(
    out: Path, shards: Sequence[ShardInfo], splits: Sequence[str], *, world_size: int, workers: int, **_: Any
) -> tuple[list[ShardInfo], list[dict[str, Any]]]:
    """Once every group is written: the shards arranged for ``split_by_node``, and ids.i64."""
    arranged = arrange(out, shards, splits, world_size, workers)
    return arranged, [write_wds_ids(out, arranged)]


def extend_wds(
    staging: Path, staged: str, files: list[dict[str, Any]], delta: dict[str, Any] | None,
    shards: Sequence[ShardInfo], splits: Sequence[str], generation: int, **_: Any,
) -> tuple[list[dict[str, Any]], list[tuple[str, str]], list[tuple[str, str]]]:  # fmt: skip
    """An append's ids: the added shards' ids.i64 becomes ``ids-{generation:06d}.i64`` after the
    export's own (readers join them in order); no file of the export is rewritten."""
    if delta is None:
        return files, [], []
    entry = next(f for f in delta["files"] if f["file"] == IDS_FILE)
    name = ids_name(generation)
    return [*files, {**entry, "file": name}], [(f"{staged}/delta/{IDS_FILE}", name)], []


def recipe_keys(
    shards: Sequence[ShardInfo],
    splits: Sequence[str],
    seen: Iterable[str],
    features: Any,
    shard_bytes: int | None,
    texts: bool = False,
) -> tuple[dict[str, Any]]:
    """index.json's ``wds``: what the webdataset recipe reads (``seen``: the image member suffixes written)."""
    used = set(seen)
    per_rank: dict[str, int] = {}
    for shard in shards:
        if shard.rank == 0:
            per_rank[shard.split] = per_rank.get(shard.split, 0) + 1
    return ({
        "image_key": image_key_spec(used), "shards_per_rank": per_rank,
        "urls": {split: [s.file for s in shards if s.split == split] for split in splits},
        "hf_features": hf_features(used, features, texts),
    },)  # fmt: skip


_PADS = [bytes(n) for n in range(BLOCK)]


def shards_per_rank(per_rank: Sequence[int], samples: int, workers: int) -> int:
    """Shards each rank of a split gets: at least as many as any rank's size cut made, a
    multiple of ``workers`` (even work per DataLoader worker), never more than its samples."""
    most = max(per_rank, default=0)
    return min(samples, max(workers, math.ceil(most / workers) * workers)) if samples else 0


def arrange(
    out: Path, shards: Sequence[ShardInfo], splits: Sequence[str], world_size: int, workers: int
) -> list[ShardInfo]:
    """Give every rank of a split the same number of shards and name shard k of a split for
    rank ``k % world_size``: the order webdataset's ``split_by_node`` deals them out in."""
    arranged: list[ShardInfo] = []
    for split in splits:
        ranks: dict[int, list[ShardInfo]] = {r: [] for r in range(world_size)}
        for shard in shards:
            if shard.split == split:
                ranks[shard.rank].append(shard)
        samples = min(sum(s.samples for s in mine) for mine in ranks.values())
        target = shards_per_rank([len(mine) for mine in ranks.values()], samples, workers)
        for mine in ranks.values():
            while len(mine) < target:
                k = max(range(len(mine)), key=lambda i: mine[i].samples)
                mine[k : k + 1] = _halve(out, mine[k])
        for j in range(target):
            for rank in range(world_size):
                part = ranks[rank][j]
                name = shard_name(split, j * world_size + rank, ".tar")
                os.rename(out / part.file, out / name)
                arranged.append(ShardInfo(name, split, rank, part.samples, part.bytes, part.xxh3_128, part.first))
    return arranged


def _sample_starts(path: Path) -> list[int]:
    """Byte offsets where each sample of a shard this module wrote begins, from its headers."""
    starts: list[int] = []
    key = None
    with open(path, "rb") as f:
        offset = 0
        while True:
            head = f.read(BLOCK)
            if len(head) < BLOCK or head == _ZEROS[:BLOCK]:
                return starts
            name = head[:100].split(b"\0", 1)[0]
            size = int(head[124:135], 8)
            member_key = name.split(b".", 1)[0]
            if member_key != key:
                starts.append(offset)
                key = member_key
            offset += BLOCK + size + (-size % BLOCK)
            f.seek(offset)


def _halve(out: Path, shard: ShardInfo) -> list[ShardInfo]:
    """Two shards from one, cut at the sample boundary nearest half its bytes."""
    path = out / shard.file
    starts = _sample_starts(path)
    end = path.stat().st_size - len(_ZEROS)
    middle = min(starts[1:], key=lambda s: abs(2 * s - end))
    k = starts.index(middle)
    names = (shard.file[: -len(".part")] + "a.part", shard.file[: -len(".part")] + "b.part")
    pieces = []
    with open(path, "rb") as f:
        for name, (lo, hi), first, count in zip(
            names, ((0, middle), (middle, end)), (shard.first, shard.first + k), (k, shard.samples - k), strict=True
        ):
            f.seek(lo)
            piece = RawShard(out / name)
            left = hi - lo
            while left:
                chunk = f.read(min(left, 1 << 22))
                piece.write([chunk])
                left -= len(chunk)
            piece.write([_ZEROS])
            digest = piece.close()
            pieces.append(ShardInfo(name, shard.split, shard.rank, count, piece.bytes, digest, first))
    path.unlink()
    return pieces


def _pad(size: int) -> bytes:
    return _PADS[-size % BLOCK]


def npy(blob: bytes, dtype: str, dim: int) -> bytes:
    """A .npy file (format 1.0) holding one 1-D vector, without numpy."""
    text = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': ({dim},), }}"
    pad = -(10 + len(text) + 1) % 64
    head = (text + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + blob
