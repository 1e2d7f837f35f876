"""One part of a ``--part I/N`` export: which plan groups it writes, and its part manifest.

Part I of N writes the groups ``balanced_parts`` gives it (by samples per (split, rank)
group), each into its own folder ``g{group:06d}/`` with the shard names a one-machine export
would give that group if it were the first of its split; ``dlindex-part.json`` records what
``dlindex.export.merge`` needs to number them, check them and write index.json without the
catalog. Everything in it is checked here before the merge uses it: it may be damaged or
hand-edited.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import xxhash

from dlindex.engines.parts import MAX_PARTS as MAX_SHARDS
from dlindex.engines.parts import Part as Shard  # export/ says Shard for a part until its restructuring settles
from dlindex.engines.parts import balanced_parts
from dlindex.export.plan import ExportError, Group, Plan
from dlindex.export.shards import Context, ShardInfo
from dlindex.exported.confine import MAX_INDEX_BYTES, ConfineError, check_relative, read_regular
from dlindex.exported.formats import get
from dlindex.exported.index import INDEX_VERSION, PART_INDEX
from dlindex.exported.validate import KNOWN_FORMATS, MAX_COUNT, MAX_WORLD_SIZE

PART_VERSION = 1
_HEX = frozenset("0123456789abcdef")
_DTYPES = ("<f4", "<f8", "<f2")
_SPLIT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@dataclass(frozen=True)
class PlanGroup:
    """One (split, rank) group of the plan: its samples (repeats included) and the part that writes it."""

    split: str
    rank: int
    samples: int
    part: int


@dataclass(frozen=True)
class Part:
    """A part manifest, checked. ``written`` maps a group's position in ``groups`` to its
    shards, named relative to ``folder``, in the order the group's writer made them."""

    folder: Path
    shard: Shard
    digest: str  # the plan's XXH3-128: every part of one export computed the same plan
    schema: int  # the catalog's schema version
    groups: tuple[PlanGroup, ...]
    head: dict[str, Any]  # index.json without what depends on the files (describe.describe_export)
    seen: tuple[str, ...]  # wds: image member suffixes written
    labels: tuple[tuple[str, str, int], ...]  # (split, class, samples written)
    written: dict[int, tuple[ShardInfo, ...]]

    @property
    def format(self) -> str:
        return str(self.head["format"])

    def listed(self) -> dict[str, int]:
        """Every file of the part folder by name, with its size (-1: the manifest itself)."""
        sizes = {s.file: s.bytes for shards in self.written.values() for s in shards}
        sizes[PART_INDEX] = -1
        return sizes


def group_folder(position: int) -> str:
    return f"g{position:06d}"


def plan_digest(plan: Plan) -> str:
    """XXH3-128 of the plan: every group's split, rank, repeats and rows, in order."""
    hasher = xxhash.xxh3_128()
    for group in plan.groups:
        rows = group.rows
        assert isinstance(rows, Collection)  # a --part export never streams its rows: a list, or spilled
        hasher.update(f"{group.split}\0{group.rank}\0{group.padded}\0{len(rows)}\n".encode())
        hasher.update("\n".join(map(repr, rows)).encode("utf-8", "surrogateescape"))
    return hasher.hexdigest()


def owners(plan: Plan, count: int) -> list[int]:
    """The part (0..count-1) that writes each group: balanced by samples, the same on every machine."""
    return balanced_parts([len(g.rows) for g in plan.groups], count)  # type: ignore[arg-type]


def write_groups(
    ctx: Context, shard: Shard, owner: Sequence[int], writer: Callable[[Context, Group, int], list[ShardInfo]]
) -> dict[int, list[ShardInfo]]:
    """Write this part's groups, each into its own folder numbered from 0: group -> its shards."""
    written: dict[int, list[ShardInfo]] = {}
    for position, group in enumerate(ctx.plan.groups):
        if owner[position] != shard.index:
            continue
        folder = group_folder(position)
        (ctx.out / folder).mkdir()
        shards = writer(replace(ctx, out=ctx.out / folder), group, 0)
        written[position] = [_inside(s, folder) for s in shards]
    return written


def _inside(shard: ShardInfo, folder: str) -> ShardInfo:
    return ShardInfo(f"{folder}/{shard.file}", shard.split, shard.rank, shard.samples, shard.bytes, shard.xxh3_128,
                     shard.first)  # fmt: skip


def part_manifest(
    shard: Shard, plan: Plan, owner: Sequence[int], digest: str, schema: int, head: Mapping[str, Any],
    seen: Sequence[str], labels: Sequence[tuple[str, str, int]], written: Mapping[int, Sequence[ShardInfo]],
) -> bytes:  # fmt: skip
    """The bytes of ``dlindex-part.json``."""
    data = {
        "dlindex_part": PART_VERSION,
        "shard": str(shard),
        "plan": {
            "xxh3_128": digest,
            "groups": [[g.split, g.rank, len(g.rows), owner[i]] for i, g in enumerate(plan.groups)],  # type: ignore[arg-type]
        },
        "catalog_schema": schema,
        "index": dict(head),
        "seen": sorted(seen),
        "labels": [list(entry) for entry in labels],
        "written": [
            {"group": position, "shards": [{**s.as_dict(), "first": s.first} for s in shards]}
            for position, shards in sorted(written.items())
        ],
    }
    return (json.dumps(data, indent=1, ensure_ascii=True) + "\n").encode()


def load_part(folder: str | os.PathLike[str]) -> Part:
    """The checked part manifest of ``folder``; ExportError (one line) if it has none or it is damaged."""
    path = Path(folder) / PART_INDEX
    try:
        raw = read_regular(os.fspath(path), MAX_INDEX_BYTES)
    except FileNotFoundError:
        raise ExportError(f"{folder} is not a part of a --part export: no {PART_INDEX}") from None
    except ConfineError as e:
        raise ExportError(str(e)) from None
    except OSError as e:
        raise ExportError(f"cannot read {path}: {e.strerror}") from None
    return parse_part(raw, Path(folder))


def parse_part(raw: bytes, folder: Path) -> Part:
    """A part manifest from its bytes, every value the merge uses checked."""
    where = os.path.join(os.fspath(folder), PART_INDEX)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ExportError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ExportError(f"{where}, line {e.lineno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ExportError(f"{where}: nested too deeply to be a part manifest") from None
    check = _Checker(where)
    data = check.obj(data, "the manifest")
    version = data.get("dlindex_part")
    if version != PART_VERSION or isinstance(version, bool):
        raise ExportError(f"{where}: part manifest version {_short(version)}; this dlindex reads version "
                          f"{PART_VERSION} (merge with the dlindex that wrote the parts)")  # fmt: skip
    shard = _shard(check.text(data.get("shard"), "shard"), where)
    plan = check.obj(data.get("plan"), "plan")
    digest = check.digest(plan.get("xxh3_128"), "plan.xxh3_128")
    groups = tuple(_plan_group(check, g, f"plan.groups[{i}]", shard.count)
                   for i, g in enumerate(check.items(plan.get("groups"), "plan.groups")))  # fmt: skip
    schema = check.number(data.get("catalog_schema"), "catalog_schema", 0, 1 << 31)
    head = _head(check, data.get("index"))
    seen = tuple(check.text(s, "seen[]") for s in check.items(data.get("seen"), "seen"))
    splits = {g.split for g in groups}
    labels = []
    for i, entry in enumerate(check.items(data.get("labels"), "labels")):
        items = check.items(entry, f"labels[{i}]")
        if len(items) != 3:
            raise ExportError(f"{where}: labels[{i}] must be [split, class, samples]")
        split, name = check.text(items[0], f"labels[{i}][0]"), check.text(items[1], f"labels[{i}][1]")
        if split not in splits or name not in head["classes"]:
            raise ExportError(f"{where}: labels[{i}] names a split or class the export does not have")
        labels.append((split, name, check.number(items[2], f"labels[{i}][2]")))
    written: dict[int, tuple[ShardInfo, ...]] = {}
    for i, entry in enumerate(check.items(data.get("written"), "written")):
        key = f"written[{i}]"
        entry = check.obj(entry, key)
        position = check.number(entry.get("group"), f"{key}.group", 0, len(groups) - 1)
        if position in written:
            raise ExportError(f"{where}: {key} lists group {position} a second time")
        group = groups[position]
        if group.part != shard.index:
            raise ExportError(f"{where}: {key}: group {position} belongs to part {group.part}, not {shard.index}")
        shards = tuple(_shard_entry(check, s, f"{key}.shards[{j}]", group)
                       for j, s in enumerate(check.items(entry.get("shards"), f"{key}.shards")))  # fmt: skip
        per_file = get(head["format"]).files_per_shard  # dali: a list and its jsonl manifest
        if sum(s.samples for s in shards) != group.samples * per_file:
            raise ExportError(f"{where}: {key}: its shards hold {sum(s.samples for s in shards)} samples, "
                              f"the plan gives the group {group.samples}")  # fmt: skip
        written[position] = shards
    missing = [i for i, g in enumerate(groups) if g.part == shard.index and i not in written]
    if missing:
        raise ExportError(f"{where}: group {missing[0]} of part {shard} is not listed as written")
    names = [s.file for shards in written.values() for s in shards]
    if len(set(names)) != len(names) or PART_INDEX in names:
        raise ExportError(f"{where}: a file is listed twice")
    return Part(folder, shard, digest, schema, groups, head, seen, tuple(labels), written)


def _shard(text: str, where: str) -> Shard:
    index, sep, count = text.partition("/")
    if not (sep and index.isdigit() and count.isdigit() and len(index) <= 6 and len(count) <= 6):
        raise ExportError(f"{where}: shard must be I/N, not {_short(text)}")
    if not (1 <= int(count) <= MAX_SHARDS and int(index) < int(count)):
        raise ExportError(f"{where}: shard {_short(text)} is not a part of N (I from 0 to N-1)")
    return Shard(int(index), int(count))


def _plan_group(check: _Checker, value: Any, key: str, count: int) -> PlanGroup:
    items = check.items(value, key)
    if len(items) != 4:
        raise ExportError(f"{check.where}: {key} must be [split, rank, samples, part]")
    split = check.text(items[0], f"{key}[0]")
    if not split or len(split) > 64 or not set(split) <= _SPLIT_CHARS:
        raise ExportError(f"{check.where}: {key}: split {_short(split)} must be letters, digits or _")
    rank = check.number(items[1], f"{key}[1]", 0, MAX_WORLD_SIZE - 1)
    return PlanGroup(
        split, rank, check.number(items[2], f"{key}[2]"), check.number(items[3], f"{key}[3]", 0, count - 1)
    )


def _shard_entry(check: _Checker, value: Any, key: str, group: PlanGroup) -> ShardInfo:
    entry = check.obj(value, key)
    name = check.text(entry.get("file"), f"{key}.file")
    try:
        check_relative(name.encode("utf-8", "surrogateescape"), "file")
    except ConfineError as e:
        raise ExportError(f"{check.where}: {key}: {e}") from None
    if entry.get("split") != group.split or entry.get("rank") != group.rank:
        raise ExportError(f"{check.where}: {key} is not of its group's split and rank")
    return ShardInfo(
        name, group.split, group.rank, check.number(entry.get("samples"), f"{key}.samples"),
        check.number(entry.get("bytes"), f"{key}.bytes"), check.digest(entry.get("xxh3_128"), f"{key}.xxh3_128"),
        check.number(entry.get("first"), f"{key}.first"),
    )  # fmt: skip


def _head(check: _Checker, value: Any) -> dict[str, Any]:
    """index.json's describe_export part: what the merge reads from it must be what it expects."""
    head = check.obj(value, "index")
    from dlindex.version import __version__

    if head.get("dlindex_export") != INDEX_VERSION:
        raise ExportError(f"{check.where}: the parts were written for export version "
                          f"{_short(head.get('dlindex_export'))}; this dlindex writes {INDEX_VERSION}")  # fmt: skip
    if head.get("dlindex_version") != __version__:
        raise ExportError(f"{check.where}: written by dlindex {_short(head.get('dlindex_version'))}; "
                          f"merge with that version (this is {__version__})")  # fmt: skip
    if head.get("format") not in KNOWN_FORMATS:
        raise ExportError(f"{check.where}: index.format must be one of {', '.join(KNOWN_FORMATS)}")
    catalog = check.obj(head.get("catalog"), "index.catalog")
    if "\0" in check.text(catalog.get("path"), "index.catalog.path"):
        raise ExportError(f"{check.where}: index.catalog.path holds a NUL byte")
    check.number(catalog.get("changes"), "index.catalog.changes", -MAX_COUNT - 1)
    root = check.text(head.get("file_root"), "index.file_root")
    if not root.startswith("/") or "\0" in root:
        raise ExportError(f"{check.where}: index.file_root must be an absolute path, not {_short(root)}")
    options = check.obj(head.get("options"), "index.options")
    check.number(options.get("world_size"), "index.options.world_size", 1, MAX_WORLD_SIZE)
    if options.get("shard_bytes") is not None:
        check.number(options.get("shard_bytes"), "index.options.shard_bytes", 1)
    if get(head["format"]).workers:
        check.number(options.get("workers"), "index.options.workers", 1, 1 << 20)
    features = head.get("features")
    if features is not None:
        features = check.obj(features, "index.features")
        check.text(features.get("name"), "index.features.name")
        check.number(features.get("dim"), "index.features.dim", 1, 1 << 24)
        if features.get("dtype") not in _DTYPES:
            raise ExportError(f"{check.where}: index.features.dtype must be one of {', '.join(_DTYPES)}")
    counts = check.obj(head.get("counts"), "index.counts")
    if list(counts) != ["samples", "selected", "dropped", "padded", "splits", "skipped"]:
        raise ExportError(f"{check.where}: index.counts does not have the keys an export's index.json has")
    classes = check.items(head.get("classes"), "index.classes")
    if not all(isinstance(c, str) for c in classes):
        raise ExportError(f"{check.where}: index.classes must be a list of class names")
    for key in ("created_at", "dlindex_shards", "files"):
        if key not in head:
            raise ExportError(f"{check.where}: index has no {key!r}")
    return head


class _Checker:
    """Checks of one manifest's values, each ExportError naming the manifest and the key."""

    def __init__(self, where: str) -> None:
        self.where = where

    def obj(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ExportError(f"{self.where}: {key} must be an object, not {_short(value)}")
        return value

    def items(self, value: Any, key: str) -> list[Any]:
        if not isinstance(value, list):
            raise ExportError(f"{self.where}: {key} must be a list, not {_short(value)}")
        return value

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise ExportError(f"{self.where}: {key} must be text, not {_short(value)}")
        return value

    def number(self, value: Any, key: str, low: int = 0, high: int = MAX_COUNT) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ExportError(f"{self.where}: {key} must be a whole number from {low} to {high}, not {_short(value)}")
        return value

    def digest(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or len(value) != 32 or not set(value) <= _HEX:
            raise ExportError(f"{self.where}: {key} must be 32 hex digits (an XXH3-128), not {_short(value)}")
        return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
