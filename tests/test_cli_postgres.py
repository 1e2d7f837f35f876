"""`dlindex postgres start|stop|status` through CliRunner and in a real process, on real servers."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex.catalog.postgres.server import stop_local_postgres

from .conftest import DLINDEX, REPO, invoke, one_error_line
from .servers import postgres_home, require_postgres

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")


@pytest.fixture
def home() -> Iterator[Path]:
    require_postgres()
    home = postgres_home()
    yield home
    for data in home.iterdir():
        if (data / "PG_VERSION").exists():
            stop_local_postgres(data)
    shutil.rmtree(home, ignore_errors=True)


def test_start_status_stop(runner: CliRunner, home: Path) -> None:
    pg = str(home / "pg")
    started = invoke(runner, "postgres", "start", pg)
    assert started.exit_code == 0, started.output
    url = started.stdout.strip()
    assert url.startswith("postgresql://postgres@127.0.0.1:") and url.endswith("/dlindex")
    assert started.stderr == f"export DLINDEX_DB={url}\n"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)

    status = invoke(runner, "postgres", "status", pg, "--json")
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout) | {"pid": 0} == {
        "data_dir": pg, "running": True, "pid": 0, "port": int(url.rsplit(":", 1)[1].split("/")[0]), "url": url,
    }  # fmt: skip
    assert invoke(runner, "postgres", "status", pg).stdout.startswith(f"running: {url} (pid ")

    stopped = invoke(runner, "postgres", "stop", pg)
    assert (stopped.exit_code, stopped.stdout, stopped.stderr) == (0, "", f"stopped: {pg}\n")
    assert invoke(runner, "postgres", "stop", pg).stderr == f"not running: {pg}\n"
    assert invoke(runner, "postgres", "status", pg).stdout.startswith(f"stopped: {pg} (port ")
    assert invoke(runner, "postgres", "start", pg).stdout.strip() == url  # the same port again


def test_bad_input_is_one_line(runner: CliRunner, home: Path) -> None:
    (home / "other").mkdir()
    (home / "other" / "notes.txt").write_text("mine")
    for command in ("start", "stop", "status"):
        line = one_error_line(invoke(runner, "postgres", command, str(home / "other")))
        assert "is not a PostgreSQL data folder" in line
    assert (home / "other" / "notes.txt").read_text() == "mine"
    line = one_error_line(invoke(runner, "postgres", "start", str(home / "pg"), "--bindir", str(home / "none")))
    assert "no PostgreSQL server programs" in line
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(invoke(runner, "postgres", "start", str(home / "pg"), "--port", str(port)))
    assert f"port {port} on 127.0.0.1 is in use" in line
    assert invoke(runner, "postgres", "start", str(home / "pg"), "--port", "0").exit_code == 2


def test_in_a_real_process(home: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = subprocess.run([*DLINDEX, "postgres", "start", str(home / "pg")], capture_output=True, text=True,
                             env=env, timeout=120)  # fmt: skip
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert started.stderr == f"export DLINDEX_DB={url}\n"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("dlindex",)
    stopped = subprocess.run([*DLINDEX, "postgres", "stop", str(home / "pg")], capture_output=True, text=True,
                             env=env, timeout=120)  # fmt: skip
    assert stopped.returncode == 0, stopped.stderr
    # the programs are missing: one line, exit 1, nothing made
    missing = subprocess.run([*DLINDEX, "postgres", "start", str(home / "new"), "--bindir", str(home / "none")],
                             capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith("Error: no PostgreSQL server programs")
    assert not (home / "new").exists()
