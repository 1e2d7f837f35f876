"""Reading an export back: its index.json and its manifest rows (for --verify and the loader)."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .plan import ExportError
from .shards import PATH_B64, exact_path

INDEX = "index.json"
# pyarrow (and so pandas) read every file of a folder as parquet except names starting with
# "_" or ".": a parquet export keeps its index under this name so `pd.read_parquet(DIR)` works.
PARQUET_INDEX = "_index.json"
# 2: the shard list moved from "shards" to SHARDS_KEY (an mds export's root index.json is
# also streaming's, which reads "version" and "shards"); the default split is "train".
INDEX_VERSION = 2
SHARDS_KEY = "dlindex_shards"
MANIFEST_SUFFIXES = (".jsonl", ".csv", ".parquet")
_INTS = ("id", "label_id", "width", "height", "bytes")


def index_name(fmt: str) -> str:
    """The file name of an export's own index for a format."""
    return PARQUET_INDEX if fmt == "parquet" else INDEX


def index_path(out_dir: str | os.PathLike[str]) -> Path:
    """OUT_DIR's dlindex index file (index.json, or _index.json in a parquet export)."""
    folder = Path(out_dir)
    for name in (INDEX, PARQUET_INDEX):
        if (folder / name).is_file():
            return folder / name
    return folder / INDEX


def load_index(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """OUT_DIR's index.json as a dict; ExportError if OUT_DIR is not a dlindex export."""
    path = index_path(out_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(f"{out_dir} is not a dlindex export: no {INDEX}") from None
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict) or "dlindex_export" not in data:
        raise ExportError(f"{path} is not a dlindex export index")
    version = data["dlindex_export"]
    if not isinstance(version, int) or version > INDEX_VERSION:
        raise ExportError(f"{path} has export version {version!r}; upgrade dlindex to read it")
    key = SHARDS_KEY if version >= 2 else "shards"
    shards = data.get(key)
    if not isinstance(shards, list) or not all(isinstance(s, dict) and isinstance(s.get("file"), str) for s in shards):
        raise ExportError(f"{path} lists no shards under {key!r}; re-run dlindex export")
    return data


def listed_shards(index: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The shard files an export's index.json lists (the one place that knows the key).

    Version 1 exports listed them under "shards"; they still read."""
    if index.get("dlindex_export", INDEX_VERSION) < 2:
        return list(index["shards"])
    return list(index[SHARDS_KEY])


def manifest_files(index: Mapping[str, Any], split: str | None = None, rank: int | None = None) -> list[str]:
    """The manifest shards of an export (jsonl/csv/parquet, or dali's jsonl), in order."""
    return [
        s["file"] for s in listed_shards(index)
        if s["file"].endswith(MANIFEST_SUFFIXES) and (split is None or s["split"] == split)
        and (rank is None or s["rank"] == rank)
    ]  # fmt: skip


def manifest_rows(out_dir: str | os.PathLike[str], name: str) -> Iterator[dict[str, Any]]:
    """The rows of one manifest shard as dicts; ``path`` is always the exact name as ``str``
    (surrogate escapes for names that are not UTF-8: ``os.fsencode(row["path"])`` gives the
    bytes), restored from ``path_b64`` / ``path_bytes`` where the file shows it escaped."""
    path = Path(out_dir) / name
    if name.endswith(".jsonl"):
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            for n, line in enumerate(f, 1):
                try:
                    row = json.loads(line)
                except ValueError:
                    raise ExportError(f"{name}, line {n}: not a JSON object; the manifest is damaged") from None
                if not isinstance(row, dict) or not isinstance(row.get("path"), str):
                    raise ExportError(f"{name}, line {n}: no path; the manifest is damaged")
                if PATH_B64 in row:
                    row[PATH_B64] = row[PATH_B64] or None
                    row["path"] = exact_path(row["path"], str(row[PATH_B64] or ""))
                yield row
    elif name.endswith(".csv"):
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
            try:
                for n, row in enumerate(csv.DictReader(f), 2):
                    yield _csv_row(name, n, row)
            except csv.Error as e:
                raise ExportError(f"{name}: not a CSV manifest ({e})") from None
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq

        for row in pq.read_table(path).to_pylist():
            raw = row.pop("path_bytes", None)
            if raw is not None:
                row["path"] = os.fsdecode(raw)
            yield row
    else:
        raise ExportError(f"{name} is not a manifest shard")


def _csv_row(name: str, n: int, row: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(row)
    if not isinstance(out.get("path"), str) or None in out:
        raise ExportError(f"{name}, line {n}: not a row of the manifest's columns; the manifest is damaged")
    try:
        for key in _INTS:
            out[key] = int(row[key]) if row.get(key) else None
        if out.get("feature"):
            out["feature"] = json.loads(row["feature"])
    except ValueError:
        raise ExportError(f"{name}, line {n}: a number or feature column does not parse; the manifest is damaged") from None
    if PATH_B64 in out:
        out[PATH_B64] = out[PATH_B64] or None
        out["path"] = exact_path(out["path"], out[PATH_B64])
    return out


def source_path(index: Mapping[str, Any], path: str, root: str | os.PathLike[str] | None = None) -> bytes:
    """A manifest path as the absolute path of the source file, in bytes: relative paths are
    relative to ``root`` when given (the tree moved since the export), else to index.json's file_root."""
    raw = os.fsencode(path)
    if raw.startswith(b"/"):
        if root is not None:
            raise ExportError("this export holds absolute paths (--absolute-paths); root= cannot move them, re-run dlindex export")
        return raw
    base = os.fsencode(root) if root is not None else os.fsencode(index.get("file_root") or "/")
    return base.rstrip(b"/") + b"/" + raw
