"""The test suite's own servers (tests/servers.py): pg_url and redis_url give fresh, working databases."""

from __future__ import annotations

import pytest

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e '.[test]')")
redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install -e '.[test]')")


@pytest.mark.parametrize("round", [1, 2])
def test_pg_url_is_a_fresh_database(pg_url: str, round: int) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT current_database() LIKE 'dlindex_test_%'").fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
        conn.execute("CREATE TABLE left_behind (n int)")  # the next round must not see it


def test_the_server_preloads_pg_stat_statements(postgres_server: str) -> None:
    with psycopg.connect(postgres_server) as conn:
        (libraries,) = conn.execute("SHOW shared_preload_libraries").fetchone() or ("",)
    assert "pg_stat_statements" in libraries


@pytest.mark.parametrize("round", [1, 2])
def test_redis_url_is_an_empty_db(redis_url: str, round: int) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.ping() is True
        assert client.dbsize() == 0
        client.set("left-behind", b"1")
    finally:
        client.close()
