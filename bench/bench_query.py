"""The dlindex query benchmark: training-time queries, the result cache, mark, the query log.

A synthetic catalog of --rows image rows (default 1,000,000) in --labels labels (default
1,000) is written straight into SQLite (no image files): 100-row runs of one label, as a
scan of class folders leaves them; ~70% processed; 99% ok, 0.7% corrupt, 0.3% missing;
created_at spread evenly over the last 30 days (so a 24-hour window holds ~3.3%). No
secondary indexes: these are the figures `dlindex index` has to improve on.

Cases, every figure a median of --reps runs in this process unless it says otherwise:
  query    per-label 32 sampling among processed rows, a 24-hour window, the unprocessed
           filter: `query_rows(catalog, ...)` read to the end with the default columns, cold
           (cache=False) and answered from the result cache (second and later runs); plus
           the per-label query end to end through the CLI (`dlindex query ... > /dev/null`).
  log      query-log overhead: the same three cold queries with logging on vs off
           (interleaved runs, each opening and closing its catalog so the log flush is
           included); plus the absolute per-call cost on a tiny query run 5,000 times.
  mark     `dlindex mark --processed -` of all 1,000,000 ids from stdin, end to end (a fresh
           process, wall clock, every row changing), vs the seed's "before" loop: one
           `UPDATE ... WHERE id = ?` executed and committed per id with Python's sqlite3
           defaults, on a 10,000-id slice, in the same run. Also 1,000,000 JSON lines (the
           `query --format jsonl | mark` pipeline's input) and the naive loop under
           dlindex's own pragmas (synchronous=NORMAL), for reference.

The results are printed and written into docs/benchmarks.md between
<!-- bench_query:start --> and <!-- bench_query:end --> (other scripts own other sections).

  python bench/bench_query.py                  # full run (~3 min on 2 cores), writes docs
  python bench/bench_query.py --quick          # 100,000 rows, 2 reps, no docs
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from common import compile_sources, fill_path_hash, write_section

from dlindex import (
    Catalog,
    query_rows,
)

START, END = "<!-- bench_query:start -->", "<!-- bench_query:end -->"
PY = sys.executable
# "24h" is resolved to a timestamp to the second when a query runs; a training script that
# asks again with the same window start (as here) gets the cached answer.
_DAY_AGO = (_dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M:%SZ")
QUERIES: dict[str, dict[str, Any]] = {
    "per-label 32, processed": {"per_label": 32, "processed": True, "seed": 0},
    "created in the last 24 h": {"since": _DAY_AGO},
    "unprocessed": {"processed": False},
}
CLI_PER_LABEL = ["query", "--per-label", "32", "--processed", "--seed", "0", "--format", "jsonl"]
TARGET_MARK_RATE = 200_000
TARGET_MARK_RATIO = 50
TARGET_LOG_OVERHEAD = 0.05

_GENERATE = """WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows),
h(i, a, b) AS (SELECT i, (i * 2654435761) % 4294967296, (i * 40503 + 12345) % 65536 FROM n)
INSERT INTO image_metadata (id, root_id, file_path, label_id, width, height, format, mode, bytes,
    mtime_ns, xxh3_128, status, processed, processing_status, created_at, updated_at)
SELECT i, 1, printf('class_%04d/%08d.jpg', 1 + ((i / 100) * 7919) % :labels, i),
    1 + ((i / 100) * 7919) % :labels, 64 + a % 961, 64 + (a / 961) % 961, 'JPEG', 'RGB',
    20000 + a % 200000, 1700000000000000000 + i * 1000, printf('%016x%016x', a * 7, a * 13),
    CASE WHEN b % 1000 < 7 THEN 'corrupt' WHEN b % 1000 < 10 THEN 'missing' ELSE 'ok' END,
    CASE WHEN b % 100 < 70 THEN 1 ELSE 0 END,
    CASE WHEN b % 100 < 70 THEN 'completed' WHEN b % 100 < 71 THEN 'failed' WHEN b % 100 < 73 THEN 'queued' END,
    strftime('%Y-%m-%d %H:%M:%S', 'now', printf('-%d seconds', (:rows - i) * 2592000 / :rows)),
    strftime('%Y-%m-%d %H:%M:%S', 'now', printf('-%d seconds', (:rows - i) * 2592000 / :rows))
FROM h"""
_LABELS = """WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :labels)
INSERT INTO labels (id, name) SELECT i, printf('class_%04d', i) FROM n"""
_RESET = "UPDATE image_metadata SET processed = 0 WHERE id BETWEEN ? AND ?"
_NAIVE = "UPDATE image_metadata SET processed = 1 WHERE id = ?"


def make_catalog(path: Path, rows: int, labels: int) -> float:
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    started = time.perf_counter()
    with Catalog(path, create=True, log=False) as catalog, catalog.write_transaction() as conn:
        conn.execute("INSERT INTO roots (id, path) VALUES (1, '/data/train')")
        conn.execute(_LABELS, {"labels": labels})
        conn.execute(_GENERATE, {"rows": rows, "labels": labels})
    fill_path_hash(path)
    checkpoint(path)
    return time.perf_counter() - started


def checkpoint(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def wait_idle(max_wait: float) -> float:
    """Wait (up to max_wait s) for the 1-minute load average to drop below 1; return it."""
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] >= 1.0 and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def median_time(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(reps):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def run_query(db: Path, options: dict[str, Any], *, log: bool, cache: bool) -> int:
    with Catalog(db, log=log) as catalog:
        return sum(1 for _ in query_rows(catalog, **options, cache=cache))


def bench_queries(db: Path, reps: int) -> list[dict[str, Any]]:
    results = []
    for name, options in QUERIES.items():
        cold, rows = median_time(lambda options=options: run_query(db, options, log=True, cache=False), reps)
        before = cache_entries(db)
        run_query(db, options, log=True, cache=True)  # stores the result, if the cache wants it
        stored = cache_entries(db) > before
        cached, _ = median_time(lambda options=options: run_query(db, options, log=True, cache=True), reps)
        results.append({"query": name, "options": options, "rows": rows, "cold_ms": cold * 1000,
                        "cached_ms": cached * 1000, "speedup": cold / cached, "stored": stored})  # fmt: skip
        print(f"  {name}: {rows:,} rows, cold {cold * 1000:.0f} ms, cached {cached * 1000:.0f} ms"
              f" ({cold / cached:.1f}x{'' if stored else ', not stored'})")  # fmt: skip
    return results


def cache_entries(db: Path) -> int:
    with Catalog(db, log=False) as catalog:
        return int(catalog.conn.execute("SELECT count(*) FROM query_cache").fetchone()[0])


def bench_cli(db: Path, reps: int) -> dict[str, float]:
    def cli(*extra: str) -> float:
        started = time.perf_counter()
        subprocess.run([PY, "-m", "dlindex", *CLI_PER_LABEL, *extra, "--db", str(db)],
                       stdout=subprocess.DEVNULL, check=True)  # fmt: skip
        return time.perf_counter() - started

    cold = statistics.median(cli("--no-cache") for _ in range(reps))
    cli()
    cached = statistics.median(cli() for _ in range(reps))
    started = time.perf_counter()
    subprocess.run([PY, "-c", "import dlindex.cli"], check=True)
    startup = time.perf_counter() - started
    print(
        f"  CLI per-label: cold {cold * 1000:.0f} ms, cached {cached * 1000:.0f} ms (interpreter + import {startup * 1000:.0f} ms)"
    )
    return {"cold_ms": cold * 1000, "cached_ms": cached * 1000, "startup_ms": startup * 1000}


def bench_log(db: Path, reps: int) -> dict[str, Any]:
    per_query = []
    for name, options in QUERIES.items():
        off: list[float] = []
        on: list[float] = []
        for _ in range(reps):  # interleaved, so drift in machine load hits both alike
            for log, times in ((False, off), (True, on)):
                started = time.perf_counter()
                run_query(db, options, log=log, cache=False)
                times.append(time.perf_counter() - started)
        off_ms, on_ms = statistics.median(off) * 1000, statistics.median(on) * 1000
        per_query.append({"query": name, "off_ms": off_ms, "on_ms": on_ms, "overhead": on_ms / off_ms - 1})
        print(f"  log overhead, {name}: off {off_ms:.0f} ms, on {on_ms:.0f} ms ({(on_ms / off_ms - 1) * 100:+.1f}%)")
    calls = 5000
    tiny: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(3):
        for log in (False, True):
            with Catalog(db, log=log) as catalog:
                started = time.perf_counter()
                for _ in range(calls):
                    for _ in query_rows(catalog, limit=10, columns="id,file_path", cache=False):
                        pass
                catalog.close()  # the final flush counts
                tiny[log].append((time.perf_counter() - started) / calls)
    tiny_off, tiny_on = statistics.median(tiny[False]) * 1e6, statistics.median(tiny[True]) * 1e6
    print(f"  log overhead, tiny query x{calls}: off {tiny_off:.1f} us, on {tiny_on:.1f} us per call")
    return {"queries": per_query, "tiny_off_us": tiny_off, "tiny_on_us": tiny_on, "tiny_calls": calls}


def bench_mark(db: Path, rows: int, reps: int, work: Path) -> dict[str, Any]:
    ids_file = work / "ids.txt"
    ids_file.write_text("".join(f"{i}\n" for i in range(1, rows + 1)))
    jsonl_file = work / "ids.jsonl"
    with Catalog(db, log=False) as catalog, open(jsonl_file, "w") as out:
        for row in query_rows(catalog, status=(), columns="id,path,label", cache=False):
            out.write(json.dumps(row) + "\n")

    def reset(first: int, last: int) -> None:
        conn = sqlite3.connect(db)
        conn.execute(_RESET, (first, last))
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()

    def mark_from(path: Path) -> tuple[float, dict[str, Any]]:
        reset(1, rows)
        with open(path, "rb") as stdin:
            started = time.perf_counter()
            done = subprocess.run([PY, "-m", "dlindex", "mark", "--processed", "-", "--json", "--db", str(db)],
                                  stdin=stdin, capture_output=True, check=True)  # fmt: skip
            seconds = time.perf_counter() - started
        result = json.loads(done.stdout)
        assert result["updated"] == rows, result
        return seconds, result

    ids_runs = [mark_from(ids_file)[0] for _ in range(reps)]
    json_runs = [mark_from(jsonl_file)[0] for _ in range(max(1, reps - 1))]
    mark_s, json_s = statistics.median(ids_runs), statistics.median(json_runs)

    def naive(slice_ids: int, synchronous: str | None) -> float:
        reset(1, slice_ids)
        conn = sqlite3.connect(db)  # Python's defaults: deferred transactions, synchronous=FULL
        if synchronous:
            conn.execute(f"PRAGMA synchronous = {synchronous}")
        started = time.perf_counter()
        for i in range(1, slice_ids + 1):
            conn.execute(_NAIVE, (i,))
            conn.commit()
        seconds = time.perf_counter() - started
        conn.close()
        return slice_ids / seconds

    slice_ids = min(10_000, rows)
    naive_rate = statistics.median(naive(slice_ids, None) for _ in range(max(1, reps - 2)))
    naive_normal = statistics.median(naive(slice_ids, "NORMAL") for _ in range(max(1, reps - 2)))
    mark_rate = rows / mark_s
    print(
        f"  mark {rows:,} ids: {mark_s:.2f} s, {mark_rate:,.0f} ids/s; JSON lines {json_s:.2f} s, {rows / json_s:,.0f}/s"
    )
    print(f"  naive loop ({slice_ids:,} ids): {naive_rate:,.0f} ids/s (synchronous=NORMAL: {naive_normal:,.0f}); "
          f"mark is {mark_rate / naive_rate:.0f}x")  # fmt: skip
    return {"ids": rows, "seconds": mark_s, "rate": mark_rate, "runs": ids_runs, "json_seconds": json_s,
            "json_rate": rows / json_s, "naive_ids": slice_ids, "naive_rate": naive_rate,
            "naive_normal_rate": naive_normal, "ratio": mark_rate / naive_rate,
            "ratio_normal": mark_rate / naive_normal}  # fmt: skip


def render(meta: dict[str, Any], queries: list[dict[str, Any]], cli: dict[str, float], log: dict[str, Any],
           mark: dict[str, Any]) -> str:  # fmt: skip
    def ok(passed: bool) -> str:
        return "**pass**" if passed else "**FAIL**"

    rows = meta["rows"]
    worst = max(q["overhead"] for q in log["queries"])
    lines = [
        START,
        "## Queries, the result cache, mark and the query log (`bench/bench_query.py`)",
        "",
        f"Synthetic catalog: {rows:,} rows, {meta['labels']:,} labels, ~70% processed, created_at over 30 days,"
        f" no secondary indexes; generated straight into SQLite in {meta['generate_s']:.1f} s.",
        f"Machine: {meta['machine']}. Run {meta['when']}; medians of {meta['reps']} runs; load average before"
        f" the run {meta['load']:.2f}.",
        "",
        "### Queries (library, `query_rows(catalog, ...)` read to the end, default columns)",
        "",
        "| query | rows | cold (no cache) | cached | speed-up |",
        "|---|---:|---:|---:|---:|",
    ]
    for q in queries:
        if q["stored"]:
            lines.append(
                f"| {q['query']} | {q['rows']:,} | {q['cold_ms']:.0f} ms | {q['cached_ms']:.0f} ms | {q['speedup']:.1f}x |"
            )
        else:  # the "cached" runs ran the query again: only noise tells them apart
            lines.append(f"| {q['query']} | {q['rows']:,} | {q['cold_ms']:.0f} ms | not stored (see below) | - |")
    lines += [
        "",
        f"End to end through the CLI (`dlindex {' '.join(CLI_PER_LABEL)} > /dev/null`, a fresh process each):"
        f" cold {cli['cold_ms']:.0f} ms, cached {cli['cached_ms']:.0f} ms, of which {cli['startup_ms']:.0f} ms"
        " is starting Python and importing dlindex.",
        "",
        "The result cache keeps a result's ids and answers a repeat by primary-key lookups (about 1.5 us a",
        "row, plus building the rows, which cold and cached runs share). It stores a result only when the",
        "query took at least twice that long inside SQLite and returned at most 100,000 rows: class-balanced",
        "sampling (a sort of every candidate row) and narrow time windows gain; a filter returning 30% of",
        "the catalog would not, and is not stored. The 24-hour window is given as a fixed start time",
        '(`since=` an ISO time computed once); `since="24h"` resolves to a new second every second.',
        "",
        "### mark",
        "",
        "| what | ids | time | ids/s | target | |",
        "|---|---:|---:|---:|---|---|",
        f"| `dlindex mark --processed -` < ids (end to end, fresh process) | {rows:,} | {mark['seconds']:.2f} s"
        f" | {mark['rate']:,.0f} | >= {TARGET_MARK_RATE:,} ids/s | {ok(mark['rate'] >= TARGET_MARK_RATE)} |",
        f"| the same from JSON lines (`query --format jsonl` output) | {rows:,} | {mark['json_seconds']:.2f} s"
        f" | {mark['json_rate']:,.0f} | | |",
        f"| seed's loop: `UPDATE ... WHERE id = ?` + commit per id, sqlite3 defaults | {mark['naive_ids']:,} | |"
        f" {mark['naive_rate']:,.0f} | | |",
        f"| mark / seed's loop | | | {mark['ratio']:.0f}x | >= {TARGET_MARK_RATIO}x | {ok(mark['ratio'] >= TARGET_MARK_RATIO)} |",
        f"| (reference) the loop with dlindex's synchronous=NORMAL | {mark['naive_ids']:,} | |"
        f" {mark['naive_normal_rate']:,.0f} | | mark is {mark['ratio_normal']:.0f}x |",
        "",
        "Every mark run changes every row (the flags are reset between runs). The seed's loop uses Python's",
        "`sqlite3.connect()` defaults (synchronous=FULL: one WAL sync per commit); with dlindex's own",
        "synchronous=NORMAL the per-id loop avoids the sync, and mark's advantage is the smaller ratio shown.",
        "",
        "### Query-log overhead (logging on vs off, cold queries, catalog opened and closed each run)",
        "",
        "| query | log off | log on | overhead | target | |",
        "|---|---:|---:|---:|---|---|",
    ]
    for q in log["queries"]:
        lines.append(f"| {q['query']} | {q['off_ms']:.0f} ms | {q['on_ms']:.0f} ms | {q['overhead'] * 100:+.1f}% |"
                     f" <= {TARGET_LOG_OVERHEAD * 100:.0f}% | {ok(q['overhead'] <= TARGET_LOG_OVERHEAD)} |")  # fmt: skip
    tiny_cost = log["tiny_on_us"] - log["tiny_off_us"]
    lines += [
        "",
        f"Absolute cost per logged query: a tiny query (`limit=10`, {log['tiny_calls']:,} calls in one catalog)"
        f" takes {log['tiny_off_us']:.1f} us without the log and {log['tiny_on_us']:.1f} us with it: {tiny_cost:.1f} us"
        f" per call, buffer flushes included ({tiny_cost / log['tiny_off_us'] * 100:.0f}% of a query that small;"
        " under 5% for any query above ~0.1 ms).",
        "",
        f"Targets: mark >= {TARGET_MARK_RATE:,} ids/s {ok(mark['rate'] >= TARGET_MARK_RATE)};"
        f" mark >= {TARGET_MARK_RATIO}x the seed's loop {ok(mark['ratio'] >= TARGET_MARK_RATIO)};"
        f" query-log overhead <= {TARGET_LOG_OVERHEAD * 100:.0f}% {ok(worst <= TARGET_LOG_OVERHEAD)}"
        f" (worst {worst * 100:+.1f}%).",
        "",
        "Reproduce:",
        "",
        "```bash",
        f"python bench/bench_query.py --rows {rows} --labels {meta['labels']} --reps {meta['reps']}",
        f"python bench/bench_query.py --rows {rows} --keep DIR   # keeps DIR/catalog.db, ids.txt, ids.jsonl; then e.g.",
        "time dlindex mark --processed - --db DIR/catalog.db < DIR/ids.txt",
        "dlindex query --per-label 32 --processed --db DIR/catalog.db --explain",
        "```",
        "",
        f"Wall time of this run: {meta['total_s'] / 60:.1f} min.",
        END,
    ]
    return "\n".join(lines)


def write_docs(path: Path, section: str) -> None:
    write_section(path, START, END, section)


def main(argv: list[str] | None = None) -> int:
    compile_sources()  # time dlindex as pip installs it, with its bytecode
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, help="image rows (default 1,000,000; --quick: 100,000)")
    ap.add_argument("--labels", type=int, default=1000)
    ap.add_argument("--reps", type=int, help="repetitions per measurement (default 5; --quick: 2)")
    ap.add_argument("--quick", action="store_true", help="small catalog, 2 reps, no docs (smoke test)")
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temporary folder)")
    ap.add_argument("--docs", help="markdown file to update (default docs/benchmarks.md; --quick: none)")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--max-wait-idle", type=float, default=120, help="wait up to this many s for load < 1 first")
    a = ap.parse_args(argv)
    rows = a.rows or (100_000 if a.quick else 1_000_000)
    reps = a.reps or (2 if a.quick else 5)
    docs = None if a.no_docs else (Path(a.docs) if a.docs else (None if a.quick else REPO / "docs" / "benchmarks.md"))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dlindex-bench-query-") as tmp:
        work = Path(a.keep) if a.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        db = work / "catalog.db"
        load = wait_idle(a.max_wait_idle)
        print(f"generating {rows:,} rows, {a.labels:,} labels into {db} (load {load:.2f})")
        generate_s = make_catalog(db, rows, a.labels)
        print(f"  {generate_s:.1f} s\nqueries")
        queries = bench_queries(db, reps)
        cli = bench_cli(db, reps)
        print("query log")
        log = bench_log(db, reps)
        print("mark")
        mark = bench_mark(db, rows, reps, work)
    meta = {
        "rows": rows, "labels": a.labels, "reps": reps, "generate_s": generate_s, "load": load,
        "when": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "total_s": time.perf_counter() - started,
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
                   f"SQLite {sqlite3.sqlite_version}",
    }  # fmt: skip
    section = render(meta, queries, cli, log, mark)
    print()
    print(section)
    if docs is not None:
        write_docs(docs, section)
        print(f"\nwritten to {docs}")
    worst = max(q["overhead"] for q in log["queries"])
    passed = mark["rate"] >= TARGET_MARK_RATE and mark["ratio"] >= TARGET_MARK_RATIO and worst <= TARGET_LOG_OVERHEAD
    print(f"commands: {shlex.join([PY, *sys.argv])}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
