"""Real PostgreSQL and Redis servers for the tests: one of each per session, a fresh database per test.

``.ci/run`` starts both and says where through ``DLINDEX_TEST_POSTGRES`` (a server URL) and
``DLINDEX_TEST_REDIS`` (``redis://HOST:PORT``); without them the session starts its own (with
dlindex's own ``pgserver`` and ``redis-server``) on free ports and stops them at its end. Where
the programs or client libraries are absent the tests that use them skip, saying why.

A test server is thrown away after the run, so it is run without durability (``throwaway``): no
fsync, no synchronous commit. Each ``DROP DATABASE`` forces a checkpoint, and with fsync on a
checkpoint waits for the disk: on a busy machine that made one test's teardown take 75 s. It also
keeps 100,000 pg_stat_statements entries (the default 5,000 fill up within one run of the suite,
every test database's statements counted apart, and the server then evicts the least-used: a
test's one-off ``CREATE INDEX`` vanished from the view it was checked in).

    def test_x(pg_url: str, redis_url: str) -> None:  # an empty database, an empty Redis db
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from dlindex.catalog.postgres.local_server import find_bindir, start_local_postgres, stop_local_postgres
from dlindex.errors import DlindexError

# Read at import: the autouse fixture of conftest.py removes every DLINDEX_* variable per test.
ENV_POSTGRES = os.environ.get("DLINDEX_TEST_POSTGRES")
ENV_REDIS = os.environ.get("DLINDEX_TEST_REDIS")
# Redis has 16 logical dbs by default; 0 is left alone. Under pytest-xdist the workers may share one
# server ($DLINDEX_TEST_REDIS): each takes every Nth db, so no two tests ever flush each other's.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_REDIS_DBS = itertools.cycle(range(1 + _WORKER % 15, 16, min(_WORKERS, 15)))  # up to 15 workers


def postgres_home() -> Path:
    """A new folder under the system temp dir that the postgres OS user can reach (under root the
    server runs as that user, and pytest's own temp folders are 0700 root). The caller removes it."""
    home = Path(tempfile.mkdtemp(prefix="dlindex-test-pg-"))
    home.chmod(0o711)
    return home


def require_postgres() -> None:
    """Skip the test unless PostgreSQL's server programs are installed."""
    try:
        find_bindir()
    except DlindexError as e:
        pytest.skip(f"no PostgreSQL server: {e}")


def with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


STATEMENTS_KEPT = 100_000  # pg_stat_statements.max of a test server (a restart applies it)


def throwaway(url: str) -> None:
    """Run the server at ``url`` (superuser) as a scratch server: what it writes is not fsynced,
    commits do not wait for the disk, and checkpoints cost no disk flush. For test servers only:
    the data of a server that crashes (the machine, not PostgreSQL) is lost. Also sets the
    pg_stat_statements limit, which takes effect at the next start."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for name in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {name} = off")
        conn.execute(f"ALTER SYSTEM SET pg_stat_statements.max = {STATEMENTS_KEPT}")
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a PostgreSQL server's ``dlindex`` database (superuser): $DLINDEX_TEST_POSTGRES or our own."""
    if ENV_POSTGRES:
        yield ENV_POSTGRES
        return
    require_postgres()
    home = postgres_home()
    try:
        url = start_local_postgres(home / "data")
        with contextlib.suppress(ImportError):  # without psycopg no test reaches the server's databases
            throwaway(url)
            stop_local_postgres(home / "data")  # the statements limit needs a restart (same port)
            url = start_local_postgres(home / "data")
        yield url
    finally:
        if (home / "data" / "PG_VERSION").exists():
            stop_local_postgres(home / "data")
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server: str) -> Iterator[str]:
    """A new, empty database on the session's server, dropped (sessions and all) after the test."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")
    from psycopg import sql

    name = f"dlindex_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield with_database(postgres_server, name)
    finally:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """``redis://127.0.0.1:PORT`` of a Redis server: $DLINDEX_TEST_REDIS or our own (no persistence)."""
    if ENV_REDIS:
        yield ENV_REDIS
        return
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("no Redis server: redis-server is not on PATH (apt-get install redis-server)")
    home = Path(tempfile.mkdtemp(prefix="dlindex-test-redis-"))
    port = free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(home),
            "--logfile", str(home / "redis.log")]  # fmt: skip
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_redis(proc, port, home / "redis.log")
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """``redis://HOST:PORT/N``: a logical db of the session's server, emptied (FLUSHDB) for this test."""
    redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install -e '.[test]')")
    url = with_database(redis_server, str(next(_REDIS_DBS)))
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()
    return url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_redis(proc: subprocess.Popen[bytes], port: int, log: Path, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            pytest.fail(f"redis-server exited with {proc.returncode}: {tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"redis-server did not answer on port {port} within {timeout_s} s")
