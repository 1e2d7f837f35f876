"""Catalog versions (issue #35): what history costs and what reading an old version costs.

On a copy of the 10^7-row benchmark catalog (make_catalog.ensure_catalog), ten "weeks", each
two versions: a `mark` of 1% of the rows (a flag flips) and an append of 1% new rows (rows
inserted as a scan inserts them). The same ten weeks run on a second copy whose history
triggers were dropped right after the migration: the same-run baseline "without versions".

Figures: history bytes per changed row and the catalog's growth after the ten weeks (with
and without versions); each week's `mark` time with and without history (the triggers'
cost on mark); queries at the current state, at version 1 (every week's history applies) and
at a middle version: each `--at` median beside the same query's current median (goal <= 2x);
`diff` of one week beside the week's own mark; the migration of the 10^7 catalog to schema 20.

    python bench/bench_versions.py [--rows 10000000] [--weeks 10] [--reps 3] [--docs docs/benchmarks.md]

Written to docs/benchmarks.md between <!-- bench_versions:start --> and <!-- bench_versions:end -->.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_section
from make_catalog import ensure_catalog

START, END = "<!-- bench_versions:start -->", "<!-- bench_versions:end -->"
DLINDEX = [sys.executable, "-m", "dlindex"]
_TRIGGERS = ("image_history_inserted", "image_history_updated", "image_history_deleted")
# An append of new rows, as scan's insert writes them: copies of existing rows at new paths.
_APPEND = """INSERT INTO image_metadata (root_id, file_path, label_id, width, height, format, mode, bytes,
        mtime_ns, xxh3_128, status, split, pixel_limit, orientation, inode, ctime_ns, path_hash)
    SELECT root_id, file_path || :suffix, label_id, width, height, format, mode, bytes, mtime_ns,
        xxh3_128, status, split, pixel_limit, orientation, inode, ctime_ns, path_hash + :week
    FROM image_metadata WHERE id IN (SELECT value FROM json_each(:ids))"""


_PER_LABEL_INDEX = (
    "CREATE INDEX IF NOT EXISTS bench_per_label ON image_metadata (label_id, path_hash) "
    "WHERE status = 'ok' AND excluded = 0"
)


def copy_catalog(src: Path, dst: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{dst}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(src, dst)


def file_bytes(db: Path) -> int:
    return sum(os.path.getsize(f"{db}{s}") for s in ("", "-wal") if os.path.exists(f"{db}{s}"))


def checkpoint(db: Path) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def week(db: Path, n: int, number: int, rng: random.Random) -> float:
    """One week on ``db``: a mark of 1% (timed) and an append of 1%, each its own version."""
    from dlindex import Catalog, mark_samples

    marked = rng.sample(range(1, n + 1), n // 100)
    added = json.dumps(rng.sample(range(1, n + 1), n // 100))
    with Catalog(db, log=False) as catalog:
        started = time.perf_counter()
        mark_samples(catalog, map(str, marked), excluded=bool(number % 2), processed=bool(number % 3))
        seconds = time.perf_counter() - started
        with catalog.versioned(f"append week {number}"), catalog.write_transaction() as conn:
            conn.execute(_APPEND, {"suffix": f".w{number}", "week": number, "ids": added})
    return seconds


def run(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def median_run(cmd: list[str], reps: int) -> float:
    run(cmd)  # warm the page cache: every figure is a warm one, current and --at alike
    return statistics.median(run(cmd) for _ in range(reps))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e7)
    ap.add_argument("--weeks", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default="/tmp/dlindex-versions")
    ap.add_argument("--docs", default="docs/benchmarks.md")
    ap.add_argument(
        "--reuse", action="store_true", help="keep the two catalogs and figures of the last run; time the reads again"
    )
    ap.add_argument("--render", action="store_true", help="write docs from the last run's figures only")
    args = ap.parse_args(argv)
    n = int(args.rows)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    source = ensure_catalog(n)
    with_h, without = work / "versions.db", work / "baseline.db"
    f: dict[str, object] = {"rows": n, "weeks": args.weeks}
    saved = work / "weeks.json"
    if (args.reuse or args.render) and saved.exists():
        f = json.loads(saved.read_text())
    else:
        run_weeks(args, n, source, with_h, without, f)
        saved.write_text(json.dumps(f))
    if not (args.render and "stats_ratio" in f):
        reads(args, with_h, f)
        saved.write_text(json.dumps(f))
    write(Path(args.docs), f, int(f["middle"]))  # type: ignore[call-overload]
    print(json.dumps(f, indent=1))
    return 0


def run_weeks(
    args: argparse.Namespace, n: int, source: Path, with_h: Path, without: Path, f: dict[str, object]
) -> None:
    """Both copies, the migration, the weeks, and the storage and mark figures."""
    from dlindex import Catalog

    for db in (with_h, without):
        copy_catalog(source, db)
        started = time.perf_counter()
        Catalog(db, log=False).close()  # migrates to schema 20
        f.setdefault("migrate_s", round(time.perf_counter() - started, 1))
    with sqlite3.connect(without) as conn:
        for trigger in _TRIGGERS:
            conn.execute(f"DROP TRIGGER {trigger}")  # names from this script
    for db in (with_h, without):
        checkpoint(db)
    size0 = {db: file_bytes(db) for db in (with_h, without)}
    marks: dict[Path, list[float]] = {with_h: [], without: []}
    for number in range(1, args.weeks + 1):
        for db in (with_h, without):
            marks[db].append(week(db, n, number, random.Random(number)))
        print(f"week {number}: mark {marks[with_h][-1]:.2f} s (without history {marks[without][-1]:.2f} s)", flush=True)
    for db in (with_h, without):
        checkpoint(db)
    with sqlite3.connect(with_h) as conn:
        history = int(conn.execute("SELECT count(*) FROM image_history").fetchone()[0])
        history_bytes = int(
            conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name LIKE 'image_history%'").fetchone()[0]
        )
        top = int(conn.execute("SELECT max(id) FROM versions").fetchone()[0])
        label = str(conn.execute("SELECT name FROM labels ORDER BY id LIMIT 1 OFFSET 7").fetchone()[0])
    growth = {db: file_bytes(db) - size0[db] for db in (with_h, without)}
    f.update(
        history_rows=history, history_bytes=history_bytes, bytes_per_changed_row=round(history_bytes / history, 1),
        growth_mb=round(growth[with_h] / 1e6, 1), growth_without_mb=round(growth[without] / 1e6, 1),
        catalog_mb=round(file_bytes(with_h) / 1e6, 1),
        mark_s=round(statistics.median(marks[with_h]), 3), mark_without_s=round(statistics.median(marks[without]), 3),
    )  # fmt: skip
    f["mark_ratio"] = round(float(f["mark_s"]) / float(f["mark_without_s"]), 2)  # type: ignore[arg-type]
    f["middle"], f["top"], f["label"] = 1 + top // 2, top, label
    f["mark_weeks"], f["mark_without_weeks"] = (
        [round(x, 2) for x in marks[with_h]],
        [round(x, 2) for x in marks[without]],
    )


def reads(args: argparse.Namespace, with_h: Path, f: dict[str, object]) -> None:
    """Each read now and at two past versions (medians of warm runs), and a week's diff."""
    middle, top, label = int(f["middle"]), int(f["top"]), str(f["label"])  # type: ignore[call-overload]
    queries = {
        # --no-cache: the current state's answer is computed, as an --at one always is
        "label": ["query", "--label", label, "--format", "jsonl", "-c", "id,path,label_id", "--no-cache"],
        "per_label": ["query", "--per-label", "32", "--seed", "0", "--format", "jsonl", "--no-cache"],
        "stats": ["stats", "--json"],
    }
    for name, q in queries.items():
        cmd = (
            [*DLINDEX, *q, "--db", str(with_h), "--no-log"] if name != "stats" else [*DLINDEX, *q, "--db", str(with_h)]
        )
        now = median_run(cmd, args.reps)
        oldest = median_run([*cmd, "--at", "1"], args.reps)
        mid = median_run([*cmd, "--at", str(middle)], args.reps)
        f[f"{name}_s"], f[f"{name}_at1_s"], f[f"{name}_atmid_s"] = round(now, 3), round(oldest, 3), round(mid, 3)
        f[f"{name}_ratio"] = round(max(oldest, mid) / now, 2)
        print(f"{name}: now {now:.2f} s, --at 1 {oldest:.2f} s, --at {middle} {mid:.2f} s", flush=True)
    f["diff_week_s"] = round(
        median_run([*DLINDEX, "diff", str(top - 2), str(top), "--json", "--db", str(with_h)], args.reps), 3
    )
    # The per-label sample again with the index `dlindex index` makes for it (dropped after, so a
    # --reuse run times the reads above without it again).
    with sqlite3.connect(with_h) as conn:
        conn.execute(_PER_LABEL_INDEX)
        conn.execute("ANALYZE")  # as `dlindex index --apply` leaves it
    try:
        cmd = [*DLINDEX, *queries["per_label"], "--db", str(with_h), "--no-log"]
        now = median_run(cmd, args.reps)
        oldest, mid = median_run([*cmd, "--at", "1"], args.reps), median_run([*cmd, "--at", str(middle)], args.reps)
        f["indexed_s"], f["indexed_at1_s"], f["indexed_atmid_s"] = round(now, 3), round(oldest, 3), round(mid, 3)
        f["indexed_ratio"] = round(max(oldest, mid) / now, 2)
        print(f"per_label indexed: now {now:.2f} s, --at 1 {oldest:.2f} s, --at {middle} {mid:.2f} s", flush=True)
    finally:
        with sqlite3.connect(with_h) as conn:
            conn.execute("DROP INDEX IF EXISTS bench_per_label")


def write(docs: Path, f: dict[str, object], middle: int) -> None:
    section = f"""{START}
## bench_versions

Catalog versions (issue #35): `python bench/bench_versions.py` on a copy of the {f["rows"]:,}-row
benchmark catalog; {f["weeks"]} weeks, each a `mark` of 1% of the rows (a flag flips) and an append
of 1% new rows, each its own version; the same weeks on a second copy without the history
triggers (the baseline). Medians of warm runs on this machine (2 cores, shared).

| figure | with versions | without (baseline) | ratio |
|---|---|---|---|
| history bytes per changed row | {f["bytes_per_changed_row"]} ({f["history_rows"]:,} rows, {int(f["history_bytes"]) / 1e6:.1f} MB) | - | - |
| catalog growth after {f["weeks"]} weeks | {f["growth_mb"]} MB | {f["growth_without_mb"]} MB | of {f["catalog_mb"]} MB |
| `mark` of 1% ({int(f["rows"]) // 100:,} ids), median week | {f["mark_s"]} s | {f["mark_without_s"]} s | {f["mark_ratio"]}x |
| migration of the catalog to schema 20 | {f["migrate_s"]} s | | |

| read | now | `--at 1` | `--at {middle}` | worst / now (goal <= 2x) |
|---|---|---|---|---|
| `query --label L` (jsonl) | {f["label_s"]} s | {f["label_at1_s"]} s | {f["label_atmid_s"]} s | {f["label_ratio"]}x |
| `query --per-label 32 --seed 0` | {f["per_label_s"]} s | {f["per_label_at1_s"]} s | {f["per_label_atmid_s"]} s | {f["per_label_ratio"]}x |
| `stats` | {f["stats_s"]} s | {f["stats_at1_s"]} s | {f["stats_atmid_s"]} s | {f["stats_ratio"]}x |
| `query --per-label 32 --seed 0`, with a `(label_id, path_hash)` index | {f.get("indexed_s", "-")} s | {f.get("indexed_at1_s", "-")} s | {f.get("indexed_atmid_s", "-")} s | {f.get("indexed_ratio", "-")}x |

`dlindex diff` of the last week (two versions, 2% of the rows): {f["diff_week_s"]} s, against
{f["mark_s"]} s for that week's mark alone: a diff reads what changed, not the catalog.

How to read it: every query runs `--no-cache` (an `--at` read is never cached, so neither is
its baseline). `--at 1` is the oldest state, where every week's history applies ({f["history_rows"]:,}
history rows are the second part of the view); `--at {middle}` is half way. The label query
and the per-label sample read the whole live table in both states (this catalog has no index on
`label_id`); at a past state the label query reads the history part through the schema's history
index on `(label_id, path_hash)` (schema 20; {f["label_ratio"]}x, 1.96x when it read every history
row), the one-pass per-label sample numbers every history row of the state too. `stats` at this size estimates from
65,536 rows read by id: at a past state the rows come from both parts and the id span from a
merge of both: {float(f["stats_atmid_s"]) / float(f["stats_s"]):.2f}x at `--at {middle}`, {float(f["stats_at1_s"]) / float(f["stats_s"]):.2f}x at `--at 1`,
where the history part is largest (an aggregate over the view itself would read every row;
whether each root's tree is there is asked of the table itself, a question about now). With the
index `dlindex index` makes for a per-label sample (`(label_id, path_hash) WHERE status = 'ok'
AND excluded = 0`, made for its row and dropped after), a past state seeks each label's first 32
among its live rows (reading each row once, every column: the output comes from them), then,
through the schema's history index `(label_id, path_hash)`, only the history rows of the state
that come before a label's 32nd live row, and numbers the two together (before schema 20 it read
every history row of the state: 2.6x at the oldest state; before that it ran the one-pass
statement: 15.6 s at 10^7). `mark` pays for the history
it writes ({f["mark_ratio"]}x at 1% of the rows picked at random, where each row is on a page
of its own; 1.68x before schema 20 added the history's label index; ~1.3x CPU at 10^6).
{END}"""
    write_section(docs, START, END, section)


if __name__ == "__main__":
    raise SystemExit(main())
