"""Scale-out: `dlindex merge` of part catalogs, the balance of `--part I/N`, N shards run at once
against one process, and `--engine ray` against the local engine (`bench_scale` section).

    python bench/bench_scale.py                 # everything, ~10 min on 2 cores
    python bench/bench_scale.py --parts merge   # one part: merge, balance, curve, ray
    python bench/bench_scale.py --quick         # small sizes, prints only

Every figure is measured against its baseline in the same run; medians of --reps runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, compile_sources, write_section
from make_trees import FULL, ensure_big, work_dir

START = "<!-- bench_scale:start -->"
END = "<!-- bench_scale:end -->"
PARTS = ("merge", "balance", "curve", "ray")


def dlindex_cmd() -> list[str]:
    found = shutil.which("dlindex", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "dlindex"]


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - started


def timed_together(cmds: list[list[str]]) -> float:
    """Wall time of several commands started at once (N machines' parts, here on one box)."""
    started = time.perf_counter()
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL) for cmd in cmds]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"a part failed: {codes}")
    return time.perf_counter() - started


def rm_db(db: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(db) + suffix).unlink(missing_ok=True)


# --- merge: 4 part catalogs of 250k rows each -------------------------------------------------


def make_part(path: Path, index: int, count: int, rows: int, root: str) -> None:
    """A finished scan part of ``rows`` samples, written straight into SQLite (like a real part:
    its own root row, labels, rows and its shard run)."""
    from dlindex.catalog.connection import Catalog
    from dlindex.catalog.sqlite.migrations import path_hash

    rm_db(path)
    Catalog(path, create=True, log=False).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO roots (path) VALUES (?)", (root,))
        conn.executemany("INSERT INTO labels (name) VALUES (?)", [(f"class{c:03d}",) for c in range(100)])
        conn.executemany(  # every column a scan writes (path_hash, inode, ctime_ns included)
            "INSERT INTO image_metadata (root_id, file_path, label_id, width, height, format, mode, bytes, "
            "mtime_ns, xxh3_128, status, pixel_limit, orientation, inode, ctime_ns, path_hash) "
            "VALUES (1, ?, ?, 500, 375, 'JPEG', 'RGB', ?, ?, ?, 'ok', ?, 1, ?, ?, ?)",
            (
                (key, n % 100 + 1, 100_000 + n, 1_700_000_000_000_000_000 + n, f"{n * 2654435761:032x}"[-32:],
                 89_478_485, 1000 + n, 1_700_000_000_000_000_000 + n, path_hash(key))
                for n in range(index, rows * count, count)
                for key in (f"class{n % 100:03d}/{n:08d}.jpg",)
            ),
        )  # fmt: skip
        conn.execute(
            "INSERT INTO shard_runs (job, subject, part, parts, plan, state, finished_at) "
            "VALUES ('scan', ?, ?, ?, 'bench', 'completed', CURRENT_TIMESTAMP)",
            (root, index, count),
        )
    conn.close()


def bench_merge(work: Path, rows: int, reps: int) -> dict[str, Any]:
    parts = [work / f"merge-part{i}.db" for i in range(4)]
    for i, part in enumerate(parts):
        make_part(part, i, 4, rows, "/data/images")
    into = work / "merge-into.db"
    times = []
    for _ in range(reps):
        rm_db(into)
        times.append(timed([*dlindex_cmd(), "merge", *map(str, parts), "--into", str(into), "-q"]))
    (merged,) = sqlite3.connect(into).execute("SELECT count(*) FROM image_metadata").fetchone()
    # baseline in the same run: the same rows copied by plain SQLite (ATTACH + INSERT ... SELECT)
    plain = []
    for _ in range(reps):
        target = work / "merge-plain.db"
        rm_db(target)
        shutil.copy(parts[0], target)
        started = time.perf_counter()
        conn = sqlite3.connect(target, isolation_level=None)
        conn.execute("BEGIN")
        for part in parts[1:]:
            conn.execute("ATTACH ? AS p", (str(part),))
            conn.execute(
                "INSERT INTO image_metadata (root_id, file_path, label_id, width, height, format, mode, bytes, "
                "mtime_ns, xxh3_128, status, pixel_limit) SELECT 1, file_path, label_id, width, height, format, "
                "mode, bytes, mtime_ns, xxh3_128, status, pixel_limit FROM p.image_metadata"
            )
            conn.execute("COMMIT")
            conn.execute("DETACH p")
            conn.execute("BEGIN")
        conn.execute("COMMIT")
        conn.close()
        plain.append(time.perf_counter() - started)
    return {"rows_per_part": rows, "parts": 4, "merged_rows": merged, "merge_s": times,
            "plain_copy_s": plain}  # fmt: skip


# --- balance and the speed-up curve on the 50k tree -------------------------------------------


def bench_balance(tree: Path) -> dict[str, Any]:
    from dlindex.scan.listing import WalkOptions, WalkReport
    from dlindex.scan.units import part_units

    out: dict[str, Any] = {}
    for count in (2, 4, 8):
        options = WalkOptions(root=os.fsencode(os.path.realpath(tree)))
        plans = [part_units(os.fsencode(os.path.realpath(tree)), options, WalkReport(), i, count) for i in range(count)]
        files = [p.files for p in plans]
        ideal = plans[0].total / count
        out[str(count)] = {"files": files, "total": plans[0].total,
                           "worst_off": max(abs(f - ideal) / ideal for f in files)}  # fmt: skip
    return out


def bench_curve(work: Path, tree: Path, reps: int) -> dict[str, Any]:
    """A first scan of the tree: one process with N workers (the local engine), against N parts
    with one worker each started at once plus the merge. N = 1, 2, 4 on this 2-core machine."""
    out: dict[str, Any] = {}
    cmd = dlindex_cmd()
    for count in (1, 2, 4):
        one, parts_total, merge_only = [], [], []
        for _ in range(reps):
            db = work / "curve-one.db"
            rm_db(db)
            one.append(timed([*cmd, "scan", str(tree), "--db", str(db), "-q", "--workers", str(count)]))
            part_dbs = [work / f"curve-part{i}.db" for i in range(count)]
            for p in part_dbs:
                rm_db(p)
            scan_s = timed_together(
                [[*cmd, "scan", str(tree), "--db", str(p), "-q", "--workers", "1", "--part", f"{i}/{count}"]
                 for i, p in enumerate(part_dbs)]
            )  # fmt: skip
            into = work / "curve-merged.db"
            rm_db(into)
            m = timed([*cmd, "merge", *map(str, part_dbs), "--into", str(into), "-q"])
            parts_total.append(scan_s + m)
            merge_only.append(m)
        out[str(count)] = {"one_process_s": one, "parts_s": parts_total, "merge_s": merge_only}
    return out


# --- ray against the local engine -------------------------------------------------------------


def bench_ray(work: Path, tree: Path, reps: int) -> dict[str, Any]:
    try:
        import ray  # noqa: F401
    except ImportError as e:
        return {"skipped": f"ray is not installed ({e}); pip install 'dlindex[ray]'"}
    address = start_ray(work)
    env = {**os.environ, "RAY_ADDRESS": address}
    cmd = dlindex_cmd()
    out: dict[str, Any] = {"address": address}
    try:
        db = work / "ray-base.db"
        rm_db(db)
        subprocess.run([*cmd, "scan", str(tree), "--db", str(db), "-q"], check=True)
        floor = []
        for _ in range(reps):
            floor.append(timed([sys.executable, "-c", _RAY_FLOOR], env=env))
        out["floor_s"] = floor
        jobs = ["scan", "scan-cold", "features", "export"] if can_drop_caches() else ["scan", "features", "export"]
        for job in jobs:
            local, on_ray = [], []
            for _ in range(reps):
                for engine, times in (("local", local), ("ray", on_ray)):
                    run_db = work / f"ray-{job}.db"
                    rm_db(run_db)
                    if not job.startswith("scan"):
                        shutil.copy(db, run_db)
                    if job == "scan-cold":
                        drop_caches()
                    args = {
                        "scan": ["scan", str(tree)],
                        "scan-cold": ["scan", str(tree)],
                        "features": ["features", "compute", "--type", "colorhist", "--extractor", "colorhist"],
                        "export": ["export", str(work / f"ray-out-{engine}"), "--format", "wds", "--overwrite",
                                   "--split", "train=0.9,val=0.1", "--world-size", "4"],
                    }[job]  # fmt: skip
                    times.append(timed([*cmd, *args, "--db", str(run_db), "-q", "--engine", engine], env=env))
            out[job] = {"local_s": local, "ray_s": on_ray}
    finally:
        subprocess.run([ray_binary(), "stop", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def ray_binary() -> str:
    return shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"


# What any job on Ray pays before and after its work, measured as the CLI pays it: a fresh
# process imports ray, connects to the running cluster, runs one task and disconnects.
_RAY_FLOOR = """
import logging, ray
ray.init(address="auto", log_to_driver=False, logging_level=logging.ERROR, include_dashboard=False)
ray.get(ray.remote(lambda: 1).remote())
ray.shutdown()
"""


def can_drop_caches() -> bool:
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches() -> None:
    """A first scan of a tree nobody read yet: the page cache emptied (needs root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def start_ray(work: Path) -> str:
    ray_bin = ray_binary()
    subprocess.run([ray_bin, "stop", "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(
        [ray_bin, "start", "--head", "--num-cpus", str(os.cpu_count() or 2), "--port", "6390",
         "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", str(work / "ray-tmp")],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return "auto"  # the cluster `ray start` left on this machine, at the address it advertises


# --- report ----------------------------------------------------------------------------------


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def render(results: dict[str, Any], argv: list[str]) -> str:
    lines = [START, "## bench_scale: shards, merge and Ray (#18)", ""]
    lines.append(f"`python bench/bench_scale.py {' '.join(argv)}`".replace("  ", " ").strip())
    lines.append(
        f"on {os.cpu_count()} CPUs; medians of {results['reps']} runs; every baseline measured in the same run."
    )
    lines.append("")
    lines += ["| what | measured | baseline (same run) | ratio | target | |", "|---|---|---|---|---|---|"]
    if "merge" in results:
        m = results["merge"]
        t, p = med(m["merge_s"]), med(m["plain_copy_s"])
        lines.append(
            f"| `dlindex merge` of 4 scan parts x {m['rows_per_part']:,} rows ({m['merged_rows']:,} merged) "
            f"| {t:.2f} s | plain SQLite ATTACH + INSERT...SELECT {p:.2f} s | {t / p:.2f}x | <= 10 s "
            f"| {'pass' if t <= 10 else 'MISS'} |"
        )
    if "balance" in results:
        for count, b in results["balance"].items():
            worst = b["worst_off"]
            lines.append(
                f"| per-part files, N={count}, {b['total']:,}-file tree | {', '.join(f'{f:,}' for f in b['files'])} "
                f"| 1/N = {b['total'] / int(count):,.0f} | worst {worst:.1%} off | within 10% "
                f"| {'pass' if worst <= 0.10 else 'MISS'} |"
            )
    if "curve" in results:
        base = med(results["curve"]["1"]["one_process_s"])
        for count, c in results["curve"].items():
            one, parts, merge = med(c["one_process_s"]), med(c["parts_s"]), med(c["merge_s"])
            lines.append(
                f"| first scan, N={count} parts at once + merge ({merge:.2f} s of it) | {parts:.1f} s "
                f"| one process, {count} worker(s): {one:.1f} s | {base / parts:.2f}x over 1 worker | reported | |"
            )
    if "ray" in results:
        r = results["ray"]
        if "skipped" in r:
            lines.append(f"| `--engine ray` | not run: {r['skipped']} | | | <= 1.3x | |")
        titles = {"scan": "scan, warm", "scan-cold": "scan, cold (page cache dropped)",
                  "features": "features compute --type colorhist", "export": "export wds, 2 splits x 4 ranks"}  # fmt: skip
        if "floor_s" in r:
            floor, warm = med(r["floor_s"]), med(r["scan"]["local_s"]) if "scan" in r else float("nan")
            lines.append(
                f"| Ray's floor: a process that imports ray, connects, runs one no-op task, disconnects | {floor:.2f} s "
                f"| local warm scan {warm:.1f} s | {floor / warm:.2f}x of the scan before any work | reported | |"
            )
        for job, title in titles.items():
            if job in r:
                t, loc = med(r[job]["ray_s"]), med(r[job]["local_s"])
                lines.append(
                    f"| `--engine ray`: {title}, 50k, running cluster | {t:.1f} s | local engine {loc:.1f} s "
                    f"| {t / loc:.2f}x | <= 1.3x | {'pass' if t / loc <= 1.3 else 'MISS'} |"
                )
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=250_000, help="rows per part catalog in the merge case")
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 rep, no docs")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--work", default=None)
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    work = work_dir(args.work) / "scale"
    work.mkdir(parents=True, exist_ok=True)
    compile_sources()
    reps = 1 if args.quick else args.reps
    results: dict[str, Any] = {"reps": reps}
    if "merge" in parts:
        results["merge"] = bench_merge(work, 5_000 if args.quick else args.rows, reps)
    tree = None
    if any(p in parts for p in ("balance", "curve", "ray")):
        tree = ensure_big(FULL, work_dir(args.work))
    if "balance" in parts and tree:
        results["balance"] = bench_balance(tree)
    if "curve" in parts and tree:
        results["curve"] = bench_curve(work, tree, reps)
    if "ray" in parts and tree:
        results["ray"] = bench_ray(work, tree, reps)
    text = render(results, argv)
    print(text)
    (work_dir(args.work) / f"bench_scale-{int(time.time())}.json").write_text(json.dumps(results, indent=1))
    if not (args.quick or args.no_docs):
        write_section(REPO / "docs" / "benchmarks.md", START, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
