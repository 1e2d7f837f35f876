"""`dlindex index --suggest` on large catalogs: the sampled scratch copy against the previous default.

For each catalog given (e.g. bench/make_catalog.py's 10^6 and 10^7 rows; each is copied first,
as the advisor must never write into it, and given a query log of training-time reads:
per-label sampling, unprocessed work, a time window, the failed list, three calls each),
`suggest_indexes` runs with the default (tables over 250,000 rows sampled, about 250,000 rows
fetched by rowid) and, on a catalog of at most 2,000,000 rows, again in the same process with
``sample_rows=2_000_000``, the previous default: a whole copy (the previous sample of larger
catalogs, drawn by a full scan, is gone from the code). Each run's wall and CPU time (this process's: SQLite
runs in it), peak RSS, sample and suggestions are reported; CPU time is what to compare on a
shared machine.

  python bench/bench_index_size.py /tmp/dlindex-bench-cat/c1m.db /tmp/dlindex-bench/catalog-10000000-1000l-s0.db
  python bench/bench_index_size.py --no-baseline CATALOG ...   # the default only

Results go to docs/benchmarks.md between <!-- bench_index_size:start --> and <!-- bench_index_size:end -->.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import compile_sources, write_section

from dlindex import Catalog, QuerySpec, query_rows
from dlindex.advisor import suggest_indexes

START, END = "<!-- bench_index_size:start -->", "<!-- bench_index_size:end -->"
OLD_SAMPLE_ROWS = 2_000_000


def workload(db: Path) -> None:
    """The training-time reads, three calls each, logged by dlindex into the copy's query log."""
    with Catalog(db) as catalog:
        for seed in range(3):
            for spec in (
                QuerySpec(per_label=32, seed=seed, cache=False),
                QuerySpec(status="ok", processed=False, limit=1000, cache=False),
                QuerySpec(since="2026-12-01", processed=True, limit=5000, cache=False),
                QuerySpec(processing_status=("failed",), cache=False),
            ):
                for _ in query_rows(catalog, spec):
                    pass


def advise(db: Path, **kw: Any) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    with Catalog(db, log=False) as catalog:
        a = suggest_indexes(catalog, **kw)
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "sample": a.sample,
            "rows": a.sampled_from, "suggestions": [s.sql for s in a.suggestions]}  # fmt: skip


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    compile_sources()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("catalogs", nargs="+", type=Path)
    ap.add_argument(
        "--work", type=Path, default=Path(os.environ.get("DLINDEX_BENCH_DIR", "/tmp/dlindex-bench")) / "size"
    )
    ap.add_argument("--no-baseline", action="store_true", help="only the default (sampled) path")
    ap.add_argument("--docs", type=Path, default=REPO / "docs" / "benchmarks.md")
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    advised: list[tuple[str, ...]] = []
    for src in a.catalogs:
        db = a.work / src.name
        shutil.copyfile(src, db)  # never write into the original: the query log goes into the copy
        with sqlite3.connect(db) as conn:
            rows = int(conn.execute("SELECT max(rowid) FROM image_metadata").fetchone()[0])
        print(f"{src} ({rows:,} rows): logging the workload ...", flush=True)
        workload(db)
        runs = {"sampled (default)": advise(db)}
        if not a.no_baseline and rows <= OLD_SAMPLE_ROWS:  # its whole copy; the old scan-drawn sample is gone
            runs[f"sample_rows={OLD_SAMPLE_ROWS:,} (previous default)"] = advise(db, sample_rows=OLD_SAMPLE_ROWS)
        for name, r in runs.items():
            print(f"  {name}: {r}", flush=True)
            lines.append(f"| {rows:,} | {name} | 1/{r['sample']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                         f"{len(r['suggestions'])} |")  # fmt: skip
        if len(runs) > 1:
            same = len({tuple(r["suggestions"]) for r in runs.values()}) == 1
            lines.append(f"| | same suggestions both ways: {'yes' if same else 'no'} | | | | |")
        advised.append(tuple(runs["sampled (default)"]["suggestions"]))
        db.unlink()
    section = "\n".join([
        START, "## `index --suggest` at size (`bench/bench_index_size.py`, #34)", "",
        f"Run {_dt.datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs shared with other jobs: compare CPU "
        f"seconds (SQLite runs in the process). Peak RSS {peak_rss_mb():,.0f} MB.", "",
        "| rows | scratch copy | sample | wall s | CPU s | suggestions |", "|---:|---|---:|---:|---:|---:|",
        *lines, "", f"The sampled advice is the same on every catalog: {'yes' if len(set(advised)) == 1 else 'no'}.", END,
    ])  # fmt: skip
    print(section)
    if not a.no_docs:
        write_section(a.docs, START, END, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
