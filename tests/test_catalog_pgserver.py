"""dlindex/catalog/postgres/server.py on real PostgreSQL servers: start, status, stop, restart, bad input."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlindex.catalog.postgres import server as pgserver
from dlindex.catalog.postgres.server import (
    find_bindir,
    local_postgres_status,
    start_local_postgres,
    stop_local_postgres,
)
from dlindex.errors import DlindexError, InputError

from .servers import free_port, postgres_home, require_postgres

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")


@pytest.fixture
def home() -> Iterator[Path]:
    """A folder the server user can reach; every server started under it is stopped after the test."""
    require_postgres()
    home = postgres_home()
    yield home
    for data in home.iterdir():
        if (data / "PG_VERSION").exists():
            stop_local_postgres(data)
    shutil.rmtree(home, ignore_errors=True)


def select_one(url: str) -> object:
    with psycopg.connect(url, connect_timeout=10) as conn:
        row = conn.execute("SELECT 1").fetchone()
        return row[0] if row else None


def test_start_status_stop_cycle(home: Path) -> None:
    url = start_local_postgres(home / "pg")
    status = local_postgres_status(home / "pg")
    assert status.running and status.url == url and status.pid
    assert url == f"postgresql://postgres@127.0.0.1:{status.port}/dlindex"
    assert select_one(url) == 1
    assert start_local_postgres(home / "pg") == url  # already running: the same server
    assert stop_local_postgres(home / "pg") is True
    assert local_postgres_status(home / "pg").running is False
    assert stop_local_postgres(home / "pg") is False
    with pytest.raises(psycopg.OperationalError):
        select_one(url)


def test_a_restart_keeps_port_and_data(home: Path) -> None:
    url = start_local_postgres(home / "pg")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    stop_local_postgres(home / "pg")
    assert start_local_postgres(home / "pg") == url
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT n FROM kept").fetchall() == [(42,)]


def test_a_given_port_and_a_moved_one(home: Path) -> None:
    port = free_port()
    url = start_local_postgres(home / "pg", port=port)
    assert url.endswith(f":{port}/dlindex") and select_one(url) == 1
    with pytest.raises(InputError, match="already runs on port"):
        start_local_postgres(home / "pg", port=free_port())
    stop_local_postgres(home / "pg")
    other = free_port()
    assert start_local_postgres(home / "pg", port=other).endswith(f":{other}/dlindex")


def test_an_empty_folder_is_initialised_in_place(home: Path) -> None:
    (home / "pg").mkdir()
    assert select_one(start_local_postgres(home / "pg")) == 1


def test_pg_stat_statements_is_preloaded_and_hypopg_installs(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
        conn.execute("CREATE TABLE t (a int)")
        conn.execute("SELECT count(*) FROM t WHERE a = 1")
        calls = conn.execute("SELECT calls FROM pg_stat_statements WHERE query LIKE %s", ["%FROM t WHERE a%"])
        assert [r[0] for r in calls.fetchall()] == [1]
        conn.execute("CREATE EXTENSION hypopg")
        (name,) = conn.execute("SELECT indexname FROM hypopg_create_index('CREATE INDEX ON t (a)')").fetchone() or ("",)
        assert "btree_t_a" in name
        assert conn.execute("SELECT count(*) FROM hypopg_list_indexes").fetchone() == (1,)


def test_a_folder_of_other_files_is_refused_and_kept(home: Path) -> None:
    (home / "other").mkdir()
    (home / "other" / "notes.txt").write_text("mine")
    for call in (start_local_postgres, stop_local_postgres, local_postgres_status):
        with pytest.raises(InputError, match="not a PostgreSQL data folder"):
            call(home / "other")
    assert [p.name for p in (home / "other").iterdir()] == ["notes.txt"]
    (home / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        start_local_postgres(home / "file")


def test_a_busy_port_is_refused(home: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(InputError, match=f"port {port} on 127.0.0.1 is in use"):
            start_local_postgres(home / "pg", port=port)


def test_a_non_loopback_address_is_refused(home: Path) -> None:
    with pytest.raises(InputError, match="not a loopback address"):
        start_local_postgres(home / "pg", host="0.0.0.0")
    assert not (home / "pg").exists()


def test_missing_programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match="no PostgreSQL server programs"):
        find_bindir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(pgserver, "_VERSIONED_BINDIRS", str(tmp_path / "postgresql" / "*" / "bin"))
    with pytest.raises(InputError, match="PostgreSQL is not installed"):
        start_local_postgres(tmp_path / "pg")
    assert not (tmp_path / "pg").exists()


def test_the_newest_versioned_bindir_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for version in ("9.6", "15", "16"):
        for name in pgserver.PROGRAMS:
            program = tmp_path / version / "bin" / name
            program.parent.mkdir(parents=True, exist_ok=True)
            program.write_text("#!/bin/sh\n")
            program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(pgserver, "_VERSIONED_BINDIRS", str(tmp_path / "*" / "bin"))
    assert find_bindir() == tmp_path / "16" / "bin"


@pytest.mark.skipif(not hasattr(pgserver.os, "geteuid") or pgserver.os.geteuid() != 0, reason="root only")
def test_under_root_a_folder_the_postgres_user_cannot_reach_is_refused(tmp_path: Path) -> None:
    require_postgres()
    tmp_path.chmod(0o700)  # pytest's folders are 0700 root
    with pytest.raises(InputError, match="cannot reach"):
        start_local_postgres(tmp_path / "pg")
    assert not (tmp_path / "pg").exists()


def test_a_failed_start_says_why_in_one_line(home: Path) -> None:
    start_local_postgres(home / "pg")
    stop_local_postgres(home / "pg")
    with (home / "pg" / "postgresql.conf").open("a") as f:
        f.write("shared_buffers = 'lots'\n")
    with pytest.raises(DlindexError, match="did not start") as caught:
        start_local_postgres(home / "pg")
    assert "\n" not in str(caught.value) and 'invalid value for parameter "shared_buffers"' in str(caught.value)
