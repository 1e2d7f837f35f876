"""features export: kill -9 or SIGTERM mid-write leaves no temporary file behind for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from dlindex import Catalog
from dlindex.features import ComputeOptions, compute_features, export_features
from dlindex.pids import host_tag as _host
from dlindex.pids import process_start

REPO = Path(__file__).resolve().parents[1]

SLOW_EXPORT = """
import sys, time
import numpy as np
from dlindex import Catalog
from dlindex.features import storage

real = storage._write_npz
def slow_write_npz(f, arrays):
    f.write(b"half an npz")
    f.flush()
    print("writing", flush=True)
    time.sleep(60)
    real(f, arrays)
storage._write_npz = slow_write_npz
with Catalog(sys.argv[1]) as catalog:
    try:
        storage.export_features(catalog, "colorhist", sys.argv[2])
    except Exception as e:
        print(type(e).__name__, e, flush=True)
        sys.exit(130)
"""


def computed(db: Path) -> Path:
    with Catalog(db) as catalog:
        compute_features(catalog, "colorhist", None, ComputeOptions(workers=1))
    return db


def start_slow(db: Path, out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_EXPORT, str(db), str(out)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n", proc.stderr.read() if proc.stderr else ""
    return proc


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_kill_9_leftover_is_removed_by_the_next_export(scanned_db: Path, tmp_path: Path) -> None:
    computed(scanned_db)
    out = tmp_path / "out" / "colorhist.npz"
    out.parent.mkdir()
    proc = start_slow(scanned_db, out)
    assert len(temps(out.parent)) == 1
    proc.kill()
    proc.wait()
    (leftover,) = temps(out.parent)
    assert leftover.startswith(".colorhist.npz.dlx-")
    with Catalog(scanned_db) as catalog:
        export_features(catalog, "colorhist", out)
    assert temps(out.parent) == [] and not out.with_name(leftover).exists()
    with np.load(out) as z:
        assert z["vectors"].shape == (6, 96)


def test_sigterm_mid_export_cleans_up_and_says_so(scanned_db: Path, tmp_path: Path) -> None:
    computed(scanned_db)
    out = tmp_path / "colorhist.npz"
    proc = start_slow(scanned_db, out)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Interrupted features export interrupted" in stdout
    assert temps(tmp_path) == [] and not out.exists()


def test_only_dead_processes_files_of_this_form_are_removed(scanned_db: Path, tmp_path: Path) -> None:
    computed(scanned_db)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = process_start(dead.pid)
    dead.wait()
    host = _host()
    mine = f".colorhist.npz.dlx-{host}-{os.getpid()}-{process_start(os.getpid())}-abc123.tmp"
    gone = f".other.npz.dlx-{host}-{dead.pid}-{dead_start}-def456.tmp"
    reused = f".x.npz.dlx-{host}-{os.getpid()}-{process_start(os.getpid()) + 1}-ghi789.tmp"  # our pid, not our start
    elsewhere = f".y.npz.dlx-{'0' * 8 if host != '0' * 8 else '1' * 8}-{dead.pid}-{dead_start}-jkl012.tmp"
    users = [".colorhist.npz.bak", "notes.tmp", f".z.npz.dlx-{host}-{dead.pid}-{dead_start}-x.tmp.keep"]
    for name in (mine, gone, reused, elsewhere, *users):
        (tmp_path / name).write_bytes(b"x")
    link = f".l.npz.dlx-{host}-{dead.pid}-{dead_start}-lnk.tmp"
    os.symlink(tmp_path / "notes.tmp", tmp_path / link)
    with Catalog(scanned_db) as catalog:
        export_features(catalog, "colorhist", tmp_path / "colorhist.npz")
    left = {p.name for p in tmp_path.iterdir()}
    assert gone not in left and reused not in left
    assert {mine, elsewhere, link, *users} <= left
