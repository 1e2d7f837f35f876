"""`dlindex index` on a PostgreSQL catalog: dlindex's advice against Dexter's rule on the seed's training workload.

A server catalog of 200,000 rows (the generator of bench_index.py, written on the server with
one INSERT ... SELECT over generate_series: no client round trip per row) runs a training
slice through dlindex, so both the query log and pg_stat_statements record it:

  balanced     query_rows(labels=[L], per_label=32, processed=True, seed=s)     300 calls
  label_files  SELECT file_path, label_id ... WHERE label_id = ? AND processed = 1  600
  window_24h   query_rows(since=now-24h, until=now, processed=True)              36
  unprocessed  query_rows(processed=False, limit=1000)                           36
  failed       query_rows(processing_status=["failed"])                          18
  hourly       WHERE bytes > ? ORDER BY bytes DESC LIMIT 20                       3
  report       a full-table GROUP BY label_id                                     1
  random       ORDER BY random() LIMIT 64                                         6
  writes       UPDATE ... SET processed = 1 WHERE id = ? on 2,000 rows

(a tenth of bench_index.py's three-hour slice: the same mix). `dlindex index --suggest --json`
computes the advice; then bench/dexter.py computes Dexter's set for the same statements with
hypothetical indexes (cost >= 100, saving >= 50%, single and two-column candidates; the advice
a user runs builds no competitor's indexes). Then each set is built for real (CREATE INDEX,
ANALYZE), every statement is timed on the server with the same parameters (EXPLAIN ANALYZE execution time, median of --reps runs),
weighted by its calls, and the per-row cost of `UPDATE ... SET processed = 1 WHERE id = ?`
over 2,000 rows is timed (rolled back); then the set is dropped again.

  python bench/bench_index_postgres.py --url postgresql://postgres@127.0.0.1:55432/postgres
  python bench/bench_index_postgres.py --url ... --quick     # 50,000 rows, 3 reps, no docs

Results go to docs/benchmarks.md between <!-- bench_index_postgres:start --> and
<!-- bench_index_postgres:end -->.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import psycopg
from common import compile_sources, write_section
from dexter import RULE, dexter_for

from dlindex import Catalog, QuerySpec, query_rows
from dlindex.catalog.postgres.dialect import server_statement
from dlindex.query.rows import prepare

START, END = "<!-- bench_index_postgres:start -->", "<!-- bench_index_postgres:end -->"
NOW = _dt.datetime.now(_dt.UTC).replace(microsecond=0)
DAY_AGO = (NOW - _dt.timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M:%SZ")
UNTIL = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
LABEL_FILES = "SELECT file_path, label_id FROM image_metadata WHERE label_id = ? AND processed = 1"
HOURLY = "SELECT id, file_path, bytes FROM image_metadata WHERE bytes > ? ORDER BY bytes DESC LIMIT 20"
REPORT = ("SELECT label_id, count(*), sum(processed), avg(width), avg(height), sum(bytes) FROM image_metadata "
          "GROUP BY label_id")  # fmt: skip
RANDOM = "SELECT id, file_path FROM image_metadata ORDER BY random() LIMIT 64"
MARK = "UPDATE image_metadata SET processed = 1 WHERE id = ?"
_FILL = """INSERT INTO image_metadata (id, root_id, file_path, label_id, width, height, format, mode, bytes, mtime_ns,
    xxh3_128, status, processed, processing_status, created_at, updated_at)
SELECT i, 1, 'class_' || lpad(((i / 100) * 7919 %% %(labels)s + 1)::text, 4, '0') || '/' || lpad(i::text, 8, '0') || '.jpg',
    (i / 100) * 7919 %% %(labels)s + 1, 64 + a %% 961, 64 + (a / 961) %% 961, 'JPEG', 'RGB', 20000 + a %% 200000,
    1700000000000000000 + i * 1000, lpad(to_hex(a * 7), 16, '0') || lpad(to_hex(a * 13), 16, '0'),
    CASE WHEN b %% 1000 < 7 THEN 'corrupt' WHEN b %% 1000 < 10 THEN 'missing' ELSE 'ok' END,
    CASE WHEN b %% 100 < 70 THEN 1 ELSE 0 END,
    CASE WHEN b %% 100 < 70 THEN 'completed' WHEN b %% 100 < 71 THEN 'failed' WHEN b %% 100 < 73 THEN 'queued' END,
    to_char(%(now)s::timestamp - make_interval(secs => (%(rows)s - i) * 2592000.0 / %(rows)s), 'YYYY-MM-DD HH24:MI:SS'),
    to_char(%(now)s::timestamp - make_interval(secs => (%(rows)s - i) * 2592000.0 / %(rows)s), 'YYYY-MM-DD HH24:MI:SS')
FROM (SELECT i, (i::bigint * 2654435761) %% 4294967296 AS a, (i::bigint * 40503 + 12345) %% 65536 AS b
      FROM generate_series(1, %(rows)s) i) s"""


def make_catalog(base: str, name: str, rows: int, labels: int) -> tuple[str, float]:
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    url = base.rsplit("/", 1)[0] + "/" + name
    started = time.perf_counter()
    with Catalog(url, create=True, log=False) as catalog:
        conn = catalog.conn
        conn.execute_raw("INSERT INTO roots (id, path) VALUES (1, '/data/train')")
        conn.execute_raw("INSERT INTO labels (id, name) SELECT i, 'class_' || lpad(i::text, 4, '0') "
                         "FROM generate_series(1, %s) i", (labels,))  # fmt: skip
        conn.execute_raw(_FILL, {"rows": rows, "labels": labels, "now": NOW.strftime("%Y-%m-%d %H:%M:%S")})
        conn.execute_raw("SELECT setval(pg_get_serial_sequence('image_metadata', 'id'), %s)", (rows,))
        conn.execute_raw("VACUUM ANALYZE image_metadata")
        conn.execute_raw("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute_raw("SELECT pg_stat_statements_reset()")
    return url, time.perf_counter() - started


def patterns(url: str, labels: int, rng: random.Random) -> list[dict[str, Any]]:
    """name, calls, and the (server text, params) each copy is timed with."""
    with Catalog(url, log=False) as catalog:

        def dl(spec: QuerySpec) -> tuple[str, Any]:
            p = prepare(catalog, spec)
            return p.sql, p.params

        label = rng.randint(1, labels)
        found = [
            ("balanced", 300, dl(QuerySpec(labels=(f"class_{label:04d}",), per_label=32, processed=True, seed=1,
                                           columns=("id", "path", "label"), cache=False))),
            ("label_files", 600, (LABEL_FILES, (label,))),
            ("window_24h", 36, dl(QuerySpec(since=DAY_AGO, until=UNTIL, processed=True, columns=("id", "path", "label"),
                                            cache=False))),
            ("unprocessed", 36, dl(QuerySpec(processed=False, limit=1000, columns=("id", "path"), cache=False))),
            ("failed", 18, dl(QuerySpec(processing_status=("failed",), columns=("id", "path", "error"), cache=False))),
            ("hourly", 3, (HOURLY, (210000,))),
            ("report", 1, (REPORT, ())),
            ("random", 6, (RANDOM, ())),
        ]  # fmt: skip
    return [{"name": n, "calls": c, "sql": sql, "params": params} for n, c, (sql, params) in found]


def run_workload(url: str, ps: list[dict[str, Any]], labels: int, rng: random.Random) -> float:
    started = time.perf_counter()
    by = {p["name"]: p for p in ps}
    with Catalog(url) as catalog:
        for i in range(by["balanced"]["calls"]):
            spec = QuerySpec(labels=(f"class_{rng.randint(1, labels):04d}",), per_label=32, processed=True, seed=i,
                             columns=("id", "path", "label"), cache=False)  # fmt: skip
            for _ in query_rows(catalog, spec):
                pass
        for _ in range(by["label_files"]["calls"]):
            list(catalog.read(LABEL_FILES, (rng.randint(1, labels),)))
        for name in ("window_24h", "unprocessed", "failed", "hourly", "report", "random"):
            for _ in range(by[name]["calls"]):
                list(catalog.read(by[name]["sql"], by[name]["params"]))
        with catalog.write_transaction() as conn:
            conn.executemany(MARK, [(i,) for i in range(1, 2001)])
    return time.perf_counter() - started


def time_patterns(url: str, ps: list[dict[str, Any]], reps: int) -> dict[str, dict[str, Any]]:
    out = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for p in ps:
            text, params = server_statement(p["sql"], p["params"])
            times, plan = [], ""
            for i in range(reps + 1):
                row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}", params).fetchone()
                data = row[0] if row else [{}]
                if i:
                    times.append(float(data[0]["Execution Time"]))
                plan = _summary(data[0]["Plan"])
            out[p["name"]] = {"ms": statistics.median(times), "plan": plan}
    return out


def _summary(plan: dict[str, Any]) -> str:
    names = []
    stack = [plan]
    while stack:
        node = stack.pop()
        if "Index Name" in node:
            names.append(f"{node['Node Type']} {node['Index Name']}")
        elif node.get("Node Type") == "Seq Scan":
            names.append("Seq Scan")
        stack.extend(node.get("Plans", ()))
    return "; ".join(dict.fromkeys(names)) or plan.get("Node Type", "")


def update_cost(url: str, rows: int) -> float:
    """Microseconds per row of UPDATE ... SET processed = 1 WHERE id = ? (rolled back)."""
    with psycopg.connect(url) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM image_metadata WHERE processed = 0 ORDER BY id LIMIT %s",
                                          (rows,)).fetchall()]  # fmt: skip
        conn.rollback()
        times = []
        for _ in range(3):
            with conn.cursor() as cur:
                started = time.perf_counter()
                cur.executemany("UPDATE image_metadata SET processed = 1 WHERE id = %s", [(i,) for i in ids])
                times.append(time.perf_counter() - started)
            conn.rollback()
    return statistics.median(times) / len(ids) * 1e6


def build(url: str, statements: list[str]) -> list[str]:
    names = []
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)
            names.append(sql.split()[2])
        conn.execute("ANALYZE image_metadata")
    return names


def drop(url: str, names: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for name in names:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        conn.execute("ANALYZE image_metadata")


def main(argv: list[str] | None = None) -> int:
    compile_sources()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("DLINDEX_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:55432/postgres"),
                    help="a server's maintenance database; the bench makes database bench_index_pg beside it")  # fmt: skip
    ap.add_argument("--rows", type=int)
    ap.add_argument("--labels", type=int, default=1_000)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--docs", help="markdown file to update (default docs/benchmarks.md)")
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args(argv)
    a.rows = a.rows or (50_000 if a.quick else 200_000)
    a.reps = a.reps or (3 if a.quick else 7)
    docs = None if a.no_docs or a.quick else Path(a.docs) if a.docs else REPO / "docs" / "benchmarks.md"
    rng = random.Random(0)
    print(f"server catalog: {a.rows:,} rows ...", flush=True)
    url, made = make_catalog(a.url, "bench_index_pg", a.rows, a.labels)
    ps = patterns(url, a.labels, rng)
    print("running the workload (logged) ...", flush=True)
    workload_s = run_workload(url, ps, a.labels, rng)
    print("dlindex index --suggest ...", flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "DLINDEX_CACHE_DIR": "/tmp/dlindex-bench/index-pg-cache"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dlindex", "index", "--suggest", "--json", "--db", url],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    suggest_s = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"dlindex index --suggest failed:\n{proc.stderr}")
    advice = json.loads(proc.stdout)
    ours = [s["sql"] for s in advice["suggestions"]]
    print("Dexter's rule on the same statements (hypothetical indexes) ...", flush=True)
    started = time.perf_counter()
    dexter_set, verdicts = dexter_for(url)
    dexter_s = time.perf_counter() - started
    dexter = [d.sql() for d in dexter_set]
    timed: dict[str, dict[str, Any]] = {}
    per_row: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for name, statements in (("none", []), ("dlindex", ours), ("dexter", dexter)):
        print(f"timing with {name}'s indexes ...", flush=True)
        names = build(url, statements)
        try:
            timed[name] = time_patterns(url, ps, a.reps)
            per_row[name] = update_cost(url, 2000)
            with psycopg.connect(url) as conn:
                sizes[name] = sum(int(conn.execute("SELECT pg_relation_size(to_regclass(%s))", (n,)).fetchone()[0])
                                  for n in names)  # fmt: skip
        finally:
            drop(url, names)
    totals = {n: sum(p["calls"] * timed[n][p["name"]]["ms"] for p in ps) for n in timed}
    checks = {
        "dlindex's set: workload total < Dexter's": totals["dlindex"] < totals["dexter"],
        "dlindex's set: no more indexes than Dexter's": len(ours) <= len(dexter),
        "dlindex's set: workload total <= 0.2x no index": totals["dlindex"] <= 0.2 * totals["none"],
    }
    with psycopg.connect(a.url) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    meta = {"rows": a.rows, "labels": a.labels, "reps": a.reps, "made_s": made, "workload_s": workload_s,
            "suggest_s": suggest_s, "dexter_s": dexter_s, "server": version, "cpus": os.cpu_count(),
            "machine": platform.machine(), "when": _dt.datetime.now().strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    section = render(meta, ps, timed, totals, per_row, sizes, ours, dexter, advice, checks)
    print(section)
    Path("/tmp/dlindex-bench").mkdir(parents=True, exist_ok=True)
    Path(f"/tmp/dlindex-bench/bench_index_postgres-{int(time.time())}.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "timed": timed,
                "totals": totals,
                "per_row_us": per_row,
                "advice": advice,
                "dexter": {"rule": RULE, "indexes": dexter, "statements": [v.as_dict() for v in verdicts]},
            },
            indent=1,
        )
    )
    if docs is not None:
        write_section(docs, START, END, section)
        print(f"\nwritten to {docs}")
    return 0 if all(checks.values()) else 1


def render(meta: dict[str, Any], ps: list[dict[str, Any]], timed: dict[str, Any], totals: dict[str, float],
           per_row: dict[str, float], sizes: dict[str, int], ours: list[str], dexter: list[str],
           advice: dict[str, Any], checks: dict[str, bool]) -> str:  # fmt: skip
    def ms(v: float) -> str:
        return f"{v:,.3f}" if v < 10 else f"{v:,.1f}"

    lines = [
        START,
        "## Index advice on PostgreSQL (`bench/bench_index_postgres.py`)",
        "",
        f"Server catalog: {meta['rows']:,} rows, {meta['labels']:,} labels (bench_index.py's generator, written on "
        f"the server in {meta['made_s']:.1f} s), PostgreSQL {meta['server']}, {meta['cpus']} CPUs, {meta['machine']}. "
        f"Run {meta['when']}; the workload (a tenth of bench_index.py's slice) ran through dlindex in "
        f"{meta['workload_s']:.1f} s; `dlindex index --suggest` took {meta['suggest_s']:.1f} s, Dexter's rule "
        f"({RULE}; bench/dexter.py, hypothetical indexes) {meta['dexter_s']:.1f} s. Each set was built "
        f"for real with ANALYZE; times are the server's execution times (EXPLAIN ANALYZE), medians of {meta['reps']} runs.",
        "",
        "| statement | calls | keys only ms | dlindex ms | Dexter ms | dlindex plan | Dexter plan |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for p in ps:
        t = {n: timed[n][p["name"]] for n in timed}
        lines.append(f"| {p['name']} | {p['calls']:,} | {ms(t['none']['ms'])} | {ms(t['dlindex']['ms'])} | "
                     f"{ms(t['dexter']['ms'])} | {t['dlindex']['plan']} | {t['dexter']['plan']} |")  # fmt: skip
    lines += [
        f"| **workload (calls x ms)** | | **{ms(totals['none'])}** | **{ms(totals['dlindex'])}** | "
        f"**{ms(totals['dexter'])}** | | |",
        "",
        "| set | indexes added | size | UPDATE processed, µs per row |",
        "|---|---:|---:|---:|",
    ]
    for name, n in (("keys only", "none"), ("dlindex", "dlindex"), ("Dexter's rule", "dexter")):
        count = {"none": 0, "dlindex": len(ours), "dexter": len(dexter)}[n]
        lines.append(f"| {name} | {count} | {sizes[n] / 2**20:.1f} MiB | {per_row[n]:.1f} |")
    lines += ["", "dlindex's set:", "", "```sql", *[s + ";" for s in ours], "```", "", "Dexter's set:", "", "```sql",
              *[s + ";" for s in dexter], "```", ""]  # fmt: skip
    lines += [f"- {'PASS' if ok else 'FAIL'}: {what}" for what, ok in checks.items()]
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
