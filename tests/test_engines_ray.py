"""--engine ray on a real two-node Ray cluster on this machine: same bytes as the local engine,
work on both nodes, a worker killed mid-job, an unreachable address as one line.

One cluster for the module (a head and a second raylet, one CPU each, through Ray's own
``ray.cluster_utils.Cluster``: each node is a real raylet process); starting it costs seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dlindex import Catalog, InputError
from dlindex.features import ComputeOptions, compute_features

from .conftest import DLINDEX, REPO, compute, invoke, make_jpeg, make_png, one_error_line, rows

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[test]' brings ray[data])")
pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'ray[data]')")

IMAGES = 120
VECTORS = "SELECT image_id, feature_type, vector FROM image_features ORDER BY image_id, feature_type"
FAILURES = "SELECT image_id, feature_type, state, error FROM feature_state ORDER BY image_id, feature_type"

# A user extractor that says where it ran: PID.log in $RAYSPY_DIR gets the node id of each image.
SPY = """
import os, time
import ray
from dlindex.features.extractors import colorhist

def fn(image):
    folder = os.environ["RAYSPY_DIR"]
    node = ray.get_runtime_context().get_node_id()
    with open(os.path.join(folder, f"{os.getpid()}.log"), "a") as f:
        f.write(node + "\\n")
    time.sleep(float(os.environ.get("RAYSPY_SLEEP", "0")))
    return colorhist(image)
"""


# --- without a cluster: these run first, before the module's cluster starts -------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_address_is_one_line(scanned_db: Path) -> None:
    port = _closed_port()
    result = invoke(
        CliRunner(), "features", "compute", "--type", "colorhist", "--engine", "ray",
        "--address", f"127.0.0.1:{port}", "--db", str(scanned_db),
    )  # fmt: skip
    line = one_error_line(result)
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in line
    assert rows(scanned_db, "SELECT count(*) FROM feature_types") == [(0,)]  # nothing written


@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b""])
def test_a_listener_that_is_not_ray_is_one_line(tree: Path, tmp_path: Path, answer: bytes) -> None:
    """An HTTP server, or one that hangs up: ray.init would wait on it forever."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(answer)

        thread = threading.Thread(target=serve)
        thread.start()
        result = invoke(
            CliRunner(), "scan", str(tree), "--engine", "ray", "--address", f"127.0.0.1:{port}",
            "--db", str(tmp_path / "c.db"),
        )  # fmt: skip
        thread.join()
    assert f"something listens at 127.0.0.1:{port}, but it does not answer as a Ray cluster" in one_error_line(result)


def test_ray_address_from_the_environment(scanned_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{_closed_port()}")
    with pytest.raises(InputError, match="cannot reach the Ray cluster"), Catalog(scanned_db) as catalog:
        compute_features(catalog, "colorhist", options=ComputeOptions(engine="ray"))


def test_address_without_engine_ray_is_refused(scanned_db: Path) -> None:
    result = invoke(CliRunner(), "features", "compute", "-t", "colorhist", "--address", "h:1", "--db", str(scanned_db))
    assert "give --engine ray" in one_error_line(result)


def test_without_ray_the_error_names_the_extra(scanned_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(InputError, match=r"pip install 'dlindex\[ray\]'"), Catalog(scanned_db) as catalog:
        compute_features(catalog, "colorhist", options=ComputeOptions(engine="ray"))


def test_ray_is_imported_only_when_asked_for() -> None:
    code = (
        "import sys, dlindex, dlindex.engines.ray, dlindex.features.pipeline, dlindex.cli.features\n"
        "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'ray was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --- on the module's cluster -------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A head and a second raylet, one CPU each, shared by the module's tests."""
    from ray.cluster_utils import Cluster

    spy = tmp_path_factory.mktemp("spy")
    saved = {name: os.environ.get(name) for name in ("RAYSPY_DIR", "RAY_BACKEND_LOG_LEVEL")}
    os.environ["RAYSPY_DIR"] = str(spy)  # inherited by the raylets, so by every worker
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    node = {"num_cpus": 1, "object_store_memory": 80 * 1024**2, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    cluster.add_node(**{k: v for k, v in node.items() if k != "include_dashboard"})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    with warnings.catch_warnings():  # Ray Data's own deprecated settings, read as it starts
        warnings.simplefilter("ignore", DeprecationWarning)
        ray.data.DataContext.get_current().wait_for_min_actors_s = 60  # both actors up before work starts
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 small JPEGs and PNGs in three classes, one of them not an image."""
    root = tmp_path_factory.mktemp("ray") / "images"
    for i in range(IMAGES):
        colour = (i * 37 % 256, i * 11 % 256, 255 - i % 256)
        if i % 4:
            make_jpeg(root / f"c{i % 3}" / f"{i:03d}.jpg", (24 + i % 9, 16 + i % 5), colour)
        else:
            make_png(root / f"c{i % 3}" / f"{i:03d}.png", (12 + i % 7, 12), colour)
    return root


def _dlindex(*args: str | Path) -> str:
    """The CLI in a process of its own: this one is a Ray driver, and forking one (as the local
    engine's worker pools do) can leave its gRPC channels stuck."""
    proc = subprocess.run([*DLINDEX, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def local_db(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree computed by the local engine: the reference bytes."""
    db = tmp_path_factory.mktemp("local") / "catalog.db"
    _dlindex("scan", tree, "--db", db, "--workers", "1", "--quiet")
    for name in ("colorhist", "dhash"):
        _dlindex("features", "compute", "--type", name, "--workers", "2", "--db", db, "--quiet")
    return db


def _copy_scan(local_db: Path, tmp_path: Path) -> Path:
    """The same scan, without the vectors: a copy of the reference catalog before compute."""
    db = tmp_path / "catalog.db"
    shutil.copy(local_db, db)
    with Catalog(db) as catalog, catalog.write_transaction() as conn:
        conn.execute("DELETE FROM image_features")
        conn.execute("DELETE FROM feature_state")
    return db


def test_a_real_clusters_address_passes_the_check(cluster: Any) -> None:
    from dlindex.engines.ray import connected

    with connected(cluster.address) as connection:  # the head's GCS answers the HTTP/2 handshake
        assert connection.is_initialized()


def test_ray_stores_the_local_engines_bytes(cluster: object, local_db: Path, tmp_path: Path) -> None:
    db = _copy_scan(local_db, tmp_path)
    # one type (each job starts its actors: ~7 s); colorhist on Ray is the next test's
    summary = compute(db, "dhash", engine="ray", workers=2, batch_size=8)
    assert (summary.computed, summary.failed) == (IMAGES, 0)
    dhash = [r for r in rows(local_db, VECTORS) if r[1] == "dhash"]
    assert rows(db, VECTORS) == dhash and len(dhash) == IMAGES
    assert rows(db, FAILURES) == rows(local_db, FAILURES) == []


def test_failures_are_recorded_as_the_local_engine_records_them(cluster: object, tmp_path: Path) -> None:
    root = tmp_path / "images"
    make_png(root / "a" / "ok.png")
    make_png(root / "a" / "gone.png")
    make_png(root / "a" / "garbled.png")
    dbs = [tmp_path / "local.db", tmp_path / "ray.db"]
    _dlindex("scan", root, "--db", dbs[0], "--workers", "1", "--quiet")
    shutil.copy(dbs[0], dbs[1])
    (root / "a" / "gone.png").unlink()
    (root / "a" / "garbled.png").write_bytes(b"\x89PNG not really")
    local = json.loads(_dlindex("features", "compute", "--type", "colorhist", "--db", dbs[0], "--json"))
    on_ray = compute(dbs[1], "colorhist", engine="ray").as_dict()
    assert (on_ray["computed"], on_ray["failed"]) == (local["computed"], local["failed"]) == (1, 2)
    assert on_ray["error_samples"] == local["error_samples"]
    assert rows(dbs[1], FAILURES) == rows(dbs[0], FAILURES)
    assert rows(dbs[1], VECTORS) == rows(dbs[0], VECTORS)


def _spy(tmp_path: Path) -> str:
    (tmp_path / "spy_extractor.py").write_text(textwrap.dedent(SPY))
    return f"{tmp_path / 'spy_extractor.py'}:fn"


def _spied(spy: Path) -> dict[int, list[str]]:
    """pid -> the node id of each image that process extracted."""
    return {int(f.stem): f.read_text().split() for f in spy.glob("*.log")}


def test_actors_run_on_both_nodes(cluster: object, local_db: Path, tmp_path: Path) -> None:
    spy = Path(os.environ["RAYSPY_DIR"])
    for f in spy.glob("*.log"):
        f.unlink()
    db = _copy_scan(local_db, tmp_path)
    summary = compute(db, "spy", extractor=_spy(tmp_path), engine="ray", workers=2, batch_size=8)
    assert summary.computed == IMAGES
    nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(nodes) == 2
    seen = _spied(spy)
    assert {node for lines in seen.values() for node in lines} == nodes
    assert sum(len(lines) for lines in seen.values()) == IMAGES
    spy_vectors = [(i, v) for i, t, v in rows(db, VECTORS) if t == "spy"]
    assert spy_vectors == [(i, v) for i, t, v in rows(local_db, VECTORS) if t == "colorhist"]


def test_a_worker_killed_mid_job_changes_nothing(cluster: object, local_db: Path, tmp_path: Path) -> None:
    spy = Path(os.environ["RAYSPY_DIR"])
    for f in spy.glob("*.log"):
        f.unlink()
    os.environ["RAYSPY_SLEEP"] = "0.02"  # ~2.4 s of work: the kill lands mid-job
    db = _copy_scan(local_db, tmp_path)
    killed: list[int] = []

    def progress(n: int) -> None:
        if not killed:  # after the first batch is back: kill the worker that extracted last
            victim = int(max(spy.glob("*.log"), key=lambda f: f.stat().st_mtime_ns).stem)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    try:
        with Catalog(db) as catalog:
            options = ComputeOptions(extractor=_spy(tmp_path), engine="ray", workers=2, batch_size=4)
            summary = compute_features(catalog, "spy", options=options, progress=progress)
    finally:
        os.environ.pop("RAYSPY_SLEEP", None)
    assert killed
    assert (summary.computed, summary.failed) == (IMAGES, 0)
    assert sum(len(lines) for lines in _spied(spy).values()) >= IMAGES  # what the victim held was redone
    spy_vectors = [(i, v) for i, t, v in rows(db, VECTORS) if t == "spy"]
    assert spy_vectors == [(i, v) for i, t, v in rows(local_db, VECTORS) if t == "colorhist"]
    assert rows(db, FAILURES) == []


def test_the_cli_runs_on_ray(cluster: object, local_db: Path, tmp_path: Path) -> None:
    db = _copy_scan(local_db, tmp_path)
    result = invoke(CliRunner(), "features", "compute", "--type", "dhash", "--engine", "ray", "--db", str(db), "--json")
    assert result.exit_code == 0, result.output
    assert [(i, v) for i, t, v in rows(db, VECTORS)] == [(i, v) for i, t, v in rows(local_db, VECTORS) if t == "dhash"]


# --- scan and export: static shards as Ray tasks, merged ----------------------------------------

SAMPLES = (
    "SELECT m.file_path, l.name, m.width, m.height, m.format, m.bytes, m.xxh3_128, m.status "
    "FROM image_metadata AS m LEFT JOIN labels AS l ON l.id = m.label_id ORDER BY m.file_path"
)


def _kill_first_part(killed: list[int], stop: threading.Event) -> None:
    """Kill -9 the Ray worker running the first part seen (its child process runs the part)."""
    while not stop.is_set() and not killed:
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if proc.name.isdigit() and b"child_main" in cmdline:
                worker = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
                os.kill(worker, signal.SIGKILL)
                killed.append(worker)
                return
        time.sleep(0.005)


def test_scan_on_ray_equals_one_scan_with_a_worker_killed(
    cluster: object, tree: Path, local_db: Path, tmp_path: Path
) -> None:
    db = tmp_path / "ray.db"
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_part, args=(killed, stop))
    killer.start()
    try:
        result = invoke(
            CliRunner(), "scan", str(tree), "--engine", "ray", "--ray-tasks", "3", "--db", str(db), "--json"
        )
    finally:
        stop.set()
        killer.join()
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["engine"], summary["parts"], summary["seen"], summary["new"]) == ("ray", 3, IMAGES, IMAGES)
    assert killed, "no part was seen running"
    assert rows(db, SAMPLES) == rows(local_db, SAMPLES)
    assert not (tmp_path / "ray.db.parts").exists()
    # a rescan on Ray (one part per CPU: 2) keeps every id: stat-only, nothing new
    ids = rows(db, "SELECT id, file_path FROM image_metadata ORDER BY id")
    again = json.loads(invoke(CliRunner(), "scan", str(tree), "--engine", "ray", "--db", str(db), "--json").stdout)
    assert (again["parts"], again["seen"], again["new"], again["unchanged"]) == (2, IMAGES, 0, IMAGES)
    assert rows(db, "SELECT id, file_path FROM image_metadata ORDER BY id") == ids


def test_export_on_ray_equals_one_export(cluster: object, local_db: Path, tmp_path: Path) -> None:
    args = ("--format", "wds", "--split", "train=0.8,val=0.2", "--world-size", "2", "--shard-size", "16")
    _dlindex("export", tmp_path / "one", *args, "--db", local_db, "--quiet")
    result = invoke(
        CliRunner(), "export", str(tmp_path / "many"), *args, "--engine", "ray", "--ray-tasks", "3",
        "--db", str(local_db), "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["parts"] == 3
    one = {p.relative_to(tmp_path / "one"): p for p in (tmp_path / "one").rglob("*") if p.is_file()}
    many = {p.relative_to(tmp_path / "many"): p for p in (tmp_path / "many").rglob("*") if p.is_file()}
    assert sorted(one) == sorted(many)
    for name, path in one.items():
        if name.name == "index.json":
            a, b = json.loads(path.read_text()), json.loads(many[name].read_text())
            a.pop("created_at"), b.pop("created_at")
            assert a == b
        else:
            assert path.read_bytes() == many[name].read_bytes(), name
    assert not (tmp_path / "many.parts").exists()


def test_scan_on_ray_refuses_part_and_prune(cluster: object, tree: Path, tmp_path: Path) -> None:
    for extra in (("--part", "0/2"), ("--prune",)):
        result = invoke(CliRunner(), "scan", str(tree), "--engine", "ray", *extra, "--db", str(tmp_path / "x.db"))
        assert "--engine ray" in one_error_line(result)


# --- run folders (#32) --------------------------------------------------------------------------


def _killed_scan_on_ray(cluster: Any, tree: Path, db: Path) -> None:
    """Start ``scan --engine ray`` in a process of its own and kill -9 it once both parts have
    begun their scans: what a Ctrl-\\ or an OOM kill of the driver leaves behind."""
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    args = [*DLINDEX, "scan", str(tree), "--engine", "ray", "--ray-tasks", "2", "--db", str(db), "--quiet"]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = [db.with_name(db.name + ".parts") / f"part-{i}.db" for i in range(2)]
    begun: set[Path] = set()
    deadline = time.monotonic() + 120
    while len(begun) < 2 and time.monotonic() < deadline and proc.poll() is None:
        for part in set(parts) - begun:
            with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(part, timeout=1)) as conn:
                if conn.execute("SELECT count(*) FROM shard_runs WHERE job = 'scan'").fetchone()[0]:
                    begun.add(part)
        time.sleep(0.005)
    proc.kill()
    proc.wait(timeout=30)
    assert len(begun) == 2, "the scan finished (or failed) before both parts began"


@pytest.mark.parametrize("tree_changes", [False, True])
def test_a_rerun_after_a_kill_keeps_the_marks_made_meanwhile(
    cluster: Any, tree: Path, tmp_path: Path, tree_changes: bool
) -> None:
    """Without the cut, the rerun's merge undid every mark (exit 0); with a changed tree it
    failed for ever with "parts cut differently" until the folder was deleted by hand."""
    root = tmp_path / "images"
    shutil.copytree(tree, root)
    db = tmp_path / "catalog.db"
    _dlindex("scan", root, "--db", db, "--workers", "1", "--quiet")
    if tree_changes:  # the parts have rows to write
        for path in (root / "c1").iterdir():
            os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    _killed_scan_on_ray(cluster, root, db)
    marked = rows(db, "SELECT count(*) FROM image_metadata")[0][0]
    invoke(CliRunner(), "mark", "--processed", "-", "--db", str(db), input="\n".join(map(str, range(1, marked + 1))))
    if tree_changes:  # now the resumed parts were cut from another tree: thrown away, scanned afresh
        make_png(root / "c9" / "new.png", (9, 9), (1, 2, 3))
    result = invoke(CliRunner(), "scan", str(root), "--engine", "ray", "--ray-tasks", "2", "--db", str(db), "--json")
    assert result.exit_code == 0, result.output
    unmarked = [(0, 1)] if tree_changes else []
    assert rows(db, "SELECT processed, count(*) FROM image_metadata GROUP BY processed") == [*unmarked, (1, marked)]
    assert not db.with_name(db.name + ".parts").exists()


@pytest.mark.parametrize("job", ["scan", "export"])
def test_a_run_folder_dlindex_did_not_make_is_refused_untouched(tree: Path, tmp_path: Path, job: str) -> None:
    other = tmp_path / "other.db"
    _dlindex("scan", tree, "--db", other, "--workers", "1", "--quiet")
    if job == "scan":  # a new catalog: not even made
        db, target, folder = tmp_path / "new.db", str(tree), tmp_path / "new.db.parts"
    else:
        db, target, folder = other, str(tmp_path / "out"), tmp_path / "out.parts"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    shutil.copy(other, folder / "part-0.db")  # a catalog the user keeps there
    result = invoke(CliRunner(), job, target, "--engine", "ray", "--db", str(db))
    assert f"{folder} exists and dlindex did not make it" in one_error_line(result)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "part-0.db"]
    assert (folder / "part-0.db").read_bytes() == other.read_bytes()
    assert db.exists() == (job == "export")


def test_a_killed_workers_task_folder_is_removed_by_the_next_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray worker killed mid-task never runs its own cleanup: the next task on the host removes
    its folder (never a live worker's, nor a folder dlindex did not name)."""
    import tempfile

    from dlindex.engines import ray as engine
    from dlindex.pids import host_tag, process_start

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"dlindex-task-{host_tag()}-{gone.stdout.strip()}-1.abc"
    live = tmp_path / f"dlindex-task-{host_tag()}-{os.getpid()}-{process_start(os.getpid())}.def"
    other = tmp_path / "dlindex-task-notours"
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "task.pickle").write_bytes(b"x")
    assert engine._isolated(max, (1, 2)) == 2
    assert not dead.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])
