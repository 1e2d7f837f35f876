"""Checks of what an export's readers take from disk: index.json and manifest rows.

Both may be damaged or hand-edited; every check raises ExportError naming the file (and the
line, or the key) so ``--verify`` and the loaders answer with one line, never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dlindex.exported import ExportError
from dlindex.exported.confine import ConfineError, check_relative
from dlindex.exported.formats import NAMES, WDS, get, load
from dlindex.exported.index import INDEX_VERSION, shards_key

MAX_COUNT = (1 << 63) - 1  # counts and sizes fit SQLite's INTEGER, like the catalog's own
MAX_WORLD_SIZE = 1 << 16
KNOWN_FORMATS = NAMES  # the registry's (dlindex.exported.formats)
_HEX = frozenset("0123456789abcdef")


def _where(path: str, key: str) -> str:
    return f"{path}: {key}"


def _int(value: Any, path: str, key: str, low: int = 0, high: int = MAX_COUNT, *, none: bool = False) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ExportError(f"{_where(path, key)} must be a whole number from {low} to {high}, not {_short(value)}")
    return value


def _str(value: Any, path: str, key: str, *, none: bool = False) -> str | None:
    if value is None and none:
        return None
    if not isinstance(value, str):
        raise ExportError(f"{_where(path, key)} must be text, not {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _digest(value: Any, path: str, key: str) -> None:
    if not isinstance(value, str) or len(value) != 32 or not set(value) <= _HEX:
        raise ExportError(f"{_where(path, key)} must be 32 hex digits (an XXH3-128), not {_short(value)}")


def _file_entry(entry: Any, path: str, key: str, *, shard: bool) -> None:
    if not isinstance(entry, dict):
        raise ExportError(f"{_where(path, key)} must be an object, not {_short(entry)}")
    for name in ("file", "bytes", "xxh3_128", *(("split", "rank", "samples") if shard else ())):
        if name not in entry:
            raise ExportError(f"{_where(path, key)} has no {name!r}")
    name = _str(entry["file"], path, f"{key}.file")
    assert name is not None
    try:
        check_relative(name.encode("utf-8", "surrogateescape"), "file")
    except ConfineError as e:
        raise ExportError(f"{_where(path, key)}: {e}") from None
    _int(entry["bytes"], path, f"{key}.bytes")
    _digest(entry["xxh3_128"], path, f"{key}.xxh3_128")
    if shard:
        _str(entry["split"], path, f"{key}.split")
        _int(entry["rank"], path, f"{key}.rank", 0, MAX_WORLD_SIZE - 1)
        _int(entry["samples"], path, f"{key}.samples")


def check_version(data: Any, path: str) -> int:
    """The export version of an index (1 or 2); ExportError if ``data`` is no dlindex index."""
    if not isinstance(data, dict) or "dlindex_export" not in data:
        raise ExportError(f"{path} is not a dlindex export index")
    version = data["dlindex_export"]
    if isinstance(version, int) and not isinstance(version, bool) and version > INDEX_VERSION:
        raise ExportError(f"{path} has export version {version}; upgrade dlindex to read it")
    _int(version, path, "dlindex_export", 1, INDEX_VERSION)
    return version  # type: ignore[no-any-return]


def check_index(data: Any, path: str, shards: Any) -> dict[str, Any]:
    """``data`` if it is an index.json dlindex can read; ExportError naming ``path`` and the key.

    Args:
        shards: the shard list as ``index.listed_shards`` finds it (a KeyError there is a missing key).
    """
    version = check_version(data, path)
    for key in ("format", "file_root", "labels", "options", "catalog"):
        if key not in data:
            raise ExportError(f"{path} has no {key!r}; it is damaged, or not written by dlindex")
    if data["format"] not in KNOWN_FORMATS:
        raise ExportError(
            f"{_where(path, 'format')} must be one of {', '.join(KNOWN_FORMATS)}, not {_short(data['format'])}"
        )
    root = _str(data["file_root"], path, "file_root")
    if not root or not root.startswith("/") or "\0" in root:
        raise ExportError(f"{_where(path, 'file_root')} must be an absolute path, not {_short(root)}")
    labels = data["labels"]
    if not isinstance(labels, dict) or len(labels) > MAX_COUNT:
        raise ExportError(f"{_where(path, 'labels')} must be an object of class index -> name")
    for k in range(len(labels)):
        if str(k) not in labels or not isinstance(labels[str(k)], str):
            raise ExportError(
                f"{_where(path, 'labels')} must name classes 0..{len(labels) - 1}; {k} is missing or not text"
            )
    if "classes" in data or version >= 2:  # v2: the class list, "labels" the same as an object
        classes = data.get("classes")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise ExportError(f"{_where(path, 'classes')} must be a list of class names")
        if classes != [labels[str(k)] for k in range(len(labels))]:
            raise ExportError(f"{_where(path, 'classes')} and 'labels' must name the same classes in the same order")
        if not isinstance(data.get("class_list", "catalog"), str):
            raise ExportError(f"{_where(path, 'class_list')} must be text")
    options = data["options"]
    if not isinstance(options, dict):
        raise ExportError(f"{_where(path, 'options')} must be an object")
    _int(options.get("world_size", 1), path, "options.world_size", 1, MAX_WORLD_SIZE)
    if not isinstance(options.get("absolute_paths", False), bool):
        raise ExportError(f"{_where(path, 'options.absolute_paths')} must be true or false")
    catalog = data["catalog"]
    if not isinstance(catalog, dict) or not isinstance(catalog.get("path"), str):
        raise ExportError(f"{_where(path, 'catalog.path')} must be text")
    if not isinstance(shards, list):
        raise ExportError(f"{path}: the shard list must be a list")
    key = shards_key(version)
    for i, entry in enumerate(shards):
        _file_entry(entry, path, f"{key}[{i}]", shard=True)
    files = data.get("files", [])
    if not isinstance(files, list):
        raise ExportError(f"{_where(path, 'files')} must be a list")
    for i, entry in enumerate(files):
        _file_entry(entry, path, f"files[{i}]", shard=False)
    listed = {entry["file"] for entry in (*shards, *files)}
    check = get(data["format"]).check_clients
    if check is not None:
        load(check)(data, path, listed, version)
    checked: dict[str, Any] = data  # a dict: check_version saw to it
    return checked


def check_wds_keys(data: Mapping[str, Any], path: str, listed: set[str], version: int) -> None:
    """The webdataset recipe's keys (where there are): its urls must be shards the export lists."""
    (key,) = WDS.client_keys  # the recipe's object
    if key not in data:
        return
    wds = data[key]
    if not isinstance(wds, dict):
        raise ExportError(f"{_where(path, key)} must be an object")
    _str(wds.get("image_key", ""), path, "wds.image_key")
    urls = wds.get("urls", {})
    if not isinstance(urls, dict):
        raise ExportError(f"{_where(path, 'wds.urls')} must be an object of split -> shard files")
    for split, names in urls.items():
        if not isinstance(names, list):
            raise ExportError(f"{_where(path, f'wds.urls.{split}')} must be a list of shard files")
        for name in names:
            if name not in listed:
                raise ExportError(f"{_where(path, f'wds.urls.{split}')}: {_short(name)} is not a shard of the export")
    per_rank = wds.get("shards_per_rank", {})
    if not isinstance(per_rank, dict):
        raise ExportError(f"{_where(path, 'wds.shards_per_rank')} must be an object of split -> count")
    for split, n in per_rank.items():
        _int(n, path, f"wds.shards_per_rank.{split}")
    if not isinstance(wds.get("hf_features", {}), (dict, type(None))):
        raise ExportError(f"{_where(path, 'wds.hf_features')} must be an object")


def check_streaming_keys(data: Mapping[str, Any], path: str, listed: set[str], version: int) -> None:
    """An mds export's root index is also streaming's (since export version 2): "version" 2
    and "shards" whose basenames are shards the export lists (streaming opens them)."""
    if version < 2:
        return
    _int(data.get("version"), path, "version", 2, 2)
    entries = data.get("shards")
    if not isinstance(entries, list):
        raise ExportError(f"{_where(path, 'shards')} must be a list (streaming's shard entries)")
    for i, entry in enumerate(entries):
        raw = entry.get("raw_data") if isinstance(entry, dict) else None
        name = raw.get("basename") if isinstance(raw, dict) else None
        if not isinstance(name, str):
            raise ExportError(f"{_where(path, f'shards[{i}].raw_data.basename')} must be text")
        try:
            check_relative(name.encode("utf-8", "surrogateescape"), "file")
        except ConfineError as e:
            raise ExportError(f"{_where(path, f'shards[{i}]')}: {e}") from None
        if name not in listed:
            raise ExportError(
                f"{_where(path, f'shards[{i}].raw_data.basename')}: {_short(name)} is not a shard of the export"
            )


def check_row(row: Any, where: str, classes: int, absolute_paths: bool = False) -> dict[str, Any]:
    """A manifest row as readers use it: ``path`` a plain relative path (absolute only in an
    ``--absolute-paths`` export), ``id`` and ``label_id`` whole numbers (``label_id`` a class
    of the export), ``bytes`` a size or null; ExportError naming ``where``."""
    if not isinstance(row, dict):
        raise ExportError(f"{where}: a row must be an object, not {_short(row)}")
    for key in ("id", "path", "label_id"):
        if key not in row:
            raise ExportError(f"{where}: no {key!r}")
    if not isinstance(row["path"], str) or not row["path"]:
        raise ExportError(f"{where}: 'path' must be non-empty text, not {_short(row['path'])}")
    raw = row["path"].encode("utf-8", "surrogateescape")
    try:
        if raw.startswith(b"/") and absolute_paths:
            check_relative(raw.lstrip(b"/") or b".", "path")
        else:
            check_relative(raw, "path")
    except ConfineError as e:
        raise ExportError(f"{where}: {e}") from None
    _int(row["id"], where, "'id'", -MAX_COUNT - 1)
    _int(row["label_id"], where, "'label_id'", 0, max(classes - 1, 0))
    if classes == 0:
        raise ExportError(f"{where}: 'label_id' {row['label_id']} but index.json names no classes")
    _int(row.get("bytes"), where, "'bytes'", none=True)
    for key in ("width", "height"):
        _int(row.get(key), where, repr(key), none=True)
    digest = row.get("xxh3_128")
    if digest is not None:
        _digest(digest, where, "'xxh3_128'")
    if row.get("text") is not None and not isinstance(row["text"], str):
        raise ExportError(f"{where}: 'text' must be a string")
    texts = row.get("texts")
    if texts is not None and (not isinstance(texts, list) or not all(isinstance(t, str) for t in texts)):
        raise ExportError(f"{where}: 'texts' must be a list of strings")
    feature = row.get("feature")
    if feature is not None and (not isinstance(feature, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in feature)):  # fmt: skip
        raise ExportError(f"{where}: 'feature' must be a list of numbers")
    return row


def listed_bytes(shards: Sequence[Mapping[str, Any]], files: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """File name -> the size index.json records for it."""
    return {entry["file"]: entry["bytes"] for entry in (*shards, *files)}
