"""`dlindex export` at size: peak memory and rows/s of manifests from 10^6-10^8-row catalogs
(`bench_export_size` section of docs/benchmarks.md).

Catalogs come from bench/make_catalog.py's ``ensure_catalog`` (made once under
$DLINDEX_BENCH_DIR, then reused); each is copied (``cp --reflink=auto``) before the runs, since
an export records itself in its catalog, and the copy is removed after. Every case is a fresh
process; the figures are its wall and CPU seconds, rows/s by the wall clock, and the peak RSS
of its process tree (the jsonl second process included), sampled from /proc every 50 ms. The
baseline, measured in the same run, is a bare python sqlite3 loop writing the same jsonl
columns (id, path, label, label_id, width, height, format, bytes, xxh3_128) of the same rows.

    python bench/bench_export_size.py                          # 10^6 rows, writes docs
    python bench/bench_export_size.py --rows 1000000,10000000  # both sizes (nice -n 19 on a shared box)
    python bench/bench_export_size.py --pythonpath /old/checkout --no-docs   # another dlindex
    python bench/bench_export_size.py --before /old/checkout --scratch /tmp/me   # both, case by case
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, compile_sources, write_section
from make_catalog import ensure_catalog
from size_measure import tree_rss_kib

START, END = "<!-- bench_export_size:start -->", "<!-- bench_export_size:end -->"
BEFORE = " [before]"
CASES: dict[str, list[str]] = {
    "jsonl": ["--format", "jsonl"],
    "jsonl --split": ["--format", "jsonl", "--split", "train=0.9,val=0.1"],
    "jsonl --shuffle --split --world-size 8": [
        "--format", "jsonl", "--shuffle", "--split", "train=0.9,val=0.1", "--world-size", "8",
    ],
    "csv --shuffle": ["--format", "csv", "--shuffle"],
    "parquet": ["--format", "parquet"],
    "jsonl --limit 20": ["--format", "jsonl", "--limit", "20"],
}  # fmt: skip


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    """Wall and CPU seconds and the peak tree RSS (MB) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # cwd: not the checkout, whose dlindex/ `python -m` would import ahead of PYTHONPATH's
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.05):
            peak = max(peak, tree_rss_kib(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    done.set()
    sampler.join()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {err.decode(errors='replace').strip()[-500:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mb": round(peak / 1024)}


def bench_size(
    rows: int, work: Path, env: dict[str, str], cases: list[str], scratch: Path, before: dict[str, str] | None = None
) -> dict[str, Any]:
    source = ensure_catalog(rows, work=work)
    db = scratch / f"export-size-{rows}.db"
    subprocess.run(["cp", "--reflink=auto", str(source), str(db)], check=True)
    out = scratch / f"export-size-{rows}.out"
    results: dict[str, Any] = {"rows": rows}
    try:
        bare = [
            sys.executable,
            str(Path(__file__).resolve().parent / "baselines" / "export_jsonl.py"),
            str(db),
            str(out) + ".jsonl",
        ]
        base = run(bare, env, work)
        with open(str(out) + ".jsonl", "rb") as f:
            selected = sum(1 for _ in f)
        os.unlink(str(out) + ".jsonl")
        results["selected"] = selected
        results["bare sqlite3 loop"] = {**base, "rows_per_s": round(selected / base["wall_s"])}
        for name in cases:
            for label, code in ((name + BEFORE, before), (name, env)):
                if code is None:
                    continue
                shutil.rmtree(out, ignore_errors=True)
                cmd = [sys.executable, "-m", "dlindex", "export", str(out), "--db", str(db), *CASES[name]]
                figures = run(cmd, code, scratch)
                summary = json.loads(next(out.glob("*index.json")).read_text())["counts"]
                figures["rows_per_s"] = round(summary["selected"] / figures["wall_s"])
                figures["selected"] = summary["selected"]
                results[label] = figures
                print(rows, label, figures, flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(db) + suffix).unlink(missing_ok=True)
    return results


def render(all_results: list[dict[str, Any]], argv: list[str]) -> str:
    lines = [
        START, "## `dlindex export` at size (bench/bench_export_size.py)", "",
        f"`python bench/bench_export_size.py {' '.join(argv)}`".replace("  ", " "), "",
        "Peak RSS of the process tree; rows/s by the wall clock and per CPU second (user + system, the "
        "process tree), and the ratio to a bare python sqlite3 loop writing the same jsonl columns of the "
        "same rows in the same run, by CPU. Manifests only (the generated catalogs have no image files). "
        "On a shared 2-core machine wall times vary with the load; CPU seconds much less.", "",
        "| rows | command | wall s | CPU s | rows/s (wall) | rows per CPU s | vs bare loop (CPU) | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for results in all_results:
        selected = results["selected"]
        base = selected / max(results["bare sqlite3 loop"]["cpu_s"], 0.01)
        for name, figures in results.items():
            if not isinstance(figures, dict):
                continue
            case = name.removesuffix(BEFORE)
            shown = "bare sqlite3 loop (baseline)" if case not in CASES else f"`export {' '.join(CASES[case])}`"
            if name.endswith(BEFORE):
                shown += " (before: `--before` code)"
            per_cpu = figures.get("selected", selected) / max(figures["cpu_s"], 0.01)
            lines.append(
                f"| {results['rows']:,} | {shown} | {figures['wall_s']} | {figures['cpu_s']} | "
                f"{figures['rows_per_s']:,} | {per_cpu:,.0f} | {per_cpu / base:.2f}x | {figures['peak_rss_mb']:,} |"
            )
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000000", help="catalog sizes, comma-separated")
    parser.add_argument("--cases", default=",".join(CASES), help="cases, comma-separated: " + ", ".join(CASES))
    parser.add_argument("--work", default=os.environ.get("DLINDEX_BENCH_DIR", "/tmp/dlindex-bench"))
    parser.add_argument("--pythonpath", default=str(REPO), help="the dlindex to measure (default: this checkout)")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    parser.add_argument("--before", help="another dlindex checkout to run each case with too, in the same run")
    parser.add_argument("--scratch", help="where the catalog copy and the exports go (default: --work)")
    args = parser.parse_args(argv)
    compile_sources()
    env = {**os.environ, "PYTHONPATH": args.pythonpath}
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")
    before = {**os.environ, "PYTHONPATH": args.before} if args.before else None
    scratch = Path(args.scratch or args.work)
    scratch.mkdir(parents=True, exist_ok=True)
    results = [bench_size(int(n), Path(args.work), env, cases, scratch, before) for n in args.rows.split(",")]
    section = render(results, sys.argv[1:] if argv is None else argv)
    print(section)
    if not args.no_docs:
        write_section(REPO / "docs" / "benchmarks.md", START, END, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
