"""Reading an export back: its index.json and its manifest rows (for --verify and the loader)."""

from __future__ import annotations

import base64
import csv
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from dlindex.exported import ExportError
from dlindex.exported.confine import (
    MAX_INDEX_BYTES,
    ConfineError,
    bounded_lines,
    check_relative,
    join_inside,
    open_regular,
    read_regular,
    resolve_inside,
)
from dlindex.exported.formats import MANIFEST_SUFFIXES
from dlindex.exported.index import (
    INDEX,
    PART_INDEX,
    index_path,
    listed_shards,
    shards_key,
)
from dlindex.exported.validate import check_index, check_row, check_version

# Text formats (jsonl, csv, the wds/mds json) add this key: the exact name in base64 where it is
# not UTF-8 (then ``path`` shows it with \\xNN escapes, valid UTF-8 for pandas, polars, duckdb),
# else "" (not null: polars types a column from its first rows, and null there would mean no type).
PATH_B64 = "path_b64"

_INTS = ("id", "label_id", "width", "height", "bytes")


def load_index(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """OUT_DIR's index (index.json, _index.json in a parquet export) as a dict, checked
    (validate.check_index); ExportError if OUT_DIR is not a dlindex export, or its index is
    damaged (naming the line or the key)."""
    path = index_path(out_dir)
    try:
        raw = read_regular(os.fspath(path), MAX_INDEX_BYTES)
    except FileNotFoundError:
        if os.path.lexists(os.path.join(out_dir, PART_INDEX)):
            raise ExportError(f"{out_dir} is one part of a --part export: merge all its parts first") from None
        raise ExportError(f"{out_dir} is not a dlindex export: no {INDEX}") from None
    except OSError as e:
        raise ExportError(f"cannot read {path}: {e.strerror}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ExportError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}, line {e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ExportError(f"{path}: nested too deeply to be an export index") from None
    check_version(data, str(path))  # before listed_shards, which picks the key by version
    try:
        shards = listed_shards(data)
    except (KeyError, TypeError):
        key = shards_key(data["dlindex_export"])
        raise ExportError(f"{path} lists no shards under {key!r}; it is damaged, or not written by dlindex") from None
    return check_index(data, str(path), shards)


def manifest_files(index: Mapping[str, Any], split: str | None = None, rank: int | None = None) -> list[str]:
    """The manifest shards of an export (jsonl/csv/parquet, or dali's jsonl), in order."""
    return [
        s["file"] for s in listed_shards(index)
        if s["file"].endswith(MANIFEST_SUFFIXES) and (split is None or s["split"] == split)
        and (rank is None or s["rank"] == rank)
    ]  # fmt: skip


def manifest_rows(
    out_dir: str | os.PathLike[str],
    name: str,
    *,
    max_bytes: int | None = None,
    classes: int | None = None,
    absolute_paths: bool = False,
) -> Iterator[dict[str, Any]]:
    """The rows of one manifest shard as dicts; ``path`` is always the exact name as ``str``
    (surrogate escapes for names that are not UTF-8: ``os.fsencode(row["path"])`` gives the
    bytes), restored from ``path_b64`` / ``path_bytes`` where the file shows it escaped.

    The file must be a regular file inside OUT_DIR of at most ``max_bytes``; a damaged row
    raises ExportError naming the file and line (the row number for parquet). With
    ``classes``, each row is checked (validate.check_row) against that many classes, and its
    path (absolute ones only with ``absolute_paths``).
    """
    try:
        check_relative(os.fsencode(name), "manifest")
        path = resolve_inside(os.fsencode(out_dir), os.fsencode(name), what="manifest")
    except ConfineError as e:
        raise ExportError(f"{out_dir}: {e}") from None
    shown = os.path.join(os.fspath(out_dir), name)
    try:
        if name.endswith(".jsonl"):
            for number, line in bounded_lines(path, max_bytes):
                where = f"{shown}, line {number}"
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError) as e:
                    raise ExportError(f"{where}: not a JSON object ({str(e).partition(': line')[0]})") from None
                row = _exact(row, where)
                yield row if classes is None else check_row(row, where, classes, absolute_paths)
        elif name.endswith(".csv"):
            text = (line.decode("utf-8", "surrogateescape") for _, line in bounded_lines(path, max_bytes))
            reader = csv.DictReader(text)
            for row in _csv_rows(reader, shown):
                where = f"{shown}, line {reader.line_num}"
                row = _exact(row, where)
                yield row if classes is None else check_row(row, where, classes, absolute_paths)
        elif name.endswith(".parquet"):
            for number, row in enumerate(_parquet_rows(path, max_bytes, shown), 1):
                row = _exact(row, f"{shown}, row {number}")
                yield row if classes is None else check_row(row, f"{shown}, row {number}", classes, absolute_paths)
        else:
            raise ExportError(f"{name} is not a manifest shard")
    except FileNotFoundError:
        raise ExportError(f"{shown}: missing") from None


def exact_path(text: str, b64: str | None) -> str:
    """The inverse of export.shards.shown_path, as ``str`` with surrogate escapes (``os.fsencode`` gives the bytes)."""
    if not b64:
        return text
    try:
        return os.fsdecode(base64.b64decode(b64, validate=True))
    except ValueError:
        raise ExportError(f"path_b64 {b64[:40]!r} is not base64; the manifest is damaged") from None


def _exact(row: Any, where: str) -> dict[str, Any]:
    """A row with a text ``path``, its exact name restored from ``path_b64`` (where the
    manifest shows a name that is not UTF-8 escaped); ExportError naming ``where``."""
    if not isinstance(row, dict):
        raise ExportError(f"{where}: a row must be an object, not {type(row).__name__}; the manifest is damaged")
    if not isinstance(row.get("path"), str):
        raise ExportError(f"{where}: no path; the manifest is damaged")
    if PATH_B64 in row:
        b64 = row[PATH_B64] or None
        if b64 is not None and not isinstance(b64, str):
            raise ExportError(f"{where}: 'path_b64' must be text; the manifest is damaged")
        row[PATH_B64] = b64
        try:
            row["path"] = exact_path(row["path"], b64)
        except ExportError as e:
            raise ExportError(f"{where}: {e}") from None
    return row


def _csv_rows(reader: csv.DictReader[str], shown: str) -> Iterator[dict[str, Any]]:
    try:
        for row in reader:
            where = f"{shown}, line {reader.line_num}"
            if None in row or None in row.values():
                raise ExportError(f"{where}: {len(row)} fields where the header names {len(reader.fieldnames or ())}")
            out: dict[str, Any] = dict(row)
            for key in _INTS:
                try:
                    out[key] = int(row[key]) if row.get(key) else None
                except ValueError:
                    raise ExportError(f"{where}: {key!r} must be a whole number, not {row[key][:40]!r}") from None
            for key in ("feature", "texts"):  # JSON lists in a csv field
                if row.get(key):
                    try:
                        out[key] = json.loads(row[key])
                    except (ValueError, RecursionError):
                        raise ExportError(f"{where}: {key!r} is not a JSON list") from None
            if "text" in row and not row["text"]:
                out["text"] = None
            yield out
    except csv.Error as e:
        raise ExportError(f"{shown}, line {reader.line_num}: {e}") from None


def _parquet_rows(path: bytes, max_bytes: int | None, shown: str) -> Iterator[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    fd, _ = open_regular(path, max_bytes)
    with os.fdopen(fd, "rb") as f:
        try:
            rows = pq.read_table(f).to_pylist()
        except (pa.ArrowException, OSError, ValueError) as e:  # (UnicodeDecodeError is a ValueError)
            first = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise ExportError(f"{shown}: not a readable parquet file ({first})") from None
    for row in rows:
        raw = row.pop("path_bytes", None)
        if isinstance(raw, bytes):
            row["path"] = os.fsdecode(raw)
        yield row


def absolute_paths(index: Mapping[str, Any]) -> bool:
    """Whether the export was written with ``--absolute-paths`` (its rows may then be absolute)."""
    return bool(index.get("options", {}).get("absolute_paths", False))


def source_path(index: Mapping[str, Any], path: str, root: str | os.PathLike[str] | bytes | None = None) -> bytes:
    """A manifest path as the absolute path of the source file, in bytes, confined to ``root``
    (default: the export's ``file_root``) by its text: ConfineError for ``..`` or an absolute
    path, which is accepted only in an export written with ``--absolute-paths`` and only under
    the root. Readers then open it through ``confine.real_inside`` (symlinks that leave the root).
    """
    base = os.fsencode(root) if root is not None else os.fsencode(index.get("file_root") or "/")
    absolute = absolute_paths(index)
    return join_inside(base, os.fsencode(path), allow_absolute=absolute)
