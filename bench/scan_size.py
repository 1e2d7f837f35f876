"""The scan's size curve for bench/bench_scan.py (case ``size``): tiny trees of 10^5 and 2*10^5
files (and 2*10^6 with --big), each scanned first and again unchanged, every dlindex run
interleaved with its baselines on the same tree:

  warm first scan   vs the one-process read loop (bench/baselines/read_all.py), page cache warm
  cold first scan   vs a 32-thread read (bench/baselines/parallel_read.py), caches dropped (root)
  unchanged rescan  vs find ROOT -type f -printf '%s %T@\\n', directories and inodes warm

Besides the ratios: files/s over the first scan (rows written, sampled every second from the
catalog: does it fall as the catalog grows?), peak RSS (``/usr/bin/time -f %M``, the largest
process) and the peak summed PSS of the process tree, and CPU seconds (user + system of
dlindex and its workers).  Written to docs/benchmarks.md between <!-- bench_scan_size:start -->
and <!-- bench_scan_size:end -->.  Trees: bench/make_trees.py ``tiny-<N>`` under --size-work.

  python bench/bench_scan.py --cases size --reps 1 --size-work /tmp/dlindex-bench-2m --big
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import make_trees as mt
from common import write_section

START, END = "<!-- bench_scan_size:start -->", "<!-- bench_scan_size:end -->"
SIZES = (100_000, 200_000)
BIG = 2_000_000
bs: Any = None  # the bench_scan module that runs this case
GOALS = {"warm": 0.5, "cold": 0.8, "rescan": 1.2}  # issue #34


def _load() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


class _Rows:
    """Samples ``max(id)`` of a catalog being written every ``every`` seconds: rows over time."""

    def __init__(self, db: Path, every: float = 1.0) -> None:
        self.db, self.every = db, every
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Rows:
        self.t0 = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            with contextlib.suppress(sqlite3.Error):
                con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=0.2)
                try:
                    n = con.execute("SELECT max(id) FROM image_metadata").fetchone()[0] or 0
                finally:
                    con.close()
                self.samples.append((time.perf_counter() - self.t0, int(n)))

    def rates(self, n: int) -> list[tuple[int, float]]:
        """files/s over each tenth of the rows (by the samples nearest to each tenth)."""
        pts = [(0.0, 0)] + [s for s in self.samples if s[1] > 0]
        out: list[tuple[int, float]] = []
        for k in range(1, 11):
            lo, hi = (k - 1) * n // 10, k * n // 10
            a = next((p for p in pts if p[1] >= lo), None)
            b = next((p for p in pts if p[1] >= hi), None)
            if a is None or b is None or b[0] <= a[0]:
                continue
            out.append((k * 10, (b[1] - a[1]) / (b[0] - a[0])))
        return out


def case_size(b: Any) -> None:
    """Run the size curve; adds rows to ``b.rows`` and keeps the section for the docs in ``b.size_section``."""
    # bench_scan runs as __main__: its globals (the temp dir, the load monitor) live there
    global bs
    bs = sys.modules[type(b).__module__]
    work = Path(b.a.size_work) if b.a.size_work else b.work
    sizes = [int(float(x)) for x in b.a.sizes.split(",")] if b.a.sizes else list(SIZES)
    sizes += [BIG] if b.a.big and BIG not in sizes else []
    cold_ok = os.geteuid() == 0
    results: dict[int, dict[str, Any]] = {}
    for n in sizes:
        root = mt.ensure_tiny(n, work)
        db = b.dbdir / f"size{n}.db"
        res: dict[str, Any] = {"load": []}
        big = n >= BIG

        def warm(root: Path = root, big: bool = big) -> None:
            # a 2M tree's data is warmed once (7.8 GB); smaller ones before every run
            if not big or not getattr(warm, "done", False):
                bs.warm_data(root)
                warm.done = True  # type: ignore[attr-defined]

        for rep in range(b.reps):
            res["load"].append(_load())
            r = b.py("size", "read_all.py", root, prep=warm)
            res.setdefault("read_all", []).append(r.wall)
            res.setdefault("read_all_cpu", []).append(r.cpu_s)
            b.say(f"size {n}: read loop {r.wall:.2f}s cpu {r.cpu_s:.1f}s ({_load()})")
            bs.rm_db(db)
            with _Rows(db) as rows:
                r = b.dl_scan("size", root, db, fresh=True, sample_tree=True, expect={"seen": n, "new": n}, prep=warm)
            res.setdefault("scan", []).append(r.wall)
            res.setdefault("scan_cpu", []).append(r.cpu_s)
            res["scan_rss_mb"] = max(res.get("scan_rss_mb", 0), r.maxrss_kb * 1024 / bs.MB)
            res["scan_pss_mb"] = max(res.get("scan_pss_mb", 0), r.tree_peak_kb * 1024 / bs.MB)
            res["curve"] = rows.rates(n)
            b.say(f"size {n}: first scan {r.wall:.2f}s cpu {r.cpu_s:.1f}s rss {res['scan_rss_mb']:.0f} MB "
                  f"curve {[(p, round(v)) for p, v in res['curve']]} ({_load()})")  # fmt: skip
            find = f"find {bs.q(root)} -type f -printf '%s %T@\\n' > /dev/null"

            def meta(root: Path = root, db: Path = db) -> None:
                bs.warm_meta(root)
                bs.sh(f"cat {bs.q(db)}* > /dev/null")

            # The first rescan after a scan compares every folder with its rows and remembers it
            # (dlindex.scan.digests); the next ones, the steady state, recall them.
            r = b.dl_scan("size", root, db, fresh=False, sample_tree=True,
                          expect={"seen": n, "unchanged": n, "new": 0}, prep=meta)  # fmt: skip
            res.setdefault("rescan_first", []).append(r.wall)
            res.setdefault("rescan_first_cpu", []).append(r.cpu_s)
            for f in b.rotated(rep, ["find", "rescan"]):
                if f == "find":
                    r = b.shell("size", find, prep=meta)
                    res.setdefault("find", []).append(r.wall)
                    res.setdefault("find_cpu", []).append(r.cpu_s)
                else:
                    r = b.dl_scan("size", root, db, fresh=False, sample_tree=True,
                                  expect={"seen": n, "unchanged": n, "new": 0}, prep=meta)  # fmt: skip
                    res.setdefault("rescan", []).append(r.wall)
                    res.setdefault("rescan_cpu", []).append(r.cpu_s)
                    res["rescan_rss_mb"] = max(res.get("rescan_rss_mb", 0), r.maxrss_kb * 1024 / bs.MB)
                    res["rescan_pss_mb"] = max(res.get("rescan_pss_mb", 0), r.tree_peak_kb * 1024 / bs.MB)
            b.say(f"size {n}: first rescan {res['rescan_first'][-1]:.2f}s, rescan {res['rescan'][-1]:.2f}s "
                  f"cpu {res['rescan_cpu'][-1]:.1f}s find "
                  f"{res['find'][-1]:.2f}s cpu {res['find_cpu'][-1]:.1f}s ({_load()})")  # fmt: skip
            if cold_ok and (not big or b.a.big_cold):
                r = b.py("size", "parallel_read.py", root, 32, prep=bs.drop_caches)
                res.setdefault("read32", []).append(r.wall)
                r = b.dl_scan("size", root, db, fresh=True, expect={"seen": n, "new": n}, prep=bs.drop_caches)
                res.setdefault("cold", []).append(r.wall)
                b.say(f"size {n}: cold scan {r.wall:.2f}s 32-thread read {res['read32'][-1]:.2f}s ({_load()})")
            bs.rm_db(db)
        results[n] = res
        _rows(b, n, res)
    b.size_section = _render(b, results, work)


def _rows(b: Any, n: int, res: dict[str, Any]) -> None:
    med, Row = bs.med, bs.Row
    d = med(res["scan"])
    a = med(res["read_all"])
    b.rows.append(Row("size", f"warm first scan, {n:,} tiny files", d, n, "(a) read loop, 1 process", a, a / d,
                      "throughput vs (a)", f">= {GOALS['warm']}x", a / d >= GOALS["warm"],
                      samples={k: res[k] for k in ("read_all", "scan", "find", "rescan")}))  # fmt: skip
    if res.get("cold"):
        c, r32 = med(res["cold"]), med(res["read32"])
        b.rows.append(Row("size", f"cold first scan, {n:,} tiny files", c, n, "32-thread read", r32, r32 / c,
                          "throughput vs baseline", f">= {GOALS['cold']}x", r32 / c >= GOALS["cold"]))  # fmt: skip
    r, f = med(res["rescan"]), med(res["find"])
    b.rows.append(Row("size", f"unchanged rescan, {n:,} tiny files", r, n, "find -type f -printf", f, r / f,
                      "time / baseline time", f"<= {GOALS['rescan']}x", r / f <= GOALS["rescan"]))  # fmt: skip


def _render(b: Any, results: dict[int, dict[str, Any]], work: Path) -> str:
    med = bs.med
    head = ("| files | first scan (warm) | files/s | CPU s: scan / read loop | vs read loop | cold vs 32-thread "
            "read | first rescan (compares) | rescan | CPU s: rescan / find | vs find -printf | peak RSS scan / rescan | tree PSS scan / rescan "
            "| load (1, 5, 15 min) |")  # fmt: skip
    lines = [START, "## Scan at size (`bench/bench_scan.py --cases size`)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores; medians of "
             f"{b.reps} run(s); each dlindex run next to its baselines on the same tree. Goals (#34): warm >= "
             f"{GOALS['warm']}x the read loop, cold >= {GOALS['cold']}x the 32-thread read, unchanged rescan <= "
             f"{GOALS['rescan']}x `find -printf`. CPU s: user + system of the command and its child "
             "processes, less sensitive than wall time to other jobs on the machine. The first rescan "
             "after a scan compares every folder with its rows and remembers it (`scan_digests`); the rescan "
             "columns are the later ones, which recall them.", "", head, "|" + "---|" * (head.count("|") - 1)]  # fmt: skip
    for n, res in results.items():
        d, a, r, f = med(res["scan"]), med(res["read_all"]), med(res["rescan"]), med(res["find"])
        cold = f"{med(res['read32']) / med(res['cold']):.2f}x" if res.get("cold") else "-"
        lines.append(
            f"| {n:,} | {d:.1f} s | {n / d:,.0f} | {med(res['scan_cpu']):.1f} / {med(res['read_all_cpu']):.1f} | "
            f"{a / d:.2f}x | {cold} | {med(res['rescan_first']):.2f} s ({med(res['rescan_first']) / f:.2f}x) | "
            f"{r:.2f} s | {med(res['rescan_cpu']):.2f} / {med(res['find_cpu']):.2f} | "
            f"{r / f:.2f}x | {res['scan_rss_mb']:.0f} / {res['rescan_rss_mb']:.0f} MB "
            f"| {res['scan_pss_mb']:.0f} / {res['rescan_pss_mb']:.0f} MB | {res['load'][0].removeprefix('load ')} |"
        )
    lines += ["", "files/s of the first scan over each tenth of the rows (from the catalog's `max(id)`, sampled "
              "every second):", ""]  # fmt: skip
    for n, res in results.items():
        lines.append(f"- {n:,}: " + ", ".join(f"{p}% {v:,.0f}" for p, v in res["curve"]))
    lines += ["", "```sh", "python bench/make_trees.py --only tiny --tiny N --work " + str(work) + "   # per size",
              f"python bench/bench_scan.py --cases size --reps {b.reps} --size-work {work}"
              + (f" --sizes {b.a.sizes}" if b.a.sizes else "") + (" --big" if b.a.big else ""), "```", END]  # fmt: skip
    return "\n".join(lines)


def write_docs(path: Path, section: str) -> None:
    write_section(path, START, END, section)
