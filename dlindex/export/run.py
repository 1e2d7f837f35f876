"""``dlindex export``: select, plan and write one export, then its index.json."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlindex.catalog.classes import SPLITS, has_presplit_root
from dlindex.export.dali import write_dali
from dlindex.export.files import hash_file, packable
from dlindex.export.manifest import _pyarrow, write_csv, write_jsonl, write_parquet
from dlindex.export.mds import VERSION as MDS_VERSION
from dlindex.export.mds import split_index, streaming_shards, write_mds
from dlindex.export.outdir import OutputDir
from dlindex.export.plan import ExportError, Plan, make_plan, parse_split, select_halves, select_rows, tree_split_choice
from dlindex.export.reader import (
    INDEX_VERSION,
    SHARDS_KEY,
    index_name,
)
from dlindex.export.shards import Context, ShardInfo
from dlindex.export.validate import MAX_COUNT, MAX_WORLD_SIZE
from dlindex.export.vectors import feature_source
from dlindex.export.wds import DEFAULT_WORKERS, arrange, hf_features, image_key_spec, write_wds
from dlindex.procs import sigterm_as_interrupt
from dlindex.query.rows import split_counts
from dlindex.query.spec import QuerySpec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog

WRITERS: dict[str, Callable[[Context, Any, int], list[ShardInfo]]] = {
    "jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet, "dali": write_dali,
    "wds": write_wds, "mds": write_mds,
}  # fmt: skip
FORMATS = tuple(WRITERS)
# Packed formats cut shards by size unless told otherwise (mds: streaming's own default).
DEFAULT_SHARD_BYTES = {"wds": 256 << 20, "mds": 64 << 20}
PACKED = ("wds", "mds")  # the formats that read and carry the image bytes
MAX_SHARD_SAMPLES = 1 << 31
MAX_SHARD_BYTES = 1 << 40
MAX_READ_THREADS = 256
MAX_WORKERS = 1024  # shards per rank: a DataLoader has far fewer workers
_ROOTS = "SELECT path FROM roots"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.I)

# fmt: skip


@dataclass(frozen=True)
class ExportOptions:
    """What ``dlindex export`` takes besides OUT_DIR; ``query`` holds the filters of ``dlindex query``.

    Args:
        shard_bytes: an int or text such as ``"256MiB"``, ``"1GB"``.
        split: ``"train=0.9,val=0.1"`` or a mapping: assigned by content hash; ``"tree"``: the
            tree's split folders; ``"val"``, ``"train,val"``: only these split folders. None:
            the tree's split folders when the selection is in split folders, else one split.
        drop_last: with ``world_size`` > 1, drop the remainder instead of padding with repeats.
        read_threads: read source files ahead with this many threads (cold caches, packed formats).
        workers: wds: every rank gets at least this many shards (a multiple of it), so a
            ``DataLoader(num_workers=N)`` with N up to this never has a worker without a shard.
    """

    format: str = "jsonl"
    query: QuerySpec = field(default_factory=QuerySpec)
    shard_size: int | None = None
    shard_bytes: int | str | None = None
    shuffle: bool = False
    seed: int = 0
    split: Mapping[str, float] | str | None = None
    world_size: int = 1
    drop_last: bool = False
    features: str | None = None
    absolute_paths: bool = False
    overwrite: bool = False
    read_threads: int = 0
    workers: int = DEFAULT_WORKERS


@dataclass(frozen=True)
class ExportSummary:
    out_dir: str
    format: str
    samples: int  # written, repeats included
    selected: int
    dropped: int
    padded: int
    splits: dict[str, int]
    shards: int
    bytes: int
    seconds: float
    skipped: dict[str, int] = field(default_factory=dict)  # sources not packed, by reason

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def parse_size(value: int | str | None) -> int | None:
    """Bytes from ``123``, ``"64MiB"``, ``"1.5GB"``, ``"500k"`` (K/M/G alone and KiB.. are powers of 1024)."""
    if value is None or isinstance(value, int):
        return value
    match = _SIZE.match(value)
    if not match:
        raise ExportError(f"size {value!r}: write a number of bytes with an optional unit, e.g. 256MiB or 1GB")
    number, unit, binary, b = match.groups()
    power = "kmgt".index(unit.lower()) + 1 if unit else 0
    base = 1000 if (unit and b and not binary) else 1024
    if len(number) > 20:  # float() of 400 digits is inf; no shard is that large anyway
        raise ExportError(f"size {value!r} is larger than {MAX_SHARD_BYTES} bytes")
    return int(float(number) * base**power)


def check_bounds(options: ExportOptions, shard_bytes: int | None) -> None:
    """ExportError for an option outside what an export can honour, before anything is allocated."""
    spec = options.query
    bounds: list[tuple[str, Any, int, int]] = [
        ("--shard-size", options.shard_size, 1, MAX_SHARD_SAMPLES),
        ("--shard-bytes", shard_bytes, 1, MAX_SHARD_BYTES),
        ("--world-size", options.world_size, 1, MAX_WORLD_SIZE),
        ("--read-threads", options.read_threads, 0, MAX_READ_THREADS),
        ("--workers", options.workers, 1, MAX_WORKERS),
        ("--seed", options.seed, -MAX_COUNT - 1, MAX_COUNT),
        ("--limit", spec.limit, 0, MAX_COUNT),
        ("--per-label", spec.per_label, 0, MAX_COUNT),
        ("--min-width", spec.min_width, 0, MAX_COUNT),
        ("--min-height", spec.min_height, 0, MAX_COUNT),
    ]  # fmt: skip
    for name, value, low, high in bounds:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ExportError(f"{name} must be a whole number, not {value!r}")
        if not low <= value <= high:
            unit = " byte" if name == "--shard-bytes" else ""
            raise ExportError(f"{name} must be at least {low}{unit} and at most {high}, not {value}")


def export_catalog(
    catalog: Catalog,
    out_dir: str | os.PathLike[str],
    options: ExportOptions | None = None,
    progress: Callable[[int], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> ExportSummary:
    """Write an export of the selected samples to ``out_dir``, atomically; raise ExportError
    (an InputError) before writing anything when an option or the selection is unusable.

    Args:
        progress: called with the number of samples written since the last call.
        warn: called with one line for each source file skipped (wds, mds: not a regular
            file, or not of its catalogued size); they are counted in ``skipped``.
    """
    options = options or ExportOptions()
    started = time.perf_counter()
    fmt = options.format
    if fmt not in WRITERS:
        raise ExportError(f"unknown format {fmt!r}; choose from: {', '.join(FORMATS)}")
    if fmt == "parquet":
        _pyarrow()
    tree = tree_split_choice(options.split)
    split = None if tree is not None else parse_split(options.split)
    shard_bytes = parse_size(options.shard_bytes)
    check_bounds(options, shard_bytes)
    if options.shard_size is None and shard_bytes is None:
        shard_bytes = DEFAULT_SHARD_BYTES.get(fmt)
    target = Path(out_dir)
    # Before anything is read: OUT_DIR must be safe to write (and to replace, with --overwrite).
    output = OutputDir(target, options.overwrite, protected_files(catalog), [r for (r,) in catalog.read(_ROOTS, {})])
    skipped: Counter[str] = Counter()
    restore = sigterm_as_interrupt()  # a SIGTERM removes the temporary folder, as Ctrl-C does
    try:
        features = feature_source(catalog, options.features) if options.features else None
        changes = catalog.changes()
        # A file without a class (directly under ROOT) has no label_id to train on: ImageFolder
        # leaves such files out too.
        query = replace(options.query, has_class=True, split=tree or options.query.split)
        tree_names = _tree_splits(catalog, query, tree) if split is None else None
        tree_rows: dict[str, list[tuple[Any, ...]]] | None = None
        upper = None
        if tree_names is not None:
            tree_rows = {}
            for name in tree_names:
                part, prepared = select_rows(catalog, replace(query, split=(name,)), options.shuffle, options.seed)
                if fmt in PACKED:  # these read every source: only regular files of their catalogued size
                    part = packable(part, {k: v[1] for k, v in (prepared.roots or {}).items()}, skipped, warn)
                tree_rows[name] = list(part)
            rows: Any = ()
        else:
            # Only a plain single jsonl file is written in two halves (the writer appends the
            # second process's part); every other export needs all the rows here.
            halves = (fmt == "jsonl" and options.shard_size is None and shard_bytes is None and features is None
                      and not split and options.world_size == 1)  # fmt: skip
            if halves:
                rows, prepared, upper = select_halves(catalog, query, options.shuffle, options.seed)
            else:
                rows, prepared = select_rows(catalog, query, options.shuffle, options.seed)
            if fmt in PACKED:  # these read every source: only regular files of their catalogued size
                rows = packable(rows, {k: v[1] for k, v in (prepared.roots or {}).items()}, skipped, warn)
        plan = make_plan(
            rows, prepared.classes or (), prepared.class_index or {}, prepared.roots or {},
            class_list=prepared.class_list or "catalog", split=split, tree_splits=tree_rows,
            world_size=options.world_size, drop_last=options.drop_last, absolute_paths=options.absolute_paths,
            stream=fmt != "dali",
        )  # fmt: skip
        del rows, tree_rows
        split_option: Any = "tree" if tree_names is not None else split
        ctx = Context.make(
            plan, output.tmp, shard_size=options.shard_size, shard_bytes=shard_bytes, features=features,
            progress=progress, read_threads=options.read_threads, upper=upper if fmt == "jsonl" else None,
        )  # fmt: skip
        shards: list[ShardInfo] = []
        numbers: Counter[str] = Counter()
        for group in plan.groups:
            written = WRITERS[fmt](ctx, group, numbers[group.split])
            numbers[group.split] += len(written) // (2 if fmt == "dali" else 1)
            shards.extend(written)
        if fmt == "wds":
            shards = arrange(ctx.out, shards, plan.splits, options.world_size, options.workers)
        selected = plan.selected if plan.selected is not None else plan.samples
        if not selected:
            if skipped:
                raise ExportError(f"no samples left to export: {sum(skipped.values())} skipped (see the warnings)")
            raise ExportError("no samples match the filters; nothing exported")
        extra: list[dict[str, Any]] = []
        if fmt == "mds":
            for name, data in split_index(ctx, shards).items():
                (output.tmp / name).write_bytes(data)
                size, digest = hash_file(output.tmp / name)
                extra.append({"file": name, "bytes": size, "xxh3_128": digest})
        clients = _client_keys(ctx, fmt, shards)
        index = build_index(
            catalog, replace(options, query=query, split=split_option), fmt, shard_bytes, changes, plan, selected,
            shards, extra, features, clients, skipped,
        )  # fmt: skip
        (output.tmp / index_name(fmt)).write_bytes(index)
        output.commit()
    except BaseException:
        output.abort()  # never leave a half export that looks whole
        raise
    finally:
        restore()
    total = sum(s.bytes for s in shards) + sum(f["bytes"] for f in extra) + len(index)
    return ExportSummary(
        out_dir=str(target), format=fmt, samples=plan.samples, selected=selected, dropped=plan.dropped,
        padded=plan.padded, splits=_split_counts(plan), shards=len(shards), bytes=total,
        skipped=dict(sorted(skipped.items())), seconds=round(time.perf_counter() - started, 3),
    )  # fmt: skip


def build_index(
    catalog: Catalog, options: ExportOptions, fmt: str, shard_bytes: int | None, changes: int, plan: Plan,
    selected: int, shards: list[ShardInfo], extra: list[dict[str, Any]], features: Any,
    clients: Mapping[str, Any] | None = None,
    skipped: Mapping[str, int] | None = None,
) -> bytes:  # fmt: skip
    """index.json: the only file with a wall-clock time in it ($SOURCE_DATE_EPOCH fixes it)."""
    from dlindex import __version__

    spec = options.query
    counts: dict[str, Any] = {}
    for group in plan.groups:
        entry = counts.setdefault(group.split, {"samples": 0, "ranks": [], "labels": {}})
        n = plan.tally.samples[(group.split, group.rank)]
        entry["samples"] += n
        entry["ranks"].append(n)
    for (split, label), n in plan.tally.labels.items():
        name = plan.labels[plan.label_index[label]]
        counts[split]["labels"][name] = counts[split]["labels"].get(name, 0) + n
    for entry in counts.values():
        entry["labels"] = dict(sorted(entry["labels"].items()))
    index = {
        "dlindex_export": INDEX_VERSION,
        "format": fmt,
        "created_at": _created_at(),
        "dlindex_version": __version__,
        "catalog": {"path": os.fsdecode(os.path.abspath(catalog.path)), "changes": changes},
        "filters": {
            "labels": list(spec.labels), "split": list(spec.split), "classes": spec.classes, "status": list(spec.status), "processed": spec.processed,
            "processing_status": list(spec.processing_status),
            "since": None if spec.since is None else str(spec.since),
            "until": None if spec.until is None else str(spec.until),
            "min_width": spec.min_width, "min_height": spec.min_height, "per_label": spec.per_label,
            "limit": spec.limit,
        },
        "options": {
            "shuffle": options.shuffle, "seed": options.seed,
            "split": options.split if options.split == "tree" else parse_split(options.split),
            "world_size": options.world_size, "drop_last": options.drop_last and options.world_size > 1,
            "shard_size": options.shard_size, "shard_bytes": shard_bytes, "features": options.features,
            "absolute_paths": options.absolute_paths, "workers": options.workers if fmt == "wds" else None,
        },
        "file_root": os.fsdecode(plan.file_root.rstrip(b"/") or b"/"),
        # label_id is the index in "classes"; "class_list" says which list that is ("labels":
        # the --label names only, "catalog": all the catalog's classes). "labels" is the same
        # list as an object, kept for readers of older exports.
        "classes": list(plan.labels),
        "class_list": plan.class_list,
        "labels": {str(k): name for k, name in enumerate(plan.labels)},
        "features": None if features is None else {"name": features.name, "dtype": features.dtype, "dim": features.dim},
        "counts": {
            "samples": plan.samples, "selected": selected,
            "dropped": plan.dropped, "padded": plan.padded, "splits": counts,
            "skipped": dict(sorted((skipped or {}).items())),
        },
        SHARDS_KEY: [s.as_dict() for s in shards],
        "files": extra,
        **(clients or {}),
    }  # fmt: skip
    try:
        text = json.dumps(index, indent=1, ensure_ascii=False)
        return (text + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(index, indent=1, ensure_ascii=True) + "\n").encode()


def _tree_splits(catalog: Catalog, query: QuerySpec, tree: tuple[str, ...] | None) -> list[str] | None:
    """The tree's split folders to export as splits, or None for one split (no split folders)."""
    if tree is None and not has_presplit_root(catalog):
        return None  # no need to count the selection's splits: there are none
    counts = split_counts(catalog, query)
    named = [s for s in SPLITS if counts.get(s)]
    outside = counts.get(None, 0)
    if tree is None and not named:
        return None  # a tree without split folders: one split, as ever
    if outside:
        hint = "select the split folders with --split NAME,... or" if tree is None else "use"
        raise ExportError(
            f"{outside} selected sample(s) are not in a split folder ({', '.join(named)}); "
            f"{hint} --split NAME=FRACTION to split every sample by content hash"
        )
    return named


def _client_keys(ctx: Context, fmt: str, shards: list[ShardInfo]) -> dict[str, Any]:
    """What a format's own client reads from index.json: streaming's keys (mds), the
    webdataset recipe's keys (wds)."""
    if fmt == "mds":
        # streaming reads only "version" and "shards" of an index.json: StreamingDataset(local=OUT_DIR)
        return {"version": MDS_VERSION, "shards": streaming_shards(ctx, shards)}
    if fmt == "wds":
        per_rank: dict[str, int] = {}
        for shard in shards:
            if shard.rank == 0:
                per_rank[shard.split] = per_rank.get(shard.split, 0) + 1
        return {"wds": {
            "image_key": image_key_spec(ctx.seen), "shards_per_rank": per_rank,
            "urls": {split: [s.file for s in shards if s.split == split] for split in ctx.plan.splits},
            "hf_features": hf_features(ctx.seen, ctx.features),
        }}  # fmt: skip
    return {}


def protected_files(catalog: Catalog) -> list[str]:
    """The catalog file and its journals: no export may replace a folder that holds them."""
    path = os.fspath(catalog.path)
    return [path, *(path + suffix for suffix in ("-wal", "-journal", "-shm"))]


def _created_at() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    moment = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch.isdigit() else datetime.now(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _split_counts(plan: Plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for (split, _), n in plan.tally.samples.items():
        out[split] = out.get(split, 0) + n
    return out
