"""`export --append` at size (issue #35): a week's 1% of changes appended to a 10^7-row export.

On a copy of the benchmark catalog (make_catalog.ensure_catalog): a full export, then one
"week" as bench_versions makes it (a mark of 1% of the rows, an append of 1% new rows, each
its own version), then ``dlindex export OUT --append``. Beside it, in the same run:

- **the 1% alone**: the same export of a catalog that holds only as many rows as the week
  changed (the ensure_catalog of rows/100), the cost the issue's goal compares with (<= 2x);
- **a full re-export** of the changed catalog, what an append saves (the ratio).

Every figure is one process's wall and CPU seconds and the peak RSS of its process tree
(bench_export_size.run). The generated catalogs name no image files, so the formats are the
manifests (jsonl, parquet); the packed formats' append writes only the added samples' shards
(tests/test_export_append.py checks that no other file changes).

    python bench/bench_append.py [--rows 10000000] [--formats jsonl,parquet] [--docs docs/benchmarks.md]

Written to docs/benchmarks.md between <!-- bench_append:start --> and <!-- bench_append:end -->.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_export_size import run
from bench_versions import copy_catalog, week
from common import REPO, write_section
from make_catalog import ensure_catalog

START, END = "<!-- bench_append:start -->", "<!-- bench_append:end -->"
DLINDEX = [sys.executable, "-m", "dlindex"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e7)
    ap.add_argument("--formats", default="jsonl,parquet")
    ap.add_argument("--work", default="/tmp/dlindex-append")
    ap.add_argument("--docs", default="docs/benchmarks.md")
    args = ap.parse_args(argv)
    n = int(args.rows)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "DLINDEX_NO_LOG": "1"}
    results: list[dict[str, Any]] = []
    for fmt in args.formats.split(","):
        db, small = work / "catalog.db", work / "small.db"
        copy_catalog(ensure_catalog(n), db)
        copy_catalog(ensure_catalog(n // 100), small)
        for location in (db, small):  # the migration to versions, not timed with the exports
            subprocess.run([*DLINDEX, "stats", "--db", str(location)], env=env, check=True, stdout=subprocess.DEVNULL)
        out = work / "out"
        first = run([*DLINDEX, "export", str(out), "--format", fmt, "--db", str(db)], env, work)
        week(db, n, 1, random.Random(1))
        appended = run([*DLINDEX, "export", str(out), "--append", "--db", str(db)], env, work)
        index = json.loads((out / ("_index.json" if fmt == "parquet" else "index.json")).read_text())
        again = run([*DLINDEX, "export", str(work / "again"), "--format", fmt, "--db", str(db)], env, work)
        alone = run([*DLINDEX, "export", str(work / "alone"), "--format", fmt, "--db", str(small)], env, work)
        entry = index["appends"][-1]
        results.append({"format": fmt, "rows": n, "added": entry["samples"], "removed": entry["removed"],
                        "first": first, "append": appended, "again": again, "alone": alone})  # fmt: skip
        print(json.dumps(results[-1]), flush=True)
        shutil.rmtree(work)
        work.mkdir()
    write(Path(args.docs), results)
    return 0


def write(docs: Path, results: list[dict[str, Any]]) -> None:
    lines = [
        START,
        "## `export --append` at size (`bench/bench_append.py`, #35)",
        "",
        "One week on a copy of the generated catalog (1% of the rows marked, 1% new rows, as `bench_versions` "
        "makes them), appended to its export; beside it in the same run the same export of a catalog of only "
        "1% of the rows (the goal: an append costs at most 2x that) and a full re-export of the changed catalog. "
        "Wall and CPU seconds of one process each, peak RSS of its process tree.",
        "",
        "| format | rows | added / removed | append s (CPU) | 1% alone s (CPU) | append / alone | full re-export s | "
        "re-export / append | append peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        a, alone, again = r["append"], r["alone"], r["again"]
        lines.append(
            f"| {r['format']} | {r['rows']:,} | {r['added']:,} / {r['removed']:,} | {a['wall_s']:.2f} ({a['cpu_s']:.2f}) | "
            f"{alone['wall_s']:.2f} ({alone['cpu_s']:.2f}) | {a['wall_s'] / alone['wall_s']:.2f}x | {again['wall_s']:.2f} | "
            f"{again['wall_s'] / a['wall_s']:.1f}x | {a['peak_rss_mb']:.0f} |"
        )
    lines += ["", END]
    write_section(docs, START, END, "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
