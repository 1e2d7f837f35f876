"""``scan --engine ray``: the scan's static parts as Ray tasks, each into a part catalog, then merged.

Part I of N is ``scan --part I/N`` (dlindex.scan.units cuts the walk's units the same on every
machine) into ``CATALOG.parts/part-I.db`` beside the catalog, which must be on a file system
that every node sees at the same path, as must ROOT. The run folder is dlindex's own
(dlindex.engines.runfolder). Every part starts from one copy of the catalog, the cut
(``cut.db``), so ids, flags and vectors survive the merge, which is made against the cut:
what the catalog changed after it (a ``mark`` meanwhile) wins over the parts' copies. A task
whose worker or node dies is run again and resumes from what its part committed; so does a
rerun of a killed job. Parts cut from trees that differ (the tree changed between a killed
run and its rerun) are thrown away and the scan starts once more from a fresh cut. Once all N
are done, ``merge_catalogs`` writes them into the catalog in one transaction and the run folder
is removed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from dlindex.catalog.connection import Catalog
from dlindex.catalog.merge import CatalogMergeSummary, merge_catalogs
from dlindex.catalog.sqlite.connect import DEFAULT_DB, connect_readonly
from dlindex.engines.parts import MAX_PARTS, Part
from dlindex.engines.ray import cluster_resources, connected, run_tasks
from dlindex.engines.runfolder import (
    check_run_folder,
    claim_run_folder,
    discard_entries,
    options_digest,
    remove_run_folder,
)
from dlindex.errors import InputError
from dlindex.scan.options import ScanOptions, ScanSummary, check_root
from dlindex.scan.run import scan_tree

_RETRIES = 3  # reruns of a part whose worker or node died
_CUT = "cut.db"  # the copy of the catalog every part starts from; the merge's base
_SQLITE_FILES = ("", "-wal", "-shm", "-journal", ".tmp")  # a catalog file, its companions, its copy in progress
_SCAN_RUNS = "SELECT plan, subject, part, started_at FROM shard_runs WHERE job = 'scan'"


@dataclass(frozen=True)
class RayScanSummary:
    """The parts' scans added up (``scan``), and the merge that wrote them into the catalog."""

    scan: ScanSummary
    merge: CatalogMergeSummary
    parts: int

    def as_dict(self) -> dict[str, Any]:
        return {**self.scan.as_dict(), "engine": "ray", "parts": self.parts, "merge": asdict(self.merge)}


def scan_on_ray(
    db: str | Path | None,
    root: str | Path,
    options: ScanOptions | None = None,
    *,
    address: str | None = None,
    tasks: int = 0,
) -> RayScanSummary:
    """Scan ``root`` into the catalog file ``db`` (made if absent) as ``tasks`` Ray tasks (0: one
    per CPU of the cluster); see the module doc and docs/scale-out.md.

    Raises:
        InputError: ``--part`` or ``--prune`` given too, an unreachable address, ray missing.
    """
    options = options or ScanOptions()
    if options.part is not None:
        raise InputError("--engine ray cuts the scan into parts itself: leave out --part")
    if options.prune:
        raise InputError("--prune cannot go with --engine ray (parts cannot tell); run dlindex scan ROOT --prune after")
    started = time.perf_counter()
    db, root = _catalog_path(db), Path(root).absolute()
    check_root(root)
    work = db.with_name(db.name + ".parts")
    check_run_folder(work)  # a folder dlindex did not make: one line, before Ray starts
    with Catalog(db, create=True, log=False):  # a foreign file: one line, before Ray starts
        pass
    with connected(address):
        count = min(MAX_PARTS, tasks or int(cluster_resources().get("CPU", 1)) or 1)
        part_options = replace(options, workers=1)
        job = {"job": "scan", "catalog": str(db), "root": str(root), "options": options_digest(part_options)}
        names = [_CUT, *(f"part-{i}.db" for i in range(count))]
        claim_run_folder(work, job, [name + end for name in names for end in _SQLITE_FILES])
        cut, parts = work / _CUT, [work / name for name in names[1:]]
        calls = [(str(part), str(root), replace(part_options, part=Part(i, count))) for i, part in enumerate(parts)]
        for _ in range(2):
            _cut_parts(db, cut, parts)
            summaries = run_tasks(scan_part, calls, max_retries=_RETRIES)
            if len(_plans(cut, parts)) <= 1:
                break
            discard_entries(work)  # parts cut from trees that differ (a rerun after the tree changed): afresh
        else:
            raise InputError(f"{root} changed while it was scanned, twice; run the scan again once it is still")
    merged = merge_catalogs(parts, into=db, cut=cut)
    remove_run_folder(work)
    return RayScanSummary(scan=_add_up(summaries, time.perf_counter() - started), merge=merged, parts=count)


def scan_part(part: str, root: str, options: ScanOptions) -> ScanSummary:
    """One Ray task: part ``options.part`` of the scan into the part catalog ``part``."""
    with Catalog(part, create=True, log=False) as catalog:
        return scan_tree(catalog, Path(root), options)


def _cut_parts(db: Path, cut: Path, parts: list[Path]) -> None:
    """The cut, a copy of the catalog, and a copy of it for each part not begun yet."""
    if not cut.exists():
        for part in parts:  # begun from a cut that is gone: their base is unknown
            for end in _SQLITE_FILES:
                Path(f"{part}{end}").unlink(missing_ok=True)
        _copy_catalog(db, cut)
    for part in parts:
        if not part.exists():
            _copy_catalog(cut, part)  # each part diffs against the catalog's rows, keeping ids


def _copy_catalog(source: Path, target: Path) -> None:
    """A consistent copy of a catalog in use (SQLite's backup API), written under a temporary name."""
    partial = target.with_name(target.name + ".tmp")
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(partial) as dst:
        src.backup(dst)
    partial.replace(target)


def _plans(cut: Path, parts: list[Path]) -> set[str]:
    """The cuts of the tree that the parts' scans made in this run folder."""
    plans: set[str] = set()
    with contextlib.closing(connect_readonly(cut, timeout=30)) as conn:
        before = set(conn.execute(_SCAN_RUNS))
    for part in parts:
        with contextlib.closing(connect_readonly(part, timeout=30)) as conn:
            plans.update(row[0] for row in set(conn.execute(_SCAN_RUNS)) - before)
    return plans


def _add_up(summaries: list[ScanSummary], seconds: float) -> ScanSummary:
    """One summary for the whole tree: counts added, samples joined, the wall time of the job."""
    first = summaries[0]
    values: dict[str, Any] = {}
    for f in fields(ScanSummary):
        items = [getattr(s, f.name) for s in summaries]
        if isinstance(items[0], bool):
            values[f.name] = any(items)
        elif isinstance(items[0], int):
            values[f.name] = sum(items)
        elif isinstance(items[0], tuple):
            values[f.name] = tuple(x for item in items for x in item)[:20]
        elif isinstance(items[0], dict):
            keys = dict.fromkeys(k for item in items for k in item)
            values[f.name] = {k: sum(item.get(k, 0) for item in items) for k in keys}
        else:
            values[f.name] = getattr(first, f.name)
    # scan_id 0: each part's scan has its own id, and the merge adds them all (merge.scans_added).
    # Parts do not check --labels paths (a part holds only its own rows): 0 unknown, as with --part.
    rate = round(values["seen"] / seconds, 1) if seconds else 0.0
    values.update(scan_id=0, seconds=round(seconds, 3), files_per_s=rate)
    return ScanSummary(**values)


def _catalog_path(db: str | Path | None) -> Path:
    """The catalog file, absolute (the tasks run elsewhere): ``db``, ``$DLINDEX_DB`` or ./dlindex.db."""
    return Path(db if db is not None else os.environ.get("DLINDEX_DB", DEFAULT_DB)).absolute()
