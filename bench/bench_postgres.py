"""The server catalog benchmark (#19): the same work on a SQLite file and on PostgreSQL, one run.

Both catalogs hold --rows image rows (default 1,000,000) in --labels labels (1,000), written by
the scan's own write path, then reused for everything else:

  insert   `BatchWriter.flush` (dlindex/scan/batch_writer.py) of synthetic probe results, 2,000 rows a
           flush as the scan's writer commits them: COPY on PostgreSQL, executemany of a plain
           INSERT on SQLite; rows/s over the flush time (one build per backend; the median
           flush is shown too). Then one untimed UPDATE gives the rows bench_query.py's mix
           (~70% processed, 1% corrupt/missing, created_at over 30 days), 128-d float32 vectors
           are loaded for every row (COPY / executemany) and PostgreSQL is VACUUM ANALYZEd, as
           its autovacuum would after such a load.
  query    the training queries (by label, per-label sampling, unprocessed, status, size,
           seeded random order, a time window, failed features): `query_rows(...)` read to the
           end, default columns, no result cache, one open catalog per backend; median of
           --reps, backends interleaved; every result compared between backends.
  fetch    `feature_vectors(catalog, ids, type)`, the training loader's one query per batch
           (dlindex/loader/worker.py), for --fetch-batches random batches of 256 ids, no matrix
           cache; median and p99 ms, vectors compared.
  mark     `mark_samples(catalog, 1,000,000 ids, processed=...)` (what `dlindex mark` runs),
           every run changing every row; median of --mark-reps per backend.
  writers  8 processes at once, each `mark_samples` of --tx transactions of --batch ids
           (disjoint ids, every row changing), against 1 process doing one writer's share:
           aggregate ids/s and the ratio 8 / 1, median of --reps pairs; machine CPU busy over the
           run, client and server CPU seconds. Repeated with synchronous_commit=off (a session
           setting, labelled) to show how much is the commit's WAL flush.

PostgreSQL: by default a throwaway PostgreSQL 15 server started here (initdb -A trust as the
`postgres` user, TCP on 127.0.0.1, stock settings but pg_stat_statements; durability on),
stopped at the end; or --postgres URL of a server (a database `dlindex_bench` is made there).

  python bench/bench_postgres.py                 # full run (~6 min on 2 cores), writes docs
  python bench/bench_postgres.py --quick         # 50,000 rows, 2 reps, no docs
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import multiprocessing as mp
import os
import platform
import shlex
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import numpy as np
from common import compile_sources, write_section

from dlindex import Catalog, feature_vectors, query_rows
from dlindex.catalog.postgres.server import start_local_postgres, stop_local_postgres
from dlindex.features.types import create_type
from dlindex.query.mark import mark_samples
from dlindex.scan.batch_writer import BatchWriter, register_root
from dlindex.scan.diff import ToProbe
from dlindex.scan.probe import Probe

START, END = "<!-- bench_postgres:start -->", "<!-- bench_postgres:end -->"
FLUSH_ROWS = 2000  # the scan writer's batch (dlindex.scan.batch_writer._FLUSH_ROWS)
DIM = 128
FEATURE = "bench_emb"
FETCH_BATCH = 256
TARGET_BULK = 0.5  # PostgreSQL's bulk paths >= 0.5x SQLite's
TARGET_WRITERS = 4.0  # 8 writers >= 4x one writer on PostgreSQL
SHOWN_SETTINGS = ("server_version", "shared_buffers", "fsync", "synchronous_commit", "wal_level", "full_page_writes",
                  "max_wal_size", "checkpoint_timeout", "autovacuum")  # fmt: skip
_DAY_AGO = (_dt.datetime.now(_dt.UTC) - _dt.timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M:%SZ")
QUERIES: dict[str, dict[str, Any]] = {
    "one label": {"labels": ["class_0001"]},
    "per-label 32, processed, seed 0": {"per_label": 32, "processed": True, "seed": 0},
    "unprocessed": {"processed": False},
    "status corrupt or missing": {"status": ["corrupt", "missing"]},
    "min 512 x 512": {"min_width": 512, "min_height": 512},
    "random order, seed 0, limit 1,000": {"order": "random", "seed": 0, "limit": 1000},
    "created in the last 24 h": {"since": _DAY_AGO},
    "processing_status failed": {"processing_status": ["failed"]},
}
# bench_query.py's mix, by id: the same arithmetic on both backends, so the same rows
_MIX = """UPDATE image_metadata SET
    status = CASE WHEN ((id * 40503 + 12345) % 65536) % 1000 < 7 THEN 'corrupt'
        WHEN ((id * 40503 + 12345) % 65536) % 1000 < 10 THEN 'missing' ELSE 'ok' END,
    processed = CASE WHEN ((id * 40503 + 12345) % 65536) % 100 < 70 THEN 1 ELSE 0 END,
    processing_status = CASE WHEN ((id * 40503 + 12345) % 65536) % 100 < 70 THEN 'completed'
        WHEN ((id * 40503 + 12345) % 65536) % 100 < 71 THEN 'failed'
        WHEN ((id * 40503 + 12345) % 65536) % 100 < 73 THEN 'queued' END,
    created_at = {created}, updated_at = {created}"""
_CREATED_SQLITE = "strftime('%Y-%m-%d %H:%M:%S', :base, printf('-%d seconds', (:rows - id) * 2592000 / :rows))"
_CREATED_PG = (
    "to_char(%(base)s::timestamp - make_interval(secs => (%(rows)s - id) * 2592000 / %(rows)s), "
    "'YYYY-MM-DD HH24:MI:SS')"
)
_SET_DIM = "UPDATE feature_types SET dim = ?, version = version + 1 WHERE name = ?"
_ALL_PROCESSED = "SELECT DISTINCT processed FROM image_metadata"


# ---------------------------------------------------------------- the PostgreSQL server


class Server:
    """A PostgreSQL server: one started here (stopped by ``stop``), or one given by URL."""

    def __init__(self, admin_url: str, data_dir: Path | None = None) -> None:
        self.admin_url = admin_url
        self.data_dir = data_dir

    def database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {name}")
        return self.admin_url.rsplit("/", 1)[0] + "/" + name

    def settings(self) -> dict[str, str]:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in SHOWN_SETTINGS}  # type: ignore[index]

    def stop(self) -> None:
        if self.data_dir is not None:
            stop_local_postgres(self.data_dir)


def start_server(work: Path) -> Server:
    """A throwaway local server (``dlindex postgres start``'s): stock settings, TCP on 127.0.0.1."""
    if os.geteuid() == 0:
        os.chmod(work, 0o711)  # the server runs as the postgres user, who must reach its folder
    data = work / "pg"
    return Server(start_local_postgres(data), data)


# ---------------------------------------------------------------- building the catalogs


def probe_batch(first: int, n: int, labels: int) -> list[tuple[Probe, ToProbe]]:
    """What the scan's workers hand its writer for files first..first+n-1 (100-file class runs)."""
    out = []
    for i in range(first, first + n):
        a = (i * 2654435761) % 4294967296
        label = f"class_{1 + ((i // 100) * 7919) % labels:04d}"
        key = f"{label}/{i:08d}.jpg"
        probe = Probe(key, "ok", 20000 + a % 200000, 1700000000000000000 + i * 1000,
                      f"{a * 7 % 2**64:016x}{a * 13 % 2**64:016x}", 64 + a % 961, 64 + (a // 961) % 961,
                      "JPEG", "RGB")  # fmt: skip
        out.append((probe, ToProbe(key.encode(), key, label, None, None)))
    return out


class ServerSide:
    """A PostgreSQL catalog's server process: its CPU seconds and the WAL the server wrote."""

    def __init__(self, catalog: Catalog) -> None:
        self.conn = catalog.conn if catalog.backend.is_server else None
        self.pid = int(self.conn.execute_raw("SELECT pg_backend_pid()").fetchone()[0]) if self.conn else None

    def sample(self) -> tuple[float, int]:
        if self.conn is None or self.pid is None:
            return 0.0, 0
        wal = int(self.conn.execute_raw("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])
        return _cpu_ticks(self.pid), wal


def bench_insert(location: str, rows: int, labels: int) -> dict[str, Any]:
    """The scan writer's flushes of ``rows`` new files into a new catalog; only flush() is timed."""
    flushes: list[float] = []
    client = 0.0
    with Catalog(location, create=True) as catalog:
        root_id = register_root(catalog, "/data/train", None)
        writer = BatchWriter(catalog, root_id)
        label_times: list[float] = []
        label_ids = writer._label_ids

        def timed_label_ids(conn: Any, names: set[str | None]) -> dict[str | None, int | None]:
            started = time.perf_counter()
            found = label_ids(conn, names)
            label_times.append(time.perf_counter() - started)
            return found

        writer._label_ids = timed_label_ids  # type: ignore[method-assign]
        server = ServerSide(catalog)
        cpu0, wal0 = server.sample()
        for first in range(1, rows + 1, FLUSH_ROWS):
            writer.rows = probe_batch(first, min(FLUSH_ROWS, rows + 1 - first), labels)
            started, cpu = time.perf_counter(), time.process_time()
            writer.flush()
            flushes.append(time.perf_counter() - started)
            client += time.process_time() - cpu
        cpu1, wal1 = server.sample()
        count = int(catalog.conn.execute("SELECT count(*) FROM image_metadata").fetchone()[0])
    assert count == rows, (count, rows)
    total = sum(flushes)
    per_flush = statistics.median(flushes)
    return {"seconds": total, "rate": rows / total, "flush_ms": per_flush * 1000, "flush_rate": FLUSH_ROWS / per_flush,
            "client_cpu": client, "server_cpu": cpu1 - cpu0, "wal_mb": (wal1 - wal0) / 1e6,
            "labels_ms": statistics.median(label_times) * 1000}  # fmt: skip


def copy_costs(url: str, labels: int, batches: int = 10) -> dict[str, float]:
    """Why PostgreSQL's insert costs what it does: COPY of the scan's 2,000-row batches into scratch
    copies of image_metadata with and without its two foreign keys (roots, labels), and without
    its indexes too; median ms a batch, batches alternating between the tables."""
    import psycopg

    tables = {"as in the catalog": "fk_probe", "without the 2 foreign keys": "nofk_probe",
              "without foreign keys and indexes": "bare_probe"}  # fmt: skip
    columns = ("root_id", "file_path", "label_id", "width", "height", "format", "mode", "bytes", "mtime_ns",
               "xxh3_128", "status")  # fmt: skip
    times: dict[str, list[float]] = {t: [] for t in tables}
    with psycopg.connect(url, autocommit=True) as conn:
        ids = dict(conn.execute("SELECT name, id FROM labels").fetchall())
        like = "LIKE image_metadata INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY"
        conn.execute(f"CREATE TABLE fk_probe ({like} INCLUDING INDEXES, FOREIGN KEY (root_id) REFERENCES roots(id),"
                     " FOREIGN KEY (label_id) REFERENCES labels(id))")  # fmt: skip
        conn.execute(f"CREATE TABLE nofk_probe ({like} INCLUDING INDEXES)")
        conn.execute(f"CREATE TABLE bare_probe ({like})")
        try:
            for k in range(batches):
                batch = [(1, p.key, ids[item.label], p.width, p.height, p.format, p.mode, p.bytes, p.mtime_ns,
                          p.xxh3_128, p.kind) for p, item in probe_batch(1 + k * FLUSH_ROWS, FLUSH_ROWS, labels)]  # fmt: skip
                for name, table in tables.items():
                    started = time.perf_counter()
                    with (
                        conn.transaction(),
                        conn.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy,
                    ):
                        for row in batch:
                            copy.write_row(row)
                    times[name].append(time.perf_counter() - started)
        finally:
            conn.execute("DROP TABLE fk_probe, nofk_probe, bare_probe")
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def mix_rows(location: str, rows: int, base: str) -> float:
    """Untimed setup: bench_query.py's statuses, flags and created_at on every row; vectors for every row."""
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    chunk = 100_000
    if location.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute(_MIX.replace("%", "%%").format(created=_CREATED_PG), {"base": base, "rows": rows})
        with Catalog(location) as catalog, catalog.write_transaction() as tx:
            create_type(tx, FEATURE, "float32", "import")
            for first in range(1, rows + 1, chunk):
                n = min(chunk, rows + 1 - first)
                vectors = rng.standard_normal((n, DIM), dtype=np.float32)
                tx.copy_rows("image_features", ("image_id", "feature_type", "vector"),
                             ((first + k, FEATURE, vectors[k].tobytes()) for k in range(n)))  # fmt: skip
            tx.execute(_SET_DIM, (DIM, FEATURE))
        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")  # as autovacuum would after a load this size
    else:
        conn = sqlite3.connect(location, isolation_level=None)
        conn.execute(_MIX.format(created=_CREATED_SQLITE), {"base": base, "rows": rows})
        conn.close()
        with Catalog(location) as catalog, catalog.write_transaction() as tx:
            create_type(tx, FEATURE, "float32", "import")
            for first in range(1, rows + 1, chunk):
                n = min(chunk, rows + 1 - first)
                vectors = rng.standard_normal((n, DIM), dtype=np.float32)
                tx.executemany("INSERT INTO image_features (image_id, feature_type, vector) VALUES (?, ?, ?)",
                               ((first + k, FEATURE, vectors[k].tobytes()) for k in range(n)))  # fmt: skip
            tx.execute(_SET_DIM, (DIM, FEATURE))
        checkpoint(location)
    return time.perf_counter() - started


def checkpoint(path: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


# ---------------------------------------------------------------- reads


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, default=str).encode()).hexdigest()[:16]


def bench_queries(locations: dict[str, str], reps: int) -> list[dict[str, Any]]:
    catalogs = {name: Catalog(loc) for name, loc in locations.items()}
    opened: dict[str, list[float]] = {name: [] for name in locations}
    for _ in range(reps):
        for name, loc in locations.items():
            started = time.perf_counter()
            Catalog(loc).close()
            opened[name].append(time.perf_counter() - started)
    out = [{"query": "open the catalog (connect, schema check)", "rows": None, "same": True,
            **{name: statistics.median(t) * 1000 for name, t in opened.items()}}]  # fmt: skip
    try:
        for query, options in QUERIES.items():
            times: dict[str, list[float]] = {name: [] for name in locations}
            digests: dict[str, str] = {}
            counts: dict[str, int] = {}
            for _ in range(reps):  # interleaved, so drift in machine load hits both alike
                for name, catalog in catalogs.items():
                    started = time.perf_counter()
                    result = list(query_rows(catalog, **options, cache=False))
                    times[name].append(time.perf_counter() - started)
                    digests[name], counts[name] = digest(result), len(result)
            same = len(set(digests.values())) == 1 and len(set(counts.values())) == 1
            row = {"query": query, "rows": counts["sqlite"], "same": same,
                   **{name: statistics.median(t) * 1000 for name, t in times.items()}}  # fmt: skip
            out.append(row)
            print(f"  {query}: {row['rows']:,} rows, sqlite {row['sqlite']:.1f} ms, postgresql"
                  f" {row['postgresql']:.1f} ms{'' if same else ', RESULTS DIFFER'}")  # fmt: skip
    finally:
        for catalog in catalogs.values():
            catalog.close()
    return out


def bench_fetch(locations: dict[str, str], rows: int, batches: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    id_batches = [rng.choice(rows, FETCH_BATCH, replace=False) + 1 for _ in range(batches)]
    out: dict[str, Any] = {"same": True}
    digests = {}
    for name, loc in locations.items():
        with Catalog(loc) as catalog:
            for ids in id_batches[:20]:  # warm-up: connection, statement, pages
                feature_vectors(catalog, ids, FEATURE)
            times = []
            h = hashlib.sha256()
            for ids in id_batches:
                started = time.perf_counter()
                vectors = feature_vectors(catalog, ids, FEATURE)
                times.append(time.perf_counter() - started)
                h.update(vectors.tobytes())
            digests[name] = h.hexdigest()
        out[name] = {"median_ms": statistics.median(times) * 1000,
                     "p99_ms": float(np.percentile(times, 99)) * 1000}  # fmt: skip
        print(f"  fetch {FETCH_BATCH} vectors, {name}: median {out[name]['median_ms']:.2f} ms,"
              f" p99 {out[name]['p99_ms']:.2f} ms")  # fmt: skip
    out["same"] = len(set(digests.values())) == 1
    return out


# ---------------------------------------------------------------- writes


def bench_mark(locations: dict[str, str], rows: int, reps: int) -> tuple[dict[str, Any], bool]:
    """mark_samples of every id, every run changing every row; returns the flag left on every row."""
    records = [b"%d" % i for i in range(1, rows + 1)]
    times: dict[str, list[float]] = {name: [] for name in locations}
    costs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in locations}
    flag = False
    for rep in range(reps + 1):  # the first (untimed) run sets every row to the same flag
        for name, loc in locations.items():
            with Catalog(loc) as catalog:
                server = ServerSide(catalog)
                cpu0, wal0 = server.sample()
                started, cpu = time.perf_counter(), time.process_time()
                result = mark_samples(catalog, records, processed=flag)
                seconds, client = time.perf_counter() - started, time.process_time() - cpu
                cpu1, wal1 = server.sample()
                if rep:
                    assert result.updated == rows, (name, result)
                    times[name].append(seconds)
                    costs[name].append((client, cpu1 - cpu0, (wal1 - wal0) / 1e6))
                    print(f"  mark {rows:,} ids, {name}: {seconds:.2f} s (client CPU {client:.2f} s, server CPU"
                          f" {cpu1 - cpu0:.2f} s, WAL {(wal1 - wal0) / 1e6:.0f} MB)")  # fmt: skip
        flag = not flag
    for loc in locations.values():  # every row holds the last flag set
        with Catalog(loc, log=False) as catalog:
            assert catalog.conn.execute(_ALL_PROCESSED).fetchall() == [(int(not flag),)]
    out = {name: {"seconds": statistics.median(t), "runs": t, "rate": rows / statistics.median(t),
                  "client_cpu": statistics.median(c[0] for c in costs[name]),
                  "server_cpu": statistics.median(c[1] for c in costs[name]),
                  "wal_mb": statistics.median(c[2] for c in costs[name])} for name, t in times.items()}  # fmt: skip
    return out, not flag


def _cpu_ticks(pid: int | None = None) -> float:
    """CPU seconds of a process (utime + stime), or busy seconds of the whole machine."""
    hz = os.sysconf("SC_CLK_TCK")
    if pid is None:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        values = [int(v) for v in fields]
        return (sum(values[:8]) - values[3] - values[4]) / hz  # all but idle and iowait
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / hz


def _writer(location: str, first: int, transactions: int, batch: int, flag: bool, ready: Any, go: Any,
            results: Any) -> None:  # fmt: skip
    """One writer process: ``transactions`` marks of ``batch`` consecutive ids from ``first``."""
    with Catalog(location) as catalog:
        backend = None
        if catalog.backend.is_server:
            backend = int(catalog.conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        mark_samples(catalog, [], processed=flag)  # warm: temp tables, statements, a commit
        ready.put(os.getpid())
        go.wait()
        started, cpu = time.monotonic(), time.process_time()
        server = _cpu_ticks(backend) if backend is not None else 0.0
        updated = 0
        for k in range(transactions):
            low = first + k * batch
            updated += mark_samples(catalog, [b"%d" % i for i in range(low, low + batch)], processed=flag).updated
        ended = time.monotonic()
        results.put({"started": started, "ended": ended, "updated": updated, "client_cpu": time.process_time() - cpu,
                     "server_cpu": (_cpu_ticks(backend) - server) if backend is not None else 0.0})  # fmt: skip


def run_writers(location: str, writers: int, first: int, transactions: int, batch: int, flag: bool) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # a fork would share the parent's open connections
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    shares = [(location, first + w * transactions * batch, transactions, batch, flag, ready, go, results)
              for w in range(writers)]  # fmt: skip
    procs = [ctx.Process(target=_writer, args=share) for share in shares]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    machine = _cpu_ticks()
    opened = time.monotonic()
    go.set()
    done = [results.get(timeout=600) for _ in procs]
    wall = max(d["ended"] for d in done) - opened
    machine = _cpu_ticks() - machine
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    updated = sum(d["updated"] for d in done)
    assert updated == writers * transactions * batch, (updated, writers, transactions, batch)
    return {"wall": wall, "ids_per_s": updated / wall, "tx_per_s": writers * transactions / wall,
            "busy": machine / wall / (os.cpu_count() or 1), "client_cpu": sum(d["client_cpu"] for d in done),
            "server_cpu": sum(d["server_cpu"] for d in done)}  # fmt: skip


def bench_writers(locations: dict[str, str], reps: int, writers: int, transactions: int, batch: int,
                  flag: bool) -> dict[str, Any]:  # fmt: skip
    """``writers`` processes vs one, on disjoint ids: one writer's share is ids [1, T*B]; the
    many writers' ids follow it. Each run flips its region's flag, so every row changes."""
    share = transactions * batch
    out: dict[str, Any] = {}
    for name, loc in locations.items():
        state = {1: flag, writers: flag}
        runs: dict[int, list[dict[str, Any]]] = {1: [], writers: []}
        for _ in range(reps):
            for n in (1, writers):  # paired, in turn
                state[n] = not state[n]
                first = 1 if n == 1 else 1 + share
                runs[n].append(run_writers(loc, n, first, transactions, batch, state[n]))
        one = {k: statistics.median(r[k] for r in runs[1]) for k in runs[1][0]}
        many = {k: statistics.median(r[k] for r in runs[writers]) for k in runs[writers][0]}
        ratios = [m["ids_per_s"] / o["ids_per_s"] for o, m in zip(runs[1], runs[writers], strict=True)]
        # If every transaction costs the CPU one writer spends on it (client + its server process),
        # the cores allow at most this many transactions a second, whatever the number of writers.
        cpu_per_tx = (one["client_cpu"] + one["server_cpu"]) / transactions
        ceiling = (os.cpu_count() or 1) / cpu_per_tx / one["tx_per_s"] if cpu_per_tx else float("inf")
        out[name] = {"one": one, "many": many, "ratio": many["ids_per_s"] / one["ids_per_s"], "ratios": ratios,
                     "cpu_per_tx_ms": cpu_per_tx * 1000, "ceiling": ceiling}  # fmt: skip
        print(f"  {name}: 1 writer {one['ids_per_s']:,.0f} ids/s ({one['tx_per_s']:.0f} tx/s, busy {one['busy']:.0%}),"
              f" {writers} writers {many['ids_per_s']:,.0f} ids/s ({many['tx_per_s']:.0f} tx/s, busy"
              f" {many['busy']:.0%}): {out[name]['ratio']:.2f}x")  # fmt: skip
    return out


# ---------------------------------------------------------------- the docs


def render(meta: dict[str, Any], insert: dict[str, Any], copies: dict[str, float], queries: list[dict[str, Any]],
           fetch: dict[str, Any], mark: dict[str, Any], writers: dict[str, Any]) -> str:  # fmt: skip
    def ok(passed: bool) -> str:
        return "pass" if passed else "**MISS**"

    rows, w = meta["rows"], meta["writers"]
    s, p = "sqlite", "postgresql"
    settings = ", ".join(f"{k} {v}" for k, v in meta["settings"].items())
    wr, wo = writers["durable"], writers.get("nosync")
    ins, mk = insert[p]["rate"] / insert[s]["rate"], mark[s]["seconds"] / mark[p]["seconds"]
    lines = [
        START,
        "## The server catalog: SQLite file vs PostgreSQL (`bench/bench_postgres.py`, #19)",
        "",
        f"Measured {meta['when']} on {meta['machine']}; one run, both backends side by side in it; load average"
        f" {meta['load']:.2f} at the start, {meta['load_end']:.2f} at the end. Both catalogs: {rows:,} rows in"
        f" {meta['labels']:,} labels written by the scan's writer (first row below), then bench_query.py's mix of"
        f" statuses, flags and dates and a {DIM}-d float32 vector per row ({meta['setup_s']:.0f} s of untimed"
        " setup, PostgreSQL then VACUUM ANALYZEd). SQLite: a file, dlindex's settings (WAL, synchronous=NORMAL)."
        f" PostgreSQL over TCP on 127.0.0.1, {meta['server']}: {settings}. Server and clients share the"
        f" {os.cpu_count()} cores. Reproduce: `{meta['command']}`.",
        "",
        "| figure | SQLite | PostgreSQL | PostgreSQL / SQLite | target | |",
        "|---|---:|---:|---:|---|---|",
        f"| scan insert: `BatchWriter.flush` of {rows:,} new rows (COPY vs executemany), rows/s"
        f" | {insert[s]['rate']:,.0f} | {insert[p]['rate']:,.0f} | {ins:.2f}x | >= {TARGET_BULK}x | {ok(ins >= TARGET_BULK)} |",
        f"| `mark` of {rows:,} ids (`mark_samples`, every row changing), s, median of {meta['mark_reps']}"
        f" | {mark[s]['seconds']:.2f} | {mark[p]['seconds']:.2f} | {mk:.2f}x | >= {TARGET_BULK}x | {ok(mk >= TARGET_BULK)} |",
        f"| feature fetch: {FETCH_BATCH} vectors by id (`feature_vectors`), median (p99) ms"
        f" | {fetch[s]['median_ms']:.2f} ({fetch[s]['p99_ms']:.2f}) | {fetch[p]['median_ms']:.2f}"
        f" ({fetch[p]['p99_ms']:.2f}) | {fetch[s]['median_ms'] / fetch[p]['median_ms']:.2f}x | reported"
        f" | {'same vectors' if fetch['same'] else '**vectors differ**'} |",
        f"| {w} writers / 1 writer, `mark_samples` of {meta['batch']} ids per transaction, aggregate ids/s"
        f" | {wr[s]['ratio']:.2f}x | {wr[p]['ratio']:.2f}x | | PostgreSQL >= {TARGET_WRITERS}x"
        f" | {ok(wr[p]['ratio'] >= TARGET_WRITERS)} |",
    ]
    if wo is not None:
        lines.append(f"| (extra, **not durable**) the same, PostgreSQL with synchronous_commit=off | |"
                     f" {wo[p]['ratio']:.2f}x | | | {ok(wo[p]['ratio'] >= TARGET_WRITERS)} |")  # fmt: skip
    lines += [
        "",
        "PostgreSQL / SQLite is PostgreSQL's speed as a fraction of SQLite's (times are inverted: higher is"
        " faster). Where the time goes (client = this Python process, server = its PostgreSQL backend, from"
        " /proc; WAL from pg_current_wal_lsn):",
        "",
        "| | SQLite | PostgreSQL |",
        "|---|---:|---:|",
        f"| scan insert: median {FLUSH_ROWS:,}-row flush, ms (of it: label ids, 2 statements per flush)"
        f" | {insert[s]['flush_ms']:.1f} ({insert[s]['labels_ms']:.1f}) | {insert[p]['flush_ms']:.1f}"
        f" ({insert[p]['labels_ms']:.1f}) |",
        f"| scan insert: client / server CPU s, WAL MB | {insert[s]['client_cpu']:.1f} / - | {insert[p]['client_cpu']:.1f}"
        f" / {insert[p]['server_cpu']:.1f}, {insert[p]['wal_mb']:,.0f} |",
        f"| `mark` {rows:,}: client / server CPU s, WAL MB | {mark[s]['client_cpu']:.1f} / - | {mark[p]['client_cpu']:.1f}"
        f" / {mark[p]['server_cpu']:.1f}, {mark[p]['wal_mb']:,.0f} |",
        "",
        f"COPY of one {FLUSH_ROWS:,}-row scan batch into scratch copies of `image_metadata` (same run, median of 10,"
        " ms): " + "; ".join(f"{k} {v:.1f}" for k, v in copies.items()) + ".",
        "",
        "Training queries: `query_rows(catalog, ...)` read to the end (default columns, no result cache, one"
        f" open catalog per backend), median ms of {meta['reps']}, backends interleaved; every result compared"
        " row by row between the backends:",
        "",
        "| query | rows | SQLite ms | PostgreSQL ms | PostgreSQL / SQLite | same rows |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for q in queries:
        shown = "" if q["rows"] is None else f"{q['rows']:,}"
        lines.append(f"| {q['query']} | {shown} | {q[s]:.1f} | {q[p]:.1f} | {q[s] / q[p]:.2f}x |"
                     f" {'yes' if q['same'] else '**no**'} |")  # fmt: skip
    lines += [
        "",
        f"Writers: each process opens its own catalog, then runs {meta['tx']} `mark_samples` of {meta['batch']} ids"
        " (disjoint ids, every row changing; one transaction each); rate = all ids / wall time from a common"
        f" start to the last finish; median of {meta['reps']} pairs (1 writer, then {w}). Busy = the machine's CPU"
        f" time over wall time x {os.cpu_count()} cores; client / server CPU = the writers' own CPU seconds and"
        " their PostgreSQL backends'. CPU ceiling = the ratio the cores allow if each transaction costs the CPU"
        " it costs one writer alone.",
        "",
        "| backend | writers | ids/s | transactions/s | CPU busy | client CPU s | server CPU s | CPU ms / transaction (1 writer) | CPU ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, data in (("", wr), (", synchronous_commit=off (not durable)", wo)):
        if data is None:
            continue
        for name in data:
            for n, key in ((1, "one"), (w, "many")):
                r = data[name][key]
                extra = f" {data[name]['cpu_per_tx_ms']:.1f} | {data[name]['ceiling']:.2f}x |" if n == 1 else " | |"
                lines.append(f"| {name}{label} | {n} | {r['ids_per_s']:,.0f} | {r['tx_per_s']:,.0f} | {r['busy']:.0%}"
                             f" | {r['client_cpu']:.2f} | {r['server_cpu']:.2f} |{extra}")  # fmt: skip
    lines += [
        "",
        "### What it means",
        "",
        meaning(insert, copies, mark, wr, wo, w),
        "",
        f"Wall time of this run: {meta['total_s'] / 60:.1f} min.",
        END,
    ]
    return "\n".join(lines)


def meaning(insert: dict[str, Any], copies: dict[str, float], mark: dict[str, Any], wr: dict[str, Any],
            wo: dict[str, Any] | None, w: int) -> str:  # fmt: skip
    """The paragraph under the tables: what this run's figures say, and why."""
    s, p = "sqlite", "postgresql"
    fk, nofk = copies["as in the catalog"], copies["without the 2 foreign keys"]
    pg = wr[p]
    text = (
        "A SQLite write is a library call into pages of this process; a PostgreSQL write is statements sent over a"
        " socket to a server process that, here, shares the 2 cores with the clients. Scan insert: COPY itself is"
        f" not the cost, the foreign keys are: PostgreSQL checks both (roots, labels) with a query per row, {fk:.0f} ms"
        f" a batch against {nofk:.0f} ms without them; the writer's label ids (2 statements per flush)"
        f" take {insert[p]['labels_ms']:.1f} ms of a {insert[p]['flush_ms']:.0f} ms flush."
        " `mark` of every id: PostgreSQL writes a new version of every row (MVCC) with new entries in both"
        f" its indexes ({mark[p]['wal_mb']:,.0f} MB of WAL), after locking every row in id order; its server process"
        f" spends {mark[p]['server_cpu']:.1f} s of CPU where SQLite's whole mark takes {mark[s]['seconds']:.1f} s."
        f" Many small writers: one `mark_samples` call costs {pg['cpu_per_tx_ms']:.1f} ms of CPU on PostgreSQL"
        " (client and server: it stages the ids in a temporary table kept for the connection, locks the rows"
        " in id order, updates them and moves the change counter), so the cores allow at most"
        f" {pg['ceiling']:.1f}x one writer's rate, and {w} writers reached {pg['ratio']:.2f}x. "
    )
    if wo is not None:
        text += (
            f"With synchronous_commit=off they reached {wo[p]['ratio']:.2f}x and one writer ran"
            f" {wo[p]['one']['tx_per_s']:,.0f} against {pg['one']['tx_per_s']:,.0f} transactions/s: the commit's"
            " WAL flush is not the limit on this disk, CPU is. "
        )
    text += (
        f"SQLite runs its {w} writers one at a time, with sleeps in the busy handler between, at"
        f" {wr[s]['ratio']:.2f}x one writer. Reads pay a connection's round trips and a server-side cursor (the"
        " open and one-label rows); large results are dominated by building rows in Python, which both backends"
        " share. The targets assume a server with cores of its own: on one 2-core machine, with the load average"
        " shown, the bulk paths and the writer ratio miss."
    )
    return text


# ---------------------------------------------------------------- main


def wait_idle(max_wait: float) -> float:
    """Wait (up to max_wait s) for the 1-minute load average to drop below 1; return it."""
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] >= 1.0 and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    compile_sources()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, help="image rows per catalog (default 1,000,000; --quick: 50,000)")
    ap.add_argument("--labels", type=int, default=1000)
    ap.add_argument("--reps", type=int, help="repetitions of queries and writer pairs (default 5; --quick: 2)")
    ap.add_argument("--mark-reps", type=int, help="timed runs of the 1M-id mark per backend (default 3; --quick: 1)")
    ap.add_argument("--fetch-batches", type=int, default=200)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--tx", type=int, default=100, help="transactions per writer (default 100)")
    ap.add_argument("--batch", type=int, default=256, help="ids per writer transaction (default 256)")
    ap.add_argument("--postgres", help="URL of a server to use (default: start a throwaway one here)")
    ap.add_argument("--no-nosync", action="store_true", help="skip the synchronous_commit=off writer runs")
    ap.add_argument("--quick", action="store_true", help="small catalogs, 2 reps, no docs (smoke test)")
    ap.add_argument("--docs", help="markdown file to update (default docs/benchmarks.md; --quick: none)")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--max-wait-idle", type=float, default=120, help="wait up to this many s for load < 1 first")
    a = ap.parse_args(argv)
    rows = a.rows or (50_000 if a.quick else 1_000_000)
    reps = a.reps or (2 if a.quick else 5)
    mark_reps = a.mark_reps or (1 if a.quick else 3)
    assert (1 + a.writers) * a.tx * a.batch <= rows, "--writers x --tx x --batch ids must fit in --rows"
    docs = None if a.no_docs else (Path(a.docs) if a.docs else (None if a.quick else REPO / "docs" / "benchmarks.md"))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dlindex-bench-pg-") as tmp:
        work = Path(tmp)
        os.environ["XDG_CACHE_HOME"] = str(work / "cache")  # no feature matrix from an earlier run
        server = Server(a.postgres) if a.postgres else start_server(work)
        try:
            settings = server.settings()
            locations = {"sqlite": str(work / "catalog.db"), "postgresql": server.database("dlindex_bench")}
            load = wait_idle(a.max_wait_idle)
            print(f"PostgreSQL {settings['server_version']} at {server.admin_url}; {rows:,} rows per catalog;"
                  f" load {load:.2f}")  # fmt: skip
            insert = {}
            for name, loc in locations.items():
                insert[name] = bench_insert(loc, rows, a.labels)
                print(f"  scan insert, {name}: {insert[name]['seconds']:.1f} s, {insert[name]['rate']:,.0f} rows/s,"
                      f" median flush {insert[name]['flush_ms']:.1f} ms")  # fmt: skip
            copies = copy_costs(locations["postgresql"], a.labels)
            print("  COPY of 2,000 rows, ms: " + ", ".join(f"{k} {v:.1f}" for k, v in copies.items()))
            base = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            setup_s = sum(mix_rows(loc, rows, base) for loc in locations.values())
            print(f"  setup (mix, vectors, VACUUM ANALYZE): {setup_s:.1f} s\nqueries")
            queries = bench_queries(locations, reps)
            print("feature fetch")
            fetch = bench_fetch(locations, rows, a.fetch_batches)
            print("mark")
            mark, flag = bench_mark(locations, rows, mark_reps)
            print("writers")
            writers = {"durable": bench_writers(locations, reps, a.writers, a.tx, a.batch, flag)}
            if not a.no_nosync:
                print("writers, synchronous_commit=off")
                nosync = {"postgresql": locations["postgresql"] + "?options=-csynchronous_commit%3Doff"}
                # the durable runs flipped each region an even or odd number of times
                flag_now = flag if reps % 2 == 0 else not flag
                writers["nosync"] = bench_writers(nosync, reps, a.writers, a.tx, a.batch, flag_now)
        finally:
            server.stop()
    meta = {
        "rows": rows, "labels": a.labels, "reps": reps, "mark_reps": mark_reps, "writers": a.writers, "tx": a.tx,
        "batch": a.batch, "settings": {k: v for k, v in settings.items() if k != "server_version"},
        "server": f"PostgreSQL {settings['server_version'].split()[0]}"
                  + (" (a throwaway server started by the script, stock postgresql.conf)" if not a.postgres else ""),
        "when": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "setup_s": setup_s,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()},"
                   f" SQLite {sqlite3.sqlite_version}",
        "command": shlex.join(["python", "bench/bench_postgres.py", *(argv if argv is not None else sys.argv[1:])]),
        "total_s": time.perf_counter() - started, "load": load, "load_end": os.getloadavg()[0],
    }  # fmt: skip
    section = render(meta, insert, copies, queries, fetch, mark, writers)
    print()
    print(section)
    if docs is not None:
        write_section(docs, START, END, section)
        print(f"\nwritten to {docs}")
    same = all(q["same"] for q in queries) and fetch["same"]
    passed = (
        insert["postgresql"]["rate"] / insert["sqlite"]["rate"] >= TARGET_BULK
        and mark["sqlite"]["seconds"] / mark["postgresql"]["seconds"] >= TARGET_BULK
        and writers["durable"]["postgresql"]["ratio"] >= TARGET_WRITERS
    )
    return 0 if passed and same else 1


if __name__ == "__main__":
    sys.exit(main())
