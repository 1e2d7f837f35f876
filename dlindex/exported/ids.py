"""ids.i64: the catalog id of every sample of a wds export, in shard order, so a reader can seek."""

from __future__ import annotations

import array
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import xxhash

from dlindex.exported import ExportError
from dlindex.exported.confine import read_listed
from dlindex.exported.index import ShardInfo, listed_shards
from dlindex.exported.tar import iter_members

IDS_FILE = "ids.i64"  # int64 little-endian, one per sample (pad repeats included)
_APPENDED_IDS = re.compile(r"ids-\d{6}\.i64")  # export --append's, one per generation


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


def ids_name(generation: int) -> str:
    """The ids file of an append's shards (generation 0: the export's own, ids.i64)."""
    return IDS_FILE if generation == 0 else f"ids-{generation:06d}.i64"


def wds_ids(
    out_dir: str | os.PathLike[str], index: Mapping[str, Any], samples: int | None = None
) -> array.array[int] | None:
    """The ids of a wds export's samples in shard order (ids.i64, then each append's
    ids-NNNNNN.i64), checked against index.json (together one per listed sample, each its
    hash); None for an export written before ids.i64. ``samples``: the count to hold them
    against (verify's, from the shards), instead of index.json's."""
    entries = [f for f in index.get("files", []) if isinstance(f, dict) and _is_ids(f.get("file"))]
    if not entries or entries[0].get("file") != IDS_FILE:
        return None
    if samples is None:
        samples = sum(int(s["samples"]) for s in listed_shards(index))
    listed = sum(int(e["bytes"]) if isinstance(e.get("bytes"), int) else -1 for e in entries)
    if listed != 8 * samples:
        shown = os.path.join(os.fsdecode(out_dir), IDS_FILE)
        raise ExportError(f"{shown}: index.json lists {listed} bytes for the ids of {samples} samples; "
                          "the export was altered (see dlindex export --verify)")  # fmt: skip
    ids = array.array("q")
    for entry in entries:
        ids.frombytes(read_listed(out_dir, entry["file"], entry["bytes"], entry.get("xxh3_128"), what="ids file"))
    if sys.byteorder != "little":
        ids.byteswap()
    return ids


def _is_ids(name: object) -> bool:
    return isinstance(name, str) and (name == IDS_FILE or _APPENDED_IDS.fullmatch(name) is not None)
