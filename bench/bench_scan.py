"""The dlindex scan benchmark: every figure is a ratio to a baseline measured in the same run.

Cases (select with --cases; default all):
  warm    first scan of the 50k ImageNet-like tree, page cache warm, fresh DB each rep
          vs (a) a bare os.open/os.read/os.close loop (one process) and (b) find | xargs cat
  cold    first scan of a 5,000-file copy after `sync; echo 3 > /proc/sys/vm/drop_caches`
          vs the best raw parallel read (8/32/64 threads) of the same files, caches dropped too
  rescan  unchanged rescan of the 200k tiny-image tree (metadata warm)
          vs find ROOT -type f -printf '%s %T@\\n' (warm)
  rss     peak RSS of first scan and rescan at 50k, 100k and 200k files (target <= 200 MB)
  naive   speed-up over a naive single-process indexer (stat, read, xxh3_128, Image.open,
          INSERT + commit per file), 50k tree, warm
  hf      speed-up over datasets.load_dataset("imagefolder", data_dir=ROOT), 50k tree, warm
  size    (not in the default run) the size curve, 10^5 and 2*10^5 tiny files (2*10^6 with --big):
          warm/cold first scan and unchanged rescan against their baselines, files/s over the
          scan, peak RSS; its own section of docs/benchmarks.md (bench/scan_size.py)

Every measured command runs in a fresh process; wall-clock time is taken around it, so
interpreter start-up is included for dlindex and for the Python baselines alike.  Medians of
--reps repetitions are quoted.  The table is printed and written into docs/benchmarks.md between
<!-- bench_scan:start --> and <!-- bench_scan:end --> (other scripts own other sections).
Trees are generated (once, reused) by bench/make_trees.py under $DLINDEX_BENCH_DIR
(default /tmp/dlindex-bench).  Needs root for drop_caches (cold case).

  python bench/bench_scan.py                      # full run, ~8 min on a quiet machine, writes docs
  python bench/bench_scan.py --quick              # smoke test: small trees, 1 rep, no docs
  python bench/bench_scan.py --cases warm,cold --reps 5 --dlindex "python -m dlindex"
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import make_trees as mt

BASE = HERE / "baselines"
PY = sys.executable
ALL_CASES = ["warm", "cold", "rescan", "rss", "naive", "hf"]
import scan_size
from common import compile_sources, write_section

START, END = "<!-- bench_scan:start -->", "<!-- bench_scan:end -->"
MB = 1e6


# --------------------------------------------------------------------------- running things
@dataclass
class Run:
    argv: list[str] | str
    wall: float = 0.0
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    maxrss_kb: int = 0  # ru_maxrss of the child and its reaped descendants (wait4)
    tree_peak_kb: int = 0  # sampled peak of the summed PSS of the whole process tree
    timed_out: bool = False
    bg_cpus: float = 0.0  # CPUs' worth used by other processes during the run
    cpu_s: float = 0.0  # user + system seconds of the child and its reaped descendants

    @property
    def json(self) -> dict:
        for line in reversed(self.stdout.strip().splitlines()):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        raise ValueError(f"no JSON object on stdout of {self.cmd!r}: {self.stdout[-300:]!r} / {self.stderr[-500:]!r}")

    @property
    def cmd(self) -> str:
        return self.argv if isinstance(self.argv, str) else shlex.join(self.argv)

    def check(self) -> Run:
        if self.timed_out:
            raise RuntimeError(f"timed out after {self.wall:.0f}s: {self.cmd}")
        if self.rc != 0:
            raise RuntimeError(f"exit {self.rc}: {self.cmd}\n{self.stderr[-2000:]}")
        return self


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    s = f.read()
                ppid = int(s[s.rindex(b")") + 2 :].split()[1])
            except (OSError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def run(
    argv: list[str] | str,
    *,
    env: dict | None = None,
    cwd: str | Path | None = None,
    timeout: float = 1800,
    sample_tree: bool = False,
    measured: bool = False,
    prep: Callable[[], None] | None = None,
) -> Run:
    """Run one command in a fresh process; time it from the outside.

    measured: first wait for a quiet machine (QUIET); prep: then set the stage (caches), untimed.
    A measured run during which other processes used more than QUIET.limit CPUs on average is
    repeated (prep included), up to QUIET.retries times; the last attempt counts regardless.
    """
    attempt = 0
    while True:
        quiet = QUIET.wait() if measured else True
        if prep is not None:
            prep()
        r = _run_once(argv, env=env, cwd=cwd, timeout=timeout, sample_tree=sample_tree)
        if not measured:
            return r
        # repeat only after a burst of load (the machine was quiet just before), not a steady one
        disturbed = quiet and r.bg_cpus > QUIET.limit and r.wall < QUIET.retry_below_s
        if not disturbed or attempt >= QUIET.retries or r.rc != 0:
            QUIET.during.append(r.bg_cpus)
            return r
        attempt += 1
        QUIET.repeated += 1
        print(
            f"  (other processes used {r.bg_cpus:.2f} CPUs during a {r.wall:.2f}s run; repeating it)",
            file=sys.stderr,
            flush=True,
        )


def _run_once(
    argv: list[str] | str, *, env: dict | None, cwd: str | Path | None, timeout: float, sample_tree: bool
) -> Run:
    r = Run(argv)
    # ru_maxrss from our own wait4() would be polluted: a child that this (big) process forks
    # inherits our RSS high-water mark until it execs.  /usr/bin/time forks from a tiny process.
    gnu_time = sample_tree and isinstance(argv, list) and os.access("/usr/bin/time", os.X_OK)
    if gnu_time:
        Path(_tmpfile("rss")).unlink(missing_ok=True)
        argv = ["/usr/bin/time", "-f", "%M", "-o", _tmpfile("rss"), *argv]
    with open(_tmpfile("out"), "w+") as out_f, open(_tmpfile("err"), "w+") as err_f:
        busy0, _ = _cpu_busy()
        t0 = time.perf_counter()
        p = subprocess.Popen(
            argv,
            shell=isinstance(argv, str),
            stdin=subprocess.DEVNULL,
            stdout=out_f,
            stderr=err_f,
            env=env,
            cwd=cwd,
            start_new_session=True,
            executable="/bin/bash" if isinstance(argv, str) else None,
        )
        stop = threading.Event()

        def killer() -> None:
            if not stop.wait(timeout):
                r.timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)

        def sampler() -> None:
            while not stop.wait(0.02):
                r.tree_peak_kb = max(r.tree_peak_kb, sum(_pss_kb(q) for q in _descendants(p.pid)))

        threads = [threading.Thread(target=killer, daemon=True)]
        if sample_tree:
            threads.append(threading.Thread(target=sampler, daemon=True))
        for t in threads:
            t.start()
        _, status, ru = os.wait4(p.pid, 0)
        r.wall = time.perf_counter() - t0
        stop.set()
        p.returncode = os.waitstatus_to_exitcode(status)
        r.rc, r.maxrss_kb = p.returncode, ru.ru_maxrss
        r.cpu_s = ru.ru_utime + ru.ru_stime
        # CPU used by everything else meanwhile: all CPU time on the machine minus the child's
        busy1, _ = _cpu_busy()
        others = (busy1 - busy0) / CLK_TCK - (ru.ru_utime + ru.ru_stime)
        r.bg_cpus = max(0.0, others / r.wall) if r.wall > 0 else 0.0
        if gnu_time:
            try:
                r.maxrss_kb = int(Path(_tmpfile("rss")).read_text().split()[-1])
            except (OSError, ValueError, IndexError):
                r.maxrss_kb = 0
        out_f.seek(0)
        err_f.seek(0)
        r.stdout, r.stderr = out_f.read(), err_f.read()
    return r


_TMP: Path | None = None


def _tmpfile(name: str) -> str:
    assert _TMP is not None
    return str(_TMP / f"run.{name}")


def sh(cmd: str, timeout: float = 3600) -> Run:
    return run(cmd, timeout=timeout).check()


def q(p: str | Path) -> str:
    return shlex.quote(str(p))


# --------------------------------------------------------------------------- a quiet machine
def _cpu_busy() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v[:8]) - idle, sum(v[:8])


def background_load(window: float = 0.5) -> float:
    """CPUs' worth of work done by other processes over `window` seconds (we are idle then)."""
    b0, t0 = _cpu_busy()
    time.sleep(window)
    b1, t1 = _cpu_busy()
    return (b1 - b0) / max(1, t1 - t0) * (os.cpu_count() or 1)


class Quiet:
    """Before each measured run wait (up to max_wait s) until other processes use < limit CPUs."""

    def __init__(self, max_wait: float, limit: float = 0.15, retries: int = 2, retry_below_s: float = 20):
        self.max_wait, self.limit, self.retries, self.retry_below_s = max_wait, limit, retries, retry_below_s
        self.loads: list[float] = []  # load seen right before each measured run
        self.during: list[float] = []  # load by other processes during each measured run (kept ones)
        self.repeated = 0
        self.timeouts = 0  # waits in a row that ran out
        self.waited = 0.0

    def wait(self) -> bool:
        """True when the machine went quiet.  After two waits in a row ran out (a steady load,
        not a burst) only wait 5 s, until a wait succeeds again."""
        if self.max_wait <= 0:
            return True
        limit_s = self.max_wait if self.timeouts < 2 else min(5.0, self.max_wait)
        t0 = time.perf_counter()
        load = background_load()
        while load > self.limit and time.perf_counter() - t0 < limit_s:
            load = background_load()
        self.waited += time.perf_counter() - t0
        self.loads.append(load)
        quiet = load <= self.limit
        self.timeouts = 0 if quiet else self.timeouts + 1
        return quiet

    def summary(self) -> str:
        if not self.during:
            return "no measured runs"
        busy = [x for x in self.during if x > self.limit]
        before = (
            f"before each run waited up to {self.max_wait:.0f} s for them to go below {self.limit} CPUs "
            f"(total wait {self.waited:.0f} s); "
            if self.max_wait > 0
            else ""
        )
        return (
            f"{before}during the {len(self.during)} measured runs other processes used a median "
            f"{statistics.median(self.during):.2f} and at most {max(self.during):.2f} CPUs; "
            f"{self.repeated} disturbed run(s) were repeated, {len(busy)} kept run(s) still saw "
            f"> {self.limit} CPUs of other load"
        )


QUIET = Quiet(0)
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- cache control
def warm_data(root: Path) -> None:
    """Pull every byte of the tree into the page cache (untimed)."""
    sh(f"find {q(root)} -type f -print0 | xargs -0 -P 8 -n 512 cat > /dev/null")
    sh(f"find {q(root)} -type f -print0 | xargs -0 cat > /dev/null")  # second pass: cache-hot


def warm_meta(root: Path) -> None:
    """Pull directories and inodes into the cache (what an unchanged rescan needs)."""
    sh(f"find {q(root)} -type f -printf '%s %T@\\n' > /dev/null")


def drop_caches() -> None:
    sh("sync; echo 3 > /proc/sys/vm/drop_caches")


def rm_db(db: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(db) + suffix).unlink(missing_ok=True)


# --------------------------------------------------------------------------- results
@dataclass
class Row:
    case: str
    label: str
    d_s: float | None = None  # dlindex median seconds (or MB for RSS rows)
    n: int | None = None  # files
    base: str = ""
    b_s: float | None = None
    ratio: float | None = None
    ratio_kind: str = ""  # how the ratio is defined
    target: str = ""
    ok: bool | None = None
    note: str = ""
    unit: str = "s"
    samples: dict = field(default_factory=dict)

    def cells(self) -> list[str]:
        if self.unit == "MB":
            d = f"{self.d_s:.0f} MB" if self.d_s is not None else "-"
            b = f"{self.b_s:.0f} MB" if self.b_s is not None else "-"
        else:
            d = f"{self.d_s:.2f} s ({self.n / self.d_s:,.0f} files/s)" if self.d_s and self.n else "-"
            b = f"{self.b_s:.2f} s ({self.n / self.b_s:,.0f} files/s)" if self.b_s and self.n else "-"
        ratio = f"{self.ratio:.2f}x" if self.ratio is not None else "-"
        res = {True: "PASS", False: "**FAIL**", None: "info"}[self.ok]
        return [
            self.label,
            d,
            self.base or "-",
            b,
            ratio + (f" ({self.ratio_kind})" if self.ratio_kind else ""),
            self.target or "-",
            res,
        ]


HEAD = ["case", "dlindex median", "baseline", "baseline median", "ratio", "target", "result"]


def md_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


# --------------------------------------------------------------------------- the bench
class Bench:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.spec = mt.QUICK if a.quick else mt.FULL
        self.work = mt.work_dir(a.work)
        self.dbdir = self.work / "dbs"
        self.dbdir.mkdir(exist_ok=True)
        self.reps = a.reps
        self.dl = shlex.split(a.dlindex) if a.dlindex else default_dlindex()
        self.dl_env = dict(os.environ)
        # `python -m dlindex` from a source checkout: make the package importable from anywhere
        self.dl_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        # how the dlindex command is shown in the docs: the console script by name
        self.dl_shown = ["dlindex"] if not a.dlindex and Path(self.dl[0]).name == "dlindex" else self.dl
        self.scan_extra = ["--workers", str(a.workers)] if a.workers else []
        self.rows: list[Row] = []
        self.commands: dict[str, list[str]] = {}
        self.log: list[str] = []
        self.warm_scan_med: tuple[float, int] | None = None
        self.trees: dict = {}
        self.checks: list[str] = []

    # ----- helpers
    def say(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def note_cmd(self, case: str, cmd: str) -> None:
        cmd = cmd.replace(str(self.work), "$W")
        if self.dl_shown != self.dl:
            cmd = cmd.replace(shlex.join(self.dl), shlex.join(self.dl_shown))
        lst = self.commands.setdefault(case, [])
        if cmd not in lst:
            lst.append(cmd)

    def scan_argv(self, root: Path, db: Path) -> list[str]:
        return [*self.dl, "scan", str(root), "--db", str(db), "--json", *self.scan_extra]

    def dl_scan(
        self,
        case: str,
        root: Path,
        db: Path,
        *,
        fresh: bool,
        sample_tree: bool = False,
        expect: dict | None = None,
        measured: bool = True,
        prep: Callable[[], None] | None = None,
    ) -> Run:
        if fresh:
            rm_db(db)
            outer = prep

            def prep() -> None:  # a repeated attempt must start from no catalog again
                rm_db(db)
                if outer is not None:
                    outer()

        argv = self.scan_argv(root, db)
        self.note_cmd(case, shlex.join(argv))
        r = run(
            argv,
            env=self.dl_env,
            cwd=REPO,
            sample_tree=sample_tree,
            timeout=self.a.timeout,
            measured=measured,
            prep=prep,
        ).check()
        out = r.json
        for k, v in (expect or {}).items():
            if out.get(k) != v:
                raise RuntimeError(f"dlindex scan reported {k}={out.get(k)!r}, expected {v!r}: {out}")
        return r

    def py(
        self,
        case: str,
        script: str,
        *args: str | Path,
        env: dict | None = None,
        measured: bool = True,
        prep: Callable[[], None] | None = None,
    ) -> Run:
        argv = [PY, str(BASE / script), *map(str, args)]
        self.note_cmd(case, shlex.join(["python", f"bench/baselines/{script}", *map(str, args)]))
        return run(argv, env=env, timeout=self.a.timeout, measured=measured, prep=prep).check()

    def shell(self, case: str, cmd: str, prep: Callable[[], None] | None = None) -> Run:
        self.note_cmd(case, cmd)
        return run(cmd, timeout=self.a.timeout, measured=True, prep=prep).check()

    def tree(self, name: str) -> Path:
        if name not in self.trees:
            only = {"big": {"big"}, "subset": {"subset"}, "small": {"small"}, "links": {"links"}}[name]
            self.trees.update(mt.ensure_all(self.spec, self.work, only))
        return self.trees[name]

    def verify_hashes(self, db: Path, root: Path, k: int = 40) -> None:
        """Check that the catalog holds whole-file xxh3_128 digests (i.e. the scan read every byte).

        Every generated file has distinct bytes, so the digests of k random files must all be in
        image_metadata.xxh3_128.  A schema this does not know is reported, not fatal."""
        import random

        import xxhash

        files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
        sample = random.Random(0).sample(files, min(k, len(files)))
        digests = [xxhash.xxh3_128_hexdigest(Path(p).read_bytes()) for p in sample]
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                marks = ",".join("?" * len(digests))
                found = con.execute(
                    f"SELECT count(*) FROM image_metadata WHERE xxh3_128 IN ({marks})", digests
                ).fetchone()[0]
            finally:
                con.close()
        except sqlite3.Error as e:
            self.say(f"note: could not verify the catalog's digests ({e})")
            self.checks.append(f"whole-file digests not verified ({e})")
            return
        msg = f"{found} of {len(digests)} sampled files' whole-file xxh3_128 digests found in the catalog"
        self.say(msg)
        self.checks.append(msg)
        if found != len(digests):
            raise RuntimeError(f"the catalog does not hold whole-file digests: {msg}")

    @staticmethod
    def rotated(i: int, items: list) -> list:
        """Rep i runs the contenders in a rotated order, so slow drifts hit all of them alike."""
        k = i % len(items)
        return items[k:] + items[:k]

    # ----- cases
    def case_warm(self) -> None:
        root, n = self.tree("big"), self.spec.big
        db = self.dbdir / "warm.db"
        ts: dict[str, list[float]] = {"dlindex": [], "read_all": [], "xargs_cat": []}
        cat = f"find {q(root)} -type f -print0 | xargs -0 cat > /dev/null"
        prep = lambda: warm_data(root)  # noqa: E731

        def dl() -> None:
            r = self.dl_scan("warm", root, db, fresh=True, expect={"seen": n, "new": n}, prep=prep)
            if not ts["dlindex"]:
                self.verify_hashes(db, root)
            rm_db(db)
            ts["dlindex"].append(r.wall)

        def a() -> None:
            r = self.py("warm", "read_all.py", root, prep=prep)
            assert r.json["files"] == n, r.json
            ts["read_all"].append(r.wall)

        def b() -> None:
            ts["xargs_cat"].append(self.shell("warm", cat, prep=prep).wall)

        for i in range(self.reps):
            for f in self.rotated(i, [dl, a, b]):
                f()
            self.say(
                f"warm rep {i + 1}: dlindex {ts['dlindex'][-1]:.2f}s  read_all {ts['read_all'][-1]:.2f}s  "
                f"find|xargs cat {ts['xargs_cat'][-1]:.2f}s"
            )
        d, a_, b_ = med(ts["dlindex"]), med(ts["read_all"]), med(ts["xargs_cat"])
        self.warm_scan_med = (d, n)
        lab = f"warm first scan, {n:,} files"
        self.rows.append(
            Row(
                "warm",
                lab,
                d,
                n,
                "(a) os.open/read/close loop, 1 process",
                a_,
                a_ / d,
                "throughput vs (a)",
                ">= 0.40x",
                a_ / d >= 0.4,
                samples=ts,
            )
        )
        self.rows.append(
            Row("warm", lab, d, n, "(b) find | xargs cat", b_, b_ / d, "throughput vs (b)", ">= 1.50x", b_ / d >= 1.5)
        )

    def case_cold(self) -> None:
        root, n = self.tree("subset"), self.spec.subset
        db = self.dbdir / "cold.db"
        tiny = self.tiny_tree()
        threads = [int(x) for x in self.a.cold_threads.split(",")]
        ts: dict[str, list[float]] = {"dlindex": [], "dlindex_cold_start": [], **{f"read{t}": [] for t in threads}}

        def prep_dl() -> None:  # caches dropped, then interpreter + code re-warmed on a 3-file tree
            drop_caches()
            self.dl_scan("cold", tiny, self.dbdir / "tiny.db", fresh=True, measured=False)
            rm_db(self.dbdir / "tiny.db")

        def dl() -> None:
            r = self.dl_scan("cold", root, db, fresh=True, expect={"seen": n, "new": n}, prep=prep_dl)
            rm_db(db)
            ts["dlindex"].append(r.wall)

        def dl_cold_start() -> None:  # everything cold, interpreter and imports too: info only
            r = self.dl_scan("cold", root, db, fresh=True, expect={"seen": n}, prep=drop_caches)
            rm_db(db)
            ts["dlindex_cold_start"].append(r.wall)

        def reader(t: int) -> Callable[[], None]:
            def prep() -> None:
                drop_caches()
                self.py("cold", "parallel_read.py", tiny, t, measured=False)

            def go() -> None:
                r = self.py("cold", "parallel_read.py", root, t, prep=prep)
                assert r.json["files"] == n, r.json
                ts[f"read{t}"].append(r.wall)

            return go

        for i in range(self.reps):
            for f in self.rotated(i, [dl, dl_cold_start, *map(reader, threads)]):
                f()
            self.say(f"cold rep {i + 1}: " + "  ".join(f"{k} {v[-1]:.2f}s" for k, v in ts.items()))
        d = med(ts["dlindex"])
        best_t = min(threads, key=lambda t: med(ts[f"read{t}"]))
        b = med(ts[f"read{best_t}"])
        others = ", ".join(f"{t} thr {med(ts[f'read{t}']):.2f} s" for t in threads)
        self.rows.append(
            Row(
                "cold",
                f"cold first scan, {n:,} files",
                d,
                n,
                f"best raw parallel read ({best_t} threads; {others})",
                b,
                b / d,
                "throughput vs baseline",
                ">= 0.80x",
                b / d >= 0.8,
                samples=ts,
            )
        )
        dc = med(ts["dlindex_cold_start"])
        self.rows.append(
            Row(
                "cold",
                "cold first scan incl. cold interpreter/imports",
                dc,
                n,
                f"same ({best_t} threads)",
                b,
                b / dc,
                "throughput vs baseline",
                "",
                None,
            )
        )

    def case_rescan(self) -> None:
        root, n = self.tree("small"), self.spec.small
        db = self.dbdir / "rescan.db"
        first = self.dl_scan("rescan", root, db, fresh=True, expect={"seen": n, "new": n}, prep=lambda: warm_data(root))
        self.say(f"rescan: first scan of {n} files {first.wall:.2f}s {first.json}")
        ts: dict[str, list[float]] = {"dlindex": [], "find": [], "first_scan": [first.wall]}
        find = f"find {q(root)} -type f -printf '%s %T@\\n' > /dev/null"

        def prep() -> None:
            warm_meta(root)
            sh(f"cat {q(db)}* > /dev/null")

        def dl() -> None:
            r = self.dl_scan("rescan", root, db, fresh=False, expect={"seen": n, "unchanged": n, "new": 0}, prep=prep)
            ts["dlindex"].append(r.wall)

        def base() -> None:
            ts["find"].append(self.shell("rescan", find, prep=prep).wall)

        for i in range(self.reps):
            for f in self.rotated(i, [dl, base]):
                f()
            self.say(f"rescan rep {i + 1}: dlindex {ts['dlindex'][-1]:.2f}s  find {ts['find'][-1]:.2f}s")
        rm_db(db)
        d, b = med(ts["dlindex"]), med(ts["find"])
        self.rows.append(
            Row(
                "rescan",
                f"unchanged rescan, {n:,} files",
                d,
                n,
                "find -type f -printf '%s %T@\\n'",
                b,
                d / b,
                "time / baseline time",
                "<= 1.20x",
                d / b <= 1.2,
                samples=ts,
            )
        )
        self.rows.append(
            Row(
                "rescan",
                f"(first scan of the same {n:,} tiny files, warm, 1 run)",
                first.wall,
                n,
                "",
                None,
                None,
                "",
                "",
                None,
            )
        )

    def case_rss(self) -> None:
        trees = [(k, p) for k, p in sorted(self.tree("links").items())] + [(self.spec.small, self.tree("small"))]
        res: dict[int, dict] = {}
        for n, root in trees:
            db = self.dbdir / f"rss{n}.db"
            r1 = self.dl_scan(
                "rss",
                root,
                db,
                fresh=True,
                sample_tree=True,
                expect={"seen": n, "new": n},
                prep=lambda root=root: warm_data(root),
            )
            r2 = self.dl_scan(
                "rss",
                root,
                db,
                fresh=False,
                sample_tree=True,
                expect={"seen": n, "unchanged": n},
                prep=lambda root=root: warm_meta(root),
            )
            rm_db(db)
            res[n] = {
                "scan_maxrss_mb": r1.maxrss_kb * 1024 / MB,
                "scan_tree_pss_mb": r1.tree_peak_kb * 1024 / MB,
                "rescan_maxrss_mb": r2.maxrss_kb * 1024 / MB,
                "rescan_tree_pss_mb": r2.tree_peak_kb * 1024 / MB,
                "scan_s": r1.wall,
                "rescan_s": r2.wall,
            }
            self.say(f"rss {n}: " + ", ".join(f"{k} {v:.1f}" for k, v in res[n].items()))
        top = max(res)
        for what in ("scan", "rescan"):
            for n in sorted(res):
                m, t = res[n][f"{what}_maxrss_mb"], res[n][f"{what}_tree_pss_mb"]
                big = n == top
                self.rows.append(
                    Row(
                        "rss",
                        f"peak RSS, {'first scan' if what == 'scan' else 'unchanged rescan'}, {n:,} files",
                        m,
                        n,
                        "sampled PSS sum of the process tree",
                        t,
                        None,
                        "",
                        "<= 200 MB" if big else "",
                        (m <= 200 and t <= 200) if big else None,
                        unit="MB",
                        samples=res[n],
                    )
                )
            lo, hi = min(res), max(res)
            if lo != hi:
                growth = res[hi][f"{what}_maxrss_mb"] / res[lo][f"{what}_maxrss_mb"]
                per_file = (res[hi][f"{what}_maxrss_mb"] - res[lo][f"{what}_maxrss_mb"]) * MB / (hi - lo)
                self.rows.append(
                    Row(
                        "rss",
                        f"RSS growth {lo:,} -> {hi:,} files ({what})",
                        None,
                        None,
                        f"linear would be {hi / lo:.1f}x",
                        None,
                        growth,
                        f"{per_file:.0f} B per extra file",
                        f"< {hi / lo:.1f}x (sub-linear)",
                        growth < hi / lo,
                        unit="MB",
                    )
                )

    def case_size(self) -> None:
        scan_size.case_size(self)

    def _warm_dlindex(self) -> tuple[float, int]:
        if self.warm_scan_med is None:  # warm case not run: warm scans of our own
            root, n = self.tree("big"), self.spec.big
            db = self.dbdir / "warm1.db"
            ts = []
            for _ in range(self.reps):
                ts.append(
                    self.dl_scan("naive", root, db, fresh=True, expect={"seen": n}, prep=lambda: warm_data(root)).wall
                )
                rm_db(db)
            self.warm_scan_med = (med(ts), n)
        return self.warm_scan_med

    def case_naive(self) -> None:
        root, n = self.tree("big"), self.spec.big
        db = self.dbdir / "naive.db"
        ts, rates, complete = [], [], True
        for _ in range(self.a.slow_reps):
            rm_db(db)
            args = [root, db] + (["--max-seconds", str(self.a.naive_max_s)] if self.a.naive_max_s else [])
            r = self.py("naive", "naive_index.py", *args, prep=lambda: (rm_db(db), warm_data(root)))
            rm_db(db)
            out = r.json
            complete &= out["complete"]
            ts.append(r.wall)
            rates.append(out["files"] / r.wall)
            self.say(f"naive: {r.wall:.2f}s {out}")
        d, _ = self._warm_dlindex()
        b = n / med(rates)  # time for the whole tree (extrapolated if the run was capped)
        note = f"{self.a.slow_reps} run(s)" + ("" if complete else f"; capped at {self.a.naive_max_s}s, extrapolated")
        self.rows.append(
            Row(
                "naive",
                f"speed-up over naive 1-process indexer, {n:,} files, warm",
                d,
                n,
                "os.walk+stat+read+xxh3_128+Image.open+INSERT/commit per file",
                b,
                b / d,
                "speed-up",
                "report",
                None,
                note=note,
                samples={"naive": ts},
            )
        )

    def case_hf(self) -> None:
        root, n = self.tree("big"), self.spec.big
        ts = []
        info = {}
        try:
            import importlib.util

            if importlib.util.find_spec("datasets") is None:
                raise RuntimeError("the `datasets` package is not installed in this interpreter (pip install datasets)")
            cache = self.work / "hf-cache"

            def prep() -> None:
                shutil.rmtree(cache, ignore_errors=True)
                cache.mkdir()
                warm_data(root)

            env = dict(
                os.environ,
                HF_HOME=str(cache / "home"),
                HF_DATASETS_CACHE=str(cache / "datasets"),
                HF_DATASETS_OFFLINE="1",
                HF_HUB_OFFLINE="1",
                HF_HUB_DISABLE_TELEMETRY="1",
            )
            for _ in range(self.a.slow_reps):
                r = self.py("hf", "hf_imagefolder.py", root, cache, env=env, prep=prep)
                shutil.rmtree(cache, ignore_errors=True)
                info = r.json
                if info["files"] != n:
                    raise RuntimeError(f"HF loaded {info['files']} rows, expected {n}")
                ts.append(r.wall)
                self.say(f"hf: {r.wall:.2f}s {info}")
        except Exception as e:  # report, don't fail the whole benchmark
            self.rows.append(
                Row(
                    "hf",
                    "speed-up over HF datasets imagefolder",
                    None,
                    n,
                    "HF datasets",
                    None,
                    None,
                    "",
                    "report",
                    None,
                    note=f"could not run: {str(e).splitlines()[0][:200]}",
                )
            )
            return
        d, _ = self._warm_dlindex()
        b = med(ts)
        emb = (
            "reads and embeds image bytes"
            if info.get("embedded_bytes")
            else "lists the files and stores their paths; it does not read image bytes"
        )
        self.rows.append(
            Row(
                "hf",
                f"speed-up over HF datasets imagefolder, {n:,} files, warm",
                d,
                n,
                f"load_dataset('imagefolder') (datasets {info.get('datasets')})",
                b,
                b / d,
                "speed-up",
                "report",
                None,
                note=f"{self.a.slow_reps} run(s); HF {emb}",
                samples={"hf": ts},
            )
        )

    def tiny_tree(self) -> Path:
        """3 images, to re-warm interpreter and code after drop_caches."""
        tiny = self.work / "tiny3"
        if not (tiny / "a" / "x.png").exists():
            from PIL import Image

            (tiny / "a").mkdir(parents=True, exist_ok=True)
            im = Image.new("RGB", (8, 8), (10, 20, 30))
            im.save(tiny / "a" / "z.jpg")
            im.save(tiny / "a" / "y.webp")
            im.save(tiny / "a" / "x.png")
        return tiny

    # ----- driver
    def go(self, cases: list[str]) -> None:
        global _TMP
        _TMP = self.work / "tmp"
        _TMP.mkdir(exist_ok=True)
        self.fp_start = source_fingerprint()
        self.t0 = time.perf_counter()
        self.started = _dt.datetime.now(_dt.UTC)
        try:
            v = run([*self.dl, "--help"], env=self.dl_env, cwd=REPO, timeout=120)
            if v.rc != 0:
                self.say(f"warning: `{shlex.join(self.dl)} --help` exited {v.rc}: {v.stderr[-500:]}")
        except Exception as e:
            self.say(f"warning: cannot run {self.dl}: {e}")
        for c in cases:
            self.say(f"=== case {c}")
            t = time.perf_counter()
            try:
                getattr(self, f"case_{c}")()
            except Exception as e:
                tb = traceback.format_exc()
                self.say(f"case {c} FAILED: {tb}")
                self.rows.append(Row(c, f"{c}: case failed", ok=False, note=str(e).strip().splitlines()[0][:300]))
            self.log.append(f"{c}: {time.perf_counter() - t:.0f}s")
        self.total = time.perf_counter() - self.t0
        self.fp_end = source_fingerprint()
        if self.fp_end != self.fp_start:
            self.say(
                "WARNING: dlindex/ sources changed during the run; the figures mix versions: "
                + ", ".join(changed_files(self.fp_start, self.fp_end))
            )


def source_fingerprint() -> dict[str, str]:
    """sha256 (12 hex) of each of dlindex's sources, to notice when they change during a run."""
    import hashlib

    return {
        str(f.relative_to(REPO)): hashlib.sha256(f.read_bytes()).hexdigest()[:12]
        for f in sorted((REPO / "dlindex").rglob("*.py"))
    }


def fingerprint_text(fp: dict[str, str]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:12]


def changed_files(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def default_dlindex() -> list[str]:
    exe = shutil.which("dlindex")
    return [exe] if exe else [PY, "-m", "dlindex"]


def machine_info(b: Bench) -> dict:
    def cmd(c: str) -> str:
        try:
            return subprocess.run(c, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception:
            return "?"

    import PIL
    import xxhash

    cpu = cmd("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    mem = cmd("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo")
    fs = cmd(f"df -T {q(b.work)} | awk 'NR==2 {{print $2}}'")
    rev = cmd(f"git -C {q(REPO)} rev-parse --short HEAD 2>/dev/null") or "uncommitted"
    dirty = cmd(f"git -C {q(REPO)} status --porcelain 2>/dev/null | head -1")
    ver = cmd(
        f"cd {q(REPO)} && PYTHONPATH={q(REPO)} {q(PY)} -c 'import importlib.metadata as m; print(m.version(\"dlindex\"))' 2>/dev/null"
    )
    return {
        "date": b.started.strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem": mem,
        "os": f"{platform.system()} {platform.release()}",
        "fs": fs,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "pillow": PIL.__version__,
        "xxhash": xxhash.VERSION,
        "dlindex": f"{ver or '?'} (git {rev}{' + local changes' if dirty else ''})",
        "dlindex_cmd": shlex.join(b.dl_shown),
    }


def tree_size(b: Bench, name: str) -> str:
    p = b.trees.get(name)
    try:
        m = json.loads(p.with_name(p.name + ".complete").read_text())
        return f" ({m['bytes'] / 2**30:.2f} GiB)" if m["bytes"] > 2**30 else f" ({m['bytes'] / 2**20:.0f} MiB)"
    except Exception:
        return ""


def render(b: Bench, info: dict, argv: list[str]) -> str:
    s = b.spec
    lines = [
        START,
        "## Scan (`bench/bench_scan.py`)",
        "",
        f"Measured {info['date']} on {info['nproc']} cores ({info['cpu']}), {info['mem']} RAM, {info['os']}, "
        f"{info['fs']}; Python {info['python']}, SQLite {info['sqlite']}, Pillow {info['pillow']}, "
        f"xxhash {info['xxhash']}; dlindex {info['dlindex']}.",
        "",
        f"Every figure is the **median of {b.reps} run(s)** (the naive and HF baselines: {b.a.slow_reps}), each in a "
        "fresh process, timed wall-clock from outside (interpreter start-up included for dlindex and for the "
        "Python baselines). Each ratio is against a baseline measured in the same run, so it carries over "
        "between machines better than the absolute figures. Throughput ratios are baseline time / dlindex "
        "time (> 1: dlindex is faster).",
        "",
        md_table(b.rows),
        "",
        "Notes:",
        "",
        f"- Trees (`bench/make_trees.py`, seed {s.seed}): {s.big:,} ImageNet-like images in {s.big_classes} class "
        f"folders{tree_size(b, 'big')} (85 % JPEG, median ~31 KB, 5th-95th percentile ~7-190 KB; 10 % PNG; 5 % WebP); "
        f"{s.small:,} tiny PNG/JPEG images{tree_size(b, 'small')} (~0.6-2.3 KB) in {s.small_classes:,} folders; a real copy of "
        f"{s.subset:,} files of the first tree for the cold case; hard-linked prefixes of the tiny tree for RSS "
        "growth. Every file has distinct bytes.",
        "- *warm*: before every run the whole tree is read (`find | xargs cat`) so it is in the page cache; "
        "dlindex gets a fresh DB each run. *cold*: `sync; echo 3 > /proc/sys/vm/drop_caches` before every "
        "run; then a 3-file run of the same program re-warms only the interpreter and code, the data stays "
        "cold (the row 'incl. cold interpreter/imports' skips that). *rescan*: `find -printf` right before "
        "each run warms directories and inodes, the DB file is read into the cache too.",
        "- Peak RSS: `ru_maxrss` of the dlindex process via `/usr/bin/time -f %M` (the largest single process among it and "
        "its reaped children); the baseline column is the peak of the summed PSS of the whole process "
        "tree sampled every 20 ms (counts worker processes together, shared pages once).",
    ]
    lines.append(f"- Machine load: {QUIET.summary()}.")
    lines += [f"- Check: {c}." for c in b.checks]
    if b.fp_end != b.fp_start:
        ch = changed_files(b.fp_start, b.fp_end)
        lines.append(
            f"- **WARNING: {len(ch)} dlindex source file(s) changed during this run** ("
            + ", ".join(ch[:6])
            + (f" and {len(ch) - 6} more" if len(ch) > 6 else "")
            + "); the figures may mix versions."
        )
    else:
        lines.append(f"- dlindex sources fingerprint (sha256 over dlindex/**/*.py): {fingerprint_text(b.fp_start)}.")
    notes = [f"- {r.label}: {r.note}" for r in b.rows if r.note]
    lines += notes
    shown = set()
    for r in b.rows:  # every sample, so the spread behind each median is visible
        if r.unit == "s" and r.samples and id(r.samples) not in shown:
            shown.add(id(r.samples))
            parts = [
                f"{k} " + " ".join(f"{x:.2f}" for x in v) for k, v in r.samples.items() if isinstance(v, list) and v
            ]
            lines.append(f"- Samples (s), {r.case}: " + "; ".join(parts) + ".")
    lines += [
        "",
        "Reproduce (as root, from the repository root, in the venv):",
        "",
        "```sh",
        ". .venv/bin/activate && pip install -e . datasets   # datasets: benchmark-only",
        "python bench/make_trees.py" + (" --quick" if b.a.quick else "") + "   # once; reused while complete",
        ("python bench/bench_scan.py " + shlex.join(argv)).rstrip(),
        "```",
        "",
        "Exact commands of each case (`$W` = " + str(b.work) + "):",
        "",
    ]
    for c, cmds in b.commands.items():
        lines.append(f"- {c}: " + "; ".join(f"`{x}`" for x in cmds))
    lines += ["", f"Wall time of this run: {b.total / 60:.1f} min ({', '.join(b.log)}).", END]
    return "\n".join(lines)


def write_docs(path: Path, section: str) -> None:
    write_section(path, START, END, section)


def main(argv: list[str] | None = None) -> int:
    compile_sources()  # time dlindex as pip installs it, with its bytecode
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small trees, 1 rep, no docs (smoke test)")
    ap.add_argument("--cases", default=",".join(ALL_CASES), help=f"comma list of {','.join(ALL_CASES)}")
    ap.add_argument("--reps", type=int, help="repetitions per case (default 5; --quick: 1)")
    ap.add_argument("--slow-reps", type=int, help="repetitions for the naive and HF baselines (default 2; --quick: 1)")
    ap.add_argument("--dlindex", help="command to run dlindex (default: `dlindex` on PATH, else python -m dlindex)")
    ap.add_argument("--workers", type=int, help="pass --workers N to dlindex scan (default: dlindex's own)")
    ap.add_argument("--cold-threads", default="8,32,64", help="thread counts for the cold raw-read baseline")
    ap.add_argument("--naive-max-s", type=float, default=600, help="cap the naive run, extrapolate (0: no cap)")
    ap.add_argument(
        "--max-wait-idle",
        type=float,
        default=30,
        help="before each measured run wait up to this many s for other processes to go quiet (0: don't)",
    )
    ap.add_argument(
        "--retries",
        type=int,
        default=2,
        help="repeat a run (< 20 s) during which other processes used > 0.15 CPUs, up to N times",
    )
    ap.add_argument("--timeout", type=float, default=1800, help="per-command timeout, s")
    ap.add_argument("--work", help="work dir (default $DLINDEX_BENCH_DIR or /tmp/dlindex-bench)")
    ap.add_argument("--docs", help="markdown file to update (default docs/benchmarks.md; --quick: none)")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--big", action="store_true", help="size case: the 2M-file tree too (made once, ~8 GiB)")
    ap.add_argument("--big-cold", action="store_true", help="size case: a cold scan of the 2M-file tree too")
    ap.add_argument("--sizes", help="size case: comma list of tree sizes (default 100000,200000)")
    ap.add_argument("--size-work", help="size case: where the tiny-<N> trees live (default: the work dir)")
    a = ap.parse_args(argv)
    a.reps = a.reps or (1 if a.quick else 5)
    a.slow_reps = a.slow_reps or (1 if a.quick else 2)
    global QUIET
    QUIET = Quiet(a.max_wait_idle, retries=a.retries)
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in [*ALL_CASES, "size"]]
    if bad:
        ap.error(f"unknown case(s) {bad}; choose from {ALL_CASES}")
    b = Bench(a)
    b.say(f"dlindex command: {shlex.join(b.dl)}; work dir {b.work}; cases {cases}; reps {a.reps}")
    b.go(cases)
    info = machine_info(b)
    section = render(b, info, argv)
    print("\n" + section)
    stamp = b.started.strftime("%Y%m%d-%H%M%S")
    raw = b.work / f"bench_scan-{stamp}.json"
    raw.write_text(
        json.dumps(
            {
                "info": info,
                "argv": argv,
                "rows": [r.__dict__ for r in b.rows],
                "commands": b.commands,
                "dlindex_sources": {"start": b.fp_start, "end": b.fp_end},
                "load_before": QUIET.loads,
                "load_during": QUIET.during,
            },
            indent=1,
            default=str,
        )
    )
    b.say(f"raw results: {raw}")
    docs = None if a.no_docs else (Path(a.docs) if a.docs else (None if a.quick else REPO / "docs" / "benchmarks.md"))
    if docs:
        if cases != ["size"]:
            write_docs(docs, section)
        if getattr(b, "size_section", None):
            print("\n" + b.size_section)
            scan_size.write_docs(docs, b.size_section)
        b.say(f"wrote {docs}")
    return 0 if all(r.ok is not False for r in b.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
