"""Commands at size (#34): stats, per-label sampling, jsonl output and mark on a 10^6+ catalog.

Each case runs the real CLI in a fresh process (``python -m dlindex ...``, stdout to
/dev/null) and reports that process's CPU time (user + system, from ``os.wait4``), its peak
RSS and its wall time; ratios compare CPU times measured in this run. The catalog is
``bench/make_catalog.py``'s (``ensure_catalog``), copied into --work first: this script adds
an index, logs reads and marks rows, and never writes into the shared file.

Cases, in this order, at each --rows:
  jsonl      ``query --format jsonl`` (every ok row, default columns), and the same-run
             baseline: a bare python sqlite3 loop writing the same JSON lines
             (bench/baselines/query_jsonl.py); ratio = bare CPU / query CPU (goal >= 0.7).
  stats      ``stats`` (above 2M rows: estimated from a sample) and ``stats --exact``.
  per-label  ``query --per-label 32 --seed 0`` before and after the index that serves it,
             ``(label_id, path_hash) WHERE status = 'ok' AND excluded = 0`` (docs/scale.md).
  mark       ``mark --unprocessed FILE`` of every id (each row changes), ids/s on the wall clock.
With --old DIR (a checkout of an earlier dlindex, e.g. ``git archive <rev> dlindex | tar -x -C DIR``)
each dlindex case also runs that code on the same copy, same run (mark: --processed, so that
both runs change every row).

  nice -n 19 python bench/bench_at_size.py --rows 1e6 --old /tmp/old   # ~3 min on 2 busy cores
  nice -n 19 python bench/bench_at_size.py --rows 1e7 --only stats,per-label --no-docs
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from common import compile_sources, write_section
from make_catalog import ensure_catalog

START, END = "<!-- bench_at_size:start -->", "<!-- bench_at_size:end -->"
PER_LABEL_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_per_label ON image_metadata (label_id, path_hash) "
    "WHERE status = 'ok' AND excluded = 0"
)
CASES = ("jsonl", "stats", "per-label", "mark")


def run(cmd: list[str], code: Path | None = None) -> dict[str, float]:
    """One process: CPU seconds (user + sys), peak RSS in MB, wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(code or REPO), "DLINDEX_NO_LOG": "1"}
    began = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        # in the code's own folder: ``python -m`` puts the working directory first on sys.path
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.PIPE, env=env, cwd=code or REPO)
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err.decode(errors='replace')[-500:]}")
    return {
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "rss_mb": round(usage.ru_maxrss / 1024, 1),
        "wall_s": round(time.perf_counter() - began, 2),
    }


def dlindex(db: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "dlindex", *args, "--db", str(db)]


def at_size(rows: int, work: Path, old: Path | None, only: tuple[str, ...], catalog: Path | None) -> dict[str, Any]:
    shared = catalog or ensure_catalog(rows)
    db = work / f"at-size-{rows}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    shutil.copyfile(shared, db)
    codes = {"new": None, **({"old": old} if old else {})}
    out: dict[str, Any] = {"rows": rows}
    try:
        if "jsonl" in only:
            out["bare_jsonl"] = run([sys.executable, str(HERE / "baselines" / "query_jsonl.py"), str(db)])
            for name, code in codes.items():
                out[f"{name}_jsonl"] = run(dlindex(db, "query", "--format", "jsonl", "--no-cache"), code)
        if "stats" in only:
            for name, code in codes.items():
                out[f"{name}_stats"] = run(dlindex(db, "stats"), code)
            out["new_stats_exact"] = run(dlindex(db, "stats", "--exact"))
        if "per-label" in only:
            sample = ("query", "--per-label", "32", "--seed", "0", "--format", "jsonl", "--no-cache")
            out["new_per_label_noindex"] = run(dlindex(db, *sample))
            began = time.perf_counter()
            with sqlite3.connect(db) as conn:
                conn.execute(PER_LABEL_INDEX)
                conn.execute("ANALYZE image_metadata")
            out["index_build_s"] = round(time.perf_counter() - began, 1)
            for name, code in codes.items():
                out[f"{name}_per_label"] = run(dlindex(db, *sample), code)
        if "mark" in only:
            ids = work / f"at-size-{rows}.ids"
            with sqlite3.connect(db) as conn, ids.open("w") as f:
                f.writelines(f"{i}\n" for (i,) in conn.execute("SELECT id FROM image_metadata ORDER BY id"))
            out["new_mark"] = run(dlindex(db, "mark", "--unprocessed", str(ids), "-q"))
            if old:
                out["old_mark"] = run(dlindex(db, "mark", "--processed", str(ids), "-q"), old)
            ids.unlink()
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
    return out


def render(results: list[dict[str, Any]], argv: list[str]) -> str:
    lines = [
        START,
        "## Commands at size (bench/bench_at_size.py, #34)",
        "",
        f"`python bench/bench_at_size.py {' '.join(argv)}` on {os.cpu_count()} cores (shared; CPU seconds "
        "of each process, so a busy machine changes wall times, not these), peak RSS, wall. "
        "`old`: the code before #34's changes, same catalog, same run.",
        "",
        "| rows | case | CPU s | peak RSS MB | wall s | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for key, value in r.items():
            if isinstance(value, dict):
                note = ""
                if key.endswith("_jsonl") and key != "bare_jsonl" and "bare_jsonl" in r:
                    note = f"bare loop / this = {r['bare_jsonl']['cpu_s'] / max(value['cpu_s'], 0.01):.2f}x"
                if key.endswith("_mark"):
                    note = f"{r['rows'] / max(value['wall_s'], 0.01):,.0f} ids/s (wall)"
                lines.append(
                    f"| {r['rows']:,} | {key} | {value['cpu_s']} | {value['rss_mb']} | {value['wall_s']} | {note} |"
                )
        if "index_build_s" in r:
            lines.append(
                f"| {r['rows']:,} | per-label index build | | | {r['index_build_s']} | CREATE INDEX + ANALYZE |"
            )
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1e6", help="comma-separated sizes (1e6,1e7)")
    ap.add_argument("--old", type=Path, help="a directory holding an earlier dlindex package, run beside this one")
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated cases: {', '.join(CASES)}")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("DLINDEX_BENCH_DIR") or "/tmp/dlindex-bench"))
    ap.add_argument(
        "--catalog", type=Path, help="use this catalog of --rows rows (one size), copied, not ensure_catalog's"
    )
    ap.add_argument("--no-docs", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args(argv)
    only = tuple(c.strip() for c in args.only.split(",") if c.strip())
    if unknown := set(only) - set(CASES):
        ap.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    compile_sources()
    args.work.mkdir(parents=True, exist_ok=True)
    results = [at_size(int(float(n)), args.work, args.old, only, args.catalog) for n in args.rows.split(",")]
    section = render(results, sys.argv[1:] if argv is None else argv)
    print(section)
    if not args.no_docs:
        write_section(REPO / "docs" / "benchmarks.md", START, END, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
