"""``dlindex merge PART.db... --into CATALOG``: part catalogs into one, in one transaction.

Parts come from ``scan --part I/N`` (rows of their units only) or ``features compute
--part I/N`` run on copies of one catalog (vectors of their ids only); a plain catalog may
be merged too. Rows are matched by (root path, file path), never by id: ids are local to
each file. The rule for every kind of row (sample, vector, feature state, attribute):

- a part row equal to the target's is a copy, and changes nothing;
- a part row that differs from the target's (or is new) is the part's work, and wins;
- two parts whose work differs on the same row is a conflict: nothing is merged.

Every part of a sharded job must be present once, finished and cut alike (``shard_runs``).
See docs/scale-out.md.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from dlindex import faults
from dlindex.catalog import merge_cut, merge_rows
from dlindex.catalog.backend import is_server_url
from dlindex.catalog.connection import Catalog
from dlindex.catalog.shard_runs import RUN_COLUMNS, ShardRun
from dlindex.catalog.sqlite.connect import connect_readonly
from dlindex.catalog.sqlite.migrations import APPLICATION_ID, LATEST_VERSION
from dlindex.catalog.versions import command_text, summary_of
from dlindex.errors import CatalogError, InputError

_TARGET_RUNS = f"SELECT {RUN_COLUMNS} FROM shard_runs"


@dataclass(frozen=True)
class CatalogMergeSummary:
    """What ``merge_catalogs`` did."""

    into: str
    parts: int
    samples_added: int
    samples_updated: int
    samples_same: int  # part rows equal to the target's (copies)
    vectors_written: int
    vectors_stale: int  # computed from content the merged row no longer has: left out
    texts_written: int  # texts (captions...) new or changed in the catalog
    scans_added: int
    jobs: list[str] = field(default_factory=list)  # the sharded jobs whose parts were merged
    samples_kept_newer: int = 0  # part rows of samples the catalog changed after the cut: left out
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def merge_catalogs(
    parts: Sequence[str | os.PathLike[str]], into: str | os.PathLike[str], *, cut: str | os.PathLike[str] | None = None
) -> CatalogMergeSummary:
    """Merge part catalogs into ``into`` (made if absent) in one transaction; see the module doc.
    With ``cut``, the copy of ``into`` the parts started from, what ``into`` changed after the
    cut wins over the parts (dlindex.catalog.merge_cut).

    Part and target catalogs are SQLite files: the parts of a job on a server catalog write
    into it directly and need no merge (docs/postgres.md).

    Raises:
        InputError: a missing, repeated, unfinished or differently cut part, a conflict;
            nothing is written (a new ``into`` is removed again).
        CatalogError: a part that is no dlindex catalog, of another schema version, or damaged.
    """
    if is_server_url(into) or any(is_server_url(p) for p in parts):
        raise InputError(
            "merge joins part catalog files; on a server catalog the parts of a job write into it "
            "directly, with nothing to merge"
        )
    started = time.perf_counter()
    paths = _check_paths(parts, into)
    runs = {path: _read_part(path) for path in paths}
    target = Path(into)
    existed = target.exists()
    try:
        with Catalog(target, create=True, log=False) as catalog:
            conn = cast(sqlite3.Connection, catalog.conn)  # merge joins catalog files only
            known = {ShardRun(*row) for row in conn.execute(_TARGET_RUNS)}
            jobs = check_jobs({path: [run for run in found if run not in known] for path, found in runs.items()})
            try:
                merge_rows.stage(conn, paths)
                if cut is not None:
                    merge_cut.drop_copies(conn, Path(cut), merge_rows.CONTENT)
                with catalog.versioned(command_text("merge", *map(os.fspath, paths))) as version:
                    with catalog.write_transaction():
                        kept = merge_cut.drop_overtaken(conn, merge_rows.CONTENT) if cut is not None else 0
                        counts = merge_rows.apply(conn, paths)
                    version.summary = summary_of(counts)
            except sqlite3.IntegrityError as e:
                raise InputError(f"a part holds rows this catalog refuses ({e}); nothing was merged") from None
            finally:
                merge_rows.unstage(conn)
    except BaseException:
        if not existed:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(os.fspath(target) + suffix).unlink(missing_ok=True)
        raise
    return CatalogMergeSummary(
        into=os.fspath(target), parts=len(paths), jobs=jobs, samples_kept_newer=kept,
        seconds=round(time.perf_counter() - started, 3), **counts,
    )  # fmt: skip


def _check_paths(parts: Sequence[str | os.PathLike[str]], into: str | os.PathLike[str]) -> list[Path]:
    if not parts:
        raise InputError("merge: give the part catalogs to merge")
    seen: dict[str, Path] = {}
    target = os.path.realpath(into)
    for part in parts:
        path = Path(part)
        if not path.is_file():
            raise InputError(f"part {path} {'is not a file' if path.exists() else 'does not exist'}")
        real = os.path.realpath(path)
        if real == target:
            raise InputError(f"part {path} is the catalog merged into; give --into another file")
        if real in seen:
            raise InputError(f"part {path} is given twice (also as {seen[real]})")
        seen[real] = path
    return list(seen.values())


def _read_part(path: Path) -> list[ShardRun]:
    """The part's shard runs, after checking it is a whole dlindex catalog of this schema."""
    try:
        conn = connect_readonly(path, timeout=30)
    except sqlite3.Error as e:
        raise CatalogError(f"part {path}: cannot open it: {e}") from None
    try:
        (app_id,) = conn.execute("PRAGMA application_id").fetchone()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if app_id != APPLICATION_ID:
            raise CatalogError(f"part {path} is not a dlindex catalog")
        if version != LATEST_VERSION:
            hint = (
                f"open it once with this dlindex (dlindex stats --db {path}) to upgrade it"
                if version < LATEST_VERSION
                else "merge it with the dlindex that wrote it"
            )
            raise CatalogError(f"part {path} has schema version {version}, this dlindex {LATEST_VERSION}: {hint}")
        problems = [row[0] for row in conn.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            raise faults.damaged_error(path, "; ".join(str(p) for p in problems))
        return [ShardRun(*row) for row in conn.execute(_TARGET_RUNS)]
    except sqlite3.Error as e:
        raise faults.translate_error(e, catalog=path) or CatalogError(f"part {path}: {e}") from None
    except UnicodeDecodeError as e:
        raise faults.damaged_error(path, faults.garbled_message(e)) from None
    finally:
        conn.close()


def check_jobs(new_runs: dict[Path, list[ShardRun]]) -> list[str]:
    """Every sharded job among the parts' new runs is complete: each part once, finished,
    all cut alike. Returns the jobs as one line each; InputError names the first gap."""
    by_job: dict[tuple[str, str], dict[int, list[tuple[Path, ShardRun]]]] = defaultdict(lambda: defaultdict(list))
    first_holder: dict[ShardRun, Path] = {}
    for path, found in new_runs.items():
        for run in found:
            first_holder.setdefault(run, path)  # copies of one catalog carry the same runs: one run
    for run, path in first_holder.items():
        by_job[(run.job, run.subject)][run.parts].append((path, run))
    lines = []
    for (job, subject), by_count in sorted(by_job.items()):
        what = f"{'scan of' if job == 'scan' else 'features compute of type'} {subject}"
        if len(by_count) > 1:
            counts = ", ".join(f"{p.name} ({run.part}/{run.parts})" for runs in by_count.values() for p, run in runs)
            raise InputError(f"{what}: parts of different splits into N: {counts}; merge parts of one --part I/N run")
        ((count, entries),) = by_count.items()
        plans = {run.plan for _, run in entries}
        if len(plans) > 1:
            raise InputError(
                f"{what}: the parts were cut differently (the tree or the selection changed between them); "
                "run every part again"
            )
        latest: dict[int, tuple[Path, ShardRun]] = {}
        holders: dict[int, set[Path]] = defaultdict(set)
        for path, run in entries:
            holders[run.part].add(path)
            if run.part not in latest or run.started_at >= latest[run.part][1].started_at:
                latest[run.part] = (path, run)
        for part, files in sorted(holders.items()):
            if len(files) > 1:
                names = " and ".join(sorted(str(f) for f in files))
                raise InputError(f"{what}: part {part}/{count} is in both {names}; give each part once")
        missing = [i for i in range(count) if i not in latest]
        if missing:
            shown = ", ".join(f"{i}/{count}" for i in missing[:10]) + (", ..." if len(missing) > 10 else "")
            raise InputError(f"{what}: part(s) {shown} missing; run them (--part I/{count}) and merge all {count}")
        for part, (path, run) in sorted(latest.items()):
            if run.state != "completed":
                raise InputError(
                    f"{what}: part {part}/{count} in {path} did not finish ({run.state}); "
                    "run its command again to finish it, then merge"
                )
        lines.append(f"{what}: {count} part(s)")
    return lines
