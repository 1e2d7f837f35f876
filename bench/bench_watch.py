"""`dlindex scan ROOT --watch` (issue #35): how soon a new file is in the catalog, and its
automatic features; the watcher's CPU while nothing changes; a flood of new files.

Each figure beside a same-run baseline: the latency beside what a user without --watch waits
for, a plain `dlindex scan ROOT` run after the file lands (its wall time, process start
included); the flood beside a first `dlindex scan` of the same files into a fresh catalog.

    python bench/bench_watch.py [--work /tmp/dlindex-watch] [--files 10000] [--flood 100000] [--docs docs/benchmarks.md]

Latency: a file is written and closed, then the catalog is read every 10 ms (sqlite3, in this
process) until its row (and, with an automatic type, its vector) is there. Idle CPU: the
watcher's user + system time (/proc/PID/stat) over --idle seconds. Peak RSS: VmHWM of the
watcher (/proc/PID/status), which forks its scan and compute workers anew each batch.
Written to docs/benchmarks.md between <!-- bench_watch:start --> and <!-- bench_watch:end -->.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_section

START, END = "<!-- bench_watch:start -->", "<!-- bench_watch:end -->"
DLINDEX = [sys.executable, "-m", "dlindex"]


def _base_png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (40, 90, 160)).save(out, format="PNG")
    return out.getvalue()


_PNG = _base_png()


def png(i: int) -> bytes:
    """A 16x16 PNG whose bytes (and hash) are its own: a counter after IEND."""
    return _PNG + i.to_bytes(8, "big")


def make_tree(root: Path, files: int, per_folder: int = 100) -> None:
    for i in range(files):
        folder = root / f"c{i // per_folder:04d}"
        if i % per_folder == 0:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:07d}.png").write_bytes(png(i))


def wait_row(db: Path, file_path: str, vector: bool, timeout: float = 60.0) -> float:
    """Seconds until the row (and its vector) is in the catalog."""
    began = time.perf_counter()
    sql = "SELECT 1 FROM image_metadata WHERE file_path = ?"
    if vector:
        sql = "SELECT 1 FROM image_metadata m JOIN image_features f ON f.image_id = m.id WHERE m.file_path = ?"
    while True:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            if conn.execute(sql, (file_path,)).fetchone():
                return time.perf_counter() - began
        if time.perf_counter() - began > timeout:
            raise RuntimeError(f"{file_path} not catalogued within {timeout} s")
        time.sleep(0.01)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(cmd: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/dlindex-watch"))
    ap.add_argument("--files", type=int, default=10_000, help="files in the watched tree")
    ap.add_argument("--new", type=int, default=15, help="new files timed one by one (each mode)")
    ap.add_argument("--flood", type=int, default=100_000, help="new files written at once")
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measured")
    ap.add_argument("--docs", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    root, db = a.work / "tree", a.work / "w.db"
    make_tree(root, a.files)
    subprocess.run([*DLINDEX, "scan", str(root), "--db", str(db), "-q"], check=True)
    subprocess.run([*DLINDEX, "features", "compute", "--type", "colorhist", "--db", str(db), "-q"], check=True)
    watcher = subprocess.Popen([*DLINDEX, "scan", str(root), "--watch", "--db", str(db)], stdout=subprocess.DEVNULL)
    results: dict[str, object] = {"files": a.files}
    try:
        time.sleep(3)  # past the first scan and the catch-up rescan
        n = a.files
        plain: list[float] = []
        for mode in ("row", "vector"):
            if mode == "vector":
                subprocess.run([*DLINDEX, "features", "auto", "--type", "colorhist", "--db", str(db)], check=True,
                               stdout=subprocess.DEVNULL)  # fmt: skip
            lat = []
            for _ in range(a.new):
                name = f"new/{n:07d}.png"
                (root / "new").mkdir(exist_ok=True)
                (root / name).write_bytes(png(n))
                n += 1
                lat.append(wait_row(db, name, vector=mode == "vector"))
                time.sleep(0.3)
            results[mode] = lat
        # the baseline: what a user without --watch runs after a file lands (a plain rescan)
        watcher_stopped = False
        for _ in range(5):
            (root / "new" / f"{n:07d}.png").write_bytes(png(n))
            n += 1
            time.sleep(1.0)  # the watcher catalogues it first: the plain scan is an unchanged rescan
            plain.append(run([*DLINDEX, "scan", str(root), "--db", str(db), "-q"]))
        results["plain_scan"] = plain
        time.sleep(2)
        before = cpu_s(watcher.pid)
        time.sleep(a.idle)
        results["idle_cpu_s"] = cpu_s(watcher.pid) - before
        results["idle_rss_mb"] = peak_mb(watcher.pid)
        # the flood: a.flood new files written as fast as this process can, catalogued only (the
        # automatic type is turned off: its compute would be the extractor's time, not the watcher's)
        subprocess.run([*DLINDEX, "features", "auto", "--type", "colorhist", "--off", "--db", str(db)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        flood = root / "flood"
        t0 = time.perf_counter()
        make_tree(flood, a.flood)
        written = time.perf_counter() - t0
        last = f"flood/c{(a.flood - 1) // 100:04d}/{a.flood - 1:07d}.png"
        wait_row(db, last, vector=False, timeout=600)
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            while (
                conn.execute("SELECT count(*) FROM image_metadata WHERE file_path LIKE 'flood/%'").fetchone()[0]
                < a.flood
            ):
                time.sleep(0.05)
        results["flood_written_s"] = written
        results["flood_caught_s"] = time.perf_counter() - t0
        results["watch_peak_mb"] = peak_mb(watcher.pid)
    finally:
        watcher.terminate()
        watcher_stopped = watcher.wait(60) == 130
    fresh = a.work / "fresh.db"
    t = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *DLINDEX, "scan", str(flood), "--db", str(fresh), "-q"],
                          check=True, capture_output=True, text=True)  # fmt: skip
    results["flood_first_scan_s"] = time.perf_counter() - t
    results["flood_first_scan_mb"] = int(proc.stderr.strip().splitlines()[-1]) / 1024
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *DLINDEX, "scan", str(root), "--db", str(db), "-q"],
                          check=True, capture_output=True, text=True)  # fmt: skip
    results["rescan_mb"] = int(proc.stderr.strip().splitlines()[-1]) / 1024  # the same tree, unchanged
    results["stopped_130"] = watcher_stopped
    print(results)
    write_section(a.docs, START, END, render(results, a))


def render(r: dict[str, object], a: argparse.Namespace) -> str:
    def ms(xs: object) -> str:
        values = list(xs)  # type: ignore[call-overload]
        q = statistics.quantiles(values, n=10)
        return f"{statistics.median(values) * 1000:.0f} ms (p90 {q[-1] * 1000:.0f}, max {max(values) * 1000:.0f})"

    plain = statistics.median(r["plain_scan"])  # type: ignore[arg-type]
    return "\n".join(
        [
            START,
            "## `scan --watch` (`bench/bench_watch.py`, #35)",
            "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores: a watched tree of "
            f"{a.files:,} tiny PNGs (100 a folder), `dlindex scan ROOT --watch` (default debounce 500 ms), "
            f"{a.new} new files timed one at a time from their close. Command: `python bench/bench_watch.py --files {a.files} "
            f"--flood {a.flood}`.",
            "",
            "| figure | watcher | same-run baseline | goal |",
            "|---|---|---|---|",
            f"| new file -> its row in the catalog | {ms(r['row'])} | a plain `dlindex scan ROOT` after it lands: "
            f"{plain * 1000:.0f} ms (median of 5, process start included) | <= 2 s |",
            f"| new file -> its `colorhist` vector (automatic type) | {ms(r['vector'])} | - | <= 2 s + the extractor |",
            f"| CPU while idle, {a.idle:.0f} s | {r['idle_cpu_s']:.2f} CPU s ({100 * float(r['idle_cpu_s']) / a.idle:.2f}% "  # type: ignore[arg-type]
            "of a core) | - | near zero |",
            f"| {a.flood:,} new files written at once ({float(r['flood_written_s']):.1f} s to write, the watcher "  # type: ignore[arg-type]
            "rescanning meanwhile): all catalogued, after the last was written, in "
            f"| {float(r['flood_caught_s']) - float(r['flood_written_s']):.1f} s; watcher peak RSS "  # type: ignore[arg-type]
            f"{float(r['watch_peak_mb']):.0f} MB (idle before: {float(r['idle_rss_mb']):.0f} MB) | a plain rescan of "  # type: ignore[arg-type]
            f"the tree after it (unchanged): peak RSS {float(r['rescan_mb']):.0f} MB; a first "  # type: ignore[arg-type]
            f"`dlindex scan` of the same files: {float(r['flood_first_scan_s']):.1f} s, "  # type: ignore[arg-type]
            f"peak RSS {float(r['flood_first_scan_mb']):.0f} MB | nothing dropped, bounded memory |",  # type: ignore[arg-type]
            "",
            f"SIGTERM ended the watcher with exit 130: {r['stopped_130']}.",
            END,
        ]
    )


if __name__ == "__main__":
    main()
