"""Where an unchanged rescan's time goes, per file, against `find -printf` (issue #34).

An unchanged rescan must list every folder, lstat every file and read every catalog row of the
tree; this measures each of those alone, in one process, page cache warm, as CPU seconds (user +
system, best of --reps) and µs a file, beside `find ROOT -type f -printf '%s %T@\\n'` on the same
tree and dlindex's own walk + merge-join over all units (``diff_unit``, what the scan's workers
run). It also times two ways of moving the comparison into SQLite, which were tried as ways to
take the per-file Python out of the rescan: the folder's lstat results bound into a temporary
table with ``executemany`` and joined against the catalog, and the same as one JSON array per
folder joined through ``json_each``. Each leaves out what the real scan adds (labels, the
missing rows, the rows' verdicts), so each is a lower bound of its approach.

    python bench/scan_floor.py --tree /tmp/scan34/tiny-200000 --db CATALOG [--reps 3] [--docs docs/benchmarks.md]

CATALOG must hold a scan of the tree (``dlindex scan TREE --db CATALOG``); it is only read.
Written to docs/benchmarks.md between <!-- scan_floor:start --> and <!-- scan_floor:end -->.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from operator import attrgetter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_section

from dlindex.catalog.connection import connect_reader
from dlindex.scan.diff import _ROWS_FROM, DiffOptions, LabelIds, diff_unit
from dlindex.scan.listing import WalkOptions, WalkReport, list_children
from dlindex.scan.units import plan_units

START, END = "<!-- scan_floor:start -->", "<!-- scan_floor:end -->"
_STAT = attrgetter("st_size", "st_mtime_ns", "st_ino", "st_ctime_ns")
_TEMP = (
    "CREATE TEMP TABLE listed (path TEXT PRIMARY KEY, size INT, mtime_ns INT, inode INT, ctime_ns INT) WITHOUT ROWID"
)
_TEMP_JOIN = (
    "SELECT count(*), sum(m.id IS NULL OR m.bytes != l.size OR m.mtime_ns != l.mtime_ns OR m.inode IS NOT l.inode "
    "OR m.ctime_ns IS NOT l.ctime_ns OR m.status = 'missing') "
    "FROM listed l LEFT JOIN image_metadata m ON m.root_id = :root AND m.file_path = l.path"
)
_JSON_JOIN = (
    "SELECT count(*), sum(m.id IS NULL OR m.bytes != j.value->>1 OR m.mtime_ns != j.value->>2 "
    "OR m.inode IS NOT j.value->>3 OR m.ctime_ns IS NOT j.value->>4 OR m.status = 'missing') "
    "FROM json_each(:listed) j LEFT JOIN image_metadata m ON m.root_id = :root AND m.file_path = j.value->>0"
)
_ROOT_ID = "SELECT id FROM roots WHERE path = :path"


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def best(reps: int, fn: Callable[[], object]) -> float:
    """The least CPU seconds of ``reps`` runs of ``fn`` in this process."""
    out = []
    for _ in range(reps):
        c0 = cpu()
        fn()
        out.append(cpu() - c0)
    return min(out)


def find_cpu(root: bytes, reps: int) -> tuple[float, float]:
    """(CPU s, wall s) of `find -printf`, best of ``reps``, from wait4."""
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        proc = subprocess.Popen(["find", root, "-type", "f", "-printf", "%s %T@\\n"], stdout=subprocess.DEVNULL)
        _, _, ru = os.wait4(proc.pid, 0)
        runs.append((ru.ru_utime + ru.ru_stime, time.perf_counter() - t0))
    return min(runs)


def folders(root: bytes) -> list[tuple[bytes, str, list[bytes]]]:
    """Every folder with files: (path, catalog prefix, file names sorted), outside the timings."""
    out = []
    for path, _, files in os.walk(root):
        if files:
            rel = os.path.relpath(path, root)
            prefix = "" if rel == b"." else rel.decode() + "/"
            out.append((path, prefix, sorted(files)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True)
    ap.add_argument("--db", required=True, help="a catalog holding a scan of --tree (read only)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--docs", help="markdown file to write the section into (default: print only)")
    a = ap.parse_args()
    root = os.path.realpath(a.tree).encode()
    dirs = folders(root)
    n = sum(len(f) for _, _, f in dirs)
    conn = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True)
    (root_id,) = conn.execute(_ROOT_ID, {"path": root.decode()}).fetchone()
    options = WalkOptions(root=root)
    rows_params = {"root": root_id, "start": "", "limit": 89_478_485, "bomb": 2 * 89_478_485,
                   "loader_failed": "loader:", "loader_length": 7}  # fmt: skip
    stats: list[list[os.stat_result]] = []

    def lstat_all() -> None:
        stats.clear()
        for path, _, names in dirs:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            stats.append(list(map(partial(os.lstat, dir_fd=fd), names)))
            os.close(fd)

    def scandir_all() -> None:
        for path, _, _ in dirs:
            with os.scandir(path) as it:
                [e.name for e in it if e.is_file(follow_symlinks=False)]

    def list_all() -> None:
        report = WalkReport()
        for path, prefix, _ in dirs:
            list_children(path, prefix, options, report)

    def rows_all() -> None:
        for _ in conn.execute(_ROWS_FROM, rows_params):
            pass

    def diff_all() -> None:
        reader = connect_reader(a.db, timeout=30)
        labels, diff_options = LabelIds(reader), DiffOptions(options)
        unchanged = 0
        for unit in plan_units(root, options, WalkReport(), 2):
            unchanged += diff_unit(reader, root_id, unit, diff_options, labels).unchanged
        reader.close()
        assert unchanged == n, f"the catalog does not hold this tree unchanged ({unchanged} of {n})"

    temp = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True)
    temp.execute(_TEMP)

    def temp_join() -> None:
        for (_, prefix, names), st in zip(dirs, stats, strict=True):
            temp.execute("DELETE FROM listed")
            temp.executemany(
                "INSERT INTO listed VALUES (?, ?, ?, ?, ?)",
                [(prefix + name.decode(), *_STAT(s)) for name, s in zip(names, st, strict=True)],
            )
            temp.execute(_TEMP_JOIN, {"root": root_id}).fetchone()

    def json_join() -> None:
        for (_, prefix, names), st in zip(dirs, stats, strict=True):
            listed = json.dumps([(prefix + name.decode(), *_STAT(s)) for name, s in zip(names, st, strict=True)])
            conn.execute(_JSON_JOIN, {"root": root_id, "listed": listed}).fetchone()

    lstat_all()
    f_cpu, f_wall = find_cpu(root, a.reps)
    parts = [
        ("`find -printf` (whole command)", f_cpu),
        ("scandir of every folder (names, d_type)", best(a.reps, scandir_all)),
        ("dlindex `list_children` of every folder", best(a.reps, list_all)),
        ("`os.lstat` of every file (relative to its folder)", best(a.reps, lstat_all)),
        ("the merge-join's catalog rows (9 columns)", best(a.reps, rows_all)),
        ("dlindex walk + merge-join of all units, 1 process", best(a.reps, diff_all)),
        ("tried: lstat results `executemany`d into a temp table, joined (after the lstat)", best(a.reps, temp_join)),
        ("tried: lstat results as JSON, joined through `json_each` (after the lstat)", best(a.reps, json_join)),
    ]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        START, "## Where an unchanged rescan's time goes (`bench/scan_floor.py`)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {n:,} files in {len(dirs):,} folders "
        f"(`{a.tree}`), page cache warm, Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, load "
        f"{load}; CPU seconds (user + system), best of {a.reps}, each step alone in one process; `find` "
        f"{f_wall:.2f} s wall.", "",
        "| step | CPU s | µs a file | x find |", "|---|---|---|---|",
    ]  # fmt: skip
    for name, s in parts:
        lines.append(f"| {name} | {s:.3f} | {s / n * 1e6:.2f} | {s / f_cpu:.1f}x |")
    lines += ["", "```sh", f"python bench/scan_floor.py --tree {a.tree} --db CATALOG --reps {a.reps}", "```", END]
    section = "\n".join(lines)
    print(section)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", file=sys.stderr)
    if a.docs:
        write_section(Path(a.docs), START, END, section)


if __name__ == "__main__":
    main()
