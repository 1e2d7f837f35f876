"""Every command at catalog size (#34): 10^6, 10^7 and 10^8 rows, and the 2M-file scan.

One runner for issue #34's table: each case runs the real CLI (or the library, for the loader)
in a fresh process and records its wall seconds, CPU seconds (os.wait4: user + system of the
process and every child it waited for), and peak RSS of the whole process tree (bench/size_measure.py
says how), beside a baseline measured in the same run on the same catalog: a bare python
sqlite3 loop doing the same work (or a full pass over the table, for commands that have no such
loop), ``find`` and a one-process read loop for the scan. Each (rows, case) result is saved as
JSON under ``$DLINDEX_BENCH_DIR/scale-results/<rows>/<case>.json``, and the `bench_size` section
of docs/benchmarks.md is rendered from every saved result (bench/size_report.py), so one run
refreshes the cells it measured and keeps the others:

  nice -n 19 python bench/bench_size.py --rows 1e6                      # every case, ~10 min
  nice -n 19 python bench/bench_size.py --rows 1e7 --only stats,check  # a few cells
  flock /tmp/dlindex-1e8.lock nice -n 19 python bench/bench_size.py --rows 1e8 --only stats
  python bench/bench_size.py --render                                  # docs only, from saved results
  nice -n 19 python bench/bench_size.py --only scan                    # the 2M-file tree

Catalogs are bench/make_catalog.py's (``ensure_catalog(rows)``; ``--catalog`` for another file).
Read-only cases read the shared file itself (DLINDEX_NO_LOG=1: nothing is logged into it).
Cases that write (exports record themselves, the per-label index, the feature matrix, mark)
get a copy in --scratch at up to 10^7 rows, removed at the end. At 10^8 (``--in-place``, the
default from 10^8 rows up) there is no copy (~30 GB): ``mark`` marks rows and restores the flag
and ``updated_at`` exactly (checked), every other writing case is skipped unless
``--allow-writes`` (exports: their record is deleted afterwards; per-label: the index is built
and left in the catalog). At 10^8 every run must hold /tmp/dlindex-1e8.lock (``flock``, or
``--lock`` to take it per case); each case prints its time so the next run can be sized.
Outputs (exports, merged catalogs) go to --scratch and are deleted right after each
measurement; a case whose output or copy would leave less than 8 GB free is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import size_report
from common import compile_sources, write_section
from make_catalog import ensure_catalog
from size_measure import Failed, measure

LOCK = Path("/tmp/dlindex-1e8.lock")
MIN_FREE = 8 * 10**9  # the machine's rule: never let /tmp fall under 8 GB free
TWO_M = Path("/tmp/dlindex-bench-2m/tiny-2000000")
PER_LABEL_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_per_label ON image_metadata (label_id, path_hash) "
    "WHERE status = 'ok' AND excluded = 0"
)
# What `index --suggest --apply` creates for the logged time-window and status reads (names and
# definitions as the advisor writes them, so a later --suggest finds them in place).
WINDOW_INDEX_NAME = "idx_dlindex_image_metadata_created_at_32e17ccc"
WINDOW_INDEX = f"CREATE INDEX IF NOT EXISTS {WINDOW_INDEX_NAME} ON image_metadata (created_at) WHERE excluded = 0 AND status = 'ok'"
# the corrupt list: covering (what --suggest proposes since windows34), and the plain (id) index
# it proposed before, kept as a case to compare with (each read cold: a table page per row)
STATUS_INDEX_NAME = "idx_dlindex_image_metadata_id_e21316b4"
STATUS_INDEX = (
    f"CREATE INDEX IF NOT EXISTS {STATUS_INDEX_NAME} ON image_metadata (id, root_id, file_path, file_path_bytes, "
    "label_id, width, height, status, processed, processing_status, created_at, excluded) "
    "WHERE excluded = 0 AND status = 'corrupt'"
)
STATUS_ID_INDEX_NAME = "idx_dlindex_image_metadata_id_3e7dcdd4"
STATUS_ID_INDEX = f"CREATE INDEX IF NOT EXISTS {STATUS_ID_INDEX_NAME} ON image_metadata (id) WHERE excluded = 0 AND status = 'corrupt'"
# A 10-second window of the last scan (make_catalog.py's scans are 3-hour bursts a month apart):
# ~85 rows at 10^6, ~8,500 at 10^8, under windows.PROBE, so read from the index.
WINDOW = ("2026-06-04 04:00:00", "2026-06-04 04:00:10")
STATUS_FILTER = ["--status", "corrupt"]  # 0.2% of the rows: ~200k at 10^8
SPLIT = "train=0.9,val=0.1"

# Baselines: bare python sqlite3 loops (scripts run as `python -c CODE DB`)
BARE_SCAN = """
import sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
print(conn.execute("SELECT status, count(*), sum(bytes), sum(processed) FROM image_metadata GROUP BY status").fetchall())
"""
# what an epoch plan needs at least: the selected ids and labels in arrays, this rank's share taken
BARE_IDS = """
import array, sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
ids, labels = array.array("q"), array.array("q")
cur = conn.execute("SELECT id, label_id FROM image_metadata WHERE status = 'ok' AND excluded = 0 "
                   "AND label_id IS NOT NULL ORDER BY id")
while batch := cur.fetchmany(65536):
    for i, l in batch:
        ids.append(i); labels.append(l)
share = ids[3::8]
print(len(ids), len(share))
"""
LOADER_PLAN = """
import json, sys
from dlindex.torch import CatalogDataset
with open("/proc/self/status") as f:
    imported = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
dataset = CatalogDataset(sys.argv[1], world_size=8, rank=3, batch_size=256)
print(json.dumps({"batches": len(dataset), "rss_after_import_mb": round(imported / 1024, 1)}))
"""
# mark's exact restore: the saved processed and updated_at values written back (ANALYZE first:
# without statistics SQLite plans UPDATE ... FROM as a scan of the whole catalog's path index)
BARE_RESTORE = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("ATTACH DATABASE ? AS saved", (sys.argv[2],))
conn.execute("ANALYZE saved")
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE main.image_metadata SET processed = s.processed, updated_at = s.updated_at "
             "FROM saved.m AS s WHERE image_metadata.id = s.id")
conn.execute("COMMIT")
"""
# mark's baseline: SQLite's own UPDATE of the same rows to the same value (the ids read from the same
# file into a temporary table, then one statement, one transaction), as a python sqlite3 user writes it
BARE_UPDATE = """
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA synchronous = NORMAL")
conn.execute("CREATE TEMP TABLE m (id INTEGER PRIMARY KEY)")
with open(sys.argv[2], "rb") as f:
    while chunk := f.readlines(1 << 20):
        conn.execute("INSERT INTO temp.m SELECT value FROM json_each(?)", (json.dumps(list(map(int, chunk))),))
conn.execute("BEGIN IMMEDIATE")
changed = conn.execute("UPDATE image_metadata SET processed = ?, updated_at = CURRENT_TIMESTAMP "
                       "WHERE id IN (SELECT id FROM temp.m)", (int(sys.argv[3]),)).rowcount
conn.execute("COMMIT")
conn.close()
print(changed)
"""
# mark's id patterns: the ids chosen, the flag set (processed rows are 30% of the catalog, spread evenly)
MARK_PATTERNS = {
    "mark": ("the first N processed ids, --unprocessed (~30% of the rows in their span)",
             "processed = 1", 0),
    "mark-contiguous": ("N contiguous ids, --processed (a batch that landed together; ~70% change)",
                        "1", 1),
    "mark-spread": ("every 10th id, N of them, --processed (10% of a span of 10N ids; ~70% change)",
                    "id % 10 = 0", 1),
}  # fmt: skip


class Skip(Exception):
    """A case not run at this size, and why (saved only where no earlier result exists)."""


@dataclass
class Size:
    """One catalog size: where its catalog is, the scratch copy, the baselines measured so far."""

    rows: int
    shared: Path
    scratch: Path
    results: Path
    env: dict[str, str]
    in_place: bool
    allow_writes: bool
    timeout_s: float
    mark_ids: int
    no_baseline: bool = False
    cold: bool = False
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    _copy: Path | None = None

    # -- catalogs --------------------------------------------------------------------------
    def catalog_bytes(self) -> int:
        return self.shared.stat().st_size

    def need_disk(self, nbytes: float, what: str) -> None:
        free = shutil.disk_usage(self.scratch).free
        if os.stat(self.scratch).st_dev == os.stat(self.shared.parent).st_dev:
            free -= growing(self.shared.parent)
        if Path(self.scratch).resolve().is_relative_to("/dev/shm"):  # tmpfs: RAM that others need too
            free = min(free, mem_available())
        if free - nbytes < MIN_FREE:
            raise Skip(f"{what} needs ~{nbytes / 1e9:.1f} GB of {self.scratch}, {free / 1e9:.1f} GB free (keep 8 GB)")

    def writable(self, what: str) -> Path:
        """The catalog a writing case may write into: a scratch copy, or the shared file itself
        in place with --allow-writes."""
        if self.in_place:
            if not self.allow_writes:
                raise Skip(f"{what} writes into the catalog: at this size only with --allow-writes (no copy)")
            return self.shared
        if self._copy is None:
            self.need_disk(self.catalog_bytes() * 1.1, "a copy of the catalog")
            copy = self.scratch / f"copy-{self.rows}.db"
            began = time.perf_counter()
            subprocess.run(["cp", "--reflink=auto", str(self.shared), str(copy)], check=True)
            print(f"  (copied the catalog in {time.perf_counter() - began:.0f} s)", flush=True)
            self._copy = copy
        return self._copy

    def drop_copy(self) -> None:
        if self._copy is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{self._copy}{suffix}").unlink(missing_ok=True)
            shutil.rmtree(f"{self._copy}-features", ignore_errors=True)
            self._copy = None

    # -- running ---------------------------------------------------------------------------
    def run(
        self, cmd: list[str], *, stdout: Any = None, ok: tuple[int, ...] = (0,), watch: Path | None = None
    ) -> dict[str, Any]:
        return measure(cmd, env=self.env, cwd=self.scratch, stdout=stdout, timeout_s=self.timeout_s, ok_codes=ok,
                       watch=watch)  # fmt: skip

    def dl(self, db: Path, *args: str, ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
        return self.run([sys.executable, "-m", "dlindex", *args, "--db", str(db)], ok=ok)

    def py(self, code: str, *args: str, stdout: Any = None) -> dict[str, Any]:
        return self.run([sys.executable, "-c", code, *args], stdout=stdout)

    def baseline(self, name: str) -> dict[str, Any]:
        """A baseline, measured once per run and size (on the shared catalog: read-only)."""
        if self.no_baseline:
            return {}
        if name not in self.baselines:
            db = str(self.shared)
            if name == "bare-scan":
                figures = self.py(BARE_SCAN, db)
            elif name == "bare-jsonl":
                figures = self.run([sys.executable, str(HERE / "baselines" / "query_jsonl.py"), db])
            elif name == "bare-export":
                figures = self.run([sys.executable, str(HERE / "baselines" / "export_jsonl.py"), db])
            elif name == "bare-ids":
                figures = self.py(BARE_IDS, db)
            else:
                raise KeyError(name)
            self.baselines[name] = {"name": name, **figures}
            print(f"  baseline {name}: {brief(figures)}", flush=True)
        return self.baselines[name]


def growing(folder: Path) -> int:
    """Bytes still to come of catalogs being generated in ``folder`` (no ``.complete`` marker yet),
    at ~300 bytes a row: the free space they will take is not ours."""
    pending = 0
    for db in folder.glob("catalog-*-*l-s*.db"):
        if not Path(f"{db}.complete").exists():
            with contextlib.suppress(ValueError, OSError):
                pending += max(0, int(db.name.split("-")[1]) * 300 - db.stat().st_size)
    return pending


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def brief(f: dict[str, Any]) -> str:
    return f"{f['wall_s']} s wall, {f['cpu_s']} CPU s, {f['peak_rss_mb']:,.0f} MB"


# -- cases ---------------------------------------------------------------------------------
# Each returns {"command": shown command, "figures": the measured run, "baseline": figures,
# optional "parts": other runs, "extra": counts}. Order: read-only cases first (no copy yet),
# then the ones that write into a copy.
CASES: dict[str, Callable[[Size], dict[str, Any]]] = {}
WRITES: set[str] = set()


def case(
    name: str, writes: bool = False
) -> Callable[[Callable[[Size], dict[str, Any]]], Callable[[Size], dict[str, Any]]]:
    def register(fn: Callable[[Size], dict[str, Any]]) -> Callable[[Size], dict[str, Any]]:
        CASES[name] = fn
        if writes:
            WRITES.add(name)
        return fn

    return register


def _simple(s: Size, args: list[str], base: str, ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
    return {"command": "dlindex " + " ".join(args), "figures": s.dl(s.shared, *args, ok=ok),
            "baseline": s.baseline(base)}  # fmt: skip


@case("stats")
def _stats(s: Size) -> dict[str, Any]:
    return _simple(s, ["stats"], "bare-scan")


@case("stats-exact")
def _stats_exact(s: Size) -> dict[str, Any]:
    return _simple(s, ["stats", "--exact"], "bare-scan")


@case("check")
def _check(s: Size) -> dict[str, Any]:
    return _simple(s, ["check"], "bare-scan", ok=(0, 1))


@case("query-jsonl")
def _query_jsonl(s: Size) -> dict[str, Any]:
    return _simple(s, ["query", "--format", "jsonl", "--no-cache"], "bare-jsonl")


@case("loader-plan")
def _loader_plan(s: Size) -> dict[str, Any]:
    with (s.scratch / "loader.out").open("w+b") as out:
        figures = s.run([sys.executable, "-c", LOADER_PLAN, str(s.shared)], stdout=out)
        out.seek(0)
        extra = json.loads(out.read().decode().strip().splitlines()[-1])
    (s.scratch / "loader.out").unlink()
    return {"command": "python: len(CatalogDataset(DB, world_size=8, rank=3, batch_size=256))",
            "figures": figures, "baseline": s.baseline("bare-ids"), "extra": extra}  # fmt: skip


@case("loader-workers")
def _loader_workers(s: Size) -> dict[str, Any]:
    """The plan, then a DataLoader of 2 forked workers that each take their part of it
    (bench_loader_plan.py's child): the tree's peak RSS counts the pages the workers share
    with the parent (python, torch, the mapped plan) once per process, its peak Pss once."""
    child = [sys.executable, str(HERE / "bench_loader_plan.py"), "--child", str(s.shared), "--child-workers", "fork"]
    with (s.scratch / "loader-workers.out").open("w+b") as out:
        figures = s.run(child, stdout=out)
        out.seek(0)
        got = json.loads(out.read().decode().strip().splitlines()[-1])
    (s.scratch / "loader-workers.out").unlink()
    workers = got["workers_fork"]["workers"]
    extra = {"batches": got["batches"], "rank_samples": got["rank_samples"], "plan_file_bytes": got["plan_file_bytes"],
             "pickled_bytes": got["pickled_bytes"], "main_rss_mb": round(got["main"]["VmRSS"] / 2**20, 1),
             "worker_rss_mb": [round(w["VmRSS"] / 2**20, 1) for w in workers],
             "worker_pss_mb": [round(w["Pss"] / 2**20, 1) for w in workers],
             "worker_plan_mapped_mb": [round(w["RssShmem"] / 2**20, 1) for w in workers],
             "worker_private_mb": [round(w["Private"] / 2**20, 1) for w in workers]}  # fmt: skip
    return {"command": "python bench/bench_loader_plan.py --child DB --child-workers fork "
            "(CatalogDataset(DB, world_size=8, rank=3, batch_size=256), DataLoader of 2 forked workers)",
            "figures": figures, "baseline": s.baseline("bare-ids"), "extra": extra}  # fmt: skip


@case("dups")
def _dups(s: Size) -> dict[str, Any]:
    return _simple(s, ["dups", "--format", "jsonl"], "bare-scan")


@case("leaks")
def _leaks(s: Size) -> dict[str, Any]:
    return _simple(s, ["leaks", "--split", SPLIT, "--format", "jsonl"], "bare-scan")


@case("index-suggest")
def _index_suggest(s: Size) -> dict[str, Any]:
    log = workload_log(s)
    out_path = s.scratch / "suggest.json"
    with out_path.open("w+b") as out:
        figures = s.run([sys.executable, "-m", "dlindex", "index", "--suggest", "--log", str(log), "--json",
                         "--db", str(s.shared)], stdout=out)  # fmt: skip
        out.seek(0)
        advice = json.loads(out.read() or b"{}")
    out_path.unlink()
    sqls = [x.get("sql") for x in advice.get("suggestions", []) if isinstance(x, dict)]
    extra = {"suggestions": sqls, "sample": advice.get("sample"), "sampled_from": advice.get("sampled_from")}
    return {"command": "dlindex index --suggest --log workload.sql --json", "figures": figures,
            "baseline": s.baseline("bare-scan"), "extra": extra}  # fmt: skip


@case("merge")
def _merge(s: Size) -> dict[str, Any]:
    s.need_disk(s.catalog_bytes() * 1.2, "merge's target catalog")
    target = s.scratch / "merged.db"
    try:
        figures = s.run([sys.executable, "-m", "dlindex", "merge", str(s.shared), "--into", str(target), "-q"])
        extra = {"target_bytes": target.stat().st_size}
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{target}{suffix}").unlink(missing_ok=True)
    return {"command": "dlindex merge CATALOG --into NEW.db -q", "figures": figures,
            "baseline": s.baseline("bare-scan"), "extra": extra}  # fmt: skip


def _export(s: Size, name: str, args: list[str], bytes_per_row: float) -> dict[str, Any]:
    s.need_disk(s.rows * bytes_per_row, f"export {' '.join(args)}")
    db = s.writable(name)
    out = s.scratch / "export-out"
    shutil.rmtree(out, ignore_errors=True)
    try:
        figures = s.dl(db, "export", str(out), *args, "-q")
        index = next(out.glob("*index.json"), None)
        counts = json.loads(index.read_text()).get("counts", {}) if index else {}
        extra = {"selected": counts.get("selected"), "output_bytes": dir_bytes(out)}
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if db == s.shared:  # --allow-writes in place: the export's record goes with its folder
            with contextlib.closing(sqlite3.connect(db)) as conn, conn:
                conn.execute("DELETE FROM exports WHERE path = ?", (os.fspath(out),))
    if extra["selected"]:
        extra["rows_per_s"] = round(extra["selected"] / figures["wall_s"])
    return {"command": f"dlindex export OUT {' '.join(args)} -q", "figures": figures,
            "baseline": s.baseline("bare-export"), "extra": extra}  # fmt: skip


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@case("export-jsonl", writes=True)
def _export_plain(s: Size) -> dict[str, Any]:
    # a plain manifest (the generated catalog's train/ and val/ folders are its splits): 217-220 B
    # a row measured; the second process's part is drained into the shard as it is copied
    return _export(s, "export-jsonl", ["--format", "jsonl"], 225)


@case("export-jsonl-split", writes=True)
def _export_split(s: Size) -> dict[str, Any]:
    # ~220 B a row of jsonl; one pass deals the rows (no spill), the part files drained as copied
    return _export(s, "export-jsonl-split", ["--format", "jsonl", "--split", SPLIT], 225)


@case("export-parquet", writes=True)
def _export_parquet(s: Size) -> dict[str, Any]:
    return _export(s, "export-parquet", ["--format", "parquet"], 60)


@case("export-csv", writes=True)
def _export_csv(s: Size) -> dict[str, Any]:
    # ~120 B a row of csv (12 GB at 10^8 measured)
    return _export(s, "export-csv", ["--format", "csv"], 125)


def evict(db: Path) -> None:
    """Drop the catalog's pages (file and WAL) from the page cache, without root: the next read is cold."""
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(f"{db}{suffix}", os.O_RDONLY)
            try:
                os.fsync(fd)  # only clean pages can be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(s: Size, db: Path, args: list[str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A query run warm (twice, the second quoted) and, with --cold, first on an evicted page cache
    (then the cold run is quoted): (the quoted figures, every run, the output's rows and sha256)."""
    cmd = [sys.executable, "-m", "dlindex", *args, "--db", str(db)]
    parts: dict[str, Any] = {}
    if s.cold:
        evict(db)
        parts["cold"] = s.run(cmd)
        print(f"  cold: {brief(parts['cold'])}", flush=True)
    parts["warm, first run"] = s.run(cmd)
    out_path = s.scratch / "query.out"
    with out_path.open("w+b") as out:
        parts["warm"] = s.run(cmd, stdout=out)
        out.seek(0)
        digest, rows = hashlib.sha256(), 0
        while chunk := out.read(1 << 20):
            digest.update(chunk)
            rows += chunk.count(b"\n")
    out_path.unlink()
    print(f"  warm: {brief(parts['warm'])} (first run {brief(parts['warm, first run'])})", flush=True)
    return parts["cold" if s.cold else "warm"], parts, {"rows_out": rows, "output_sha256": digest.hexdigest()}


def indexed(s: Size, name: str, ddl: str, args: list[str], bytes_per_row: float) -> tuple[Path, dict[str, Any]]:
    """The catalog holding index ``name`` (built if missing, ``args`` timed once before it: the
    baseline), and extra figures: build seconds and the bytes the build added to the file."""
    db = s.shared if s.in_place else s.writable(name)
    extra: dict[str, Any] = {"index": name}
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        has = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)).fetchone()
    if not has:
        db = s.writable(f"{name}'s index")
        if not s.no_baseline:
            extra["before"] = s.dl(db, *args)
            print(f"  without {name}: {brief(extra['before'])}", flush=True)
        s.need_disk(s.rows * bytes_per_row, f"the index {name}")
        size = db.stat().st_size
        began = time.perf_counter()
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
            # A rollback journal, as dlindex's own bulk writes: WAL would hold the whole new index
            # once more until the checkpoint (~3 GB more disk at 10^8); where another connection
            # has the file open the switch fails and WAL stays.
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute("PRAGMA journal_mode = DELETE")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(ddl)
            conn.execute("PRAGMA analysis_limit = 1000")  # as index --apply: moments, not a pass per index
            conn.execute("ANALYZE image_metadata")
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        extra["index_build_s"] = round(time.perf_counter() - began, 1)
        extra["index_bytes"] = db.stat().st_size - size  # the file had no free pages to reuse (make_catalog)
        print(f"  (built {name} in {extra['index_build_s']} s, {extra['index_bytes'] / 1e6:,.0f} MB)", flush=True)
    return db, extra


def _query_case(s: Size, name: str, ddl: str, args: list[str], bytes_per_row: float, what: str) -> dict[str, Any]:
    db, extra = indexed(s, name, ddl, args, bytes_per_row)
    figures, parts, output = timed(s, db, args)
    before = extra.pop("before", None)
    baseline = {"name": "before-index", **before} if before else {}
    return {"command": "dlindex " + " ".join(args) + f"  # {what}", "figures": figures, "parts": parts,
            "baseline": baseline, "extra": {**extra, **output, "cold": s.cold}}  # fmt: skip


@case("per-label", writes=True)
def _per_label(s: Size) -> dict[str, Any]:
    args = ["query", "--per-label", "32", "--seed", "0", "--format", "jsonl", "--no-cache"]
    return _query_case(s, "idx_per_label", PER_LABEL_INDEX, args, 25, "after the index of docs/scale.md")


@case("time-window", writes=True)
def _time_window(s: Size) -> dict[str, Any]:
    args = ["query", "--since", WINDOW[0], "--until", WINDOW[1], "--format", "jsonl", "--no-cache"]
    return _query_case(s, WINDOW_INDEX_NAME, WINDOW_INDEX, args, 35, "after index --apply's created_at index")


@case("status-filter", writes=True)
def _status_filter(s: Size) -> dict[str, Any]:
    args = ["query", *STATUS_FILTER, "--format", "jsonl", "--no-cache"]
    record = _query_case(s, STATUS_INDEX_NAME, STATUS_INDEX, args, 1, "after index --apply's covering partial index")
    db = s.shared if s.in_place else s.writable(STATUS_INDEX_NAME)
    if s.cold:  # the list grows with the catalog (0.2% of it); its first page does not
        evict(db)
    record["parts"]["first 1,000 (--limit 1000)"] = page = s.dl(db, *args, "--limit", "1000")
    print(f"  --limit 1000{' cold' if s.cold else ''}: {brief(page)}", flush=True)
    return record


@case("status-filter-id", writes=True)
def _status_filter_id(s: Size) -> dict[str, Any]:
    args = ["query", *STATUS_FILTER, "--format", "jsonl", "--no-cache"]
    return _query_case(s, STATUS_ID_INDEX_NAME, STATUS_ID_INDEX, args, 1, "after a partial (id) index, not covering")


@case("similar", writes=True)
def _similar(s: Size) -> dict[str, Any]:
    s.need_disk(s.rows * 30, "similar's feature matrix")
    db = s.writable("similar (its feature matrix is written beside the catalog)")
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        query, vectors = conn.execute(
            "SELECT min(image_id), count(*) FROM image_features WHERE feature_type = 'dhash'"
        ).fetchone()
    figures = s.dl(db, "similar", str(query), "--type", "dhash", "-k", "10", "--format", "jsonl")
    return {"command": "dlindex similar ID --type dhash -k 10 --format jsonl  # matrix built in the call",
            "figures": figures, "baseline": s.baseline("bare-scan"), "extra": {"vectors": vectors}}  # fmt: skip


def _mark(s: Size, pattern: str) -> dict[str, Any]:
    """mark N ids of ``pattern`` (MARK_PATTERNS), put the rows back exactly (processed and
    updated_at, saved first), then the bare UPDATE of the same ids to the same value (the
    baseline) and put back again; checked. Reads the span first, so both find it as warm."""
    db = s.shared if s.in_place else s.writable("mark")
    what, where, flag = MARK_PATTERNS[pattern]
    saved = s.scratch / "mark-saved.db"
    ids_file = s.scratch / "mark.ids"
    saved.unlink(missing_ok=True)
    with contextlib.closing(sqlite3.connect(saved, uri=True)) as conn:  # uri: the catalog is attached read-only
        conn.execute("ATTACH DATABASE ? AS cat", (f"file:{db}?mode=ro",))
        conn.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, processed, updated_at)")
        conn.execute(f"INSERT INTO m SELECT id, processed, updated_at FROM cat.image_metadata "
                     f"WHERE {where} ORDER BY id LIMIT ?", (s.mark_ids,))  # fmt: skip
        conn.commit()
        n, lo, hi, changing = conn.execute("SELECT count(*), min(id), max(id), sum(processed IS NOT ?) FROM m",
                                           (flag,)).fetchone()  # fmt: skip
    span = hi - lo + 1
    # every changed page goes to the WAL (the bare UPDATE's one transaction: all of them), and back
    try:
        s.need_disk(s.catalog_bytes() * span / s.rows * 1.1, f"mark's WAL for ids {lo:,}..{hi:,}")
    except Skip:
        saved.unlink()
        raise
    with contextlib.closing(sqlite3.connect(f"file:{saved}?mode=ro", uri=True)) as conn, ids_file.open("w") as f:
        f.writelines(f"{i}\n" for (i,) in conn.execute("SELECT id FROM m ORDER BY id"))
    wal = Path(f"{db}-wal")

    def state() -> tuple[int, int]:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            conn.execute("ATTACH DATABASE ? AS saved", (f"file:{saved}?mode=ro",))
            in_range = conn.execute(
                "SELECT count(*) FROM image_metadata WHERE id BETWEEN ? AND ? AND processed = 1", (lo, hi)
            ).fetchone()[0]
            same = conn.execute(
                "SELECT count(*) FROM saved.m AS s JOIN image_metadata AS i ON i.id = s.id "
                "WHERE i.processed IS s.processed AND i.updated_at IS s.updated_at"
            ).fetchone()[0]
        return in_range, same

    before = state()  # also reads the span: the mark and the bare UPDATE find the same pages cached
    parts: dict[str, Any] = {}
    option = "--processed" if flag else "--unprocessed"
    try:
        marked = s.run([sys.executable, "-m", "dlindex", "mark", option, str(ids_file), "-q", "--db", str(db)],
                       watch=wal)  # fmt: skip
        print(f"  mark {option} {n:,} ids: {brief(marked)}", flush=True)
        parts["restore"] = s.py(BARE_RESTORE, str(db), str(saved))
        bare = s.run([sys.executable, "-c", BARE_UPDATE, str(db), str(ids_file), str(flag)], watch=wal)
        print(f"  bare UPDATE: {brief(bare)}", flush=True)
    finally:
        parts["restore (after the bare UPDATE)"] = s.py(BARE_RESTORE, str(db), str(saved))
        after = state()
        ids_file.unlink(missing_ok=True)
        saved.unlink(missing_ok=True)
    if after != before or before[1] != n:
        raise SystemExit(f"mark: the catalog was not restored: {before} before, {after} after ({n} ids)")
    return {"command": f"dlindex mark {option} IDS -q  # {n:,} ids: {what}",
            "figures": marked, "parts": parts, "baseline": {"name": "bare-update-in", **bare},
            "extra": {"ids": n, "id_span": span, "ids_per_s": round(n / marked["wall_s"]),
                      "bare_ids_per_s": round(n / bare["wall_s"]), "changed": changing, "pattern": pattern,
                      "restored": True, "processed_in_span": before[0]}}  # fmt: skip


for _pattern in MARK_PATTERNS:
    case(_pattern, writes=True)(functools.partial(_mark, pattern=_pattern))


@case("scan")
def _scan(s: Size) -> dict[str, Any]:
    """The 2M-file tree: first scan vs the one-process read loop, unchanged rescan vs find -printf."""
    root = TWO_M
    if not Path(f"{root}.complete").exists():
        raise Skip(f"no tree at {root} (python bench/make_trees.py --only tiny --tiny 2000000 --work {root.parent})")
    s.need_disk(1e9, "the scan's catalog")
    db = s.scratch / "scan-2m.db"
    parts: dict[str, Any] = {}
    try:
        parts["read loop (bench/baselines/read_all.py)"] = read = s.run(
            [sys.executable, str(HERE / "baselines" / "read_all.py"), str(root)]
        )
        print(f"  read loop: {brief(read)}", flush=True)
        first = s.run([sys.executable, "-m", "dlindex", "scan", str(root), "--db", str(db), "-q"])
        print(f"  first scan: {brief(first)}", flush=True)
        parts["find -type f -printf"] = s.run(["sh", "-c", f"find '{root}' -type f -printf '%s %T@\\n' > /dev/null"])
        parts["unchanged rescan"] = s.run([sys.executable, "-m", "dlindex", "scan", str(root), "--db", str(db), "-q"])
        extra = {"files": 2_000_000, "catalog_bytes": db.stat().st_size}
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    return {"command": f"dlindex scan {root} --db NEW.db -q", "figures": first, "parts": parts,
            "baseline": {"name": "read loop", **read}, "extra": extra}  # fmt: skip


# -- the workload behind index --suggest -----------------------------------------------------
def workload_log(s: Size) -> Path:
    """Training-time reads as SQL text with durations (``dlindex log import``'s format), captured once
    on the 10^6 catalog: per-label sampling, unprocessed work, a time window, the failed list,
    three seeds each, as bench/bench_index_size.py logs them. Read from a file, the workload
    needs no write into the catalog being advised (the 10^8 one is shared)."""
    path = s.results / "workload.sql"
    if path.exists():
        return path
    code = r"""
import sys, time
from dlindex import Catalog, QuerySpec, query_rows
out = []
with Catalog(sys.argv[1], log=False) as c:
    for seed in range(3):
        for spec in (QuerySpec(per_label=32, seed=seed, cache=False),
                     QuerySpec(status="ok", processed=False, limit=1000, offset=seed * 1000, cache=False),
                     QuerySpec(since="2026-12-01", processed=True, limit=5000, cache=False),
                     QuerySpec(processing_status=("failed",), cache=False)):
            seen = []
            c.conn.set_trace_callback(seen.append)
            began = time.perf_counter()
            for _ in query_rows(c, spec):
                pass
            ms = (time.perf_counter() - began) * 1000
            c.conn.set_trace_callback(None)
            main = [q for q in seen if q.startswith(("SELECT image_metadata.", "WITH"))]
            out += [f"-- duration_ms={ms:.1f}\n{q.strip().rstrip(';')};\n" for q in main[-1:]]
open(sys.argv[2], "w").write("".join(out))
"""
    small = ensure_catalog(10**6)
    subprocess.run([sys.executable, "-c", code, str(small), str(path)], env=s.env, cwd=s.scratch, check=True)
    return path


# -- the run ---------------------------------------------------------------------------------
@contextlib.contextmanager
def held(lock: Path | None) -> Iterator[None]:
    if lock is None:
        yield
        return
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def under_outer_lock() -> bool:
    """True when another process (e.g. ``flock LOCK cmd`` that started us) holds the lock."""
    with LOCK.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def code_revision() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, check=False).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "dlindex")
    # the last commit that changed dlindex/: what was measured, whatever bench/ or docs/ did since
    return git("log", "-1", "--format=%h", "--", "dlindex") + ("+dirty" if dirty else "")


def save(results: Path, key: str, name: str, record: dict[str, Any]) -> None:
    folder = results / key
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.json"
    if "skipped" in record and target.exists() and "skipped" not in json.loads(target.read_text()):
        return  # a skip never hides a measurement
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, target)


def run_size(a: argparse.Namespace, rows: int, names: list[str], env: dict[str, str]) -> None:
    shared = a.catalog or ensure_catalog(rows)
    in_place = a.in_place or rows >= 10**8
    s = Size(rows=rows, shared=shared, scratch=a.scratch, results=a.results, env=env, in_place=in_place,
             allow_writes=a.allow_writes, timeout_s=a.timeout, mark_ids=a.mark_ids, no_baseline=a.no_baseline,
             cold=a.cold)  # fmt: skip
    lock = LOCK if a.lock else None
    if rows >= 10**8 and not a.lock and not under_outer_lock():
        raise SystemExit(f"10^8 rows: run under `flock {LOCK} nice -n 19 ...` or pass --lock")
    print(f"== {rows:,} rows: {shared} ({s.catalog_bytes() / 1e9:.2f} GB){' in place' if in_place else ''}", flush=True)
    try:
        for name in names:
            if name == "scan":
                continue
            began = time.perf_counter()
            record: dict[str, Any] = {"case": name, "rows": rows, "catalog": str(shared),
                                      "catalog_bytes": s.catalog_bytes(), "code": a.revision,
                                      "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "load": [round(x, 1) for x in os.getloadavg()], "cores": os.cpu_count()}  # fmt: skip
            try:
                with held(lock):
                    record.update(CASES[name](s))
            except Skip as why:
                record["skipped"] = str(why)
            except Failed as why:
                record["failed"] = str(why)
            took = time.perf_counter() - began
            record["case_s"] = round(took, 1)
            save(a.results, str(rows), name, record)
            shown = record.get("skipped") or record.get("failed") or brief(record["figures"])
            print(f"{rows:,} {name}: {shown} (case took {took:.0f} s)", flush=True)
    finally:
        s.drop_copy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1e6", help="catalog sizes, comma-separated (1e6,1e7,1e8)")
    ap.add_argument("--only", help=f"cases, comma-separated: {', '.join(CASES)} (default: all but scan)")
    ap.add_argument("--skip", default="", help="cases to leave out")
    ap.add_argument("--catalog", type=Path, help="this catalog for the (single) --rows size, not ensure_catalog's")
    bench_dir = Path(os.environ.get("DLINDEX_BENCH_DIR") or "/tmp/dlindex-bench")
    ap.add_argument("--results", type=Path, default=bench_dir / "scale-results", help="saved JSON results")
    ap.add_argument("--scratch", type=Path, default=bench_dir / "scale-scratch", help="copies and outputs")
    ap.add_argument("--in-place", action="store_true", help="no copy even below 10^8 rows (writing cases skip)")
    ap.add_argument("--allow-writes", action="store_true", help="in place: let exports and per-label write")
    ap.add_argument("--lock", action="store_true", help=f"take {LOCK} around each case (not under flock)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a command may run (killed after)")
    ap.add_argument("--mark-ids", type=int, default=10_000_000, help="mark: at most this many processed ids")
    ap.add_argument("--no-baseline", action="store_true", help="skip the full-pass baselines (a quick cell at 10^8)")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="query cases: evict the catalog from the page cache (posix_fadvise DONTNEED) before a first run",
    )
    ap.add_argument("--render", action="store_true", help="only render docs from the saved results")
    ap.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md alone")
    a = ap.parse_args(argv)
    names = [n for n in (a.only.split(",") if a.only else [c for c in CASES if c != "scan"]) if n]
    names = [n for n in names if n not in a.skip.split(",")]
    if unknown := [n for n in names if n not in CASES]:
        ap.error(f"unknown case(s): {', '.join(unknown)}")
    if not a.render:
        compile_sources()
        a.scratch.mkdir(parents=True, exist_ok=True)
        a.results.mkdir(parents=True, exist_ok=True)
        a.revision = code_revision()
        env = {**os.environ, "PYTHONPATH": str(REPO), "DLINDEX_NO_LOG": "1", "TMPDIR": str(a.scratch),
               "SQLITE_TMPDIR": str(a.scratch)}  # fmt: skip
        sizes = [int(float(x)) for x in a.rows.split(",") if x]
        if a.catalog and len(sizes) != 1:
            ap.error("--catalog goes with one --rows size")
        for rows in sizes if names != ["scan"] else []:
            run_size(a, rows, names, env)
        if "scan" in names:
            s = Size(rows=2_000_000, shared=TWO_M, scratch=a.scratch, results=a.results, env=env, in_place=True,
                     allow_writes=False, timeout_s=a.timeout, mark_ids=0)  # fmt: skip
            record: dict[str, Any] = {"case": "scan", "rows": 2_000_000, "code": a.revision,
                                      "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                      "load": [round(x, 1) for x in os.getloadavg()], "cores": os.cpu_count()}  # fmt: skip
            began = time.perf_counter()
            try:
                with held(LOCK if a.lock else None):
                    record.update(_scan(s))
            except (Skip, Failed) as why:
                record["skipped" if isinstance(why, Skip) else "failed"] = str(why)
            record["case_s"] = round(time.perf_counter() - began, 1)
            save(a.results, "files-2000000", "scan", record)
            print(f"scan 2M files: {record.get('skipped') or record.get('failed') or brief(record['figures'])}")
    section = size_report.render(a.results)
    print(section)
    if not a.no_docs:
        write_section(REPO / "docs" / "benchmarks.md", size_report.START, size_report.END, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
