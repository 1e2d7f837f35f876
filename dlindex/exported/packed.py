"""``--verify`` of a wds export's contents: what its readers take from the tars and ids.i64.

A checksum only says a file is the one index.json lists; a tar changed and index.json re-signed
to match passes it. So each shard is also read as the writer wrote it: only regular members
named ``KEY.EXT`` (KEY the sample id's 12 digits, ``_N`` for a --pad repeat), each sample an
image and a ``.cls`` of a class the export has, the number of samples index.json claims, and
ids.i64 the ids of those sample keys in shard order.
"""

from __future__ import annotations

import array
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dlindex.exported import ExportError
from dlindex.exported.confine import ConfineError, check_relative, resolve_inside
from dlindex.exported.ids import IDS_FILE, wds_ids
from dlindex.exported.index import listed_shards
from dlindex.exported.tar import NOT_IMAGE, is_regular, iter_headers

_KEY = re.compile(rb"[0-9]{12}(_[0-9]+)?")
_EXT = re.compile(rb"[a-z0-9]{1,8}")
_NOT_IMAGE = frozenset(ext.encode() for ext in NOT_IMAGE)
_MAX_CLS_BYTES = 20
_KINDS = {b"1": "a hard link", b"2": "a symbolic link", b"3": "a character device", b"4": "a block device",
          b"5": "a folder", b"6": "a FIFO", b"x": "a pax header", b"g": "a pax header"}  # fmt: skip


def check_wds(root: Path, index: Mapping[str, Any], skip: set[str], problem: Callable[[str], None]) -> int:
    """Check every tar shard and ids.i64 of a wds export (files in ``skip`` are already
    reported); each problem is one line to ``problem``. Returns the samples found in the shards."""
    classes = len(index["labels"])
    found = array.array("q")
    complete = True
    for entry in listed_shards(index):
        name = entry["file"]
        if name in skip:
            complete = False
            continue
        try:
            ids = shard_ids(resolve_inside(os.fsencode(root), name, what="shard"), entry["bytes"], classes, name)
        except ExportError as e:
            problem(str(e))
            complete = False
            continue
        if len(ids) != entry["samples"]:
            problem(f"{name}: holds {len(ids)} samples, index.json says {entry['samples']}")
        found.extend(ids)
    claimed = index.get("counts", {}).get("samples") if isinstance(index.get("counts"), dict) else None
    if complete and claimed is not None and claimed != len(found):
        problem(f"index.json: counts.samples is {claimed!r:.40}, the shards hold {len(found)}")
    if complete and IDS_FILE not in skip:
        _check_ids(root, index, found, problem)
    return len(found)


def shard_ids(path: bytes, max_bytes: int, classes: int, shown: str) -> array.array[int]:
    """The sample ids of one shard from its member keys, in order; ExportError (one line,
    naming the shard and member) for anything the writer does not write."""
    ids = array.array("q")
    seen: set[bytes] = set()
    key: bytes | None = None
    has_image = has_cls = True
    for head, name, size, read in iter_headers(path, max_bytes):
        where = f"{shown}: member {os.fsdecode(name)!r}"
        if not is_regular(head):
            kind = _KINDS.get(head[156:157], f"of tar type {head[156:157]!r}")
            target = head[157:257].split(b"\0", 1)[0]
            to = f" to {os.fsdecode(target)!r}" if kind.endswith("link") else ""
            raise ExportError(f"{where} is {kind}{to}; a dlindex shard holds only regular files")
        try:
            check_relative(name, "name")
        except ConfineError as e:
            raise ExportError(f"{shown}: member {e}") from None
        member_key, dot, ext = name.partition(b".")
        if not dot or not _KEY.fullmatch(member_key) or not _EXT.fullmatch(ext):
            raise ExportError(f"{where} is not named KEY.EXT as dlindex names members (KEY: the sample id's 12 digits)")
        if member_key != key:
            _sample_done(key, has_image, has_cls, shown)
            if member_key in seen:
                raise ExportError(f"{where}: sample {os.fsdecode(member_key)} appears twice in the shard")
            seen.add(member_key)
            key, has_image, has_cls = member_key, False, False
            ids.append(int(member_key.partition(b"_")[0]))
        if ext == b"cls":
            if size > _MAX_CLS_BYTES:
                raise ExportError(f"{where} is {size} bytes; a class number is a few digits")
            value = read()
            if not value.isdigit() or not int(value) < classes:
                raise ExportError(f"{where}: {value!r} is not a class of the export (0 to {classes - 1})")
            has_cls = True
        elif ext not in _NOT_IMAGE:
            has_image = True
    _sample_done(key, has_image, has_cls, shown)
    return ids


def _sample_done(key: bytes | None, has_image: bool, has_cls: bool, shown: str) -> None:
    if key is not None and not (has_image and has_cls):
        missing = "image member" if not has_image else ".cls member"
        raise ExportError(f"{shown}: sample {os.fsdecode(key)} has no {missing}")


def _check_ids(root: Path, index: Mapping[str, Any], found: array.array[int], problem: Callable[[str], None]) -> None:
    """ids.i64 (and each append's ids file after it) must hold the shards' sample ids in shard
    order (readers seek by it)."""
    try:
        ids = wds_ids(root, index, samples=len(found))
    except ExportError as e:
        problem(str(e).removeprefix(os.fsdecode(root) + "/"))
        return
    if ids is None:
        return  # written before ids.i64 existed
    if ids != found:
        k = next(i for i, (a, b) in enumerate(zip(ids, found, strict=True)) if a != b)
        problem(f"{IDS_FILE}: sample {k} is id {ids[k]}, the shards hold id {found[k]} there")
