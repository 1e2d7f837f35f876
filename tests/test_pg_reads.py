"""Streamed reads of a server catalog (dlindex/catalog/postgres/aside.py): the rows come as the
server makes them, not after it has copied the whole result (a WITH HOLD cursor), and a read
still sees what it saw before (its own write transaction's rows; what was committed when it began)."""

from __future__ import annotations

import pytest

from dlindex import Catalog
from dlindex.errors import CatalogSQLError

psycopg = pytest.importorskip("psycopg")

_IDLE_IN_TRANSACTION = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'dlindex' "
    "AND state LIKE 'idle in transaction%'"
)


def _catalog_with_rows(url: str, n: int) -> None:
    with Catalog(url, create=True) as catalog:
        catalog.conn.execute_raw(f"CREATE TABLE numbers AS SELECT g FROM generate_series(1, {int(n)}) g")  # type: ignore[attr-defined]


def _idle_in_transaction(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int((conn.execute(_IDLE_IN_TRANSACTION).fetchone() or (0,))[0])


def test_the_first_rows_come_before_the_server_has_made_the_last(pg_url: str) -> None:
    """Row 4,000 cannot be made (a cast fails): a cursor whose result the server copies whole
    before the first fetch fails at once; a streamed one gives the rows before it first."""
    _catalog_with_rows(pg_url, 5000)
    failing = "SELECT g, CAST(CASE WHEN g = 4000 THEN 'x' ELSE CAST(g AS TEXT) END AS INTEGER) FROM numbers"
    with Catalog(pg_url) as catalog:
        rows = catalog.read(failing)
        assert [next(rows)[0] for _ in range(100)] == list(range(1, 101))
        with pytest.raises(CatalogSQLError, match="invalid input syntax"):
            list(rows)
        assert [tuple(r) for r in catalog.read("SELECT count(*) FROM numbers")] == [(5000,)]
        assert _idle_in_transaction(pg_url) == 0


def test_a_read_keeps_its_snapshot_and_ends_its_transaction(pg_url: str) -> None:
    """A read open across another transaction's commit sees what was committed when it began;
    once no read is open, no connection of the catalog is left inside a transaction."""
    _catalog_with_rows(pg_url, 3000)
    with Catalog(pg_url) as catalog:
        rows = catalog.read("SELECT g FROM numbers ORDER BY g")
        assert next(rows) == (1,)
        assert _idle_in_transaction(pg_url) == 1  # the read's, open while it is
        with catalog.write_transaction() as conn:
            conn.execute("INSERT INTO roots (path) VALUES ('/committed')")
        assert sum(1 for _ in rows) == 2999
        assert _idle_in_transaction(pg_url) == 0
        assert [r[0] for r in catalog.read("SELECT path FROM roots")] == ["/committed"]


def test_a_read_inside_a_write_transaction_sees_its_rows(pg_url: str) -> None:
    _catalog_with_rows(pg_url, 1)
    with Catalog(pg_url) as catalog, catalog.write_transaction() as conn:
        conn.execute("INSERT INTO roots (path) VALUES ('/not yet committed')")
        assert [r[0] for r in catalog.read("SELECT path FROM roots")] == ["/not yet committed"]
