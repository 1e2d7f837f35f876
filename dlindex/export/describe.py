"""index.json of a finished export: its selection, options, counts, shards and clients' keys."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dlindex.export.index import INDEX_VERSION, SHARDS_KEY
from dlindex.export.mds import VERSION as MDS_VERSION
from dlindex.export.mds import streaming_shards
from dlindex.export.options import ExportOptions
from dlindex.export.plan import Plan, parse_split
from dlindex.export.shards import Context, ShardInfo
from dlindex.export.wds import hf_features, image_key_spec

if TYPE_CHECKING:
    from dlindex.catalog.connection import Catalog


def build_index(
    catalog: Catalog, options: ExportOptions, fmt: str, shard_bytes: int | None, changes: int, plan: Plan,
    selected: int, shards: list[ShardInfo], extra: list[dict[str, Any]], features: Any,
    clients: Mapping[str, Any] | None = None,
    skipped: Mapping[str, int] | None = None,
    grouping: Mapping[str, Any] | None = None,
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
            "group": None if grouping is None else dict(grouping),
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


def client_keys(ctx: Context, fmt: str, shards: list[ShardInfo]) -> dict[str, Any]:
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


def _created_at() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    moment = datetime.fromtimestamp(int(epoch), UTC) if epoch.isdigit() else datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def written_per_split(plan: Plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for (split, _), n in plan.tally.samples.items():
        out[split] = out.get(split, 0) + n
    return out
