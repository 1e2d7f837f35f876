"""A PostgreSQL server stopped (``pg_ctl stop -m immediate``) while scan, mark and features compute
run in real processes: one error line each, a non-zero exit, and each catalog as it was committed.

The server is this test's own (the session's must keep running). Each command waits on a table
lock the test holds, so the server stops while every command is surely mid-work; one stop (and
one initdb) serves them all.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlindex import Catalog, ScanOptions, scan_tree
from dlindex.catalog.postgres.server import start_local_postgres, stop_local_postgres

from .conftest import make_jpeg
from .servers import postgres_home, require_postgres, with_database

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")

# Two catalogs: in "read" a worker of scan waits to read; in "write" scan, mark and features compute
# each wait to write (SHARE locks let reads through).
LOCKS = {"read": ["image_metadata IN ACCESS EXCLUSIVE MODE"],
         "write": ["image_metadata IN SHARE MODE", "image_features IN SHARE MODE"]}  # fmt: skip
COMMANDS = [
    ("read", ["scan", "{tree}", "--workers", "1"], ""),
    ("write", ["scan", "{tree}", "--workers", "1"], ""),
    ("write", ["mark", "--processed", "-"], "1\n2\n"),
    ("write", ["features", "compute", "--type", "hist", "-e", "colorhist", "--workers", "0"], ""),
]
# what each catalog holds after the stop: the committed scan of six images, nothing of the commands
AFTER = ("SELECT (SELECT count(*) FROM image_metadata), (SELECT count(*) FROM image_metadata WHERE processed = 1), "
         "(SELECT count(*) FROM image_features)")  # fmt: skip


def test_a_server_stopped_mid_command_is_one_error_line(tmp_path: Path) -> None:
    require_postgres()
    tree = tmp_path / "imgs"
    for i in range(6):
        make_jpeg(tree / ("ant", "bee")[i % 2] / f"{i}.jpg", (12, 10), (i * 30, 40, 90))
    home = postgres_home()
    data = home / "data"
    held: list[psycopg.Connection] = []
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    try:
        server = start_local_postgres(data)
        urls = {name: with_database(server, f"lost_{name}") for name in LOCKS}
        with psycopg.connect(server, autocommit=True) as conn:
            for name in LOCKS:
                conn.execute(f"CREATE DATABASE lost_{name}")  # names from this module
        for url in urls.values():
            with Catalog(url, create=True) as catalog:
                scan_tree(catalog, tree, ScanOptions(workers=1))
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # the restart after the stop has little to redo
        for i in range(4):  # new files: the scans have a batch to write
            make_jpeg(tree / "cow" / f"{i}.jpg", (12, 10), (i, 1, 2))
        for name, locks in LOCKS.items():
            holder = psycopg.connect(urls[name])
            for lock in locks:
                holder.execute(f"LOCK TABLE {lock}")  # text from this module
            held.append(holder)
        for name, args, stdin in COMMANDS:
            argv = [sys.executable, "-m", "dlindex", *(a.format(tree=tree) for a in args), "--db", urls[name]]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)  # fmt: skip
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
            procs.append((name, proc))
        with psycopg.connect(server, autocommit=True) as watcher:  # each look: a new snapshot
            deadline = time.monotonic() + 60
            while watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dlindex' "
                                  "AND wait_event_type = 'Lock'").fetchone()[0] < len(COMMANDS):  # fmt: skip
                assert all(p.poll() is None for _, p in procs), "a command ended before the server stopped"
                assert time.monotonic() < deadline, "the commands never waited on their locks"
                time.sleep(0.02)
        stop_local_postgres(data, mode="immediate")
        for name, proc in procs:
            assert proc.stderr is not None
            err = proc.stderr.read()
            assert proc.wait(60) == 1, (proc.args, err)
            assert err.count("\n") == 1 and "Traceback" not in err, (proc.args, err)
            assert err.startswith(f"Error: lost the connection to the PostgreSQL catalog {urls[name]} ("), err
        start_local_postgres(data)  # crash recovery
        for url in urls.values():
            with psycopg.connect(url) as conn:
                assert conn.execute(AFTER).fetchone() == (6, 0, 0), url
    finally:
        for holder in held:
            holder.close()
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if (data / "PG_VERSION").exists():
            stop_local_postgres(data, mode="immediate")
        shutil.rmtree(home, ignore_errors=True)
