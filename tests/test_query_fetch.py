"""A per-label sample's rows read by id through several connections (dlindex.query.fetch):
the same rows in the same order as the one statement, from one snapshot, logged as before."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from dlindex import Catalog, QuerySpec, query_rows
from dlindex.query import fetch, per_label, windows
from dlindex.query.rows import prepare

from .synthetic import Row, make_catalog, present_root

_INDEX = "CREATE INDEX per_label ON image_metadata (label_id, path_hash, id) WHERE status = 'ok' AND excluded = 0"


def _sampled(folder: Path, on_disk: bool = False) -> Path:
    """Twelve labels of uneven size, some rows without a hash or a class, and the per-label
    index (``on_disk``: an empty file at each row's path, for an export)."""
    rows = [Row(f"l{i % 12}", width=i, processed=i % 3 == 0) for i in range(4000)]
    rows += [Row("odd", status="corrupt") for _ in range(30)]
    db = make_catalog(folder / "c.db", rows, **({"root": present_root(folder / "tree", rows)} if on_disk else {}))
    conn = sqlite3.connect(db)
    conn.execute("UPDATE image_metadata SET path_hash = NULL WHERE id % 89 = 0")
    conn.execute("UPDATE image_metadata SET label_id = NULL WHERE id % 13 = 0")
    conn.execute(_INDEX)
    conn.commit()
    conn.close()
    return db


@pytest.fixture
def sampled(tmp_path: Path) -> Path:
    return _sampled(tmp_path)


@pytest.fixture
def always_apart(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Small chunks, every row 'slow': the other connections read whatever they can; the chunks
    they read are counted."""
    monkeypatch.setattr(fetch, "CHUNK", 7)
    monkeypatch.setattr(fetch, "_PROBE", 3)
    monkeypatch.setattr(fetch, "_SLOW_ROW_S", -1.0)
    read_apart: list[int] = []
    real = fetch._read

    def counted(conn: Any, sql: str, chunk: Any) -> list[tuple[Any, ...]]:
        if threading.current_thread().name.startswith("dlindex-fetch"):
            read_apart.append(len(chunk))
        return real(conn, sql, chunk)

    monkeypatch.setattr(fetch, "_read", counted)
    return read_apart


def _one_statement(db: Path, spec: QuerySpec, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The rows as the one statement gives them (the seek's ids never read apart)."""
    with Catalog(db, log=False) as catalog:
        assert prepare(catalog, spec).picked_sql is not None  # the seek: this test is about its rows
    with monkeypatch.context() as patch:
        patch.setattr(per_label, "picked", lambda template: None)
        with Catalog(db, log=False) as catalog:
            assert prepare(catalog, spec).picked_sql is None
            return list(query_rows(catalog, spec))


CASES = [
    QuerySpec(per_label=5, seed=0, cache=False),
    QuerySpec(per_label=40, seed=3, cache=False),  # wraps round the ring, then rows without a hash
    QuerySpec(per_label=9, seed=1, processed=True, limit=50, offset=7, cache=False),
    QuerySpec(per_label=9, seed=1, offset=10_000, cache=False),
    QuerySpec(per_label=3, seed=2, labels=("l1", "l7"), columns=("id", "path", "label", "width"), cache=False),
    QuerySpec(per_label=500, seed=4, limit=0, cache=False),
]


@pytest.mark.parametrize("spec", CASES, ids=range(len(CASES)))
def test_the_rows_and_their_order_are_the_statements(
    sampled: Path, spec: QuerySpec, always_apart: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _one_statement(sampled, spec, monkeypatch)
    always_apart.clear()
    with Catalog(sampled, log=False) as catalog:
        assert list(query_rows(catalog, spec)) == expected
    if len(expected) > 3 + 4 * 7:
        assert sum(always_apart) > 0  # the other connections did read


def test_a_sample_read_apart_is_cached_as_its_statement_would_be(
    sampled: Path, always_apart: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlindex.query import cache

    expected = _one_statement(sampled, QuerySpec(per_label=40, seed=3, cache=False), monkeypatch)
    monkeypatch.setattr(cache, "worth_storing", lambda seconds, rows: True)
    hits: list[bool] = []
    real_lookup = cache.lookup
    monkeypatch.setattr(cache, "lookup", lambda *a: hits.append(real_lookup(*a) is not None) or real_lookup(*a))
    spec = QuerySpec(per_label=40, seed=3)
    read: list[int] = []
    for _ in range(2):  # read apart and stored, then answered from the cache
        always_apart.clear()
        with Catalog(sampled) as catalog:
            assert list(query_rows(catalog, spec)) == expected
        read.append(sum(always_apart))
    # the second time the stored ids, their rows read apart too (a cold cache: 2.5 -> 1.0 s at 10^8)
    assert hits == [False, True] and read[0] > 0 and read[1] == len(expected) - fetch._PROBE


def test_a_cached_result_not_in_id_order_keeps_its_order(
    sampled: Path, always_apart: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored ids that do not ascend (a shuffled selection) are read in their own order."""
    from dlindex.query import cache

    monkeypatch.setattr(cache, "worth_storing", lambda seconds, rows: True)
    spec = QuerySpec(order="random", seed=5, limit=300, columns=("id", "width"))
    with Catalog(sampled) as catalog:
        first = list(query_rows(catalog, spec))
    with Catalog(sampled) as catalog:
        assert (
            cache.lookup(
                catalog,
                cache.cache_key(prepare(catalog, spec).selection_sql, prepare(catalog, spec).params),
                catalog.changes(),
            )
            is not None
        )
        again = list(query_rows(catalog, spec))
    assert again == first and [r["id"] for r in first] != sorted(r["id"] for r in first)
    assert not always_apart  # by the catalog's own connection, in the stored order


def test_a_write_meanwhile_changes_nothing_read(sampled: Path, always_apart: list[int]) -> None:
    """Rows read after another writer committed still come from the reader's snapshot."""
    spec = QuerySpec(per_label=40, seed=3, columns=("id", "width"), cache=False)
    with Catalog(sampled, log=False) as catalog:
        rows = query_rows(catalog, spec)
        first = [next(rows) for _ in range(5)]
        with Catalog(sampled, log=False) as other, other.write_transaction() as conn:
            conn.execute("UPDATE image_metadata SET width = -1")
        rest = list(rows)
    widths = {row["width"] for row in first + rest}
    assert -1 not in widths and len(first + rest) > 100
    with Catalog(sampled, log=False) as catalog:  # and a new query sees the write
        assert {row["width"] for row in query_rows(catalog, spec)} == {-1}


def test_without_other_connections_the_callers_reads_them_all(
    sampled: Path, always_apart: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlindex.catalog.sqlite.backend import SqliteBackend

    def refused(self: SqliteBackend, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("unable to open database file")

    spec = QuerySpec(per_label=40, seed=3, cache=False)
    expected = _one_statement(sampled, spec, monkeypatch)
    always_apart.clear()
    monkeypatch.setattr(SqliteBackend, "connect_reader", refused)
    with Catalog(sampled, log=False) as catalog:
        assert list(query_rows(catalog, spec)) == expected
    assert always_apart == []


def test_rows_in_memory_are_read_by_one_connection(sampled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[object] = []
    from dlindex.catalog.sqlite.backend import SqliteBackend

    real = SqliteBackend.connect_reader

    def counted(self: SqliteBackend, **kwargs: Any) -> Any:
        opened.append(kwargs)
        return real(self, **kwargs)

    monkeypatch.setattr(SqliteBackend, "connect_reader", counted)
    monkeypatch.setattr(fetch, "_SLOW_ROW_S", 10.0)
    with Catalog(sampled, log=False) as catalog:
        assert len(list(query_rows(catalog, QuerySpec(per_label=40, seed=3, cache=False)))) > 100
    assert opened == []


def test_the_log_holds_the_statement_as_before(sampled: Path, always_apart: list[int]) -> None:
    spec = QuerySpec(per_label=40, seed=3, cache=False)
    with Catalog(sampled) as catalog:
        rows = len(list(query_rows(catalog, spec)))
        sql = prepare(catalog, spec).sql
    conn = sqlite3.connect(sampled)
    logged = conn.execute("SELECT sql, rows FROM query_log WHERE kind = 'read' AND sql = ?", (sql,)).fetchall()
    conn.close()
    assert logged == [(sql, rows)] and rows > 100


_WINDOW_INDEX = "CREATE INDEX by_time ON image_metadata (created_at) WHERE excluded = 0 AND status = 'ok'"


@pytest.fixture
def timed(sampled: Path) -> Path:
    """The sampled catalog with a row a second from 2026-01-01 on, and the time window's index."""
    conn = sqlite3.connect(sampled)
    conn.execute("UPDATE image_metadata SET created_at = datetime('2026-01-01', '+' || (id * 7 % 4030) || ' seconds')")
    conn.execute(_WINDOW_INDEX)
    conn.commit()
    conn.close()
    return sampled


WINDOWS = [
    QuerySpec(since="2026-01-01 00:10:00", until="2026-01-01 00:40:00", cache=False),
    QuerySpec(until="2026-01-01 00:05:00", cache=False),  # closed on its other side by dlindex
    QuerySpec(since="2026-01-01 01:00:00", limit=40, offset=9, cache=False),
    QuerySpec(
        since="2026-01-01 00:10:00", until="2026-01-01 00:40:00", columns=("id", "path", "created_at"), cache=False
    ),
]


@pytest.mark.parametrize("spec", WINDOWS, ids=range(len(WINDOWS)))
def test_a_narrow_windows_rows_read_apart_are_the_statements(
    timed: Path, spec: QuerySpec, always_apart: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Catalog(timed, log=False) as catalog:
        assert prepare(catalog, spec).picked_sql is not None
    with monkeypatch.context() as patch:
        patch.setattr(windows, "ids_from_index", lambda *args: None)
        with Catalog(timed, log=False) as catalog:
            expected = list(query_rows(catalog, spec))
    always_apart.clear()
    with Catalog(timed, log=False) as catalog:
        assert list(query_rows(catalog, spec)) == expected
    assert len(expected) > 30 and sum(always_apart) > 0


@pytest.mark.parametrize(
    "spec",
    [
        QuerySpec(since="2026-01-01 00:10:00", until="2026-01-01 00:40:00", processed=True),  # a filter from the row
        QuerySpec(since="2026-01-01 00:10:00", until="2026-01-01 00:40:00", order="random"),
        QuerySpec(since="2026-01-01 00:10:00", status=("corrupt",)),  # not what the partial index holds
    ],
)
def test_a_window_whose_ids_need_the_table_runs_as_one_statement(timed: Path, spec: QuerySpec) -> None:
    with Catalog(timed, log=False) as catalog:
        assert prepare(catalog, spec).picked_sql is None


def test_a_wide_window_runs_as_one_statement(timed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(windows, "PROBE", 50)  # more rows than this: wide, walked in id order
    with Catalog(timed, log=False) as catalog:
        assert prepare(catalog, QuerySpec(since="2026-01-01 00:10:00", until="2026-01-01 00:40:00")).picked_sql is None


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_export_of_a_sample_read_apart_writes_the_same_shards(
    tmp_path: Path, fmt: str, always_apart: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dlindex export --per-label` reads its sample as `dlindex query` does (dlindex.export.plan.select_rows)."""
    from typer.testing import CliRunner

    sampled = _sampled(tmp_path, on_disk=True)

    from dlindex.cli import app

    def export(out: Path) -> dict[str, bytes]:
        args = ["export", str(out), "--db", str(sampled), "--format", fmt, "--per-label", "40", "--seed", "3", "-q"]
        result = CliRunner().invoke(app, [*args, "--no-log"])
        assert result.exit_code == 0, result.output
        return {p.name: p.read_bytes() for p in out.iterdir() if "index" not in p.name}

    with monkeypatch.context() as patch:
        patch.setattr(per_label, "picked", lambda template: None)
        expected = export(tmp_path / "one")
    always_apart.clear()
    assert export(tmp_path / "apart") == expected
    assert len(expected) == 1 and sum(always_apart) > 0


def test_a_sample_without_its_index_runs_as_one_statement(tmp_path: Path) -> None:
    """The window shape reads every row anyway: its ids are not read apart, then its rows again."""
    db = make_catalog(tmp_path / "c.db", [Row(f"l{i % 3}") for i in range(60)])
    with Catalog(db, log=False) as catalog:
        prepared = prepare(catalog, QuerySpec(per_label=4, seed=1))
        assert "ROW_NUMBER()" in prepared.sql and prepared.picked_sql is None
