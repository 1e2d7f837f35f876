"""The L2 cache benchmark: per-sample metadata latency at 8 concurrent readers, by backend.

Side by side in one run: SQLite local; SQLite + Redis L2; PostgreSQL over TCP and
PostgreSQL + Redis L2 (when --postgres URL or $DLINDEX_TEST_POSTGRES names a catalog that
holds the same rows); each with the L1 row cache on and off.

A reader is a process with its own catalog connection (and its own Redis connection) asking
`dlindex.loader.row_cache.RowCache` for sample rows (path, size, hash) the way the loader's workers
do, all 8 started together. Two ways of asking:
  one     one sample per call, --lookups calls, ids drawn uniformly from a hot set of --hot
          samples shared by all readers (the seed's per-sample ``__getitem__`` path)
  window  512 samples per call (the loader's read-ahead window; per-sample cost quoted)
L1 on: the worker's LRU (65,536 rows), empty at the start, so its hit rate is what the draw
gives. L1 off: a cache of 0 rows, every call goes down. L2 on: the hot set was stored in
Redis before the readers start (a hot cache); misses would fall through to the catalog.

Also the epoch's selection (``per_label=32``, the id lists L2 holds per (selection, label)):
`resolve()` by 8 concurrent ranks, with and without L2.

Every figure is the median over --reps runs of the mean per-sample latency over all readers
(p50 and p99 of single calls beside it). Writes the bench_l2 section of docs/benchmarks.md.

  python bench/bench_l2.py                       # 1,000,000 rows; starts its own redis-server
  python bench/bench_l2.py --postgres postgresql://localhost/bench --redis redis://127.0.0.1:6379/0
  python bench/bench_l2.py --quick               # 100,000 rows, 1 rep, no docs
"""

from __future__ import annotations

import argparse
import datetime as _dt
import multiprocessing
import os
import platform
import random
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from bench_query import make_catalog, wait_idle
from common import compile_sources, write_section

from dlindex import Catalog, QuerySpec

START, END = "<!-- bench_l2:start -->", "<!-- bench_l2:end -->"
READERS = 8
WINDOW = 512
L1_ROWS = 65536


def start_redis(work: Path) -> tuple[str, subprocess.Popen[bytes]]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found: apt-get install redis-server, or pass --redis URL")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(work)], stdout=subprocess.DEVNULL)  # fmt: skip
    import redis

    client = redis.Redis(port=port)
    for _ in range(500):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.02)
    return f"redis://127.0.0.1:{port}/0", proc


def l2_of(catalog: Catalog, url: str | None) -> Any:
    from dlindex.loader.l2 import L2Cache, catalog_identity

    return None if url is None else L2Cache(url, catalog_identity(catalog))


def reader(job: dict[str, Any]) -> dict[str, Any]:
    """One reader process: connect, wait for the common start, time its calls."""
    from dlindex.loader.row_cache import RowCache

    with Catalog(job["location"], log=False) as catalog:
        l2 = l2_of(catalog, job["l2"])
        rows = RowCache(catalog, L1_ROWS if job["l1"] else 0, l2, catalog.changes())
        rng = random.Random(job["seed"])
        hot = job["hot"]
        per = 1 if job["how"] == "one" else WINDOW
        calls = [[rng.choice(hot) for _ in range(per)] for _ in range(job["lookups"] // per)]
        while time.time() < job["start_at"]:
            time.sleep(0.001)
        times = []
        started = time.perf_counter()
        for ids in calls:
            t0 = time.perf_counter()
            got = rows.get_many(ids)
            times.append((time.perf_counter() - t0) / per)
            assert got[0] is not None
        total = time.perf_counter() - started
    return {"times": times, "mean": total / (len(calls) * per), "l1_hits": rows.hits, "asked": rows.hits + rows.misses}


def resolver(job: dict[str, Any]) -> float:
    from dlindex.loader.selection import epoch_spec, resolve

    with Catalog(job["location"], log=False) as catalog:
        l2 = l2_of(catalog, job["l2"])
        spec = epoch_spec(QuerySpec(per_label=32), 0, 0)
        while time.time() < job["start_at"]:
            time.sleep(0.001)
        t0 = time.perf_counter()
        resolve(catalog, spec, l2)
        return time.perf_counter() - t0


def concurrently(fn: Any, jobs: list[dict[str, Any]]) -> list[Any]:
    start_at = time.time() + 1.5  # every reader connected and warm before the clock starts
    with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
        return pool.map(fn, [{**j, "start_at": start_at} for j in jobs])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fill_l2(location: str, url: str, hot: list[int]) -> None:
    from dlindex.loader.row_cache import RowCache

    with Catalog(location, log=False) as catalog:
        RowCache(catalog, 0, l2_of(catalog, url), catalog.changes()).get_many(hot)
        from dlindex.loader.selection import epoch_spec, resolve

        resolve(catalog, epoch_spec(QuerySpec(per_label=32), 0, 0), l2_of(catalog, url))


def bench(backends: dict[str, str], url: str, rows: int, a: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(7)
    hot = sorted(rng.sample(range(1, rows + 1), a.hot))
    results = []
    for name, location in backends.items():
        fill_l2(location, url, hot)
        for l2 in (False, True):
            for how in ("one", "window"):
                for l1 in (False, True):
                    means, p50s, p99s, hit = [], [], [], 0.0
                    for rep in range(a.reps):
                        jobs = [{"location": location, "l2": url if l2 else None, "l1": l1, "how": how, "hot": hot,
                                 "lookups": a.lookups, "seed": 1000 * rep + k} for k in range(READERS)]  # fmt: skip
                        got = concurrently(reader, jobs)
                        times = [t for g in got for t in g["times"]]
                        means.append(statistics.mean(g["mean"] for g in got))
                        p50s.append(pct(times, 0.5))
                        p99s.append(pct(times, 0.99))
                        hit = sum(g["l1_hits"] for g in got) / sum(g["asked"] for g in got)
                    case = {"backend": name, "l2": l2, "how": how, "l1": l1, "mean_us": statistics.median(means) * 1e6,
                            "p50_us": statistics.median(p50s) * 1e6, "p99_us": statistics.median(p99s) * 1e6,
                            "l1_hit_rate": hit}  # fmt: skip
                    print(f"  {name:10} L2 {'on ' if l2 else 'off'} {how:6} L1 {'on ' if l1 else 'off'}: "
                          f"{case['mean_us']:8.1f} us/sample (p50 {case['p50_us']:.1f}, p99 {case['p99_us']:.1f})")  # fmt: skip
                    results.append(case)
            jobs = [{"location": location, "l2": url if l2 else None} for _ in range(READERS)]
            times = [statistics.mean(concurrently(resolver, jobs)) for _ in range(a.reps)]
            results.append({"backend": name, "l2": l2, "how": "selection", "mean_us": statistics.median(times) * 1e6})
            print(f"  {name:10} L2 {'on ' if l2 else 'off'} selection: {results[-1]['mean_us'] / 1e3:.1f} ms per rank")
    return results


def render(meta: dict[str, Any], results: list[dict[str, Any]], backends: list[str]) -> str:
    def cell(backend: str, l2: bool, how: str, l1: bool) -> dict[str, Any]:
        return next(r for r in results if (r["backend"], r["l2"], r["how"], r.get("l1", l1)) == (backend, l2, how, l1))

    lines = [START, "## L2 cache (Redis)", "",
             f"`bench/bench_l2.py`, {meta['when']}, {meta['machine']}. A {meta['rows']:,}-row catalog; "
             f"{READERS} concurrent reader processes, each its own connections; a hot set of {meta['hot']:,} "
             f"samples; {meta['lookups']:,} samples asked per reader; medians of {meta['reps']} runs. "
             "Mean per-sample metadata latency (path, size, hash of one sample), in microseconds; "
             "p50 / p99 of single calls in brackets.", "",
             "| catalog | L2 | L1 | one sample per call | window of 512 per call |", "|---|---|---|---|---|"]  # fmt: skip
    for backend in backends:
        for l2 in (False, True):
            for l1 in (False, True):
                one, win = cell(backend, l2, "one", l1), cell(backend, l2, "window", l1)
                lines.append(f"| {backend} | {'Redis' if l2 else '-'} | {'on' if l1 else 'off'} | "
                             f"{one['mean_us']:.1f} ({one['p50_us']:.1f} / {one['p99_us']:.1f}) | "
                             f"{win['mean_us']:.2f} ({win['p50_us']:.2f} / {win['p99_us']:.2f}) |")  # fmt: skip
    hits = [r["l1_hit_rate"] for r in results if r.get("l1") and r["how"] == "one"]
    lines += ["", f"L1 on: the LRU starts empty; the draw gives it a hit rate of {min(hits):.0%}-{max(hits):.0%}.",
              "", "The epoch's selection (`per_label=32`, resolved by each of 8 ranks at once; L2 holds its id "
              "lists per (selection, label)):", "", "| catalog | L2 | ms per rank |", "|---|---|---|"]  # fmt: skip
    for backend in backends:
        for l2 in (False, True):
            lines.append(
                f"| {backend} | {'Redis' if l2 else '-'} | {cell(backend, l2, 'selection', False)['mean_us'] / 1e3:.2f} |"
            )
    lines += ["", 'Conclusion (the rule `l2="auto"` implements, docs/l2-cache.md):', ""]
    for backend in backends:
        # the loader asks by the window, for every sample; the selection once per epoch and rank
        on, off = cell(backend, True, "window", False)["mean_us"], cell(backend, False, "window", False)["mean_us"]
        sel_on, sel_off = (
            cell(backend, True, "selection", False)["mean_us"],
            cell(backend, False, "selection", False)["mean_us"],
        )
        net_s = (on - off) * 1e-6 * 1_000_000 - (sel_off - sel_on) * 1e-6
        lines.append(f"- {backend}: rows from L2 {on:.1f} us/sample vs {off:.1f} from the catalog (windows, L1 off); "
                     f"the selection {sel_on / 1e3:.0f} vs {sel_off / 1e3:.0f} ms per rank. Per epoch of 1,000,000 "
                     f"samples L2 {'costs' if net_s > 0 else 'saves'} {abs(net_s):.1f} s a rank: "
                     f"{'off' if net_s > 0 else 'on'} by default.")  # fmt: skip
    if "PostgreSQL" not in backends:
        lines.append("- PostgreSQL: not measured in this run (`--postgres URL`); L2 stays on by default for a server "
                     "catalog with a Redis URL configured, the case the issue measured a round trip for.")  # fmt: skip
    lines += ["", "Reproduce:", "", "```bash", meta["command"], "```", END]
    return "\n".join(lines)


def copy_to_postgres(db: Path, url: str) -> None:
    """This run's SQLite catalog into the PostgreSQL database at ``url`` (empty, or already a
    copy of it), ids kept, by COPY: both backends then hold the same rows."""
    count = "SELECT count(*) FROM image_metadata"
    with Catalog(url, create=True, log=False) as pg, sqlite3.connect(db) as lite:
        have, want = pg.conn.execute(count).fetchone()[0], lite.execute(count).fetchone()[0]
        if have == want:
            return
        if have:
            raise SystemExit(f"{url} holds {have:,} rows, not {want:,}: give an empty database")
        print(f"copying {want:,} rows into {pg.location}")
        with pg.write_transaction() as conn:
            server: Any = conn
            for table in ("roots", "labels", "image_metadata"):
                columns = [row[1] for row in lite.execute(f"PRAGMA table_info({table})")]
                rows = lite.execute(f"SELECT {', '.join(columns)} FROM {table}")
                server.copy_rows(table, columns, rows)
                server.execute_raw(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
                )
            server.execute_raw("ANALYZE")


def main(argv: list[str] | None = None) -> int:
    compile_sources()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, help="image rows (default 1,000,000; --quick: 100,000)")
    ap.add_argument("--labels", type=int, default=1000)
    ap.add_argument("--hot", type=int, default=20_000, help="hot samples the readers ask for")
    ap.add_argument("--lookups", type=int, default=20_480, help="samples each reader asks for per run")
    ap.add_argument("--reps", type=int, help="runs per case (default 3; --quick: 1)")
    ap.add_argument(
        "--postgres",
        default=os.environ.get("DLINDEX_TEST_POSTGRES"),
        help="a PostgreSQL catalog holding the same rows (made from this run's SQLite catalog)",
    )
    ap.add_argument("--redis", default=os.environ.get("DLINDEX_TEST_REDIS"), help="a Redis URL (default: start one)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", help="work in this folder and keep it")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--max-wait-idle", type=float, default=60)
    a = ap.parse_args(argv)
    rows = a.rows or (100_000 if a.quick else 1_000_000)
    a.reps = a.reps or (1 if a.quick else 3)
    with tempfile.TemporaryDirectory(prefix="dlindex-bench-l2-") as tmp:
        work = Path(a.keep) if a.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        db = work / "catalog.db"
        if not db.exists():
            print(f"generating {rows:,} rows into {db}")
            make_catalog(db, rows, a.labels)
        backends = {"SQLite": str(db)}
        if a.postgres:
            copy_to_postgres(db, a.postgres)
            backends["PostgreSQL"] = a.postgres
        url, proc = (a.redis, None) if a.redis else start_redis(work)
        try:
            load = wait_idle(a.max_wait_idle)
            started = time.perf_counter()
            results = bench(backends, url, rows, a)
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    import redis

    meta = {"rows": rows, "hot": a.hot, "lookups": a.lookups, "reps": a.reps,
            "when": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
                       f"SQLite {sqlite3.sqlite_version}, redis-py {redis.__version__}, load {load:.2f} at the start, "
                       f"{time.perf_counter() - started:.0f} s",
            "command": " ".join(["python", "bench/bench_l2.py", *(argv if argv is not None else sys.argv[1:])])}  # fmt: skip
    section = render(meta, results, list(backends))
    print("\n" + section)
    if not a.no_docs and not a.quick:
        write_section(REPO / "docs" / "benchmarks.md", START, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
