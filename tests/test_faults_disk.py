"""Real small filesystems: a full disk (ENOSPC) in every write path, and read-only mounts.

Each test runs dlindex in a user + mount namespace (``unshare -Urm``) with a fresh tmpfs,
filled with a file until the kernel says ENOSPC, so the failure is the real one, from the
real syscalls SQLite, Python and pyarrow make. Where namespaces or tmpfs mounts are not
allowed (some CI sandboxes), the tests skip and say why.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from dlindex import Catalog, ScanOptions, scan_tree

from .conftest import make_png

REPO = Path(__file__).resolve().parents[1]
DLX = f"{sys.executable} -m dlindex"


def _namespaces_work(tmp: Path) -> str | None:
    """None if a tmpfs can be mounted in a user+mount namespace here, else the reason."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    mnt = tmp / "probe"
    mnt.mkdir()
    try:
        proc = subprocess.run(
            ["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs '{mnt}'"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    if proc.returncode != 0:
        return f"cannot mount a tmpfs in a user namespace here: {proc.stderr.strip() or proc.returncode}"
    return None


@pytest.fixture(scope="module")
def namespace(tmp_path_factory: pytest.TempPathFactory) -> None:
    reason = _namespaces_work(tmp_path_factory.mktemp("ns"))
    if reason is not None:
        pytest.skip(reason)


def run_on_tmpfs(
    tmp_path: Path, script: str, *, size: str = "16m", env: dict[str, str] | None = None
) -> dict[str, str]:
    """Run bash ``script`` with a fresh tmpfs of ``size`` at ``$M``; ``fill`` fills it up,
    ``unfill`` frees it. Lines ``key=value`` it prints come back as a dict; stderr of each
    command should go to files under ``$OUT`` (on the normal disk)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    prologue = f"""
M='{mnt}'; OUT='{tmp_path}'; DLX='{DLX}'
mount -t tmpfs -o size={size} tmpfs "$M" || exit 97
fill() {{ dd if=/dev/zero of="$M/filler" bs=4k 2>/dev/null; true; }}
unfill() {{ rm -f "$M/filler"; }}
"""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "DLINDEX_NO_LOG": "", **(env or {})}
    proc = subprocess.run(
        ["unshare", "-Urm", "bash", "-c", prologue + script], capture_output=True, text=True, env=full_env, timeout=300
    )
    assert proc.returncode != 97, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    found = dict(
        line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and " " not in line.split("=")[0]
    )
    found["_stderr"] = proc.stderr
    return found


def one_error_line(path: Path, *words: str) -> str:
    text = path.read_text()
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, text
    for word in words:
        assert word in errors[0], errors[0]
    assert "cannot rollback" not in text
    return errors[0]


def healthy(db: Path) -> dict[str, object]:
    from dlindex.catalog.check import check_catalog

    report = check_catalog(db)
    # The file is whole; a synthetic catalog's root (/data/train) is not on this machine.
    assert [p for p in report.problems if p not in report.unreachable_roots] == [], report.problems
    return report.as_dict()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for i in range(40):
        make_png(root / ("cat" if i % 2 else "dog") / f"{i:03d}.png", (24 + i, 24), (i * 5 % 255, 9, 9))
    return root


@pytest.fixture
def catalog(tmp_path: Path, tree: Path) -> Path:
    db = tmp_path / "c.db"
    with Catalog(db, create=True) as c:
        scan_tree(c, tree, ScanOptions(workers=1))
    return db


def _processed(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM image_metadata WHERE processed = 1").fetchone()[0])
    finally:
        conn.close()


def test_scan_on_a_full_disk_fails_in_one_line_keeps_the_catalog_and_reruns(
    namespace: None, tmp_path: Path, tree: Path, catalog: Path
) -> None:
    new = tmp_path / "more"
    for i in range(60):
        make_png(new / "bird" / f"{i:03d}.png", (30 + i, 30), (9, i * 3 % 255, 9))
    out = run_on_tmpfs(tmp_path, f"""
cp '{catalog}' "$M/c.db"
fill
$DLX scan '{new}' --db "$M/c.db" -q -w 1 2>"$OUT/err1"; echo rc1=$?
cp "$M/c.db" "$OUT/after-fail.db"; cp "$M/c.db-wal" "$OUT/after-fail.db-wal" 2>/dev/null
unfill
$DLX scan '{new}' --db "$M/c.db" -q -w 1 --json >"$OUT/scan2.json" 2>"$OUT/err2"; echo rc2=$?
$DLX check --db "$M/c.db" --json >"$OUT/check.json"; echo rc3=$?
sqlite3 "$M/c.db" "SELECT count(*) FROM scans WHERE state = 'running'" | sed 's/^/running=/'
""")  # fmt: skip
    assert out["rc1"] == "4", out
    one_error_line(tmp_path / "err1", "disk full", str(tmp_path / "mnt"))
    healthy(tmp_path / "after-fail.db")  # consistent right after the failure
    assert (out["rc2"], out["rc3"], out["running"]) == ("0", "0", "0"), out
    assert json.loads((tmp_path / "scan2.json").read_text())["seen"] == 60


def test_mark_on_a_full_disk_changes_nothing_then_completes(namespace: None, tmp_path: Path, catalog: Path) -> None:
    (tmp_path / "ids").write_text("".join(f"{i}\n" for i in range(1, 41)))
    out = run_on_tmpfs(tmp_path, f"""
cp '{catalog}' "$M/c.db"
fill
$DLX mark --processed --db "$M/c.db" "$OUT/ids" 2>"$OUT/err1"; echo rc1=$?
cp "$M/c.db" "$OUT/after-fail.db"
unfill
$DLX mark --processed --db "$M/c.db" "$OUT/ids" >/dev/null 2>"$OUT/err2"; echo rc2=$?
cp "$M/c.db" "$OUT/after-rerun.db"
""")  # fmt: skip
    assert out["rc1"] == "4", out
    one_error_line(tmp_path / "err1", "disk full")
    healthy(tmp_path / "after-fail.db")
    assert _processed(tmp_path / "after-fail.db") == 0  # all or nothing
    assert out["rc2"] == "0", (tmp_path / "err2").read_text()
    assert _processed(tmp_path / "after-rerun.db") == 40


def test_features_import_and_log_import_on_a_full_disk(namespace: None, tmp_path: Path, catalog: Path) -> None:
    np.savez(
        tmp_path / "v.npz", ids=np.arange(1, 41), vectors=np.random.default_rng(0).random((40, 256), dtype=np.float32)
    )
    (tmp_path / "trace.sql").write_text("SELECT * FROM image_metadata WHERE label_id = 1;\n" * 50)
    out = run_on_tmpfs(tmp_path, f"""
cp '{catalog}' "$M/c.db"
fill
$DLX features import --type emb "$OUT/v.npz" --db "$M/c.db" 2>"$OUT/err1"; echo rc1=$?
$DLX log import "$OUT/trace.sql" --db "$M/c.db" 2>"$OUT/err2"; echo rc2=$?
cp "$M/c.db" "$OUT/after-fail.db"
unfill
$DLX features import --type emb "$OUT/v.npz" --db "$M/c.db" >/dev/null 2>"$OUT/err3"; echo rc3=$?
$DLX log import "$OUT/trace.sql" --db "$M/c.db" >/dev/null 2>"$OUT/err4"; echo rc4=$?
cp "$M/c.db" "$OUT/after-rerun.db"
""")  # fmt: skip
    assert (out["rc1"], out["rc2"]) == ("4", "4"), out
    one_error_line(tmp_path / "err1", "disk full")
    one_error_line(tmp_path / "err2", "disk full")
    healthy(tmp_path / "after-fail.db")
    assert (out["rc3"], out["rc4"]) == ("0", "0"), (tmp_path / "err3").read_text() + (tmp_path / "err4").read_text()
    conn = sqlite3.connect(tmp_path / "after-rerun.db")
    assert conn.execute("SELECT count(*) FROM image_features").fetchone()[0] == 40
    conn.close()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "dali", "wds", "mds"])
def test_export_to_a_full_disk_is_one_line_and_the_catalog_is_untouched(
    namespace: None, tmp_path: Path, catalog: Path, fmt: str
) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    if fmt == "mds":
        pytest.importorskip("streaming")
    before = catalog.read_bytes()
    out = run_on_tmpfs(tmp_path, f"""
fill
$DLX export "$M/out" --format {fmt} --db '{catalog}' -q 2>"$OUT/err1"; echo rc1=$?
cp '{catalog}' "$OUT/after-fail.db"
unfill
$DLX export "$M/out2" --format {fmt} --db '{catalog}' -q >/dev/null 2>"$OUT/err2"; echo rc2=$?
""", size="4m", env={"DLINDEX_NO_LOG": "1"})  # fmt: skip
    assert out["rc1"] == "4", out
    one_error_line(tmp_path / "err1", "disk full")
    # A failed export leaves no trace in the catalog, not even a record of itself.
    assert (tmp_path / "after-fail.db").read_bytes() == before, "a failed export changed the catalog"
    assert out["rc2"] == "0", (tmp_path / "err2").read_text()
    healthy(catalog)
    # The export that succeeds adds its own record (for loaders that look for one) and nothing else.
    assert _dump_without_exports(catalog) == _dump_without_exports(tmp_path / "after-fail.db")
    conn = sqlite3.connect(catalog)
    assert conn.execute("SELECT format, samples FROM exports").fetchall() == [(fmt, 40)]
    conn.close()


def _dump_without_exports(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [line for line in conn.iterdump() if '"exports"' not in line]
    finally:
        conn.close()


def test_full_tmpdir_names_the_temporary_folder(namespace: None, tmp_path: Path) -> None:
    from .synthetic import Row, make_catalog

    db = make_catalog(tmp_path / "big.db", [Row(f"l{i % 5}") for i in range(2000)])
    (tmp_path / "ids").write_text("".join(f"{i}\n" for i in range(1, 700_001)))  # a staging table of ~7 MB
    out = run_on_tmpfs(tmp_path, f"""
SQLITE_TMPDIR="$M" TMPDIR="$M" $DLX mark --processed --db '{db}' "$OUT/ids" >/dev/null 2>"$OUT/err1"; echo rc1=$?
$DLX mark --processed --db '{db}' "$OUT/ids" >/dev/null 2>"$OUT/err2"; echo rc2=$?
""", size="256k")  # fmt: skip
    assert out["rc1"] == "4", out
    line = one_error_line(tmp_path / "err1", "disk full", str(tmp_path / "mnt"), "TMPDIR")
    assert "cannot rollback" not in line
    assert out["rc2"] == "0", (tmp_path / "err2").read_text()
    assert _processed(db) == 2000


def test_read_only_mount_every_read_works_and_writes_say_read_only(
    namespace: None, tmp_path: Path, catalog: Path
) -> None:
    (tmp_path / "ids").write_text("1\n2\n")
    np.savez(tmp_path / "v.npz", ids=np.arange(1, 3), vectors=np.ones((2, 8), dtype=np.float32))
    reads = {
        "stats": "stats", "query": "query --format paths", "export": 'export "$OUT/exp" --format jsonl -q',
        "features_list": "features list", "log": "log show", "index": "index --suggest", "check": "check",
    }  # fmt: skip
    writes = {
        "mark": 'mark --processed "$OUT/ids"', "scan": "scan '{}' -q -w 1".format(tmp_path / "tree"),
        "log_clear": "log clear", "features_import": 'features import --type emb "$OUT/v.npz"',
    }  # fmt: skip
    lines = [f"cp '{catalog}' \"$M/c.db\"", 'mount -o remount,ro "$M"']
    for name, cmd in {**reads, **writes}.items():
        lines.append(f'$DLX {cmd} --db "$M/c.db" >"$OUT/{name}.out" 2>"$OUT/{name}.err"; echo {name}=$?')
    lines.append('ls "$M" | tr "\\n" " " | sed "s/^/files=/"; echo')
    out = run_on_tmpfs(tmp_path, "\n".join(lines))
    for name in reads:
        err = (tmp_path / f"{name}.err").read_text()
        assert out[name] == "0", (name, err)
        assert "not readable" not in err and "Error" not in err, (name, err)
        assert len(err.splitlines()) <= 1, (name, err)  # at most the one read-only warning
    assert (tmp_path / "query.out").read_text().count("\n") == 40
    for name in writes:
        line = one_error_line(tmp_path / f"{name}.err", "read-only")
        assert "not readable" not in line
        assert out[name] != "0"
    assert out["files"].split() == ["c.db"]  # no -wal, -shm or journal could be left


def test_catalog_in_a_read_only_folder_of_another_user(request: pytest.FixtureRequest, catalog: Path) -> None:
    """The case of another user's catalog: readable, neither it nor its folder writable."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1) to run as another user")
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own folder is private to root
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    os.chmod(top, 0o755)
    shared = top / "shared"
    shared.mkdir()
    shutil.copy(catalog, shared / "c.db")
    os.chmod(shared / "c.db", 0o444)
    os.chmod(shared, 0o555)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*nobody, sys.executable, "-m", "dlindex", *args, "--db", str(shared / "c.db")],
                              capture_output=True, text=True, env=env, input="1\n", timeout=120)  # fmt: skip

    for args in (["stats"], ["query", "--format", "paths"], ["features", "list"], ["check"]):
        proc = run(*args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Error" not in proc.stderr and "not readable" not in proc.stderr
    code = (
        "import warnings, dlindex; warnings.simplefilter('error', dlindex.DlindexWarning)\n"
        f"c = dlindex.Catalog({str(shared / 'c.db')!r}, log=False)\n"
        "print(c.readonly_reason, sum(1 for _ in dlindex.query_rows(c)))"
    )
    lib = subprocess.run([*nobody, sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert lib.returncode == 0 and lib.stdout.split()[-1] == "40", lib.stderr
    assert "not writable" in lib.stdout
    proc = run("mark", "--processed")
    assert proc.returncode == 1 and proc.stderr.startswith("Error: catalog") and "read-only" in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert sorted(os.listdir(shared)) == ["c.db"]


def test_features_compute_and_export_on_a_full_disk(namespace: None, tmp_path: Path, catalog: Path) -> None:
    out = run_on_tmpfs(tmp_path, f"""
cp '{catalog}' "$M/c.db"
fill
$DLX features compute --type colorhist --db "$M/c.db" -w 1 -q 2>"$OUT/err1"; echo rc1=$?
cp "$M/c.db" "$OUT/after-fail.db"
unfill
$DLX features compute --type colorhist --db "$M/c.db" -w 1 -q 2>"$OUT/err2"; echo rc2=$?
cp "$M/c.db" "$OUT/after-rerun.db"
fill
$DLX features export --type colorhist "$M/hist.npz" --db "$M/c.db" 2>"$OUT/err3"; echo rc3=$?
ls -a "$M" | grep -c dlx | sed 's/^/temps=/'
unfill
$DLX features export --type colorhist "$M/hist.npz" --db "$M/c.db" >/dev/null 2>"$OUT/err4"; echo rc4=$?
cp "$M/hist.npz" "$OUT/hist.npz"
""")  # fmt: skip
    assert out["rc1"] == "4", out
    one_error_line(tmp_path / "err1", "disk full")
    healthy(tmp_path / "after-fail.db")
    assert out["rc2"] == "0", (tmp_path / "err2").read_text()
    conn = sqlite3.connect(tmp_path / "after-rerun.db")
    assert conn.execute("SELECT count(*) FROM image_features").fetchone()[0] == 40
    conn.close()
    assert out["rc3"] == "4", out
    one_error_line(tmp_path / "err3", "disk full")
    assert out["temps"] == "0", out  # no half-written temporary file left on the full disk
    assert out["rc4"] == "0", (tmp_path / "err4").read_text()
    assert np.load(tmp_path / "hist.npz")["vectors"].shape[0] == 40


def test_features_export_when_the_disk_fills_partway(namespace: None, tmp_path: Path, catalog: Path) -> None:
    # 40 x 96 float32 (15 KiB and more) into 8 KiB of free space: the write fails mid-member
    out = run_on_tmpfs(tmp_path, f"""
$DLX features compute --type colorhist --db '{catalog}' -w 1 -q 2>"$OUT/err0"; echo rc0=$?
fill
truncate -s -8K "$M/filler"
$DLX features export --type colorhist "$M/hist.npz" --db '{catalog}' 2>"$OUT/err1"; echo rc1=$?
ls -a "$M" | grep -c dlx | sed 's/^/temps=/'
""")  # fmt: skip
    assert out["rc0"] == "0", (tmp_path / "err0").read_text()
    assert out["rc1"] == "4", out
    one_error_line(tmp_path / "err1", "disk full")
    assert "Exception ignored" not in (tmp_path / "err1").read_text()
    assert out["temps"] == "0", out


def test_index_apply_and_the_advisors_scratch_copy_on_a_full_disk(namespace: None, tmp_path: Path) -> None:
    from .advisor_workload import make_catalog as make_logged
    from .advisor_workload import run_workload, snapshot

    db = make_logged(tmp_path / "logged.db")
    run_workload(db)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = snapshot(db)
    out = run_on_tmpfs(tmp_path, f"""
export DLINDEX_CACHE_DIR="$OUT/cache"
cp '{db}' "$M/c.db"
fill
$DLX index --apply --db "$M/c.db" >/dev/null 2>"$OUT/err1"; echo rc1=$?
cp "$M/c.db" "$OUT/after-fail.db"
unfill
$DLX index --apply --db "$M/c.db" --json >"$OUT/applied.json" 2>"$OUT/err2"; echo rc2=$?
cp "$M/c.db" "$OUT/after-rerun.db"
rm -f "$M/c.db"*
fill
TMPDIR="$M" SQLITE_TMPDIR="$M" $DLX index --suggest --db '{db}' >/dev/null 2>"$OUT/err3"; echo rc3=$?
ls "$M" | grep -c dlindex-advisor | sed 's/^/scratch=/'
""", size="64m")  # fmt: skip
    assert out["rc1"] == "4", out
    one_error_line(tmp_path / "err1", "disk full")
    healthy(tmp_path / "after-fail.db")
    assert snapshot(tmp_path / "after-fail.db")[0] == before[0]  # no index half-built
    assert out["rc2"] == "0", (tmp_path / "err2").read_text()
    created = json.loads((tmp_path / "applied.json").read_text())["applied"]
    assert created, created
    healthy(tmp_path / "after-rerun.db")
    assert out["rc3"] == "4", out
    one_error_line(tmp_path / "err3", "disk full", "TMPDIR")
    assert out["scratch"] == "0", out
    assert snapshot(db) == before


def test_merge_on_a_full_disk_fails_in_one_line_and_merges_nothing(
    namespace: None, tmp_path: Path, catalog: Path
) -> None:
    new = tmp_path / "more"
    for i in range(60):
        make_png(new / "bird" / f"{i:03d}.png", (30 + i, 30), (9, i * 3 % 255, 9))
    parts = [tmp_path / f"part{i}.db" for i in range(2)]
    out = run_on_tmpfs(tmp_path, f"""
$DLX scan '{new}' --db '{parts[0]}' --part 0/2 -q -w 1 && $DLX scan '{new}' --db '{parts[1]}' --part 1/2 -q -w 1
cp '{catalog}' "$M/c.db"
fill
$DLX merge '{parts[0]}' '{parts[1]}' --into "$M/c.db" -q 2>"$OUT/err1"; echo rc1=$?
cp "$M/c.db" "$OUT/after-fail.db"; cp "$M/c.db-wal" "$OUT/after-fail.db-wal" 2>/dev/null
unfill
$DLX merge '{parts[0]}' '{parts[1]}' --into "$M/c.db" --json >"$OUT/merge.json" 2>"$OUT/err2"; echo rc2=$?
""")  # fmt: skip
    assert out["rc1"] == "4", out
    one_error_line(tmp_path / "err1", "disk full")
    healthy(tmp_path / "after-fail.db")
    conn = sqlite3.connect(tmp_path / "after-fail.db")
    assert conn.execute("SELECT count(*) FROM roots WHERE path = ?", (str(new),)).fetchone()[0] == 0  # nothing merged
    conn.close()
    assert out["rc2"] == "0", (tmp_path / "err2").read_text()
    assert json.loads((tmp_path / "merge.json").read_text())["samples_added"] == 60
