"""``dlindex export --verify``: an export is still what its index.json says it is.

Every file index.json lists must exist with its size and XXH3-128; every source file a
manifest (jsonl, csv, parquet, dali) refers to must exist with the hash the catalog had
when the export was written, and each manifest must hold the rows index.json counts. A wds
export's tars and ids.i64 are read as its readers read them (exported.packed); an mds
export's shards are checked by size and hash only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from dlindex.exported import ExportError
from dlindex.exported.appended import generation, keeps, removed_ids
from dlindex.exported.confine import hash_regular, read_regular, real_inside, resolve_inside
from dlindex.exported.formats import FORMATS, JSONL, load
from dlindex.exported.index import listed_shards
from dlindex.exported.reader import absolute_paths, load_index, manifest_files, manifest_rows, source_path
from dlindex.exported.validate import listed_bytes

MAX_PROBLEMS = 1000  # listed; all are counted


@dataclass(frozen=True)
class VerifyResult:
    out_dir: str
    format: str
    files: int  # shard and index files checked
    samples: int  # source files checked (manifest formats), samples read from the shards (wds)
    problems: tuple[str, ...]
    problem_count: int

    @property
    def summary(self) -> str:
        """What was checked, in words."""
        return FORMATS.get(self.format, JSONL).verified.format(files=self.files, samples=self.samples)

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "out_dir": self.out_dir, "format": self.format, "ok": self.ok, "files": self.files,
            "samples": self.samples, "problems": self.problem_count, "first_problems": list(self.problems[:20]),
        }  # fmt: skip


def verify_export(out_dir: str | os.PathLike[str], progress: Callable[[int], None] | None = None) -> VerifyResult:
    """Check an export; raise ExportError only if OUT_DIR is not an export at all."""
    index = load_index(out_dir)
    root = Path(out_dir)
    problems: list[str] = []
    count = 0

    def problem(text: str) -> None:
        nonlocal count
        count += 1
        if len(problems) < MAX_PROBLEMS:
            problems.append(text)

    listed = [*listed_shards(index), *index.get("files", [])]
    base = os.fsencode(root)
    failed: set[str] = set()  # files already reported: not read further
    for entry in listed:
        text = _check_listed(base, entry)
        if text is not None:
            problem(f"{entry['file']}: {text}")
            failed.add(entry["file"])
    samples = 0
    claimed = {entry["file"]: entry["samples"] for entry in listed_shards(index)}
    sizes = listed_bytes(listed_shards(index), index.get("files", []))
    file_root = os.fsencode(index["file_root"])
    classes = len(index["labels"])
    absolute = absolute_paths(index)
    tree_gone = bool(manifest_files(index)) and not os.path.isdir(file_root)
    if tree_gone:  # one line, not a `missing` line for each of its images
        problem(f"source root {index['file_root']} is missing (moved or unmounted?): its images were not checked")
    try:
        removed = removed_ids(root, index)  # copies an export --append replaced: their sources may be gone
    except ExportError as e:
        problem(str(e))
        removed = {}
    generations = {entry["file"]: generation(entry) for entry in listed_shards(index)}
    for name in manifest_files(index):
        if not (root / name).is_file():
            continue  # already reported
        seen: set[bytes] = set()
        rows = 0
        try:
            for row in manifest_rows(root, name, max_bytes=sizes.get(name), classes=classes, absolute_paths=absolute):
                rows += 1
                if removed and not keeps(removed, generations.get(name, 0), row["id"]):
                    continue
                try:
                    path = source_path(index, row["path"])
                except ExportError as e:
                    problem(f"{name}: {e}")
                    continue
                if path in seen or tree_gone:
                    continue  # a --pad repeat, or nothing to check it against
                seen.add(path)
                samples += 1
                _check_source(path, file_root, row, problem)
                if progress is not None:
                    progress(1)
        except ExportError as e:
            problem(str(e))
            continue
        if rows != claimed[name]:
            problem(f"{name}: holds {rows} rows, index.json says {claimed[name]} samples")
    check = FORMATS[index["format"]].verify  # reads the packed shards as their readers do
    if check is not None:
        samples = load(check)(root, index, failed, problem)
    return VerifyResult(str(out_dir), index.get("format", "?"), len(listed), samples, tuple(problems), count)


def _check_listed(base: bytes, entry: dict[str, Any]) -> str | None:
    """What is wrong with a file index.json lists (its size, its hash), or None."""
    try:
        size, digest = hash_regular(resolve_inside(base, entry["file"], what="file"), entry["bytes"])
    except FileNotFoundError:
        return "missing"
    except ExportError as e:  # outside the export, not a regular file, larger than listed
        return str(e)
    except OSError as e:
        return f"cannot read: {e.strerror}"
    if size != entry["bytes"]:
        return f"{size} bytes, index.json says {entry['bytes']}"
    if digest != entry["xxh3_128"]:
        return "checksum differs from index.json"
    return None


def _check_source(path: bytes, base: bytes, row: dict[str, Any], problem: Callable[[str], None]) -> None:
    shown = os.fsdecode(path)
    try:
        data = read_regular(real_inside(path, base, folder_links=True), row.get("bytes"))
    except FileNotFoundError:
        problem(f"{shown}: missing (id {row.get('id')})")
        return
    except ExportError as e:
        problem(f"{e} (id {row.get('id')})")
        return
    except OSError as e:
        problem(f"{shown}: cannot read: {e.strerror}")
        return
    expected = row.get("xxh3_128")
    if expected and xxhash.xxh3_128_hexdigest(data) != expected:
        problem(f"{shown}: content changed since the export (id {row.get('id')}; hash differs from the catalog's)")
