"""index.json of a finished export: its selection, options, counts, shards and clients' keys."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dlindex.export.options import ExportOptions
from dlindex.export.plan import Plan, parse_split
from dlindex.export.shards import ShardInfo
from dlindex.exported.formats import get, load
from dlindex.exported.index import INDEX_VERSION, SHARDS_KEY

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
    head = describe_export(
        catalog.location, options, fmt, shard_bytes, changes, plan, selected, features,
        skipped, grouping,
    )  # fmt: skip
    counts = split_counts([(g.split, g.rank) for g in plan.groups], plan.tally.samples, label_counts(plan))
    return complete_index(head, counts, shards, extra, clients or {})


def describe_export(
    catalog_path: str, options: ExportOptions, fmt: str, shard_bytes: int | None, changes: int, plan: Plan,
    selected: int, features: Any, skipped: Mapping[str, int] | None = None,
    grouping: Mapping[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """index.json without what depends on the files written (``created_at``, ``counts.samples``,
    ``counts.splits``, the shard and file lists, clients' keys: None or empty here), every key
    in its place: what each part of a ``--part`` export records for the merge to complete."""
    from dlindex.version import __version__

    spec = options.query
    return {
        "dlindex_export": INDEX_VERSION,
        "format": fmt,
        "created_at": None,
        "dlindex_version": __version__,
        "catalog": {"path": catalog_path, "changes": changes},
        "filters": {
            "labels": list(spec.labels), "split": list(spec.split), "classes": spec.classes, "status": list(spec.status), "processed": spec.processed,
            "processing_status": list(spec.processing_status), "excluded": spec.excluded,
            "since": None if spec.since is None else str(spec.since),
            "until": None if spec.until is None else str(spec.until),
            "min_width": spec.min_width, "min_height": spec.min_height, "per_label": spec.per_label,
            "limit": spec.limit, **({"text": spec.text} if spec.text is not None else {}),
        },
        "options": {
            "shuffle": options.shuffle, "seed": options.seed,
            "split": options.split if options.split == "tree" else parse_split(options.split),
            "world_size": options.world_size, "drop_last": options.drop_last and options.world_size > 1,
            "shard_size": options.shard_size, "shard_bytes": shard_bytes, "features": options.features,
            **({"texts": True} if options.texts else {}),
            "absolute_paths": options.absolute_paths, "workers": options.workers if get(fmt).workers else None,
            "group": None if grouping is None else dict(grouping),
        },
        "file_root": os.fsdecode(plan.file_root.rstrip(b"/") or b"/"),
        # label_id is the index in "classes"; "class_list" says which list that is ("labels":
        # the --label names only, "catalog": all the catalog's classes). "labels" is the same
        # list as an object, kept for readers of older exports.
        "classes": list(plan.labels),
        "class_list": plan.class_list,
        "labels": {str(k): name for k, name in enumerate(plan.labels)},
        "features": None if features is None else {
            "name": features.name, "dtype": features.dtype, "dim": features.dim,
            "extractor_version": features.extractor_version,
        },
        "counts": {
            "samples": None, "selected": selected,
            "dropped": plan.dropped, "padded": plan.padded, "splits": None,
            "skipped": dict(sorted((skipped or {}).items())),
        },
        SHARDS_KEY: [],
        "files": [],
    }  # fmt: skip


def label_counts(plan: Plan) -> list[tuple[str, str, int]]:
    """(split, class name, samples written) from the plan's tally."""
    return [(split, plan.labels[plan.label_index[label]], n) for (split, label), n in plan.tally.labels.items()]


def split_counts(
    groups: Sequence[tuple[str, int]], samples: Mapping[tuple[str, int], int], labels: Iterable[tuple[str, str, int]]
) -> dict[str, Any]:
    """index.json's ``counts.splits``: per split (in group order) its samples, each rank's, and per class."""
    counts: dict[str, Any] = {}
    for split, rank in groups:
        entry = counts.setdefault(split, {"samples": 0, "ranks": [], "labels": {}})
        n = samples.get((split, rank), 0)
        entry["samples"] += n
        entry["ranks"].append(n)
    for split, name, n in labels:
        counts[split]["labels"][name] = counts[split]["labels"].get(name, 0) + n
    for entry in counts.values():
        entry["labels"] = dict(sorted(entry["labels"].items()))
    return counts


def complete_index(
    head: Mapping[str, Any], counts: dict[str, Any], shards: Sequence[ShardInfo], extra: list[dict[str, Any]],
    clients: Mapping[str, Any],
) -> bytes:  # fmt: skip
    """index.json's bytes: ``head`` (describe_export) with the time, counts, files and clients' keys filled in."""
    index = dict(head)
    index["created_at"] = _created_at()
    index["counts"] = {**head["counts"], "samples": sum(c["samples"] for c in counts.values()), "splits": counts}
    index[SHARDS_KEY] = [s.as_dict() for s in shards]
    index["files"] = extra
    index.update(clients)
    try:
        text = json.dumps(index, indent=1, ensure_ascii=False)
        return (text + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(index, indent=1, ensure_ascii=True) + "\n").encode()


def client_keys(
    fmt: str, shards: Sequence[ShardInfo], splits: Sequence[str], seen: Iterable[str], features: Any,
    shard_bytes: int | None, texts: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """What a format's own client reads from index.json (the registry's ``client_keys``:
    streaming's for mds, the webdataset recipe's for wds).

    Args:
        seen: the image member suffixes written (packed formats).
        texts: the export carries texts (``--texts``).
    """
    record = get(fmt)
    if record.clients is None:
        return {}
    values = load(record.clients)(shards, splits, seen, features, shard_bytes, texts)
    return dict(zip(record.client_keys, values, strict=True))


def _created_at() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    moment = datetime.fromtimestamp(int(epoch), UTC) if epoch.isdigit() else datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def written_per_split(plan: Plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for (split, _), n in plan.tally.samples.items():
        out[split] = out.get(split, 0) + n
    return out
