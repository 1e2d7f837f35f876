"""``export --engine ray``: the export's static shards as Ray tasks, each into a part folder, then merged.

Part I of N is ``export --part I/N`` (the plan's (split, rank) groups dealt out by size) into
``OUT.parts/part-I/`` beside OUT, on a file system that every node sees at the same path, as
are the catalog and the images. The run folder is dlindex's own (dlindex.engines.runfolder):
one it did not make is refused, and only what it wrote there is removed. A task whose worker or node dies is run again (a finished part
is kept: its ``dlindex-part.json`` is written last); once all N are done, ``merge_exports``
joins them into OUT, byte for byte the export one machine writes, and the work folder goes.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from dlindex.catalog.connection import Catalog
from dlindex.catalog.sqlite.connect import DEFAULT_DB
from dlindex.engines.parts import MAX_PARTS as MAX_SHARDS
from dlindex.engines.parts import Part as Shard  # export/ says Shard for a part until its restructuring settles
from dlindex.engines.ray import cluster_resources, connected, run_tasks
from dlindex.engines.runfolder import check_run_folder, claim_run_folder, options_digest, remove_run_folder
from dlindex.errors import InputError
from dlindex.export.merge import MergeSummary, merge_exports
from dlindex.export.options import ExportOptions
from dlindex.export.run import export_catalog
from dlindex.exported.index import PART_INDEX

_RETRIES = 3  # reruns of a part whose worker or node died


def export_on_ray(
    db: str | Path | None,
    out_dir: str | Path,
    options: ExportOptions | None = None,
    *,
    address: str | None = None,
    tasks: int = 0,
) -> MergeSummary:
    """Export the catalog file ``db`` to ``out_dir`` as ``tasks`` Ray tasks (0: one per CPU of
    the cluster), then merge the parts; the merged export is recorded in the catalog.

    Raises:
        InputError: ``--part`` given too, an unreachable address, ray missing; an ExportError
            (an InputError) of the options, raised by the first part that meets it.
    """
    options = options or ExportOptions()
    if options.shard is not None:
        raise InputError("--engine ray cuts the export into parts itself: leave out --part")
    db, out = _catalog_path(db), Path(out_dir).absolute()
    with Catalog(db) as catalog:  # a missing or foreign catalog: one line, before Ray starts
        changes = catalog.changes()
    work = out.with_name(out.name + ".parts")
    check_run_folder(work)  # a folder dlindex did not make: one line, before Ray starts
    with connected(address):
        count = min(MAX_SHARDS, tasks or int(cluster_resources().get("CPU", 1)) or 1)
        # parts of another catalog state would not merge: a rerun after a write starts afresh
        job = {
            "job": "export",
            "catalog": str(db),
            "out": str(out),
            "options": options_digest(options),
            "changes": changes,
        }
        names = [f"part-{i}" for i in range(count)]
        claim_run_folder(work, job, names)
        parts = [work / name for name in names]
        calls = [(str(db), str(part), replace(options, shard=Shard(i, count))) for i, part in enumerate(parts)]
        run_tasks(export_part, calls, max_retries=_RETRIES)
    with Catalog(db) as catalog:
        summary = merge_exports(parts, out, options.overwrite, catalog=catalog)
    remove_run_folder(work)
    return summary


def export_part(db: str, part: str, options: ExportOptions) -> int:
    """One Ray task: part ``options.shard`` of the export into the folder ``part``; its samples.
    A part finished by an earlier try is kept as it is."""
    if (Path(part) / PART_INDEX).is_file():
        return 0
    with Catalog(db, log=False) as catalog:
        return export_catalog(catalog, part, options).samples


def _catalog_path(db: str | Path | None) -> Path:
    """The catalog file, absolute (the tasks run elsewhere): ``db``, ``$DLINDEX_DB`` or ./dlindex.db."""
    return Path(db if db is not None else os.environ.get("DLINDEX_DB", DEFAULT_DB)).absolute()
