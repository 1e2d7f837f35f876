"""`dlindex index --suggest` and `--apply` on large catalogs, and the reads they are for, before and after.

For each catalog given (bench/make_catalog.py's; each is copied first, as `--apply` writes, and
given a query log of training-time reads, three calls each: per-label sampling, unprocessed
work, time windows (an empty one after the last scan, a 10-minute one, the last month's), the
failed list, the corrupt files), `suggest_indexes` runs with its default (tables over 250,000
rows sampled, about 250,000 rows fetched by rowid), then `apply_advice`; each read is timed
before (the same-run baseline) and after. Wall and CPU time of this process (SQLite runs in
it: CPU time is what to compare on a shared machine), peak RSS, the suggestions, and how many
logged reads SQLite plans on the sample as on the catalog (with the catalog's statistics
carried over, and with the sample's own ANALYZE as before) are reported.

A catalog that must not be written (the shared 10^8 one) is advised with ``--readonly``: no
copy, no `--apply`, the workload read from the query log of a copy made by an earlier run
with ``--keep`` (``--log-from``); ``--reads`` also times each read once on it as it is.

  python bench/bench_index_size.py /tmp/dlindex-bench/catalog-1000000-1000l-s0.db --keep --work W
  python bench/bench_index_size.py /tmp/dlindex-bench/catalog-10000000-1000l-s0.db --work W
  python bench/bench_index_size.py --readonly --log-from W/catalog-1000000-1000l-s0.db \
      /tmp/dlindex-bench/catalog-100000000-1000l-s0.db --work W

Results (every result-*.json in W) go to docs/benchmarks.md between
<!-- bench_index_size:start --> and <!-- bench_index_size:end -->.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
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


SPECS: dict[str, Any] = {
    "per-label 32": lambda seed: QuerySpec(per_label=32, seed=seed, cache=False),
    "unprocessed, limit 1000": lambda seed: QuerySpec(status="ok", processed=False, limit=1000, cache=False),
    "since a date after the last scan, processed, limit 5000": lambda seed: QuerySpec(
        since="2026-12-01", processed=True, limit=5000, cache=False
    ),
    "10-minute window, limit 1000": lambda seed: QuerySpec(
        since="2026-06-04 04:00:00", until="2026-06-04 04:10:00", limit=1000, cache=False
    ),
    "since the last scan's month (1/6 of rows), limit 1000": lambda seed: QuerySpec(
        since="2026-06-01", limit=1000, cache=False
    ),
    "processing status failed": lambda seed: QuerySpec(processing_status=("failed",), cache=False),
    "status corrupt": lambda seed: QuerySpec(status=("corrupt",), cache=False),
}


def workload(db: Path) -> None:
    """The training-time reads, three calls each, logged by dlindex into the copy's query log."""
    with Catalog(db) as catalog:
        for seed in range(3):
            for make in SPECS.values():
                for _ in query_rows(catalog, make(seed)):
                    pass


def latencies(db: Path, calls: int = 3) -> dict[str, tuple[int, float]]:
    """Each read's rows and wall seconds (the fastest of ``calls``: seeds 0-2 for per-label), in this process."""
    found: dict[str, tuple[int, float]] = {}
    with Catalog(db, log=False) as catalog:
        for name, make in SPECS.items():
            times, rows = [], 0
            for seed in range(calls):
                began = time.perf_counter()
                rows = sum(1 for _ in query_rows(catalog, make(seed)))
                times.append(time.perf_counter() - began)
            found[name] = (rows, min(times))
    return found


def plans_match(db: Path, log_from: Path) -> tuple[int, int, int]:
    """(logged reads, same plan on the sample with the catalog's statistics carried, same with the sample's own)."""
    from dlindex.advisor import scratch as scratch_module
    from dlindex.advisor.replay import explain
    from dlindex.advisor.workload import load_workload
    from dlindex.catalog.sandbox import guarded

    source = guarded(log_from)
    try:
        reads = [r for r in load_workload(source).reads if r.samples]
    finally:
        source.close()
    full = guarded(db)
    try:
        want = {r.fingerprint: explain(full, r.samples[0].sql, r.samples[0].params) for r in reads}
    finally:
        full.close()
    same = []
    for carried in (True, False):
        with scratch_module.Scratch(db) as scratch:
            if not carried:
                scratch.admin.execute("ANALYZE")  # the sample's own statistics, as before #34
            got = {r.fingerprint: explain(scratch.planner, r.samples[0].sql, r.samples[0].params) for r in reads}
        same.append(sum(got[fp] == want[fp] for fp in want))
    return len(reads), same[0], same[1]


def advise(db: Path, log_from: Path | None = None, **kw: Any) -> tuple[dict[str, Any], Any]:
    from dlindex.advisor import suggest as suggest_module
    from dlindex.advisor.workload import load_workload

    if log_from is not None:  # a catalog never written (10^8): the workload logged on a smaller copy
        from dlindex.catalog.sandbox import guarded

        def logged(_conn: Any, logs: Any = ()) -> Any:
            conn = guarded(log_from)
            try:
                return load_workload(conn, logs)
            finally:
                conn.close()

        suggest_module.load_workload = logged  # type: ignore[attr-defined,assignment]
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        with Catalog(db, log=False) as catalog:
            a = suggest_indexes(catalog, **kw)
    finally:
        suggest_module.load_workload = load_workload  # type: ignore[attr-defined]
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "sample": a.sample,
            "rows": a.sampled_from, "suggestions": [s.sql for s in a.suggestions]}, a  # fmt: skip


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(src: Path, work: Path, readonly: bool, log_from: Path | None, keep: bool, reads: bool) -> dict[str, Any]:
    """One catalog: the workload, ``--suggest`` (and on a copy ``--apply``), the reads before and after."""
    from dlindex.advisor import apply_advice

    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as conn:
        rows = int(conn.execute("SELECT max(rowid) FROM image_metadata").fetchone()[0])
    out: dict[str, Any] = {"rows": rows, "catalog": str(src), "when": f"{_dt.datetime.now():%Y-%m-%d %H:%M}"}
    if readonly:  # never written: advised read-only from the workload logged on a smaller copy
        print(f"{src} ({rows:,} rows): advising read-only ...", flush=True)
        out["suggest"], _ = advise(src, log_from=log_from)
        if reads:  # each once: without the indexes a read of 10^8 rows takes minutes
            out["reads"] = latencies(src, calls=1)
        with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as conn:
            out["indexes"] = [
                r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
            ]
        return out
    db = work / src.name
    shutil.copyfile(src, db)  # never write into the original: the query log goes into the copy
    try:
        print(f"{src} ({rows:,} rows): logging the workload ...", flush=True)
        workload(db)
        out["before"] = latencies(db)
        out["suggest"], advice = advise(db)
        print(f"  suggest: {out['suggest']}", flush=True)
        wall, cpu = time.perf_counter(), time.process_time()
        with Catalog(db, log=False) as catalog:
            created = apply_advice(catalog, advice).created
        out["apply"] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu, "created": created}
        out["after"] = latencies(db)
        out["plans"] = plans_match(db, db)
    finally:
        if not keep:
            db.unlink()
    return out


def _render(results: list[dict[str, Any]]) -> list[str]:
    lines = ["| rows | `--suggest` wall s | CPU s | sample | suggestions | `--apply` wall s | CPU s |",
             "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results:
        s, ap = r["suggest"], r.get("apply")
        applied = f"{ap['wall_s']:.1f} | {ap['cpu_s']:.1f}" if ap else "not run (read-only) | "
        lines.append(f"| {r['rows']:,} | {s['wall_s']:.1f} | {s['cpu_s']:.1f} | 1/{s['sample']} | "
                     f"{len(s['suggestions'])} | {applied} |")  # fmt: skip
    lines += ["", "Reads (`query_rows`, in process, fastest of 3 calls, wall seconds; before: the catalog as "
              "generated, after: with what `--apply` created):", "",
              "| read | " + " | ".join(f"{r['rows']:,} {k}" for r in results for k in ("before", "after", "reads")
                                       if k in r) + " |",
              "|---|" + "---:|" * sum(k in r for r in results for k in ("before", "after", "reads"))]  # fmt: skip
    for name in SPECS:
        cells = [f"{r[k][name][1]:.3f} ({r[k][name][0]:,} rows)" for r in results for k in ("before", "after", "reads")
                 if k in r and name in r[k]]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for r in results:
        lines.append(
            f"- {r['rows']:,} rows ({r['when']}): suggested " + "; ".join(f"`{q}`" for q in r["suggest"]["suggestions"])
        )
        if "plans" in r:
            n, carried, own = r["plans"]
            lines.append(f"  - plans of the logged reads on the sample the same as on the catalog (after `--apply`): "
                         f"{carried} of {n} with the catalog's statistics carried over, {own} of {n} with the "
                         "sample's own ANALYZE")  # fmt: skip
        if "indexes" in r:
            lines.append(
                "  - indexes the catalog had while its reads were timed: " + "; ".join(f"`{q}`" for q in r["indexes"])
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    compile_sources()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("catalogs", nargs="+", type=Path)
    ap.add_argument(
        "--work", type=Path, default=Path(os.environ.get("DLINDEX_BENCH_DIR", "/tmp/dlindex-bench")) / "size"
    )
    ap.add_argument("--readonly", action="store_true", help="advise without copying (the workload from --log-from)")
    ap.add_argument("--log-from", type=Path, help="a catalog whose query log is the workload (with --readonly)")
    ap.add_argument("--keep", action="store_true", help="keep the logged copy (a --log-from for a larger run)")
    ap.add_argument("--reads", action="store_true", help="with --readonly: time each read once on the catalog as it is")
    ap.add_argument("--docs", type=Path, default=REPO / "docs" / "benchmarks.md")
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    for src in a.catalogs:
        result = measure(src, a.work, a.readonly, a.log_from, a.keep, a.reads)
        result["peak_rss_mb"] = peak_rss_mb()
        print(json.dumps(result), flush=True)
        (a.work / f"result-{result['rows']}.json").write_text(json.dumps(result))
    results = sorted((json.loads(p.read_text()) for p in a.work.glob("result-*.json")), key=lambda r: r["rows"])
    section = "\n".join([
        START, "## `index --suggest` and `--apply` at size (`bench/bench_index_size.py`, #34)", "",
        f"{os.cpu_count()} CPUs shared with other jobs: compare CPU seconds (SQLite runs in the process). "
        f"Peak RSS {max(r['peak_rss_mb'] for r in results):,.0f} MB.", "", *_render(results), END,
    ])  # fmt: skip
    print(section)
    if not a.no_docs:
        write_section(a.docs, START, END, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
