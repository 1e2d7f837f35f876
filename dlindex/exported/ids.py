"""ids.i64: the catalog id of every sample of a wds export, in shard order, so a reader can seek."""

from __future__ import annotations

import array
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import xxhash

from dlindex.exported import ExportError
from dlindex.exported.confine import ConfineError, read_regular, resolve_inside
from dlindex.exported.index import ShardInfo, listed_shards
from dlindex.exported.tar import iter_members

IDS_FILE = "ids.i64"  # int64 little-endian, one per sample (pad repeats included)


def write_wds_ids(out: Path, shards: Sequence[ShardInfo]) -> dict[str, Any]:
    """Write ids.i64 for ``shards`` (in index order) from their member keys; its index entry."""
    ids = array.array("q")
    for shard in shards:
        key = None
        for name, _ in iter_members(out / shard.file):
            member_key = name.rpartition(b"/")[2].partition(b".")[0]
            if member_key != key:
                key = member_key
                ids.append(int(member_key.partition(b"_")[0]))  # keys are the id's digits (shards.sample_key)
    if sys.byteorder != "little":
        ids.byteswap()
    data = ids.tobytes()
    (out / IDS_FILE).write_bytes(data)
    return {"file": IDS_FILE, "bytes": len(data), "xxh3_128": xxhash.xxh3_128_hexdigest(data)}


def wds_ids(out_dir: str | os.PathLike[str], index: Mapping[str, Any]) -> array.array[int] | None:
    """The ids of a wds export's samples in shard order, checked against index.json (its size,
    one per listed sample, and its hash); None for an export written before ids.i64."""
    entry = next((f for f in index.get("files", []) if isinstance(f, dict) and f.get("file") == IDS_FILE), None)
    if entry is None:
        return None
    shown = os.path.join(os.fsdecode(out_dir), IDS_FILE)
    samples = sum(int(s["samples"]) for s in listed_shards(index))
    if entry.get("bytes") != 8 * samples:
        raise ExportError(f"{shown}: index.json lists {repr(entry.get('bytes'))[:40]} bytes for {samples} samples; "
                          "the export was altered (see dlindex export --verify)")  # fmt: skip
    try:
        path = resolve_inside(os.fsencode(out_dir), IDS_FILE, what="ids file")
        data = read_regular(path, 8 * samples, exact=True)
    except ConfineError as e:
        raise ExportError(f"{shown}: {e}") from None
    except OSError as e:
        raise ExportError(f"{shown}: {e.strerror}") from None
    if xxhash.xxh3_128_hexdigest(data) != entry.get("xxh3_128"):
        raise ExportError(f"{shown} does not match its hash in index.json; the export was altered")
    ids = array.array("q")
    ids.frombytes(data)
    if sys.byteorder != "little":
        ids.byteswap()
    return ids
