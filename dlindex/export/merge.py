"""``merge_exports``: the N parts of a ``--part I/N`` export joined into one, without the catalog.

The parts must be all N parts of one export (one plan digest, one index.json head, each I
once). Each part's files are hard-linked (copied where a link cannot be made) into a
temporary folder beside the target under the names the one-machine export gives them, and
checked there against the part manifest (size and XXH3-128); the format's own files (wds
arrangement and ids.i64, mds split indexes) and index.json are then written by the same
functions ``export`` uses, and the folder is swapped in through ``OutputDir``. The result is
the one-machine export byte for byte, ``created_at`` aside. The parts are left as they were.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlindex.engines.local import sigterm_as_interrupt
from dlindex.export.describe import client_keys, complete_index, split_counts
from dlindex.export.outdir import OutputDir
from dlindex.export.part import Part, PlanGroup, group_folder, load_part
from dlindex.export.plan import ExportError
from dlindex.export.registry import record_export
from dlindex.export.shards import Features, ShardInfo, shard_name
from dlindex.exported.confine import ConfineError, hash_regular, open_regular, resolve_inside
from dlindex.exported.formats import Format, get, load
from dlindex.exported.index import listed_shards
from dlindex.exported.validate import check_index

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog


@dataclass(frozen=True)
class MergeSummary:
    out_dir: str
    format: str
    parts: int
    samples: int  # written, repeats included
    shards: int
    bytes: int
    linked: int  # files hard-linked from the parts; the others were copied
    recorded: bool  # noted in the catalog's exports (only when a catalog was given)
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def describe(self) -> str:
        """The summary as ``dlindex merge`` prints it."""
        copied = self.shards - self.linked if self.linked <= self.shards else 0
        return (
            f"merged {self.parts} part(s) into {self.out_dir} ({self.format}) in {self.seconds:.2f} s: "
            f"{self.samples} samples, {self.shards} shards, {self.bytes} bytes"
            + (f", {copied} file(s) copied (no hard link possible)" if copied else "")
        )


def merge_exports(
    parts: Sequence[str | os.PathLike[str]],
    into: str | os.PathLike[str],
    overwrite: bool = False,
    *,
    catalog: Catalog | None = None,
) -> MergeSummary:
    """Join the folders of all N parts of a ``--part`` export into the export ``into``,
    atomically; ExportError (nothing written) unless they are exactly the N parts of one
    export and every file is what its part manifest says.

    Args:
        overwrite: replace ``into`` if it holds a dlindex export and nothing else.
        catalog: the catalog the parts were exported from: the merged export is recorded in
            it (as ``export`` records its exports); without it, nothing is recorded.
    """
    started = time.perf_counter()
    loaded = _load_all(parts)
    first = loaded[0]
    head, fmt, groups = first.head, get(first.format), first.groups
    target = Path(into)
    _check_target(target, loaded)
    if catalog is not None:
        _check_catalog(catalog, head)
    source = head["catalog"]["path"]
    protected = [source, *(source + suffix for suffix in ("-wal", "-journal", "-shm"))]
    output = OutputDir(target, overwrite, protected, [head["file_root"]])
    linked = 0
    restore = sigterm_as_interrupt()  # a SIGTERM removes the temporary folder, as Ctrl-C does
    try:
        by_index = {part.shard.index: part for part in loaded}
        splits = tuple(dict.fromkeys(g.split for g in groups))
        shards: list[ShardInfo] = []
        numbers: Counter[str] = Counter()
        for position, group in enumerate(groups):
            part = by_index[group.part]
            mine = part.written[position]
            names = _names(fmt, group, numbers[group.split], len(mine), part)
            local = _names(fmt, group, 0, len(mine), part)
            numbers[group.split] += len(mine) // fmt.files_per_shard
            for shard, name, expected in zip(mine, names, local, strict=True):
                if shard.file != f"{group_folder(position)}/{expected}":
                    raise ExportError(f"{part.folder}: its part manifest lists {shard.file!r} where group "
                                      f"{position} has {group_folder(position)}/{expected}; rerun part {part.shard}")  # fmt: skip
                (output.tmp / name).parent.mkdir(exist_ok=True)  # mds: its split's folder
                linked += _place(part, shard, output.tmp / name)
                shards.append(ShardInfo(name, shard.split, shard.rank, shard.samples, shard.bytes, shard.xxh3_128,
                                        shard.first))  # fmt: skip
        options = head["options"]
        features = recorded_features(head.get("features"))
        extra: list[dict[str, Any]] = []
        if fmt.finish is not None:  # the same as export's, on the same files
            shards, extra = load(fmt.finish)(
                output.tmp, shards, splits, world_size=options["world_size"], workers=options["workers"],
                features=features, shard_bytes=options["shard_bytes"], texts=bool(options.get("texts")),
            )  # fmt: skip
        seen = {ext for part in loaded for ext in part.seen}
        clients = client_keys(
            fmt.name, shards, splits, seen, features, options["shard_bytes"], bool(options.get("texts"))
        )
        counts = split_counts(
            [(g.split, g.rank) for g in groups], {(g.split, g.rank): g.samples for g in groups},
            [entry for part in loaded for entry in part.labels],
        )  # fmt: skip
        index = complete_index(head, counts, shards, extra, clients)
        name = fmt.index
        data = json.loads(index)
        check_index(data, f"the merged {name}", listed_shards(data))  # a part manifest can be hand-edited
        (output.tmp / name).write_bytes(index)
        output.commit()
        recorded = False
        if catalog is not None:  # best effort, as export's: the merged export is done
            recorded = record_export(catalog, target, fmt.name, data["counts"]["samples"], head["catalog"]["changes"])
    except BaseException:
        output.abort()  # never leave a half export that looks whole
        raise
    finally:
        restore()
    return MergeSummary(
        out_dir=str(target), format=fmt.name, parts=len(loaded), samples=data["counts"]["samples"], shards=len(shards),
        bytes=sum(s.bytes for s in shards) + sum(f["bytes"] for f in extra) + len(index), linked=linked,
        recorded=recorded, seconds=round(time.perf_counter() - started, 3),
    )  # fmt: skip


def _load_all(folders: Sequence[str | os.PathLike[str]]) -> list[Part]:
    """The part manifests, in part order, once each, all of one export; else ExportError."""
    if not folders:
        raise ExportError("no parts to merge; name the N folders that export --part I/N wrote")
    parts: list[Part] = []
    seen: dict[str, str] = {}
    for folder in folders:
        real = os.path.realpath(folder)
        if real in seen:
            raise ExportError(f"{os.fspath(folder)} is given twice (as {seen[real]}); name each part once")
        seen[real] = os.fspath(folder)
        parts.append(load_part(folder))
    parts.sort(key=lambda p: p.shard.index)
    first = parts[0]
    for other, part in itertools.pairwise(parts):
        if part.shard.count != first.shard.count:
            raise ExportError(f"{first.folder} is part {first.shard} and {part.folder} part {part.shard}: "
                              "parts of different exports")  # fmt: skip
        if part.shard.index == other.shard.index:
            raise ExportError(f"{other.folder} and {part.folder} are both part {part.shard}; name each part once")
        differs = _difference(first, part)
        if differs is not None:
            raise ExportError(f"{first.folder} and {part.folder} are parts of different exports ({differs} differs); "
                              "export every part from the same catalog with the same options")  # fmt: skip
    missing = sorted(set(range(first.shard.count)) - {p.shard.index for p in parts})
    if missing:
        shown = ", ".join(f"{i}/{first.shard.count}" for i in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise ExportError(f"part {shown} missing: give all {first.shard.count} parts of the export")
    return parts


def _difference(a: Part, b: Part) -> str | None:
    """What makes two parts parts of different exports, in words; None if nothing."""
    if a.groups != b.groups or a.digest != b.digest:
        return "the plan (the selected samples, their splits and ranks)"
    if a.schema != b.schema:
        return "the catalog's schema version"
    return _first_key(a.head, b.head)


def _first_key(a: Any, b: Any, path: str = "") -> str | None:
    """The first key (dotted) where two JSON values differ; None if they are equal."""
    if isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b):
        for key in a:
            found = _first_key(a[key], b[key], f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    if a == b and type(a) is type(b):
        return None
    return path or "index.json"


def _check_target(target: Path, parts: Sequence[Part]) -> None:
    real = os.path.realpath(target)
    for part in parts:
        folder = os.path.realpath(part.folder)
        if real == folder or real.startswith(folder.rstrip("/") + "/"):
            raise ExportError(f"cannot merge into {target}: it is (or is inside) the part {part.folder}; "
                              "merge into a new folder")  # fmt: skip


def _check_catalog(catalog: Catalog, head: dict[str, Any]) -> None:
    recorded = head["catalog"]["path"]
    here = catalog.location
    try:
        same = os.path.samefile(recorded, here)
    except OSError:
        same = recorded == here
    if not same:
        raise ExportError(f"the parts were exported from the catalog {recorded}, not {here}")


def _names(fmt: Format, group: PlanGroup, base: int, count: int, part: Part) -> list[str]:
    """The names a one-machine export gives a group's ``count`` shard files, numbered from
    ``base`` (the shards its split's earlier groups wrote); the same rules as the writers'."""
    if fmt.names is not None:
        names: list[str] = load(fmt.names)(group.split, group.rank, base, count)
        return names
    per = fmt.files_per_shard  # each suffix's files in turn (dali: the lists, then their manifests)
    if count % per:
        raise ExportError(f"{part.folder}: a {fmt.name} group lists {count} files, not one of each of "
                          f"{', '.join(fmt.suffixes)} per shard; rerun part {part.shard}")  # fmt: skip
    each = count // per
    return [shard_name(group.split, base + k % each, fmt.suffixes[k // each]) for k in range(count)]


def _place(part: Part, shard: ShardInfo, target: Path) -> int:
    """Hard-link (else copy) a part's file to ``target`` and check it there: 1 if linked."""
    shown = f"{part.folder}/{shard.file}"
    rerun = f"rerun part {part.shard}"
    try:
        source = resolve_inside(os.fsencode(part.folder), shard.file, what="file")
        fd, _ = open_regular(source, shard.bytes)
    except FileNotFoundError:
        raise ExportError(f"{shown} is missing; {rerun}") from None
    except ConfineError as e:
        raise ExportError(f"{part.folder}: {e}; {rerun}") from None
    except OSError as e:
        raise ExportError(f"cannot read {shown}: {e.strerror}") from None
    linked = 1
    try:
        try:
            os.link(source, target, follow_symlinks=False)
        except OSError:  # another file system, or links not allowed: copy what was opened
            linked = 0
            with os.fdopen(os.dup(fd), "rb") as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 22)
    finally:
        os.close(fd)
    try:
        size, digest = hash_regular(os.fsencode(target), shard.bytes)
    except ConfineError as e:
        raise ExportError(f"{shown}: {e}; {rerun}") from None
    if size != shard.bytes:
        raise ExportError(f"{shown} has {size} bytes, its part manifest says {shard.bytes}; {rerun}")
    if digest != shard.xxh3_128:
        raise ExportError(f"{shown}: checksum differs from its part manifest; {rerun}")
    return linked


def recorded_features(value: Any) -> Features | None:
    """The feature type's shape as index.json records it (merge fetches no vectors)."""
    if value is None:
        return None
    version = value.get("extractor_version")
    return Features(
        value["name"], value["dtype"], value["dim"], _no_fetch, version if isinstance(version, str) else None
    )


def _no_fetch(ids: list[int]) -> dict[int, bytes]:
    raise AssertionError("merge and append never read feature vectors")  # pragma: no cover
