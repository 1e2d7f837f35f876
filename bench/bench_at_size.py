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
  mark       the first (by id) 10^7 ids whose processed flag is set (all of them below 3.3*10^7
             rows; make_catalog sets 30%) are written to a file, then ``mark --unprocessed FILE``
             and ``mark --processed FILE`` put them back: each run changes every row it names, and
             the flag ends as it began (checked: both runs report updated == ids, and a count of
             processed rows over the ids' range equals the ids afterwards). ids/s on the wall
             clock; its own section (bench_at_size_mark) of docs/benchmarks.md.
             ``--in-place`` runs it on --catalog itself instead of a copy (a 10^8 catalog is too
             big to copy here): only processed flags and updated_at of those rows move, and the
             flags move back.
With --old DIR (a checkout of an earlier dlindex, e.g. ``git archive <rev> dlindex | tar -x -C DIR``)
each dlindex case also runs that code on the same copy, same run (mark: the same pair of runs).

  nice -n 19 python bench/bench_at_size.py --rows 1e6 --old /tmp/old   # ~3 min on 2 busy cores
  nice -n 19 python bench/bench_at_size.py --rows 1e7 --only stats,per-label --no-docs
  flock /tmp/dlindex-1e8.lock nice -n 19 python bench/bench_at_size.py --rows 1e8 --only mark --in-place \
      --catalog /tmp/dlindex-bench/catalog-100000000-1000l-s0.db
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from common import compile_sources, write_section
from make_catalog import ensure_catalog

START, END = "<!-- bench_at_size:start -->", "<!-- bench_at_size:end -->"
MARK_START, MARK_END = "<!-- bench_at_size_mark:start -->", "<!-- bench_at_size_mark:end -->"
MARK_IDS = 10_000_000
# The ids to mark: the first MARK_IDS (by id) whose flag is set; and the check afterwards.
_FLAGGED = "SELECT id FROM image_metadata WHERE processed = 1 ORDER BY id LIMIT ?"
_FLAGGED_UP_TO = "SELECT count(*) FROM image_metadata WHERE id <= ? AND processed = 1"
PER_LABEL_INDEX = (
    "CREATE INDEX IF NOT EXISTS idx_per_label ON image_metadata (label_id, path_hash) "
    "WHERE status = 'ok' AND excluded = 0"
)
CASES = ("jsonl", "stats", "per-label", "mark")


def run(cmd: list[str], code: Path | None = None, *, keep: bool = False) -> dict[str, Any]:
    """One process: CPU seconds (user + sys), peak RSS in MB, wall seconds (and its stdout
    as ``out`` with ``keep``: a line or two, read before its stderr)."""
    env = {**os.environ, "PYTHONPATH": str(code or REPO), "DLINDEX_NO_LOG": "1"}
    began = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        # in the code's own folder: ``python -m`` puts the working directory first on sys.path
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE if keep else sink, stderr=subprocess.PIPE, env=env, cwd=code or REPO
        )
        assert proc.stderr is not None
        out = proc.stdout.read() if proc.stdout is not None else b""
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err.decode(errors='replace')[-500:]}")
    result: dict[str, Any] = {
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "rss_mb": round(usage.ru_maxrss / 1024, 1),
        "wall_s": round(time.perf_counter() - began, 2),
    }
    if keep:
        result["out"] = out.decode()
    return result


def dlindex(db: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "dlindex", *args, "--db", str(db)]


def at_size(
    rows: int, work: Path, old: Path | None, only: tuple[str, ...], catalog: Path | None, in_place: bool = False
) -> dict[str, Any]:
    shared = catalog or ensure_catalog(rows)
    codes = {"new": None, **({"old": old} if old else {})}
    out: dict[str, Any] = {"rows": rows}
    if in_place:  # mark only, on the catalog itself, its flags put back (see the docstring)
        out.update(mark_case(shared, work, rows, codes))
        out["in_place"] = True
        return out
    db = work / f"at-size-{rows}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    shutil.copyfile(shared, db)
    os.sync()  # the copy's pages on disk before anything is timed, not written back under the first case
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
            # the earlier code first: the first run pays for a cold page cache, and it is not ours
            out.update(mark_case(db, work, rows, dict(reversed(codes.items()))))
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
    return out


def mark_case(db: Path, work: Path, rows: int, codes: dict[str, Path | None]) -> dict[str, Any]:
    """Unmark the first MARK_IDS flagged ids and mark them again, with each code; checked."""
    ids = work / f"at-size-{rows}.ids"
    began = time.perf_counter()
    n = last = 0
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn, ids.open("w") as f:
        for (last,) in conn.execute(_FLAGGED, (MARK_IDS,)):
            f.write(f"{last}\n")
            n += 1
    out: dict[str, Any] = {"mark_ids": n, "mark_id_span": last, "mark_list_s": round(time.perf_counter() - began, 1)}
    unmarked = False
    try:
        for name, code in codes.items():
            for flag in ("--unprocessed", "--processed"):
                unmarked = True  # from here until a --processed run succeeds, flags may be off
                result = run(dlindex(db, "mark", flag, str(ids), "--json"), code, keep=True)
                unmarked = flag == "--unprocessed"
                updated = json.loads(result.pop("out"))["updated"]
                if updated != n:  # every named row changes, both ways: else the flags are not put back
                    raise SystemExit(f"mark {flag} updated {updated:,} of {n:,} rows: check {db}'s processed flags")
                out[f"{name}_mark{flag.replace('--', '_')}"] = result
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            after = int(conn.execute(_FLAGGED_UP_TO, (last,)).fetchone()[0])
        if after != n:
            raise SystemExit(f"{after:,} rows up to id {last:,} are flagged after the marks, not {n:,}: check {db}")
        out["mark_restored"] = True
    finally:
        if unmarked:  # a run failed or was stopped part way: put every flag back before leaving
            print(f"putting the processed flags of {n:,} ids back in {db} ...", file=sys.stderr)
            run(dlindex(db, "mark", "--processed", str(ids), "-q"))
        ids.unlink()
    return out


def render_mark(results: list[dict[str, Any]], argv: list[str], before: str = "") -> str:
    """The mark section; rows of other sizes and their commands are kept from ``before`` (the
    section as it was), so that 10^6/10^7 on copies and 10^8 in place can run apart."""
    sizes = {f"| {r['rows']:,}" for r in results}
    kept = [ln for ln in before.splitlines() if ln.startswith("| 1") and not any(ln.startswith(z + " ") for z in sizes)]
    commands = [ln for ln in before.splitlines() if ln.startswith("- `") and "bench_at_size.py" in ln]
    commands = [c for c in commands if not any(f"--rows {r['rows']:.0e}".replace("+0", "") in c for r in results)]
    tail = before.splitlines()[
        1 + max((i for i, ln in enumerate(before.splitlines()) if ln.startswith("|")), default=-2) :
    ]
    notes = [ln for ln in tail if ln.strip() and not ln.startswith("<!--")]  # what a person added below the table
    lines = [
        MARK_START,
        "## mark at size (bench/bench_at_size.py --only mark, #34)",
        "",
        f"On {os.cpu_count()} shared cores: the first (by id) {MARK_IDS:,} ids whose `processed` flag is set (30% "
        "of a make_catalog.py catalog's rows, so they span ~3.3x as many ids; every id with the flag at 10^6 and "
        "10^7) unmarked with `mark --unprocessed FILE`, then marked again with `mark --processed FILE`: every "
        "named row changes in both runs, and the flags end as they began (checked). CPU seconds and peak RSS of "
        "each process (`os.wait4`), ids/s on the wall clock. `old`: the code before (one transaction), same "
        "catalog, same run. Runs:",
        "",
        *sorted({*commands, f"- `python bench/bench_at_size.py {' '.join(argv)}`"}),
        "",
        "| rows | ids marked (id span) | code | run | CPU s | peak RSS MB | wall s | ids/s (wall) | ids per CPU-second |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    new_rows = []
    for r in results:
        if "mark_ids" not in r:
            continue
        n = r["mark_ids"]
        where = " (in place, flags put back)" if r.get("in_place") else ""
        for key, value in r.items():
            if isinstance(value, dict) and "_mark_" in key:
                code, run_name = key.split("_mark_")
                new_rows.append(
                    f"| {r['rows']:,}{where} | {n:,} ({r['mark_id_span']:,}) | {code} | --{run_name} | "
                    f"{value['cpu_s']} | {value['rss_mb']} | {value['wall_s']} | {n / max(value['wall_s'], 0.01):,.0f} | "
                    f"{n / max(value['cpu_s'], 0.01):,.0f} |"
                )
    lines += sorted(kept + new_rows, key=lambda ln: int(ln.split("|")[1].split("(")[0].replace(",", "")))
    lines += ["", *notes] if notes else []
    lines.append(MARK_END)
    return "\n".join(lines)


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
            if isinstance(value, dict) and "_mark_" not in key:
                note = ""
                if key.endswith("_jsonl") and key != "bare_jsonl" and "bare_jsonl" in r:
                    note = f"bare loop / this = {r['bare_jsonl']['cpu_s'] / max(value['cpu_s'], 0.01):.2f}x"
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
    ap.add_argument(
        "--in-place", action="store_true", help="mark only: on --catalog itself, its flags put back (no copy)"
    )
    args = ap.parse_args(argv)
    only = tuple(c.strip() for c in args.only.split(",") if c.strip())
    if unknown := set(only) - set(CASES):
        ap.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    compile_sources()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.in_place and (only != ("mark",) or args.catalog is None or "," in args.rows):
        ap.error("--in-place runs --only mark on one --catalog")
    sizes = [int(float(n)) for n in args.rows.split(",")]
    results = [at_size(n, args.work, args.old, only, args.catalog, args.in_place) for n in sizes]
    shown = sys.argv[1:] if argv is None else argv
    docs = REPO / "docs" / "benchmarks.md"
    text = docs.read_text() if docs.exists() else ""
    before = text[text.find(MARK_START) : text.find(MARK_END)] if MARK_START in text else ""
    sections = [(MARK_START, MARK_END, render_mark(results, shown, before))] if "mark" in only else []
    if set(only) - {"mark"}:
        sections.append((START, END, render(results, shown)))
    for start, end, section in sections:
        print(section)
        if not args.no_docs:
            write_section(docs, start, end, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
