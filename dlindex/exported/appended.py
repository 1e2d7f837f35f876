"""What ``export --append`` adds to an export, as its readers see it.

Each append is a *generation* (1, 2, ...; the export as first written is 0): its shards carry
``"generation": g`` in index.json, and the ids it removed, ``_removed-{g:06d}.json`` (a JSON
list of ids), say that every copy of those samples in a shard of an earlier generation is no
longer part of the export (a removed sample, or one written again with new content, label or
path). A reader keeps a sample of a shard of generation ``g`` unless one of its ids was removed
by a later generation: ``g >= removed.get(id, 0)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from dlindex.exported import ExportError
from dlindex.exported.confine import read_listed

REMOVED_PREFIX = "_removed-"  # "_": pyarrow and pandas never read it as data
MAX_REMOVED_BYTES = 1 << 31  # ~200M ids; a larger list is not one an append wrote


def removed_name(generation: int) -> str:
    return f"{REMOVED_PREFIX}{generation:06d}.json"


def generation(entry: Mapping[str, Any]) -> int:
    """The generation of a shard entry of index.json (0: written by the export itself)."""
    value = entry.get("generation", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def removed_ids(out_dir: str | os.PathLike[str], index: Mapping[str, Any]) -> dict[int, int]:
    """Sample id -> the latest generation that removed it, from the removal lists index.json
    lists (each checked against its size and hash there); empty for an export never appended to."""
    removed: dict[int, int] = {}
    for entry in index.get("files", []):
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.startswith(REMOVED_PREFIX):
            continue
        shown = os.path.join(os.fsdecode(out_dir), name)
        number = name[len(REMOVED_PREFIX) : -len(".json")]
        size = entry.get("bytes")
        if not number.isdigit() or not name.endswith(".json") or not isinstance(size, int) or size > MAX_REMOVED_BYTES:
            raise ExportError(f"{shown}: not a removal list an append wrote; the export was altered")
        data = read_listed(out_dir, name, size, entry.get("xxh3_128"), what="removal list")
        try:
            ids = json.loads(data)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
            ids = None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ExportError(f"{shown} is not a list of sample ids; the export was altered")
        g = int(number)
        for i in ids:
            if removed.get(i, 0) < g:
                removed[i] = g
    return removed


def keeps(removed: Mapping[int, int], shard_generation: int, sample_id: int) -> bool:
    """Is this copy of ``sample_id``, in a shard of ``shard_generation``, part of the export?"""
    return shard_generation >= removed.get(sample_id, 0)
