"""The names and version of an export's own index file, and where it lists its shards.

The one place reader, validate, outdir and the writers take them from (so none of them
needs another to know what index.json is called or where its shard list lives).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlindex.exported.formats import INDEX_NAMES

INDEX = "index.json"
# pyarrow (and so pandas) read every file of a folder as parquet except names starting with
# "_" or ".": a parquet export keeps its index under this name so `pd.read_parquet(DIR)` works.
PARQUET_INDEX = "_index.json"
# 2: the shard list moved from "shards" to SHARDS_KEY (an mds export's root index.json is
# also streaming's, which reads "version" and "shards"); the default split is "train".
INDEX_VERSION = 2
SHARDS_KEY = "dlindex_shards"
# A part of a `--part I/N` export has this instead of an index: it is no export until merged.
PART_INDEX = "dlindex-part.json"


def index_path(out_dir: str | os.PathLike[str]) -> Path:
    """OUT_DIR's dlindex index file (index.json, or _index.json in a parquet export)."""
    folder = Path(out_dir)
    for name in INDEX_NAMES:
        if (folder / name).is_file():
            return folder / name
    return folder / INDEX


def shards_key(version: int) -> str:
    """The key an index of export version ``version`` lists its shards under."""
    return SHARDS_KEY if version >= 2 else "shards"


def listed_shards(index: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The shard files an export's index.json lists (the one place that knows the key).

    Version 1 exports listed them under "shards"; they still read."""
    return list(index[shards_key(index.get("dlindex_export", INDEX_VERSION))])


@dataclass(frozen=True)
class ShardInfo:
    """One file an export wrote, as index.json lists it."""

    file: str
    split: str
    rank: int
    samples: int
    bytes: int
    xxh3_128: str
    first: int = 0  # position of its first sample within its split and rank

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file, "split": self.split, "rank": self.rank, "samples": self.samples,
            "bytes": self.bytes, "xxh3_128": self.xxh3_128,
        }  # fmt: skip
