"""Putting an append's files into its export: names, the new index, a journal, the renames.

The added samples were written as an export of their own in ``OUT/.dlindex-append/delta``
(a leading dot: pyarrow and pandas never read it as data). ``stage`` decides each file's
name in OUT (numbered on from the split's last shard, so wds's "shard k is rank k % world"
and mds's ``shard.NNNNN`` hold), writes the new index files and the removal list beside
them, and then the journal: that write is the commit point. ``apply_journal`` renames the
shards in (never over a file), then the replaced index files, index.json last; it runs
again until it has finished, so an append killed at any point leaves either the old export
(no journal yet) or a journal the next ``--append`` completes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import xxhash

from dlindex.export.describe import client_keys
from dlindex.export.merge import recorded_features
from dlindex.export.plan import ExportError
from dlindex.export.shards import Features, ShardInfo
from dlindex.exported.appended import removed_name
from dlindex.exported.formats import WDS, get, load
from dlindex.exported.index import index_path, listed_shards, shards_key
from dlindex.exported.reader import load_index

STAGING = ".dlindex-append"  # inside OUT: the added files until they are renamed in
_JOURNAL = "journal.json"
_NUMBER = re.compile(r"^(?P<head>.*?)(?P<n>\d+)(?P<tail>\.[^/]*)$")  # train-000007.tar, train/shard.00007.mds


@dataclass(frozen=True)
class Journal:
    samples: int  # in the whole export now, removed copies included
    added: int
    files: int  # files added
    bytes: int


@contextlib.contextmanager
def held_export(out: Path) -> Iterator[None]:
    """One append at a time per export (a lock on the folder itself, released if killed)."""
    try:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        raise ExportError(f"{out} does not exist; --append extends an export that is there") from None
    except NotADirectoryError:
        raise ExportError(f"{out} is not a folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ExportError(f"another dlindex export --append is writing {out}; wait for it") from None
            raise
        yield
    finally:
        os.close(fd)


def clear_staging(out: Path, create: bool = False) -> Path:
    """Remove what a killed append left before its journal (only dlindex's own folder)."""
    staging = out / STAGING
    if os.path.islink(staging) or (os.path.lexists(staging) and not staging.is_dir()):
        raise ExportError(f"{staging} is not a folder dlindex made; remove it yourself")
    shutil.rmtree(staging, ignore_errors=True)
    if create:
        staging.mkdir()
    return staging


def stage(
    out: Path, index: dict[str, Any], staging: Path, generation: int, removed: list[int], states: tuple[int, int],
    delta: Any,
) -> Journal:  # fmt: skip
    """Write the new index files and the journal in ``staging``; nothing in OUT changes yet."""
    fmt = get(index["format"])
    old = listed_shards(index)
    slots = Counter(entry["split"] for entry in old)
    renames: list[tuple[str, str]] = []
    added: list[dict[str, Any]] = []
    delta_index: dict[str, Any] | None = None
    if delta is not None:
        delta_index = load_index(staging / "delta")
        for entry in listed_shards(delta_index):
            name = _renumbered(entry["file"], slots[entry["split"]] // fmt.files_per_shard)
            if os.path.lexists(out / name):
                raise ExportError(f"{out / name} exists but the export does not list it; remove it yourself")
            renames.append((f"{STAGING}/delta/{entry['file']}", name))
            added.append({**entry, "file": name, "generation": generation})
    shards = [*old, *added]
    splits = list(dict.fromkeys([*(index["counts"].get("splits") or {}), *(e["split"] for e in added)]))
    features = recorded_features(index.get("features"))
    infos = [ShardInfo(e["file"], e["split"], e["rank"], e["samples"], e["bytes"], e["xxh3_128"]) for e in shards]
    files = [f for f in index.get("files", []) if not f["file"].startswith("_removed-")]
    replaced: list[tuple[str, str]] = []
    if fmt.extend is not None:
        files, more, replaced = load(fmt.extend)(
            staging, STAGING, files, delta_index, infos, splits, generation, features=features,
            shard_bytes=index["options"].get("shard_bytes"),
        )  # fmt: skip
        renames += more
    removals = [f for f in index.get("files", []) if f["file"].startswith("_removed-")]
    if removed:
        data = json.dumps(sorted(removed)).encode()
        name = removed_name(generation)
        (staging / name).write_bytes(data)
        renames.append((f"{STAGING}/{name}", name))
        removals.append({"file": name, "bytes": len(data), "xxh3_128": xxhash.xxh3_128_hexdigest(data)})
    new_index = _new_index(index, delta_index, shards, [*files, *removals], infos, splits, features,
                           generation, len(removed), states)  # fmt: skip
    own = index_path(out).name
    (staging / own).write_bytes(new_index)
    added_samples = int(delta_index["counts"]["samples"]) if delta_index is not None else 0
    journal = {"generation": generation, "renames": renames, "replaced": [*replaced, (f"{STAGING}/{own}", own)]}
    _write_synced(staging / _JOURNAL, json.dumps(journal).encode())
    added_bytes = sum(e["bytes"] for e in added)
    total = int(json.loads(new_index)["counts"]["samples"])
    return Journal(total, added_samples, len(renames), added_bytes)


def apply_journal(out: Path) -> int | None:
    """Finish the append a journal in OUT describes (again, if it was killed): the generation
    it completed, or None when there was none (and a journal-less staging folder is cleared)."""
    staging = out / STAGING
    path = staging / _JOURNAL
    if not path.is_file():
        if os.path.lexists(staging):
            clear_staging(out)
        return None
    try:
        journal = json.loads(path.read_bytes())
        renames, replaced = _pairs(journal["renames"]), _pairs(journal["replaced"])
        generation = journal["generation"]
        if not isinstance(generation, int) or isinstance(generation, bool):
            raise TypeError(generation)
    except (ValueError, KeyError, TypeError, RecursionError):
        raise ExportError(f"{path} is damaged; remove {staging} and run the append again") from None
    for source, target in renames:
        src, dst = _inside(out, source), _inside(out, target)
        if os.path.lexists(src):
            if os.path.lexists(dst):
                raise ExportError(f"{dst} exists but the export does not list it; remove it yourself")
            dst.parent.mkdir(parents=True, exist_ok=True)  # mds: a split the export did not have
            os.rename(src, dst)
        elif not os.path.lexists(dst):
            raise ExportError(f"{src} is gone before it was put in place; remove {staging} and append again")
    for source, target in replaced:  # the index files, index.json last: the export changes here
        src = _inside(out, source)
        if os.path.lexists(src):
            os.replace(src, _inside(out, target))
    _sync_folder(out)
    shutil.rmtree(staging, ignore_errors=True)
    return generation


def _new_index(
    index: dict[str, Any], delta: dict[str, Any] | None, shards: list[dict[str, Any]], files: list[dict[str, Any]],
    infos: list[ShardInfo], splits: list[str], features: Features | None, generation: int, removed: int,
    states: tuple[int, int],
) -> bytes:  # fmt: skip
    new = dict(index)
    new["catalog"] = {**index["catalog"], "changes": states[1]}
    new["classes"] = list((delta or index)["classes"])
    new["labels"] = {str(k): name for k, name in enumerate(new["classes"])}
    counts = dict(index["counts"])
    splits_now = {k: dict(v, ranks=list(v["ranks"]), labels=dict(v["labels"])) for k, v in counts["splits"].items()}
    added: dict[str, Any] = delta["counts"] if delta is not None else {}
    for split, entry in (added.get("splits") or {}).items():
        mine = splits_now.setdefault(split, {"samples": 0, "ranks": [0] * len(entry["ranks"]), "labels": {}})
        mine["samples"] += entry["samples"]
        mine["ranks"] = [a + b for a, b in zip(mine["ranks"], entry["ranks"], strict=True)]
        for name, n in entry["labels"].items():
            mine["labels"][name] = mine["labels"].get(name, 0) + n
        mine["labels"] = dict(sorted(mine["labels"].items()))
    for key in ("selected", "dropped", "padded"):
        counts[key] = counts.get(key, 0) + added.get(key, 0)
    counts["samples"] = sum(entry["samples"] for entry in splits_now.values())
    counts["splits"] = splits_now
    counts["removed"] = counts.get("removed", 0) + removed
    new["counts"] = counts
    new[shards_key(index.get("dlindex_export", 2))] = shards
    new["files"] = files
    seen = set()
    for source in (index, delta or {}):  # wds: the image member suffixes either wrote
        keys = source.get(WDS.client_keys[0]) or {}
        seen |= {k for k, v in keys.get("hf_features", {}).items() if v.get("_type") == "Image"}
    new.update(client_keys(index["format"], infos, splits, seen, features, index["options"].get("shard_bytes")))
    moment = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new["appends"] = [*index.get("appends", []), {
        "generation": generation, "from_state": states[0], "to_state": states[1], "appended_at": moment,
        "samples": added.get("samples", 0), "removed": removed,
        "removed_file": removed_name(generation) if removed else None,
    }]  # fmt: skip
    try:
        return (json.dumps(new, indent=1, ensure_ascii=False) + "\n").encode()
    except UnicodeEncodeError:
        return (json.dumps(new, indent=1, ensure_ascii=True) + "\n").encode()


def _pairs(value: Any) -> list[tuple[str, str]]:
    """A journal's list of (from, to) names; TypeError for anything else."""
    if not isinstance(value, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(n, str) for n in p) for p in value
    ):
        raise TypeError("not a list of name pairs")
    return [(p[0], p[1]) for p in value]


def _renumbered(name: str, base: int) -> str:
    """``train-000003.tar`` with ``base`` added to its number (its width kept, or wider)."""
    match = _NUMBER.match(name)
    if match is None:
        raise ExportError(f"cannot number the appended file {name!r} after the export's own")
    n = match["n"]
    return f"{match['head']}{int(n) + base:0{len(n)}d}{match['tail']}"


def _inside(out: Path, name: str) -> Path:
    """OUT/name, refused unless it is inside OUT (its folder too, after any symbolic link)."""
    path = out / name
    real = os.path.realpath(out)
    if name.startswith("/") or ".." in name.split("/") or not os.path.realpath(path.parent).startswith(real):
        raise ExportError(f"{out / STAGING / _JOURNAL} names {name!r}, outside the export; remove it yourself")
    return path


def _write_synced(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
