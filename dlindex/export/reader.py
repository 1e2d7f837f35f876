"""Reading an export back: its index.json and its manifest rows (for --verify and the loader)."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .plan import ExportError

INDEX = "index.json"
INDEX_VERSION = 1
MANIFEST_SUFFIXES = (".jsonl", ".csv", ".parquet")
_INTS = ("id", "label_id", "width", "height", "bytes")


def load_index(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """OUT_DIR/index.json as a dict; ExportError if OUT_DIR is not a dlindex export."""
    path = Path(out_dir) / INDEX
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(f"{out_dir} is not a dlindex export: no {INDEX}") from None
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict) or "dlindex_export" not in data:
        raise ExportError(f"{path} is not a dlindex export index")
    if data["dlindex_export"] > INDEX_VERSION:
        raise ExportError(f"{path} has export version {data['dlindex_export']}; upgrade dlindex to read it")
    return data


def listed_shards(index: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The shard files an export's index.json lists (the one place that knows the key)."""
    return list(index["shards"])


def manifest_files(index: Mapping[str, Any], split: str | None = None, rank: int | None = None) -> list[str]:
    """The manifest shards of an export (jsonl/csv/parquet, or dali's jsonl), in order."""
    return [
        s["file"] for s in listed_shards(index)
        if s["file"].endswith(MANIFEST_SUFFIXES) and (split is None or s["split"] == split)
        and (rank is None or s["rank"] == rank)
    ]  # fmt: skip


def manifest_rows(out_dir: str | os.PathLike[str], name: str) -> Iterator[dict[str, Any]]:
    """The rows of one manifest shard as dicts; ``path`` is always ``str`` (surrogate escapes
    for names that are not UTF-8: ``os.fsencode(row["path"])`` gives the exact bytes)."""
    path = Path(out_dir) / name
    if name.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)
    elif name.endswith(".csv"):
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
            for row in csv.DictReader(f):
                out: dict[str, Any] = dict(row)
                for key in _INTS:
                    out[key] = int(row[key]) if row.get(key) else None
                if "feature" in out:
                    out["feature"] = json.loads(row["feature"])
                yield out
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq

        for row in pq.read_table(path).to_pylist():
            raw = row.pop("path_bytes", None)
            if raw is not None:
                row["path"] = os.fsdecode(raw)
            yield row
    else:
        raise ExportError(f"{name} is not a manifest shard")


def source_path(index: Mapping[str, Any], path: str) -> bytes:
    """A manifest path as the absolute path of the source file, in bytes."""
    raw = os.fsencode(path)
    if raw.startswith(b"/"):
        return raw
    root = os.fsencode(index.get("file_root") or "/")
    return root.rstrip(b"/") + b"/" + raw
