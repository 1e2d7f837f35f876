"""What every format writer shares: its context, shard names, sample keys and metadata JSON."""

from __future__ import annotations

import base64
import json
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlindex.export.plan import (
    BYTES,
    FORMAT,
    HASH,
    HEIGHT,
    ID,
    LABEL,
    WIDTH,
    Group,
    Plan,
    UpperHalf,
    relative_prefixes,
    sample_path,
)
from dlindex.exported.index import ShardInfo as ShardInfo  # defined with the index it describes
from dlindex.exported.reader import PATH_B64

# The keys of a manifest row and of a packed sample's metadata, in this order, in every format.
SAMPLE_KEYS = ("id", "path", "label", "label_id", "width", "height", "format", "bytes", "xxh3_128")
TEXT_KEYS = (*SAMPLE_KEYS, PATH_B64)

_encode_text = json.encoder.encode_basestring


@dataclass(frozen=True)
class Features:
    """Feature vectors of one type, fetched in batches by sample id."""

    name: str
    dtype: str  # numpy-style, e.g. "<f4"
    dim: int
    fetch: Callable[[list[int]], dict[int, bytes]]
    extractor_version: str | None = None  # the type's latest compute's (None: imported, or not recorded)
    stale: int = 0  # vectors another version of the extractor made


@dataclass(frozen=True)
class Context:
    plan: Plan
    out: Path
    shard_size: int | None
    shard_bytes: int | None
    features: Features | None = None
    texts: Any = None  # dlindex.export.texts.TextSource, with --texts
    progress: Callable[[int], None] | None = None
    read_threads: int = 0
    prefixes: Mapping[int, bytes] = field(default_factory=dict)
    upper: Mapping[str, UpperHalf] | None = None  # per split: the rows a second process writes (jsonl)
    seen: set[str] = field(default_factory=set)  # wds: the image member suffixes written

    @staticmethod
    def make(plan: Plan, out: Path, **kwargs: Any) -> Context:
        return Context(plan, out, prefixes=relative_prefixes(plan), **kwargs)

    def tick(self, n: int) -> None:
        if self.progress is not None and n:
            self.progress(n)


def shard_name(split: str, number: int, suffix: str) -> str:
    return f"{split}-{number:06d}{suffix}"


def sample_key(row: tuple[Any, ...], group: Group, j: int) -> str:
    """The key of the j-th sample of a group: from its id, never from its (hostile) name."""
    if group.padded and j >= len(group.rows) - group.padded:  # type: ignore[arg-type]
        return f"{row[ID]:012d}_{group.positions[j]}"  # a --pad repeat: keys stay unique
    return f"{row[ID]:012d}"


def shown_path(raw: bytes) -> tuple[str, str | None]:
    """(valid UTF-8 text, base64 of the exact bytes or None) for a path as bytes: the text
    shows a byte that is not UTF-8 as ``\\xNN``, so only the base64 is lossless."""
    try:
        return raw.decode(), None
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), base64.b64encode(raw).decode("ascii")


def metadata_json(row: tuple[Any, ...], ctx: Context, label_json: list[str]) -> str:
    """The sample's metadata as one JSON object (TEXT_KEYS), built without json.dumps per row."""
    path, b64 = shown_path(sample_path(row, ctx.prefixes))
    k = ctx.plan.label_index[row[LABEL]]
    return (
        f'{{"id":{row[ID]},"path":{_encode_text(path)},"label":{label_json[k]},"label_id":{k},'
        f'"width":{_num(row[WIDTH])},"height":{_num(row[HEIGHT])},"format":{_text(row[FORMAT])},'
        f'"bytes":{_num(row[BYTES])},"xxh3_128":{_text(row[HASH])},"path_b64":{_encode_text(b64 or "")}}}'
    )


# The fast path of metadata_json(): a UTF-8 name under a UTF-8 root, no NULLs.
_TEMPLATE = (
    '{"id":%d,"path":%s,"label":%s,"label_id":%d,"width":%d,"height":%d,"format":"%s","bytes":%d,'
    '"xxh3_128":"%s","path_b64":""}'
)


def json_maker(ctx: Context) -> Callable[[tuple[Any, ...]], str]:
    """A function from a row to metadata_json(row), about 3x faster on ordinary rows."""
    labels = label_json(ctx.plan)
    index = ctx.plan.label_index
    texts = text_prefixes(ctx)
    quote = _encode_text
    template = _TEMPLATE

    def make(row: tuple[Any, ...]) -> str:
        ident, root, name, raw, label, width, height, fmt, size, digest = row
        prefix = texts.get(root)
        if prefix is None or raw is not None or fmt is None or digest is None:
            return metadata_json(row, ctx, labels)
        k = index[label]
        try:
            return template % (ident, quote(prefix + name), labels[k], k, width, height, fmt, size, digest)
        except TypeError:  # a NULL number
            return metadata_json(row, ctx, labels)

    return make


def text_prefixes(ctx: Context) -> dict[int, str]:
    """The root prefixes that are UTF-8, as text: rows under them take the fast paths."""
    return {k: os.fsdecode(p) for k, p in ctx.prefixes.items() if _is_utf8(p)}


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def label_json(plan: Plan) -> list[str]:
    return [_encode_text(name) for name in plan.labels]


def _num(value: Any) -> str:
    return "null" if value is None else str(int(value))


def _text(value: Any) -> str:
    return "null" if value is None else _encode_text(str(value))


def vector_list(blob: bytes, dtype: str) -> list[float]:
    """A little-endian float vector as a list of Python floats."""
    code = {"<f4": "f", "<f8": "d", "<f2": "e"}[dtype]
    count = len(blob) // struct.calcsize(code)
    return [float(v) for v in struct.unpack(f"<{count}{code}", blob)]
