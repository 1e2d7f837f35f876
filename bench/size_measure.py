"""How bench/bench_size.py measures one command: a fresh process, its CPU seconds (os.wait4: the
process and every descendant it waited for), wall seconds, and the peak RSS of its whole process
tree, polled from /proc.

Why /proc and not the cgroup: this machine's memory controller is cgroup v1 (no ``memory.peak``),
and v1's ``memory.max_usage_in_bytes`` counts the page cache the command reads through: a 3 GB
catalog read once would show as 3 GB. The poll sums VmRSS (anonymous + file-mapped + shared
pages) of the command and every descendant every ``POLL_S`` seconds; a peak shorter than that can
be missed, so the largest single process's own peak (``ru_maxrss`` from wait4, exact) is kept
too, and the figure reported is the larger of the two. Beside it, the tree's peak Pss (the
"Pss:" line of /proc/PID/smaps_rollup, summed): a page that n processes share counts 1/n in
each, so forked workers that share their parent's pages (python, torch, a memory-mapped plan)
are counted once in all, where the RSS sum counts them once per process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

POLL_S = 0.1


def tree_rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` and every descendant, KiB."""
    return _tree_sum(pid, "status", "VmRSS:")


def tree_pss_kib(pid: int) -> int:
    """Pss of ``pid`` and every descendant, KiB: shared pages counted once in all."""
    return _tree_sum(pid, "smaps_rollup", "Pss:")


def _tree_sum(pid: int, name: str, field: str) -> int:
    """One ``field`` (KiB) of /proc/PID/``name`` summed over ``pid`` and its descendants; a
    process gone meanwhile counts 0."""
    total = 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/{name}") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith(field)), 0)
        except (OSError, ValueError, IndexError):
            pass
    return total


def _tree(pid: int) -> list[int]:
    """``pid`` and every descendant (from /proc/*/stat's parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


class Failed(Exception):
    """A measured command exited non-zero or ran past its time limit."""


def measure(
    cmd: list[str], *, env: dict[str, str], cwd: Path, stdout: IO[bytes] | int | None = None,
    timeout_s: float = 600.0, ok_codes: tuple[int, ...] = (0,), watch: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run ``cmd`` once: wall_s, cpu_s (user + system), peak_rss_mb (tree), max_rss_mb (largest
    process), peak_pss_mb (tree, polled), read_mb and write_mb (bytes the process tree caused to be
    read from and written to storage, wait4's ru_inblock and ru_oublock: /proc/PID/io's read_bytes
    and write_bytes), and with ``watch`` the largest size that file reached while it ran
    (watch_peak_mb; a -wal log)."""
    began = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL if stdout is None else stdout,
        stderr=subprocess.PIPE, start_new_session=True,  # its own group: a timeout kills the whole tree
    )  # fmt: skip
    peak = peak_pss = watched = 0
    done = threading.Event()
    timed_out = threading.Event()

    def poll() -> None:
        nonlocal peak, peak_pss, watched
        while not done.wait(POLL_S):
            peak = max(peak, tree_rss_kib(proc.pid))
            peak_pss = max(peak_pss, tree_pss_kib(proc.pid))
            if watch is not None:
                with contextlib.suppress(OSError):
                    watched = max(watched, watch.stat().st_size)
            if time.perf_counter() - began > timeout_s and not timed_out.is_set():
                timed_out.set()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    assert proc.stderr is not None
    err = proc.stderr.read()  # the child's stderr is small (summaries, progress off: not a TTY)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - began
    done.set()
    poller.join()
    if timed_out.is_set():
        raise Failed(f"over the {timeout_s:.0f} s limit (killed)")
    if proc.returncode not in ok_codes:
        raise Failed(f"exit {proc.returncode}: {err.decode(errors='replace').strip()[-400:]}")
    max_rss = usage.ru_maxrss / 1024
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(max(peak / 1024, max_rss), 1),
        "max_rss_mb": round(max_rss, 1),
        "peak_pss_mb": round(peak_pss / 1024, 1),
        "read_mb": round(usage.ru_inblock * 512 / 1e6, 1),
        "write_mb": round(usage.ru_oublock * 512 / 1e6, 1),
        **({"watch_peak_mb": round(watched / 1e6, 1)} if watch is not None else {}),
        "rc": proc.returncode,
        "stderr_tail": err.decode(errors="replace").strip()[-300:],
    }
