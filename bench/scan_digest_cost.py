"""What the catalog's scan_digests triggers (migration 16) cost the writers of image_metadata.

The triggers forget a folder's remembered rescan answer whenever a row of it is inserted,
deleted or changed in a column a rescan compares (dlindex.scan.digests). Every writer pays for
that: this script times the same writes on two catalog files made by dlindex's migrations, one
with the triggers and one with them dropped, in the same run, alternating, medians of --reps:

- a bulk INSERT of N rows in one transaction (what a first scan's writer and merge do);
- ``UPDATE ... SET processed = 1`` of every row (``mark --processed``: no watched column);
- ``UPDATE ... SET processing_status = 'completed'`` (``mark --processing-status``: a watched
  column whose trigger's WHEN clause is evaluated per row);
- ``UPDATE ... SET status = 'missing'`` of every 10th row (a rescan's missing files).

Each catalog holds one remembered folder per 1,000 rows, as after a rescan. Writes the
``scan_digest_cost`` section of docs/benchmarks.md:

  python bench/scan_digest_cost.py --rows 1000000 --reps 3
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import write_section

from dlindex.catalog.sqlite.migrations import SCAN_DIGESTS, apply_migrations

MARKERS = ("<!-- scan_digest_cost:start -->", "<!-- scan_digest_cost:end -->")
_INSERT = """INSERT INTO image_metadata (root_id, file_path, label_id, width, height, status, bytes, mtime_ns,
    xxh3_128) VALUES (1, ?, 1, 10, 10, 'ok', 1000, 1, 'x')"""
_CASES = {
    "mark --processed (processed = 1)": "UPDATE image_metadata SET processed = 1, updated_at = CURRENT_TIMESTAMP",
    "mark --processing-status completed": "UPDATE image_metadata SET processing_status = 'completed'",
    "missing files (status, every 10th row)": "UPDATE image_metadata SET status = 'missing' WHERE id % 10 = 0",
}


def _catalog(path: Path, triggers: bool, rows: int) -> tuple[sqlite3.Connection, float]:
    """A fresh catalog at ``path`` and the seconds its bulk insert of ``rows`` took."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    apply_migrations(conn)
    if not triggers:
        for statement in SCAN_DIGESTS[1:]:
            conn.execute(f"DROP TRIGGER {statement.split()[2]}")
    conn.execute("INSERT INTO roots (path) VALUES ('/x')")
    conn.execute("INSERT INTO labels (name) VALUES ('a')")
    folders = [(1, f"c{k:05d}/", f"c{k + 1:05d}/", b"0" * 16, 1000, "{}") for k in range(rows // 1000)]
    conn.executemany("INSERT INTO scan_digests VALUES (?, ?, ?, ?, ?, ?)", folders)
    started = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany(_INSERT, ((f"c{i // 1000:05d}/{i:09d}.jpg",) for i in range(rows)))
    conn.execute("COMMIT")
    return conn, time.perf_counter() - started


def _timed(conn: sqlite3.Connection, sql: str) -> float:
    started = time.perf_counter()
    conn.execute(sql)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--docs", default=str(Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"))
    parser.add_argument("--no-docs", action="store_true")
    a = parser.parse_args()
    times: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="dlindex-trigger-cost-") as work:
        for _ in range(a.reps):
            for triggers in (False, True):  # alternating: drift hits both alike
                conn, insert_s = _catalog(Path(work) / f"t{int(triggers)}.db", triggers, a.rows)
                times.setdefault(("bulk insert", triggers), []).append(insert_s)
                for name, sql in _CASES.items():
                    times.setdefault((name, triggers), []).append(_timed(conn, sql))
                conn.close()
    lines = [
        MARKERS[0],
        "## What the rescan memory's triggers cost writers (`bench/scan_digest_cost.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores, SQLite "
        f"{sqlite3.sqlite_version}; {a.rows:,} rows, one remembered folder per 1,000 rows, medians of {a.reps} "
        "runs, the same writes on a catalog without the triggers in the same run (alternating).",
        "",
        "| write | without triggers | with triggers | ratio | per row |",
        "|---|---|---|---|---|",
    ]
    for name in ["bulk insert", *_CASES]:
        base, with_ = statistics.median(times[(name, False)]), statistics.median(times[(name, True)])
        touched = a.rows // 10 if "10th" in name else a.rows
        extra = (with_ - base) / touched * 1e6
        lines.append(f"| {name} | {base:.2f} s | {with_:.2f} s | {with_ / base:.2f}x | {extra:+.2f} µs |")
    lines += ["", "```sh", f"python bench/scan_digest_cost.py --rows {a.rows} --reps {a.reps}", "```", MARKERS[1]]
    section = "\n".join(lines)
    print(section)
    if not a.no_docs:
        write_section(Path(a.docs), *MARKERS, section)


if __name__ == "__main__":
    main()
