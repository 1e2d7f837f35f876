"""Index advice measured on a scratch copy of a small logged catalog; apply, revert, list, safety.

The advice weighs time in two places: which statements are hot (calls x the ms the query log
recorded) and a regression only the clock shows. Both move with the machine's load, so here
the log's durations are pinned (``pin_logged_durations``) and replays are timed by their VM
steps (``steps_clock``): what the tests check is decided the same way on every run. The
regression check on wall-clock times is tested in test_advisor_regressions.py.
"""

from __future__ import annotations

import random
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex import Catalog, InputError, query_rows
from dlindex.advisor import Advice, apply_advice, list_indexes, replay, revert_indexes, suggest_indexes
from dlindex.advisor.model import advice_from_dict
from dlindex.advisor.scratch import Scratch
from dlindex.catalog.fingerprint import fingerprint
from dlindex.catalog.sandbox import guarded
from dlindex.catalog.sqlite.history_schema import SCHEMA_INDEXES
from dlindex.stats import slow_queries

from .advisor_workload import (
    FAILED,
    HOURLY,
    LABEL_FILES,
    LABELS,
    MARK,
    RANDOM,
    ROWS,
    copy_catalog,
    make_catalog,
    pin_logged_durations,
    run_workload,
    snapshot,
    steps_clock,
)
from .conftest import invoke, rows

PLANTED = {"planted_wh": "width, height"}


@pytest.fixture(scope="module", autouse=True)
def replays_timed_by_steps() -> Iterator[None]:
    with steps_clock():
        yield


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = make_catalog(tmp_path_factory.mktemp("advisor") / "logged.db", PLANTED)
    run_workload(path)
    pin_logged_durations(path)
    return path


@pytest.fixture(scope="module")
def advice(logged: Path, tmp_path_factory: pytest.TempPathFactory) -> Advice:
    path = copy_catalog(logged, tmp_path_factory.mktemp("advice") / "copy.db")
    with Catalog(path, log=False) as catalog:
        return suggest_indexes(catalog, runs=2)


@pytest.fixture
def catalog_copy(logged: Path, tmp_path: Path) -> Path:
    return copy_catalog(logged, tmp_path / "catalog.db")


def by_where(advice: Advice, where: str) -> list[str]:
    return [s.name for s in advice.suggestions if s.where == where]


def test_hot_statements_get_partial_covering_indexes(advice: Advice) -> None:
    label = next(s for s in advice.suggestions if s.where == "processed = 1")
    assert label.columns[0] == "label_id" and label.covering and "file_path" in label.columns
    served = {f.fingerprint: f for f in label.served}
    assert fingerprint(LABEL_FILES) in served and served[fingerprint(LABEL_FILES)].speedup > 3  # type: ignore[operator]
    assert label.size_bytes > 0 and label.insert_10k_ms is not None and label.update_columns == ("processed",)
    failed = next(s for s in advice.suggestions if s.where == "processing_status = 'failed'")
    assert fingerprint(FAILED) in failed.fingerprints and failed.sql.startswith("CREATE INDEX idx_dlindex_")
    assert len(advice.suggestions) == 2


def test_rare_statements_earn_no_index_and_random_order_gets_a_hint(advice: Advice) -> None:
    assert fingerprint(HOURLY) not in advice.hot
    assert not any(fingerprint(HOURLY) in s.fingerprints for s in advice.suggestions)
    hint = next(h for h in advice.hints if h.fingerprint == fingerprint(RANDOM))
    assert "ORDER BY random()" in hint.hint and "no index can avoid" in hint.hint


def test_an_index_no_logged_statement_uses_is_reported(advice: Advice) -> None:
    (finding,) = advice.unused
    assert (finding.name, finding.dlindex, finding.droppable) == ("planted_wh", False, False)
    assert finding.drop_sql == "DROP INDEX planted_wh"
    assert set(advice.as_dict()) >= {"suggestions", "unused", "redundant", "hints", "skipped", "workload"}


def test_suggest_reads_the_catalog_and_changes_nothing(
    catalog_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = snapshot(catalog_copy)
    with Catalog(catalog_copy, log=False) as catalog:
        again = suggest_indexes(catalog, runs=2)
    assert snapshot(catalog_copy) == before
    assert again.suggestions and not list(scratch.iterdir())  # the scratch copy is gone


def test_hostile_log_lines_are_reported_and_never_run(catalog_copy: Path, tmp_path: Path) -> None:
    attached = tmp_path / "attached.db"
    text = "\n".join([
        "this is not SQL",
        "DROP TABLE image_metadata",
        "DELETE FROM image_metadata",
        f"ATTACH DATABASE '{attached}' AS evil",
        "PRAGMA writable_schema = 1",
        "SELECT 1; DROP TABLE labels",
        "SELECT load_extension('/tmp/evil')",
        "UPDATE image_metadata SET processed = 0",
        "SELECT id FROM image_metadata WHERE label_id = 7 AND processed = 1 -- duration_ms=3",
    ])  # fmt: skip
    before = snapshot(catalog_copy)
    with Catalog(catalog_copy, log=False) as catalog:
        result = suggest_indexes(catalog, [("trace.sql", text)], runs=2)
    skipped = {(s.source, s.line): s.reason for s in result.skipped}
    assert sorted(line for _, line in skipped) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert all(reason.startswith("not a read-only SELECT") for reason in skipped.values())
    assert "counted as write load" in skipped[("trace.sql", 8)]
    assert snapshot(catalog_copy) == before and not attached.exists()


def test_guarded_connections_refuse_anything_but_reads(catalog_copy: Path) -> None:
    conn = guarded(catalog_copy)
    try:
        for sql in ("DELETE FROM labels", "EXPLAIN QUERY PLAN DELETE FROM labels", "PRAGMA user_version = 9",
                    "ATTACH DATABASE ':memory:' AS x", "SELECT load_extension('x')", "CREATE TABLE x (a)"):  # fmt: skip
            with pytest.raises(sqlite3.DatabaseError):
                conn.execute(sql).fetchall()
        assert conn.execute("SELECT count(*) FROM labels").fetchone() == (200,)
    finally:
        conn.close()


def test_apply_is_idempotent_and_revert_undoes_exactly_it(advice: Advice, catalog_copy: Path) -> None:
    names = {s.name for s in advice.suggestions}
    with Catalog(catalog_copy, log=False) as catalog:
        first = apply_advice(catalog, advice)
        second = apply_advice(catalog, advice)
    assert set(first.created) == names and first.analyzed and first.run == 1
    assert second.changes == () and second.run is None
    assert names <= {r[0] for r in rows(catalog_copy, "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert rows(catalog_copy, "SELECT count(*) FROM sqlite_stat1")[0][0] > 0
    assert rows(catalog_copy, "SELECT run, action FROM index_changes") == [(1, "create")] * len(names)
    with Catalog(catalog_copy, log=False) as catalog:
        undone = revert_indexes(catalog)
        nothing = revert_indexes(catalog)
    assert set(undone.dropped) == names and nothing.run is None
    remaining = {
        r[0]
        for r in rows(catalog_copy, "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
        if r[0] not in SCHEMA_INDEXES  # the schema's own
    }
    assert remaining == {"planted_wh"}


def test_drop_unused_drops_only_what_dlindex_made(catalog_copy: Path) -> None:
    conn = sqlite3.connect(catalog_copy)
    conn.execute("CREATE INDEX idx_dlindex_image_metadata_height_0 ON image_metadata (height)")
    conn.commit()
    conn.close()
    with Catalog(catalog_copy, log=False) as catalog:
        result = suggest_indexes(catalog, runs=2)
        drops = result.droppable()
        assert [f.name for f in drops] == ["idx_dlindex_image_metadata_height_0"]
        with pytest.raises(InputError, match="not created by dlindex"):
            apply_advice(catalog, result, create=False, drop=result.unused)
        changes = apply_advice(catalog, result, create=False, drop=drops)
        assert changes.dropped == ("idx_dlindex_image_metadata_height_0",) and not changes.analyzed
        assert revert_indexes(catalog).created == ("idx_dlindex_image_metadata_height_0",)
    names = {r[0] for r in rows(catalog_copy, "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"planted_wh", "idx_dlindex_image_metadata_height_0"} <= names


def test_list_counts_the_logged_statements_that_used_each_index(advice: Advice, catalog_copy: Path) -> None:
    with Catalog(catalog_copy, log=False) as catalog:
        apply_advice(catalog, advice)
    with Catalog(catalog_copy) as catalog:
        for label in (1, 2, 3):
            list(catalog.read(LABEL_FILES, (label,)))
    with Catalog(catalog_copy, log=False) as catalog:
        usage = {u.name: u for u in list_indexes(catalog)}
    label = next(s.name for s in advice.suggestions if s.where == "processed = 1")
    assert (usage[label].origin, usage[label].calls, usage[label].fingerprints) == ("dlindex", 3, 1)
    assert usage[label].last_used is not None and usage[label].size_bytes
    assert (usage["planted_wh"].origin, usage["planted_wh"].calls, usage["planted_wh"].last_used) == ("manual", 0, None)
    assert usage["sqlite_autoindex_labels_1"].origin == "constraint"


def test_a_large_catalog_is_measured_on_a_sample(catalog_copy: Path) -> None:
    with Catalog(catalog_copy, log=False) as catalog:
        sampled = suggest_indexes(catalog, runs=2, sample_rows=5_000)
    assert sampled.sample == 4 and sampled.sampled_from == ROWS
    assert any(s.where == "processed = 1" and s.columns[0] == "label_id" for s in sampled.suggestions)
    assert advice_from_dict(sampled.as_dict()) == sampled  # kept for --apply as it was
    with Scratch(catalog_copy, 5_000) as scratch:  # every 4th rowid, each fetched by its rowid
        copied = [r[0] for r in scratch.admin.execute("SELECT id FROM image_metadata ORDER BY id")]
        assert scratch.rows == ROWS and len(scratch.admin.execute("SELECT * FROM labels").fetchall()) == LABELS
    source = sqlite3.connect(catalog_copy)
    try:
        assert copied == [r[0] for r in source.execute("SELECT id FROM image_metadata WHERE id % 4 = 0 ORDER BY id")]
    finally:
        source.close()
    assert len(copied) == ROWS // 4


def test_repeated_runs_give_the_same_answer(
    advice: Advice, catalog_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same answer, to the figure, also when the wall clock is thrown off as other processes do:
    the replays here are timed by their VM steps (``steps_clock``)."""
    rng, measured = random.Random(0), time.perf_counter
    skew = [0.0]

    def loaded() -> float:  # each reading up to 50 ms later than the last one's drift
        skew[0] += rng.uniform(0.0, 0.05)
        return measured() + skew[0]

    monkeypatch.setattr(replay.time, "perf_counter", loaded)
    with Catalog(catalog_copy, log=False) as catalog:
        again = suggest_indexes(catalog, runs=2)
    assert [s.sql for s in again.suggestions] == [s.sql for s in advice.suggestions]
    figures = [(s.before_ms, s.after_ms, s.insert_10k_ms, s.update_10k_ms) for s in again.suggestions]
    assert figures == [(s.before_ms, s.after_ms, s.insert_10k_ms, s.update_10k_ms) for s in advice.suggestions]
    assert (again.hot, [f.name for f in again.unused], [r.sql for r in again.rejected]) == (
        advice.hot, [f.name for f in advice.unused], [r.sql for r in advice.rejected])  # fmt: skip
    assert [(e.fingerprint, e.change) for e in again.statements] == [
        (e.fingerprint, e.change) for e in advice.statements
    ]


def test_lock_waits_are_logged_and_shown(tmp_path: Path) -> None:
    db = make_catalog(tmp_path / "locks.db")
    with Catalog(db) as catalog:
        # The first write's whole-file check runs before the lock is taken: the 300 ms the holder
        # keeps it then all fall inside BEGIN IMMEDIATE (under load the check took a third of them).
        catalog.ensure_writable()
        holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
        release.start()
        try:
            with catalog.write_transaction() as conn:
                conn.execute(MARK, (1,))
        finally:
            release.join()
            holder.close()
    ((calls, waited),) = rows(db, "SELECT calls, lock_wait_ms FROM query_log WHERE sql = 'BEGIN IMMEDIATE'")
    assert calls == 1 and 200 <= float(waited) < 5000  # type: ignore[arg-type]
    with Catalog(db, log=False) as catalog:
        report = slow_queries(catalog)
    assert report.lock_wait_transactions == 1 and report.lock_wait_ms >= 200


def test_slow_queries_show_current_plans(logged: Path) -> None:
    with Catalog(logged, log=False) as catalog:
        report = slow_queries(catalog, top=2)
    assert len(report.queries) == 2
    assert report.queries[0].mean_ms >= report.queries[1].mean_ms
    assert all(q.plan and q.calls for q in report.queries)
    assert any("SCAN image_metadata" in line for q in report.queries for line in q.plan)


def test_logged_writes_to_a_without_rowid_table_are_measured(
    runner: CliRunner, image_tree: Path, db_path: Path
) -> None:
    # Found on a real collection: `features compute` logs writes to feature_state, a WITHOUT
    # ROWID table, and measuring their cost picked rows by rowid (no such column).
    db = str(db_path)
    assert invoke(runner, "scan", str(image_tree), "--db", db).exit_code == 0
    assert invoke(runner, "features", "compute", "--type", "c", "--extractor", "colorhist", "--db", db).exit_code == 0
    with Catalog(db_path) as catalog:
        with catalog.write_transaction() as conn:  # one more logged write shape on feature_state
            conn.execute("UPDATE feature_state SET state = 'queued' WHERE image_id = -1")
        for _ in range(3):
            list(query_rows(catalog, processing_status=["failed"], cache=False))
        suggest_indexes(catalog)
    logged = rows(db_path, "SELECT count(*) FROM query_log WHERE kind = 'write' AND table_name = 'feature_state'")
    assert logged[0][0] > 0  # the writes whose cost the advice measures
    result = invoke(runner, "index", "--suggest", "--db", db)
    assert result.exit_code == 0, result.output
