"""The query log: fingerprints, plans, what reads and writes record, import, show, clear."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dlindex import (
    Catalog,
    ScanOptions,
    catalog_stats,
    clear_log,
    import_log,
    log_summary,
    mark_samples,
    query_rows,
    sample_ids,
    scan_tree,
)
from dlindex.catalog.fingerprint import fingerprint, normalize, table_of
from dlindex.catalog.recorder import RESERVOIR_SIZE, classify_plan
from dlindex.catalog.sqlite.migrations import APPLICATION_ID, LATEST_VERSION, m001_initial
from dlindex.querylog.importer import parse_statements, statement_kind

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, on_postgresql
from .conftest import rows
from .synthetic import balanced

pytestmark = ON_BOTH_BACKENDS


def log_rows(db: Path, where: str = "1 = 1") -> list[tuple[object, ...]]:
    return rows(
        db, f"SELECT kind, source, sql, rows, plan, cached, calls, duration_ms FROM query_log WHERE {where} ORDER BY id"
    )


def test_fingerprint_folds_literals_placeholders_lists_and_spacing() -> None:
    same = [
        "SELECT id FROM image_metadata WHERE label_id = 3 AND status = 'ok'",
        "select id\n  from image_metadata where label_id = ? and status = :status;",
        "SELECT id FROM image_metadata WHERE label_id = 12 AND status = 'it''s'  -- a comment",
    ]
    assert len({fingerprint(s) for s in same}) == 1
    assert (
        normalize("SELECT * FROM t WHERE id IN (1, 2, 3) AND x = -- c\n 4.5")
        == "select * from t where id in (?) and x = ?"
    )
    assert normalize("INSERT INTO t VALUES (1, 'a'), (2, 'b')") == "insert into t values (?)"
    assert fingerprint("SELECT a FROM t") != fingerprint("SELECT b FROM t")
    assert normalize("SELECT class_0001 FROM t2") == "select class_0001 from t2"


def test_table_and_kind_of_statements() -> None:
    assert table_of("UPDATE image_metadata SET processed = 1") == "image_metadata"
    assert table_of("INSERT OR IGNORE INTO labels (name) VALUES (?)") == "labels"
    assert table_of("SELECT x FROM (SELECT id AS x FROM image_metadata) AS s") == "image_metadata"
    assert table_of('DELETE FROM "main"."roots"') == "roots"
    assert [statement_kind(s) for s in ("select 1", "WITH a AS (SELECT 1) SELECT * FROM a", "update t set a=1",
                                        "WITH a AS (SELECT 1) DELETE FROM t", "BEGIN", "PRAGMA x", "DROP TABLE t")] == [
        "read", "read", "write", "write", "skip", None, None,
    ]  # fmt: skip


def test_classify_plan() -> None:
    assert classify_plan(["SCAN image_metadata"]) == "scan"
    assert classify_plan(["SEARCH image_metadata USING INDEX idx_a (label_id=?)"]) == "index"
    assert classify_plan(["SEARCH image_metadata USING INTEGER PRIMARY KEY (rowid=?)"]) == "index"
    assert classify_plan(["SCAN image_metadata USING COVERING INDEX idx_b"]) == "index"
    assert classify_plan(["MATERIALIZE sample", "SCAN image_metadata", "SCAN sample"]) == "scan"
    assert classify_plan(["SCAN c VIRTUAL TABLE INDEX 1:", "SEARCH t USING INTEGER PRIMARY KEY (rowid=?)"]) == "index"
    assert classify_plan(["SCAN CONSTANT ROW"]) == "none"
    assert classify_plan([]) == "none"


def test_a_query_records_its_template_duration_rows_and_plan(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 5, "b": 5})
    with Catalog(db) as catalog:
        got = list(query_rows(catalog, labels="a", processed=False, columns="id,file_path", cache=False))
    assert len(got) == 5
    entries = log_rows(db, "sql LIKE 'SELECT image_metadata.id%'")
    assert len(entries) == 1
    kind, source, sql, n, plan, cached, calls, duration = entries[0]
    assert (kind, source, n, plan, cached, calls) == ("read", "dlindex", 5, "scan", 0, 1)
    assert sql == (
        "SELECT image_metadata.id, image_metadata.file_path FROM image_metadata WHERE "
        "image_metadata.label_id = :label_id AND image_metadata.status = 'ok' AND image_metadata.processed = 0 "
        "AND image_metadata.excluded = 0 ORDER BY image_metadata.id"
    )
    assert isinstance(duration, float) and duration >= 0
    (template,) = rows(
        db, "SELECT fingerprint, plan_detail, offered, sample_params FROM query_log_templates WHERE sql = ?", (sql,)
    )
    scan = "Seq Scan on image_metadata" if on_postgresql() else "SCAN image_metadata"  # each planner's words
    assert template[0] == fingerprint(str(sql)) and scan in str(template[1])
    assert template[2] == 1 and json.loads(str(template[3])) == [{"label_id": 1}]


def test_cached_answers_are_logged_as_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dlindex.query.cache.FETCH_S", 0.0)  # cache even a tiny result
    db = balanced(tmp_path / "b.db", {"a": 5})
    for _ in range(3):
        with Catalog(db) as catalog:
            list(query_rows(catalog, per_label=2))
    assert [e[5] for e in log_rows(db, "sql LIKE '%ROW_NUMBER%'")] == [0, 1, 1]


def test_no_log_and_env_switch_logging_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = balanced(tmp_path / "b.db", {"a": 5})
    with Catalog(db, log=False) as catalog:
        list(query_rows(catalog))
        mark_samples(catalog, ["1"], processed=True)
    monkeypatch.setenv("DLINDEX_NO_LOG", "1")
    with Catalog(db) as catalog:
        list(query_rows(catalog, per_label=1, columns="id"))
    assert log_rows(db) == []
    monkeypatch.setenv("DLINDEX_NO_LOG", "0")
    with Catalog(db) as catalog:
        list(query_rows(catalog, per_label=1, columns="id"))
    assert len(log_rows(db)) == 1


def test_stats_reads_are_logged(scanned_db: Path) -> None:
    with Catalog(scanned_db) as catalog:
        catalog_stats(catalog)
    reads = [str(e[2]) for e in log_rows(scanned_db, "kind = 'read'")]
    assert any(sql.startswith("SELECT label_id, split, count(*) FILTER") for sql in reads)  # one pass (#34)
    assert len(reads) >= 6


def test_scan_writes_are_counted_per_statement_shape(
    image_tree: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one flush: on a busy machine the half-second timer split the seven rows, and the labels' statement ran twice
    monkeypatch.setattr("dlindex.scan.batch_writer._FLUSH_SECONDS", 3600.0)
    with Catalog(db_path, create=True) as catalog:
        scan_tree(catalog, image_tree, ScanOptions(workers=1))
    writes = rows(
        db_path,
        # a write transaction that waited over 1 ms for its lock (a busy machine) adds a lock-wait
        # row, which names no table: those are tested by themselves
        "SELECT table_name, sum(calls), sum(rows) FROM query_log WHERE kind = 'write' AND lock_wait_ms IS NULL"
        " GROUP BY fingerprint, table_name",
    )
    assert ("image_metadata", 7, 7) in writes  # six PNGs and the broken file, in one upsert shape
    assert ("labels", 1, 2) in writes  # both labels (cat, dog) in one set-based statement
    assert all(table in ("image_metadata", "labels", "roots", "scans") for table, _, _ in writes)


@SQLITE_ONLY
def test_the_writes_of_a_transaction_whose_commit_failed_are_not_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dlindex.catalog.recorder.FLUSH_SECONDS", 3600.0)  # nothing flushes before the close
    db = balanced(tmp_path / "b.db", {"a": 100})
    with Catalog(db) as catalog:
        conn = catalog.conn
        real = conn.execute

        def commit_fails(sql: str, parameters: Any = (), /) -> Any:
            if sql == "COMMIT":  # as a full disk or a lost server would
                raise sqlite3.OperationalError("disk I/O error")
            return real(sql, parameters)

        conn.execute = commit_fails  # type: ignore[method-assign]
        with pytest.raises(sqlite3.OperationalError), catalog.write_transaction() as tx:
            tx.execute("UPDATE image_metadata SET width = 1 WHERE id = 1")
        del conn.execute
        with catalog.write_transaction() as tx:
            tx.execute("UPDATE image_metadata SET width = 2 WHERE id = 2")
    assert rows(db, "SELECT width FROM image_metadata WHERE id IN (1, 2) ORDER BY id")[1] == (2,)
    assert rows(db, "SELECT kind, calls, rows FROM query_log WHERE sql LIKE 'UPDATE%'") == [("write", 1, 1)]


def test_write_counts_are_batched_not_one_row_per_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dlindex.catalog.recorder.FLUSH_SECONDS", 3600.0)  # a slow machine must not flush mid-loop
    db = balanced(tmp_path / "b.db", {"a": 100})
    with Catalog(db) as catalog:
        for i in range(1, 51):
            with catalog.write_transaction() as conn:
                conn.execute("UPDATE image_metadata SET width = ? WHERE id = ?", (i, i))
    # (A stalled disk can add a 'BEGIN IMMEDIATE' lock-wait entry: not what this test is about.)
    assert rows(db, "SELECT kind, calls, rows FROM query_log WHERE sql LIKE 'UPDATE%'") == [("write", 50, 50)]
    assert rows(db, "SELECT count(*) FROM query_log WHERE sql NOT LIKE 'BEGIN%'") == [(1,)]


def test_reservoir_keeps_a_bounded_sample_of_parameters(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 30})
    for round_ in range(3):
        with Catalog(db) as catalog:
            for width in range(20):
                list(query_rows(catalog, min_width=round_ * 100 + width, columns="id"))
    ((offered, params),) = rows(
        db, "SELECT offered, sample_params FROM query_log_templates WHERE sql LIKE '%min_width%'"
    )
    samples = json.loads(str(params))
    assert offered == 60 and len(samples) == RESERVOIR_SIZE
    assert all(set(s) == {"min_width"} for s in samples)
    assert len({s["min_width"] // 100 for s in samples}) >= 2  # not only the first process's


def test_parse_statements_semicolons_lines_and_durations() -> None:
    text = """-- captured with .trace
SELECT id FROM image_metadata
  WHERE processed = 1;   -- duration_ms=12.5
-- duration_ms=3
UPDATE image_metadata SET processed = 1 WHERE id = 7;
SELECT ';' FROM t; SELECT 2;
"""
    parsed = list(parse_statements(text))
    assert [(p.sql, p.line, p.duration_ms) for p in parsed] == [
        ("SELECT id FROM image_metadata WHERE processed = 1", 2, 12.5),
        ("UPDATE image_metadata SET processed = 1 WHERE id = 7", 5, 3.0),
        ("SELECT ';' FROM t; SELECT 2", 6, None),
    ]
    lines = list(parse_statements("SELECT 1\nselect a from t where x = 'y'  -- duration_ms=0.25\n\n"))
    assert [(p.sql, p.duration_ms) for p in lines] == [("SELECT 1", None), ("select a from t where x = 'y'", 0.25)]


@SQLITE_ONLY
def test_parse_a_set_trace_callback_dump(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 3})
    captured: list[str] = []
    conn = sqlite3.connect(db)
    conn.set_trace_callback(captured.append)
    conn.execute("SELECT id FROM image_metadata WHERE label_id = ? AND processed = 1", (1,)).fetchall()
    conn.execute(
        "SELECT id,\n  (SELECT name FROM labels\nWHERE labels.id = label_id)\n  FROM image_metadata"
    ).fetchall()
    conn.close()
    parsed = list(parse_statements("\n".join(captured) + "\n"))
    assert [p.sql for p in parsed] == [
        "SELECT id FROM image_metadata WHERE label_id = 1 AND processed = 1",
        "SELECT id, (SELECT name FROM labels WHERE labels.id = label_id) FROM image_metadata",
    ]
    assert [p.line for p in parsed] == [1, 2]


def test_import_stores_statements_and_never_runs_them(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 3})
    text = "\n".join(
        [
            "SELECT id FROM image_metadata WHERE label_id = 1; -- duration_ms=4",
            "SELECT id FROM image_metadata WHERE label_id = 2; -- duration_ms=6",
            "DROP TABLE image_metadata;",
            "PRAGMA writable_schema = 1;",
            "ATTACH DATABASE 'x.db' AS x;",
            "UPDATE image_metadata SET processed = 1 WHERE id = 1;",
            "DELETE FROM image_metadata WHERE 1; SELECT 1;",
            "BEGIN;",
            "this is not sql;",
        ]
    )
    with Catalog(db) as catalog:
        summary = import_log(catalog, text)
    assert (summary.imported, summary.skipped) == (3, 6)
    assert [line for line, _ in summary.skipped_lines] == [3, 4, 5, 7, 9]
    assert rows(db, "SELECT count(*), sum(processed) FROM image_metadata") == [(3, 0)]
    assert rows(db, "SELECT kind, source, duration_ms FROM query_log ORDER BY id") == [
        ("read", "import", 4.0), ("read", "import", 6.0), ("write", "import", None),
    ]  # fmt: skip
    with Catalog(db) as catalog:
        top = log_summary(catalog).fingerprints[0]
    assert (top.calls, top.total_ms, top.mean_ms, top.sources) == (2, 10.0, 5.0, ("import",))


def test_summary_ranks_by_total_time_with_p95(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 3})
    text = "".join(f"SELECT a FROM t WHERE x = {i}; -- duration_ms={i}\n" for i in range(1, 101))
    text += "SELECT b FROM t; -- duration_ms=1000\nSELECT c FROM t; -- duration_ms=1\n"
    with Catalog(db, log=False) as catalog:
        import_log(catalog, text)
        summary = log_summary(catalog, top=2)
    assert summary.entries == 102
    first, second = summary.fingerprints
    assert (first.calls, first.total_ms, first.mean_ms, first.p95_ms) == (100, 5050.0, 50.5, 95.0)
    assert (second.calls, second.total_ms) == (1, 1000.0)
    assert first.plan == "unknown"
    assert set(summary.as_dict()["fingerprints"][0]) >= {"fingerprint", "sql", "calls", "mean_ms", "p95_ms", "plan"}


def test_clear_empties_the_log(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 3})
    with Catalog(db) as catalog:
        list(query_rows(catalog))
    with Catalog(db) as catalog:
        catalog.flush_log()
        assert clear_log(catalog) >= 1
    assert rows(db, "SELECT count(*) FROM query_log") == [(0,)]
    assert rows(db, "SELECT count(*) FROM query_log_templates") == [(0,)]


@SQLITE_ONLY
def test_a_busy_catalog_never_fails_a_read_for_its_log(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 3})
    catalog = Catalog(db)
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        catalog.querylog.last_flush -= 100  # make a mid-run flush due
        assert len(list(query_rows(catalog, cache=False))) == 3
        assert catalog.querylog.has_entries()  # kept for later: the read did not wait
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    catalog.close()
    assert len(log_rows(db)) == 3  # written when the catalog closed


@SQLITE_ONLY
def test_version_1_catalog_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "v1.db"
    conn = sqlite3.connect(db, isolation_level=None)
    m001_initial(conn)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO roots (path) VALUES ('/r')")
    conn.execute("INSERT INTO labels (name) VALUES ('a')")
    conn.execute("INSERT INTO image_metadata (root_id, file_path, label_id) VALUES (1, 'a/1.png', 1)")
    conn.close()
    with Catalog(db) as catalog:
        assert sample_ids(catalog) == [1]
        assert catalog.changes() == 0
    assert rows(db, "PRAGMA user_version") == [(LATEST_VERSION,)]


def test_garbage_with_an_unclosed_parenthesis_does_not_swallow_the_rest() -> None:
    from dlindex.querylog.importer import parse_statements

    text = (
        "SELECT broken FROM image_metadata WHERE (\n"
        "SELECT id FROM image_metadata WHERE id IN (SELECT id FROM labels)\n"
        "SELECT id FROM image_metadata WHERE processed = 1\n"
        "SELECT id FROM image_metadata WHERE processed = 0\n"
    )
    sqls = [s.sql for s in parse_statements(text)]
    assert sqls[-2:] == [
        "SELECT id FROM image_metadata WHERE processed = 1",
        "SELECT id FROM image_metadata WHERE processed = 0",
    ]
