"""Damaged catalogs, a held write lock, concurrent writers, and kill -9 at random points.

After every fault the catalog must pass SQLite's integrity check and the next run must
complete (docs/reliability.md lists the promise each test proves).
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex import Catalog, ExitCode
from dlindex.catalog.check import check_catalog
from dlindex.catalog.sqlite.migrations import LATEST_VERSION
from dlindex.cli import app
from dlindex.errors import DiskFullError
from dlindex.faults import translate_error

from .conftest import make_png
from .synthetic import Row, make_catalog, present_root

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def dlindex(*args: str, stdin: str | None = None, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dlindex", *args], input=stdin, capture_output=True, text=True,
        env={**ENV, **env}, timeout=timeout,
    )  # fmt: skip


def one_line(stderr: str, *words: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    for word in words:
        assert word in lines[0], lines[0]


# --- damaged catalogs -------------------------------------------------------------------


def _corrupt_page(db: Path) -> None:
    with sqlite3.connect(db) as conn:  # a leaf page in the middle of image_metadata's rows
        leaves = [n for (n,) in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'image_metadata' AND pagetype = 'leaf' ORDER BY pageno"
        )]  # fmt: skip
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    with open(db, "r+b") as f:  # all garbage
        f.seek(page_size * (leaves[len(leaves) // 2] - 1))
        f.write(b"\xff" * page_size)


def _drop_table(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE labels")
    conn.close()


def _newer(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {LATEST_VERSION + 1}")
    conn.close()


def _rename_column(db: Path) -> None:
    """One byte of the schema's text: roots.path becomes roots.Aath, and the schema still parses
    (what the random-damage fuzzer found: a plain SQL error from deep inside a command)."""
    data = bytearray(db.read_bytes())
    data[data.index(b"path TEXT NOT NULL UNIQUE")] = ord("A")
    db.write_bytes(bytes(data))


DAMAGE = {
    "corrupt page": _corrupt_page,
    "renamed column": _rename_column,
    "dropped table": _drop_table,
    "not a database": lambda db: db.write_bytes(b"this is not a database\n" * 2000),
    "zero length": lambda db: db.write_bytes(b""),
    "newer schema": _newer,
}
WRITES = (
    ["mark", "--processed", "-"],
    ["features", "import", "--type", "t", "{npz}"],
    ["log", "clear"],
    ["index", "--apply"],
)
READS = (["stats"], ["query"], ["features", "list"], ["log", "show"], ["export", "{out}"])


@pytest.fixture
def wide_catalog(tmp_path: Path) -> Path:
    """Enough rows that image_metadata spans several pages."""
    wide = [Row(f"l{i % 7}", width=i) for i in range(3000)]
    db = make_catalog(tmp_path / "c.db", wide, root=present_root(tmp_path / "tree", wide))
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_catalog_every_command_is_one_line_and_no_write_proceeds(
    damage: str, wide_catalog: Path, tmp_path: Path
) -> None:
    DAMAGE[damage](wide_catalog)
    before = wide_catalog.read_bytes()
    np.savez(tmp_path / "v.npz", ids=np.arange(1, 4), vectors=np.ones((3, 4), dtype=np.float32))
    runner = CliRunner()
    for argv in WRITES:
        args = [a.format(npz=tmp_path / "v.npz") for a in argv] + ["--db", str(wide_catalog)]
        result = runner.invoke(app, args, input="1\n2\n3\n")
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
        assert result.exit_code != 0, (args, result.output)
        one_line(result.stderr)
        assert wide_catalog.read_bytes() == before, f"{args} wrote into a damaged catalog"
    for argv in READS:
        args = [a.format(out=tmp_path / "exp") for a in argv] + ["--db", str(wide_catalog)]
        result = runner.invoke(app, args)
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
        if result.exit_code != 0 or damage != "corrupt page":
            # A read that never touches the bad page is still right; see docs/reliability.md.
            assert result.exit_code != 0, (args, result.output)
            one_line(result.stderr)
    # A read that succeeds may log on intact pages (reads skip the whole-file check to start
    # fast; one that finds the damage logs nothing); `check` itself never writes.
    before = wide_catalog.read_bytes()
    check = runner.invoke(app, ["check", "--db", str(wide_catalog)])
    assert check.exit_code == 1, check.output
    assert "problem" in check.stdout or "Error:" in check.stderr
    assert wide_catalog.read_bytes() == before


@pytest.mark.parametrize("argv", [["query"], ["export", "{out}"]])
def test_a_read_that_finds_damage_records_nothing_in_the_catalog(
    argv: list[str], wide_catalog: Path, tmp_path: Path
) -> None:
    """The user is told "nothing was written": the query log is not appended either."""
    _corrupt_page(wide_catalog)
    with sqlite3.connect(f"file:{wide_catalog}?mode=ro", uri=True) as conn:
        logged = conn.execute("SELECT count(*) FROM query_log").fetchall()
    conn.close()
    before = wide_catalog.read_bytes()
    result = CliRunner().invoke(app, [a.format(out=tmp_path / "exp") for a in argv] + ["--db", str(wide_catalog)])
    assert result.exit_code == ExitCode.DAMAGED, result.output
    one_line(result.stderr, "damaged", "nothing was written")
    assert wide_catalog.read_bytes() == before
    assert not Path(f"{wide_catalog}-wal").exists()
    with sqlite3.connect(f"file:{wide_catalog}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT count(*) FROM query_log").fetchall() == logged
    conn.close()


def test_corrupt_page_is_reported_as_damaged_with_the_way_out(wide_catalog: Path) -> None:
    _corrupt_page(wide_catalog)
    proc = dlindex("mark", "--processed", "--db", str(wide_catalog), stdin="1\n")
    assert proc.returncode == ExitCode.DAMAGED
    one_line(proc.stderr, "damaged", "dlindex check")


def test_a_schema_garbled_into_non_utf8_is_damage_not_a_traceback(wide_catalog: Path) -> None:
    # SQLite quotes the garbled name in its error text, which sqlite3 then fails to decode.
    data = bytearray(wide_catalog.read_bytes())
    at = data.index(b"CHECK (status = 'ok'") + len(b"CHECK (")  # a column the CHECK names
    data[at] = 0x80
    wide_catalog.write_bytes(bytes(data))
    for args in (("stats",), ("query", "--limit", "1"), ("mark", "--processed")):
        proc = dlindex(*args, "--db", str(wide_catalog), stdin="1\n")
        assert proc.returncode == ExitCode.DAMAGED, (args, proc.stderr)
        one_line(proc.stderr, "damaged", "\\x80tatus")


def test_check_reports_orphans_and_a_dead_running_scan(wide_catalog: Path) -> None:
    conn = sqlite3.connect(wide_catalog)
    conn.execute("INSERT INTO image_metadata (root_id, file_path, label_id) VALUES (99, 'x.png', 1)")
    conn.execute("INSERT INTO scans (root_id, options, pid) VALUES (1, '{}', 2147483000)")
    conn.commit()
    conn.close()
    report = check_catalog(wide_catalog)
    assert not report.healthy
    assert report.orphans == {"image_metadata -> roots": 1}
    assert len(report.interrupted_scans) == 1
    # The first write marks the dead scan interrupted.
    with Catalog(wide_catalog) as c, c.write_transaction() as conn:
        pass
    assert check_catalog(wide_catalog).interrupted_scans == ()


def test_recovery_path_from_the_docs_works(wide_catalog: Path, tmp_path: Path) -> None:
    _corrupt_page(wide_catalog)
    new = tmp_path / "new.db"
    proc = dlindex("check", "--db", str(wide_catalog), "--recover-to", str(new))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = check_catalog(new)
    assert report.healthy and 2000 < (report.images or 0) < 3000, report  # one page of rows lost
    assert dlindex("stats", "--db", str(new)).returncode == 0
    assert dlindex("mark", "--processed", "--db", str(new), stdin="1\n").returncode == 0
    again = dlindex("check", "--db", str(wide_catalog), "--recover-to", str(new))
    assert again.returncode == 1 and "already exists" in again.stderr  # never overwritten


def _unkey_id(db: Path) -> None:
    """``id INTEGER PRIMARY KEY`` of image_metadata becomes ``id ANTEGER ...``: a plain column,
    NULL in every stored row (SQLite keeps a key column's value as the rowid)."""
    data = bytearray(db.read_bytes())
    data[data.index(b"image_metadata (\n        id INTEGER PRIMARY KEY") + len(b"image_metadata (\n        id ")] = ord(
        "A"
    )
    db.write_bytes(bytes(data))


@pytest.mark.parametrize(("damage", "column"), [(_rename_column, "roots.path"), (_unkey_id, "image_metadata.id")])
def test_a_changed_column_is_damage_and_recovery_restores_dlindexs_schema(
    wide_catalog: Path, tmp_path: Path, damage: Any, column: str
) -> None:
    damage(wide_catalog)
    runner = CliRunner()
    for args in (("stats",), ("query", "--limit", "1"), ("mark", "--processed")):
        result = runner.invoke(app, [*args, "--db", str(wide_catalog)], input="1\n")
        assert result.exit_code == ExitCode.DAMAGED, (args, result.output)
        one_line(result.stderr, "damaged", f"column {column} is not as dlindex made it")
    assert any(column in p for p in check_catalog(wide_catalog).problems)
    new = tmp_path / "new.db"
    result = runner.invoke(app, ["check", "--db", str(wide_catalog), "--recover-to", str(new)])
    assert result.exit_code == 0, result.output
    assert check_catalog(new).healthy and check_catalog(new).images == 3000
    with sqlite3.connect(new) as conn:  # the values kept their places under dlindex's own names, ids their rows
        assert conn.execute("SELECT path FROM roots").fetchall() == [(str(wide_catalog.parent / "tree"),)]
        assert conn.execute("SELECT min(id), max(id), count(*), max(width) FROM image_metadata").fetchone() == (
            1, 3000, 3000, 2999,
        )  # fmt: skip
    conn.close()
    assert runner.invoke(app, ["query", "--format", "paths", "--limit", "1", "--db", str(new)]).exit_code == 0


@pytest.mark.parametrize("kind", ["read", "write"])
def test_a_check_constraint_garbled_in_the_schema_never_lies(wide_catalog: Path, tmp_path: Path, kind: str) -> None:
    # Found by flipping each byte of the schema's text: CHECK (kind IN ('read', 'write')) of the
    # query log refused the entries dlindex writes, an IntegrityError from inside the command.
    check = b"CHECK (kind IN ('read', 'write'))"
    data = bytearray(wide_catalog.read_bytes())
    data[data.index(check) + check.index(kind.encode())] = ord("A")  # 'Aead' or 'Arite'
    wide_catalog.write_bytes(bytes(data))
    command = ("stats",) if kind == "read" else ("mark", "--processed")
    proc = dlindex(*command, "--db", str(wide_catalog), stdin="1\n")
    with sqlite3.connect(wide_catalog) as conn:
        processed = conn.execute("SELECT count(*) FROM image_metadata WHERE processed = 1").fetchone()[0]
    conn.close()
    if proc.returncode == 0:  # the log in a transaction of its own, after the work: the work stands
        assert "warning: the query log was not written: the catalog's schema refused it" in proc.stderr
        assert processed == (kind == "write")
    else:  # the log rode along in the work's transaction: both rolled back, and the line says so
        assert kind == "write" and proc.returncode == ExitCode.DAMAGED and processed == 0, proc.stderr
        one_line(proc.stderr, "damaged", "CHECK constraint failed", "nothing was written")
    new = tmp_path / "new.db"
    assert dlindex("check", "--db", str(wide_catalog), "--recover-to", str(new)).returncode == 0
    again = dlindex(*command, "--db", str(new), stdin="1\n")  # dlindex's own schema again
    assert again.returncode == 0 and "warning" not in again.stderr, again.stderr


def test_a_negative_schema_version_is_a_damaged_catalog(tmp_path: Path) -> None:
    # Found by the random-damage test: 0x80 at byte 60 makes the header's user_version negative,
    # and the migrations were then indexed with it.
    db = make_catalog(tmp_path / "c.db", [Row("cat")])
    data = bytearray(db.read_bytes())
    data[60] = 0x80
    db.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["stats", "--db", str(db)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == ExitCode.DAMAGED, result.output
    one_line(result.stderr, "damaged", "schema version")


def test_text_that_is_not_utf8_is_a_damaged_catalog(tmp_path: Path) -> None:
    # Found by the random-damage test: one byte of a file_path turned to 0x80. dlindex writes only
    # UTF-8 TEXT (other names get stand-ins), so such a value can only be damage.
    db = make_catalog(tmp_path / "c.db", [Row("cat"), Row("dog")])
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE image_metadata SET file_path = CAST(X'80' AS TEXT) WHERE id = 2")
    result = CliRunner().invoke(app, ["query", "--format", "paths", "--db", str(db)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == ExitCode.DAMAGED, result.output
    one_line(result.stderr, "damaged", "file_path")


@pytest.fixture(scope="module")
def fuzz_catalog_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a 1,500-row catalog, made once: each example damages its own copy."""
    return make_catalog(
        tmp_path_factory.mktemp("fuzz-base") / "c.db", [Row(f"l{i % 3}") for i in range(1500)]
    ).read_bytes()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offset=st.integers(0, 3000 * 100), junk=st.binary(min_size=1, max_size=600))
def test_random_damage_never_tracebacks(
    tmp_path_factory: pytest.TempPathFactory, fuzz_catalog_bytes: bytes, offset: int, junk: bytes
) -> None:
    db = tmp_path_factory.mktemp("fuzz") / "c.db"
    data = bytearray(fuzz_catalog_bytes)
    offset %= len(data)
    data[offset : offset + len(junk)] = junk
    db.write_bytes(bytes(data[: max(len(data), 1)]))
    _every_command_answers_or_says_one_line(db)


class _SchemaText:
    """A catalog's bytes and where its schema's CREATE statements lie in them (short repr:
    hypothesis prints a failing example's arguments)."""

    def __init__(self, catalog: Path) -> None:
        self.data = catalog.read_bytes()
        with sqlite3.connect(f"file:{catalog}?mode=ro", uri=True) as conn:
            texts = [
                str(sql).encode() for (sql,) in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL")
            ]
        conn.close()
        self.positions = [at + i for t in texts if (at := self.data.find(t)) >= 0 for i in range(len(t))]

    def __repr__(self) -> str:
        return f"<catalog of {len(self.data)} bytes, {len(self.positions)} of schema text>"


@pytest.fixture(scope="module")
def schema_text(tmp_path_factory: pytest.TempPathFactory) -> _SchemaText:
    db = make_catalog(tmp_path_factory.mktemp("schema-text") / "c.db", [Row(f"l{i % 3}") for i in range(300)])
    return _SchemaText(db)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.integers(0, 10**9), byte=st.integers(0, 255))
@example(pick=10723, byte=128)  # `kind IN` -> `kind\x80IN`: SQLite's message is not UTF-8 (a traceback once)
@example(pick=12478, byte=36)  # a history trigger's text damaged: "no such column" inside a write (a traceback once)
@example(pick=952, byte=128)  # a column name damaged, quoted as non-UTF-8 to check's full-text index check (once)
def test_one_damaged_byte_of_the_schema_text_never_tracebacks(
    tmp_path_factory: pytest.TempPathFactory, schema_text: _SchemaText, pick: int, byte: int
) -> None:
    # The random damage above seldom lands in the schema's text, where one byte can rename a
    # column, unkey the id or garble a CHECK and still parse (each was a traceback once).
    assert len(schema_text.positions) > 3000  # every table's, index's and trigger's text was found
    data = bytearray(schema_text.data)
    data[schema_text.positions[pick % len(schema_text.positions)]] = byte
    db = tmp_path_factory.mktemp("schema-fuzz") / "c.db"
    db.write_bytes(bytes(data))
    _every_command_answers_or_says_one_line(db)


def _every_command_answers_or_says_one_line(db: Path) -> None:
    runner = CliRunner()
    for args in (["stats"], ["query", "--format", "paths"], ["mark", "--processed", "-"], ["check"]):
        result = runner.invoke(app, [*args, "--db", str(db)], input="1\n5\n")
        assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
        if result.exit_code not in (0, 1) or args[0] != "check":
            assert result.exit_code in (0, 1, 6), (args, result.output)
        if result.exit_code != 0 and args[0] != "check":
            one_line(result.stderr)


# --- errors that must not hide behind others -----------------------------------------


def test_a_failed_rollback_never_replaces_the_real_error(wide_catalog: Path) -> None:
    with (
        Catalog(wide_catalog) as c,
        pytest.raises(RuntimeError, match="the real cause"),
        c.write_transaction() as conn,
    ):
        conn.execute("ROLLBACK")  # what SQLite does itself after a full disk
        raise RuntimeError("the real cause")


def test_enospc_from_any_layer_is_disk_full_naming_the_file(tmp_path: Path) -> None:
    error = translate_error(OSError(28, "No space left on device", str(tmp_path / "out" / "part.tar")))
    assert isinstance(error, DiskFullError) and error.exit_code == ExitCode.DISK_FULL
    assert "disk full" in str(error) and "part.tar" in str(error)
    full = sqlite3.OperationalError("database or disk is full")
    assert isinstance(translate_error(full, catalog=tmp_path / "c.db"), DiskFullError)
    assert translate_error(ValueError("a bug")) is None


# --- the write lock ------------------------------------------------------------------------


def _hold_write_lock(db: Path, seconds: float) -> threading.Thread:
    ready = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
        ready.set()
        time.sleep(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    ready.wait(10)
    return thread


def test_busy_catalog_names_the_holder_and_wait_waits_longer(wide_catalog: Path) -> None:
    holder = _hold_write_lock(wide_catalog, 2.5)
    started = time.monotonic()
    proc = dlindex("mark", "--processed", "--wait", "0.5", "--db", str(wide_catalog), stdin="1\n")
    assert proc.returncode == ExitCode.BUSY, proc.stderr
    one_line(proc.stderr, "stayed locked for 0.5 s by another process", f"pid {os.getpid()}", "--wait")
    assert time.monotonic() - started < 2.4
    proc = dlindex("mark", "--processed", "--db", str(wide_catalog), stdin="1\n", DLINDEX_WAIT="20")
    assert proc.returncode == 0, proc.stderr
    holder.join()


# --- concurrent writers and kill -9 ----------------------------------------------------------


def test_two_marks_at_once_both_complete(wide_catalog: Path) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-m", "dlindex", "mark", "--processed", "--db", str(wide_catalog)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True)
        for _ in range(2)
    ]  # fmt: skip
    halves = ["".join(f"{i}\n" for i in range(1, 3001) if i % 2 == k) for k in (0, 1)]
    for proc, ids in zip(procs, halves, strict=False):
        proc.stdin.write(ids)  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    for proc in procs:
        assert proc.wait(120) == 0, proc.stderr.read()  # type: ignore[union-attr]
    conn = sqlite3.connect(wide_catalog)
    assert conn.execute("SELECT count(*) FROM image_metadata WHERE processed = 1").fetchone()[0] == 3000
    conn.close()
    assert check_catalog(wide_catalog).healthy


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kill") / "images"
    for i in range(1500):
        make_png(root / f"c{i % 10}" / f"{i:05d}.png", (20 + i % 9, 20), (i % 256, 3, 3))
    return root


def test_two_scans_of_one_tree_at_once_leave_one_row_per_file(tree: Path, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    args = [sys.executable, "-m", "dlindex", "scan", str(tree), "--db", str(db), "-q", "-w", "1"]
    assert subprocess.run([*args[:-2], "--ext", "none"], env=ENV, capture_output=True).returncode == 0  # create
    procs = [subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for proc in procs:
        assert proc.wait(180) == 0, proc.stderr.read()  # type: ignore[union-attr]
    report = check_catalog(db)
    assert report.healthy, report.problems
    assert report.images == 1500


def _wal_state(db: Path) -> tuple[int, int]:
    try:
        st = os.stat(f"{db}-wal")
    except OSError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def _kill_at(cmd: list[str], db: Path, delay: float, stdin: bytes | None = None) -> bool:
    """Start ``cmd``, wait until it has begun writing the catalog, then SIGKILL it ``delay``
    seconds later; True if it was still running when killed."""
    before = _wal_state(db)
    proc = subprocess.Popen(cmd, env=ENV, stdin=subprocess.PIPE if stdin else None,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    if stdin:
        writer = threading.Thread(target=_feed, args=(proc, stdin), daemon=True)
        writer.start()
    deadline = time.monotonic() + 60
    while proc.poll() is None and _wal_state(db) == before and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(delay)
    running = proc.poll() is None
    proc.kill()  # SIGKILL: no handler runs, no cleanup
    proc.wait(30)
    time.sleep(0.05)  # a scan's workers exit when their parent's pipe closes
    return running


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, ValueError):
        pass


KILL_POINTS = random.Random(14).sample([x / 1000 for x in range(0, 100)], 3)  # after writing starts, seeded; within
# 0.1 s, since on a quiet machine a command finishes soon after its first write


@pytest.mark.parametrize("delay", KILL_POINTS)
def test_kill_9_during_each_write_command_then_integrity_and_rerun(tree: Path, tmp_path: Path, delay: float) -> None:
    db = tmp_path / "c.db"
    py = [sys.executable, "-m", "dlindex"]
    # A first scan of half the classes, so the kill lands in a rescan with rows to add.
    assert dlindex("scan", str(tree), "--db", str(db), "-w", "1", "-q", "--exclude", "c[0-4]").returncode == 0
    killed = [_kill_at([*py, "scan", str(tree), "--db", str(db), "-w", "1", "--verify", "-q"], db, delay)]
    if db.exists():
        assert check_catalog(db).integrity == "ok"
    assert dlindex("scan", str(tree), "--db", str(db), "-w", "1", "-q").returncode == 0
    report = check_catalog(db)
    assert report.healthy and report.images == 1500, report.problems

    ids = "".join(f"{i}\n" for i in range(1, 1501)).encode() * 200
    killed.append(_kill_at([*py, "mark", "--processed", "--db", str(db)], db, delay, stdin=ids))
    assert check_catalog(db).healthy
    assert dlindex("mark", "--processed", "--db", str(db), stdin=ids.decode()[:20000]).returncode == 0

    np.savez(tmp_path / "v.npz", ids=np.arange(1, 1501), vectors=np.ones((1500, 512), dtype=np.float32))
    killed.append(
        _kill_at([*py, "features", "import", "--type", "emb", str(tmp_path / "v.npz"), "--db", str(db)], db, delay)
    )
    assert check_catalog(db).healthy
    killed.append(
        _kill_at([*py, "features", "compute", "--type", "hist", "--extractor", "colorhist", "--db", str(db)], db, delay)
    )
    assert check_catalog(db).healthy
    killed.append(_kill_at([*py, "export", str(tmp_path / "out"), "--format", "wds", "--db", str(db), "-q"], db, delay))
    assert check_catalog(db).healthy
    for argv in (
        ["features", "import", "--type", "emb", str(tmp_path / "v.npz")],
        ["features", "compute", "--type", "hist", "--extractor", "colorhist"],
        ["export", str(tmp_path / "out2"), "--format", "wds", "-q"],
    ):
        proc = dlindex(*argv, "--db", str(db))
        assert proc.returncode == 0, (argv, proc.stderr)
    assert check_catalog(db).healthy
    assert any(killed), "every command had finished before its kill: the test proved nothing"
