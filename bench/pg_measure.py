"""Run one command and measure it and a PostgreSQL server beside it (bench_postgres_size.py).

``measure(cmd)`` runs ``cmd`` in a fresh process and samples, every 0.1 s, the resident memory
of its whole process tree (the sum over the command and every process it started) and of the
server's processes (the largest backend, and the sum; backends share the server's buffers, so
the sum counts those pages once per process that touched them). It reports the tree's CPU
seconds (``os.wait4``: the command and the children it waited for), the server's CPU seconds
over the same time (its live processes plus what the postmaster reaped), wall seconds, and a
sha256 of stdout (``replace`` rewrites bytes first, so that two catalogs under different roots
hash alike).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int, int, int, int] | None:
    """(ppid, utime + stime, cutime + cstime, rss bytes) of ``pid``, ticks; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    ppid, utime, stime, cutime, cstime, rss = (int(fields[i]) for i in (1, 11, 12, 13, 14, 21))
    return ppid, utime + stime, cutime + cstime, rss * _PAGE, pid


def _all() -> dict[int, tuple[int, int, int, int, int]]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                found[int(name)] = st
    return found


def _descendants(procs: dict[int, tuple[int, int, int, int, int]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, st in procs.items():
        children.setdefault(st[0], []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def server_cpu_ticks(postmaster: int | None) -> int:
    if postmaster is None:
        return 0
    procs = _all()
    own = procs.get(postmaster)
    reaped = own[2] if own else 0
    return reaped + sum(procs[p][1] for p in _descendants(procs, postmaster))


def measure(
    cmd: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None, postmaster: int | None = None,
    replace: tuple[bytes, bytes] | None = None, interval: float = 0.1,
) -> dict[str, Any]:  # fmt: skip
    """Run ``cmd`` (stdout hashed, stderr kept); figures as the module docstring says."""
    server_before = server_cpu_ticks(postmaster)
    # GNU time's %M: the largest process's exact peak (a child forked from this process would
    # start its ru_maxrss at this process's size); the sampling adds the tree's sum
    fd, peak_file = tempfile.mkstemp(prefix="pg-measure-")
    os.close(fd)
    cmd = ["/usr/bin/time", "-f", "%M", "-o", peak_file, *cmd]
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    assert proc.stdout is not None and proc.stderr is not None
    peak = {"tree": 0, "server_max": 0, "server_sum": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            procs = _all()
            tree = sum(procs[p][3] for p in _descendants(procs, proc.pid))
            peak["tree"] = max(peak["tree"], tree)
            if postmaster is not None:
                backends = [procs[p][3] for p in _descendants(procs, postmaster) if p != postmaster]
                peak["server_max"] = max(peak["server_max"], max(backends, default=0))
                peak["server_sum"] = max(peak["server_sum"], sum(backends))
            done.wait(interval)

    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))  # type: ignore[union-attr]
    sampler = threading.Thread(target=sample)
    reader.start()
    sampler.start()
    digest = hashlib.sha256()
    out_bytes = 0
    tail = b""
    while True:
        chunk = proc.stdout.read(1 << 20)
        if not chunk:
            break
        out_bytes += len(chunk)
        if replace is None:
            digest.update(chunk)
        else:  # keep the last len(old) - 1 bytes back: a root may straddle two chunks
            data = (tail + chunk).replace(replace[0], replace[1])
            keep = len(replace[0]) - 1
            digest.update(data[:-keep] if keep else data)
            tail = data[-keep:] if keep else b""
    digest.update(tail)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - began
    done.set()
    sampler.join()
    reader.join()
    code = os.waitstatus_to_exitcode(status)
    try:
        largest = int(Path(peak_file).read_text().split()[-1]) * 1024
    except (OSError, ValueError, IndexError):
        largest = 0
    os.unlink(peak_file)
    return {
        "rc": code,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "wall_s": round(wall, 2),
        "rss_mb": round(max(peak["tree"], largest) / 2**20, 1),
        "server_cpu_s": round((server_cpu_ticks(postmaster) - server_before) / _TICK, 2) if postmaster else None,
        "server_rss_mb": round(peak["server_max"] / 2**20, 1) if postmaster else None,
        "server_sum_mb": round(peak["server_sum"] / 2**20, 1) if postmaster else None,
        "stdout_bytes": out_bytes,
        "sha256": digest.hexdigest()[:16],
        "stderr": err[0].decode(errors="replace")[-2000:] if err else "",
    }
