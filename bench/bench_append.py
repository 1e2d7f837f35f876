"""`export --append` at size (issue #35): a week's 1% of changes appended to a 10^7-row export.

On a copy of the benchmark catalog (make_catalog.ensure_catalog): a full export, then one
"week" as bench_versions makes it (a mark of 1% of the rows, an append of 1% new rows, each
its own version), then ``dlindex export OUT --append``. Beside it, in the same run:

- **the 1% alone**: the same export of a catalog that holds only as many rows as the week
  changed (the ensure_catalog of rows/100), the cost the issue's goal compares with (<= 2x);
- **a full re-export** of the changed catalog, what an append saves (the ratio).

Every figure is one process's wall and CPU seconds and the peak RSS of its process tree
(bench_export_size.run); the append and the 1% alone are the median of three runs (the export
put back between appends), the rest one run. The generated catalogs name no image files, so the formats are the
manifests (jsonl, parquet); the packed formats' append writes only the added samples' shards
(tests/test_export_append.py checks that no other file changes). With ``--files N``: a wds
export of N tiny image files scanned into the generated catalog (its own rows set aside), and a
week of 1% of the catalog's rows as new files: scan + ``features compute --queued`` + append,
beside the same three steps on a catalog of only those files.

    python bench/bench_append.py [--rows 10000000] [--formats jsonl,parquet] [--files 200000] [--files-catalog 10000000]

Written to docs/benchmarks.md between <!-- bench_append:start --> and <!-- bench_append:end -->.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_export_size import run
from bench_versions import _APPEND, copy_catalog, week
from bench_watch import png
from common import REPO, write_section
from make_catalog import ensure_catalog
from make_trees import ensure_tiny

START, END = "<!-- bench_append:start -->", "<!-- bench_append:end -->"
DLINDEX = [sys.executable, "-m", "dlindex"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e7)
    ap.add_argument("--formats", default="jsonl,parquet")
    ap.add_argument("--work", default="/tmp/dlindex-append")
    ap.add_argument("--docs", default="docs/benchmarks.md")
    ap.add_argument("--files", type=float, default=2e5, help="image files of the scan + features + wds run (0: none)")
    ap.add_argument("--files-catalog", type=float, default=1e7,
                    help="rows of the catalog the files are scanned into (0: the files alone)")  # fmt: skip
    args = ap.parse_args(argv)
    n = int(args.rows)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "DLINDEX_NO_LOG": "1"}
    results: list[dict[str, Any]] = []
    for fmt in args.formats.split(","):
        for marked in (False, True):
            results.append(catalog_week(n, fmt, marked, work, env))
            shutil.rmtree(work)
            work.mkdir()
    files = files_week(int(args.files), work, env, int(args.files_catalog)) if args.files else None
    write(Path(args.docs), results, files)
    return 0


def median_of(reps: int, measure: Any, undo: Any) -> dict[str, Any]:
    """The run of median wall time among ``reps`` (``undo`` between them puts things back)."""
    runs = []
    for k in range(reps):
        if k:
            undo()
        runs.append(measure())
    return sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]


def restore(out: Path) -> None:
    """The export as it was before its append: its saved index back, the appended files gone."""
    saved = json.loads((out.parent / "saved-index.json").read_text())
    name = "_index.json" if (out / "_index.json").exists() else "index.json"
    keep = {e["file"] for e in [*saved.get("dlindex_shards", []), *saved.get("files", [])]} | {name}
    for path in sorted(out.rglob("*"), reverse=True):
        rel = str(path.relative_to(out))
        if path.is_file() and rel not in keep:
            path.unlink()
    (out / name).write_text(json.dumps(saved))


def catalog_week(n: int, fmt: str, marked: bool, work: Path, env: dict[str, str], reps: int = 3) -> dict[str, Any]:
    """The export figures of one week on a copy of the generated catalog of ``n`` rows (append
    and the 1% alone: the median of ``reps`` runs; the export put back between appends)."""
    db, small = work / "catalog.db", work / "small.db"
    copy_catalog(ensure_catalog(n), db)
    copy_catalog(ensure_catalog(n // 100), small)
    for location in (db, small):  # the migration to versions, not timed with the exports
        subprocess.run([*DLINDEX, "stats", "--db", str(location)], env=env, check=True, stdout=subprocess.DEVNULL)
    out = work / "out"
    first = run([*DLINDEX, "export", str(out), "--format", fmt, "--db", str(db)], env, work)
    index_file = out / ("_index.json" if fmt == "parquet" else "index.json")
    (work / "saved-index.json").write_bytes(index_file.read_bytes())
    rng = random.Random(1)
    if marked:
        week(db, n, 1, rng)  # 1% marked (excluded: the export loses them) and 1% new rows
    else:
        from dlindex import Catalog

        with Catalog(db, log=False) as catalog, catalog.versioned("append"), catalog.write_transaction() as conn:
            conn.execute(
                _APPEND, {"suffix": ".w1", "week": 1, "ids": json.dumps(rng.sample(range(1, n + 1), n // 100))}
            )
    appended = median_of(reps, lambda: run([*DLINDEX, "export", str(out), "--append", "--db", str(db)], env, work),
                         undo=lambda: restore(out))  # fmt: skip
    index = json.loads((out / ("_index.json" if fmt == "parquet" else "index.json")).read_text())
    again = run([*DLINDEX, "export", str(work / "again"), "--format", fmt, "--db", str(db)], env, work)
    alone = median_of(reps, lambda: run([*DLINDEX, "export", str(work / "alone"), "--format", fmt, "--db", str(small)],
                                        env, work), undo=lambda: shutil.rmtree(work / "alone"))  # fmt: skip
    entry = index["appends"][-1]
    result = {"format": fmt, "rows": n, "week": "1% new + 1% marked" if marked else "1% new",
              "added": entry["samples"], "removed": entry["removed"], "first": first, "append": appended,
              "again": again, "alone": alone}  # fmt: skip
    print(json.dumps(result), flush=True)
    return result


def files_week(n: int, work: Path, env: dict[str, str], catalog_rows: int = 0) -> dict[str, Any]:
    """scan + features compute + export --append (wds) of 1% new image files in a tree of ``n``,
    beside the same three steps on a tree of only those files, and a full wds re-export.

    ``catalog_rows``: the tree is scanned into a copy of the generated catalog of that many rows
    (set aside with `mark --exclude`'s flag, written before the copy has versions: they name no
    files, so no export selects them), and the week is 1% of those rows."""
    tree, alone_tree = work / "tree", work / "alone-tree"
    subprocess.run(["cp", "-al", str(ensure_tiny(n)), str(tree)], check=True)  # links: the source tree stays as it is
    db, alone_db = work / "files.db", work / "alone.db"
    if catalog_rows:
        copy_catalog(ensure_catalog(catalog_rows), db)
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE image_metadata SET excluded = 1")
    out = work / "shards"
    steps = (  # dhash is an automatic type: the scan queues new rows, compute --queued reads the queue
        lambda d, t: [*DLINDEX, "scan", str(t), "--db", str(d), "-q"],
        lambda d, t: [*DLINDEX, "features", "compute", "--queued", "--db", str(d), "-q"],
    )
    for d in (db, alone_db):  # a new catalog each (or the big one), dhash automatic before the first scan
        made = f"from dlindex import Catalog; Catalog({str(d)!r}, create=True).close()"
        subprocess.run([sys.executable, "-c", made], env=env, check=True)
        subprocess.run([*DLINDEX, "features", "auto", "--type", "dhash", "--db", str(d)], env=env, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    for step in steps:
        subprocess.run(step(db, tree), env=env, check=True, stdout=subprocess.DEVNULL)
    first = run([*DLINDEX, "export", str(out), "--format", "wds", "--split", "train=0.9,val=0.1", "--db", str(db)],
                env, work)  # fmt: skip
    new = (catalog_rows or n) // 100
    for root in (tree, alone_tree):
        for i in range(new):  # a new class folder of distinct small PNGs, in both trees
            folder = root / f"new{i // 1000:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:07d}.png").write_bytes(png(i))
    week: dict[str, Any] = {}
    for name, step in zip(("scan", "features"), steps, strict=True):
        week[name] = run(step(db, tree), env, work)
    week["append"] = run([*DLINDEX, "export", str(out), "--append", "--db", str(db)], env, work)
    alone: dict[str, Any] = {}
    for name, step in zip(("scan", "features"), steps, strict=True):
        alone[name] = run(step(alone_db, alone_tree), env, work)
    alone["export"] = run([*DLINDEX, "export", str(work / "alone-shards"), "--format", "wds", "--split",
                           "train=0.9,val=0.1", "--db", str(alone_db)], env, work)  # fmt: skip
    again = run([*DLINDEX, "export", str(work / "again"), "--format", "wds", "--split", "train=0.9,val=0.1",
                 "--db", str(db)], env, work)  # fmt: skip
    result = {"files": n, "catalog_rows": catalog_rows or n + new, "new": new, "first": first, "week": week,
              "alone": alone, "again": again}  # fmt: skip
    print(json.dumps(result), flush=True)
    return result


def write(docs: Path, results: list[dict[str, Any]], files: dict[str, Any] | None) -> None:
    lines = [
        START,
        "## `export --append` at size (`bench/bench_append.py`, #35)",
        "",
        "One week on a copy of the generated catalog, appended to its export: 1% new rows (copies of random "
        "rows at new paths, as a scan inserts them), or that and a `mark --exclude` of another 1% (as "
        "`bench_versions` makes a week); beside it in the same run the same export of a catalog of only 1% of "
        "the rows (the goal: an append costs at most 2x that) and a full re-export of the changed catalog. Wall "
        "and CPU seconds of one process each (start-up included; append and 1% alone: the run of median "
        "wall time of three), peak RSS of its process tree.",
        "",
        "| format | rows | week | added / removed | append s (CPU) | 1% alone s (CPU) | append / alone | full re-export s | "
        "re-export / append | append peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        a, alone, again = r["append"], r["alone"], r["again"]
        lines.append(
            f"| {r['format']} | {r['rows']:,} | {r['week']} | {r['added']:,} / {r['removed']:,} | {a['wall_s']:.2f} ({a['cpu_s']:.2f}) | "
            f"{alone['wall_s']:.2f} ({alone['cpu_s']:.2f}) | {a['wall_s'] / alone['wall_s']:.2f}x | {again['wall_s']:.2f} | "
            f"{again['wall_s'] / a['wall_s']:.1f}x | {a['peak_rss_mb']:.0f} |"
        )
    if files is not None:
        week, alone = files["week"], files["alone"]
        total = sum(v["wall_s"] for v in week.values())
        base = sum(v["wall_s"] for v in alone.values())
        lines += [
            "",
            f"With image files: a catalog of {files['catalog_rows']:,} rows (the generated one, its rows set aside, "
            f"and a tree of {files['files']:,} tiny images, `bench/make_trees.py` tiny, hard-linked, scanned into it) "
            f"and a wds export of the images (`--split train=0.9,val=0.1`); the week is {files['new']:,} new PNGs "
            "(1% of the catalog) in new class folders: `scan` of the tree + `features compute --queued` (dhash, "
            "an automatic type) + `export --append`, beside the same three steps on a new catalog of only the new "
            "files (first scan, compute, export):",
            "",
            "| step | the week, appended: s (CPU) | the 1% alone: s (CPU) |",
            "|---|---|---|",
        ]
        for (name, a), (_, b) in zip(week.items(), alone.items(), strict=True):
            lines.append(f"| {name} | {a['wall_s']:.2f} ({a['cpu_s']:.2f}) | {b['wall_s']:.2f} ({b['cpu_s']:.2f}) |")
        lines += [
            f"| **together** | **{total:.2f}** | **{base:.2f}** (appended / alone: **{total / base:.2f}x**) |",
            "",
            f"A full wds re-export of the {files['files'] + files['new']:,} files: {files['again']['wall_s']:.2f} s "
            f"({files['again']['wall_s'] / week['append']['wall_s']:.0f}x the append; the first export "
            f"{files['first']['wall_s']:.2f} s).",
        ]
    lines += ["", END]
    write_section(docs, START, END, "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
