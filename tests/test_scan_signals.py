"""A scan killed at any moment leaves a consistent catalog, and the next scan finishes the work."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from .conftest import make_png

FILES = 5000


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("signals") / "images"
    image = Image.new("RGB", (24, 24))
    for i in range(FILES):
        folder = root / f"class{i % 20:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        image.putpixel((i % 24, (i // 24) % 24), (i % 256, 7, 7))
        image.save(folder / f"{i:05d}.png")
    return root


def _start_scan(root: Path, db: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "dlindex", "scan", str(root), "--db", str(db), "--workers", "1", "--verify"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait_for_rows(db: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
            count = conn.execute("SELECT count(*) FROM image_metadata").fetchone()[0]
            conn.close()
            if count:
                return int(count)
        except sqlite3.Error:
            pass
        time.sleep(0.005)
    return 0


def _check_consistent(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        total, distinct = conn.execute("SELECT count(*), count(DISTINCT file_path) FROM image_metadata").fetchone()
        assert total == distinct, "no duplicate rows"
        incomplete = conn.execute("SELECT count(*) FROM image_metadata WHERE xxh3_128 IS NULL").fetchone()[0]
        assert incomplete == 0, "no half-written rows"
        return int(total)
    finally:
        conn.close()


def _rescan(root: Path, db: Path) -> dict[str, object]:
    import json

    done = subprocess.run(
        [sys.executable, "-m", "dlindex", "scan", str(root), "--db", str(db), "--json"],
        capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(done.stdout)


def _workers_of(db: Path) -> list[int]:
    alive = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if os.fsencode(db) in f.read():
                        alive.append(int(pid))
            except OSError:
                pass
    return alive


@pytest.mark.timeout(180)
def test_kill_9_mid_scan_then_rescan_completes(big_tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "kill9.db"
    proc = _start_scan(big_tree, db)
    seen = _wait_for_rows(db, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert 0 < seen < FILES, "the kill should land mid-scan"
    written = _check_consistent(db)
    assert written < FILES
    time.sleep(0.5)
    assert _workers_of(db) == [], "workers die with their parent"
    summary = _rescan(big_tree, db)
    assert summary["new"] == FILES - written
    assert summary["unchanged"] == written
    assert _check_consistent(db) == FILES


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_stop_cleanly(big_tree: Path, tmp_path: Path, signum: signal.Signals) -> None:
    db = tmp_path / f"sig{int(signum)}.db"
    proc = _start_scan(big_tree, db)
    _wait_for_rows(db, proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: scan interrupted"), stderr
    assert "Traceback" not in stderr.decode()
    written = _check_consistent(db)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT state FROM scans").fetchall() == [("interrupted",)]
    conn.close()
    summary = _rescan(big_tree, db)
    assert (summary["new"], summary["unchanged"]) == (FILES - written, written)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


def _kill_as_it_forks(args: list[str], nth: int) -> int:
    """Run dlindex ARGS, stop its ``nth`` worker the moment it is forked (before it can ask the
    kernel to follow its parent), kill -9 the parent, let the worker go on; the worker's pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlindex", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    seen: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while len(seen) <= nth and time.monotonic() < deadline and proc.poll() is None:
            seen += [child for child in _children(proc.pid) if child not in seen]
        assert len(seen) > nth, f"dlindex {args[0]} forked only {len(seen)} worker(s)"
        worker = seen[nth]
        os.kill(worker, signal.SIGSTOP)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    os.kill(worker, signal.SIGCONT)
    return worker


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return True  # dead, waiting for its new parent to reap it
        except OSError:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["scan", "features"])
def test_workers_die_with_a_parent_killed_as_they_fork(image_tree: Path, tmp_path: Path, command: str) -> None:
    db = tmp_path / "orphans.db"
    if command == "features":
        for i in range(300):  # enough work that the parent is still running when its second worker forks
            make_png(image_tree / "cat" / f"more{i:03d}.png", (16, 16), (i % 256, 0, 0))
        _rescan(image_tree, db)
        args = ["features", "compute", "--type", "colorhist", "--workers", "2", "--db", str(db)]
    else:
        args = ["scan", str(image_tree), "--workers", "2", "--db", str(db)]
    for nth in (0, 1):  # the first worker forked, and one forked while another already runs
        worker = _kill_as_it_forks(args, nth)
        try:
            assert _gone(worker, 3.0), f"worker {worker} outlived its killed parent"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
