"""Index advice for the reads that must stay fast at size (#34): per-label sampling, time windows,
the catalog's planner statistics carried onto a sampled copy, a bounded ANALYZE."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dlindex import Catalog, QuerySpec, query_rows, sample_ids
from dlindex.advisor import apply_advice, suggest_indexes
from dlindex.advisor.planstats import estimate
from dlindex.advisor.scratch import Scratch
from dlindex.query import per_label, windows
from dlindex.query.rows import explain

from .synthetic import Row, balanced, make_catalog


def _log(db: Path, *specs: QuerySpec, calls: int = 3) -> None:
    with Catalog(db) as catalog:
        for _ in range(calls):
            for spec in specs:
                for _row in query_rows(catalog, spec):
                    pass


def _sql(db: Path, spec: QuerySpec) -> str:
    with Catalog(db, log=False) as catalog:
        return explain(catalog, spec).sql


def test_seek_of_turns_a_logged_window_statement_into_the_seek_dlindex_runs(tmp_path: Path) -> None:
    where = ["image_metadata.status = 'ok'", "image_metadata.excluded = 0"]
    for filters in ([], where):
        window = per_label.WINDOW.replace("{where}", " WHERE " + " AND ".join(filters) if filters else "")
        seek = per_label.SEEK.replace(
            "{where}", "".join(" AND " + w.replace("image_metadata.", "sample_rows.") for w in filters)
        )
        for tail in ("", " ORDER BY image_metadata.id LIMIT :limit"):
            logged = window.replace("{columns}", "image_metadata.id, image_metadata.width") + tail
            logged = logged.replace("{order}", "").replace("{limit}", "")
            expected = seek.replace("{columns}", "image_metadata.id, image_metadata.width")
            assert per_label.seek_of(logged) == expected.replace("{order}", "").replace("{limit}", "") + tail
    assert per_label.seek_of("SELECT id FROM image_metadata") is None


@pytest.mark.parametrize(("labels", "rows"), [(40, 150), (8, 750)])
def test_suggest_proposes_the_per_label_index_and_apply_makes_the_query_seek(
    tmp_path: Path, labels: int, rows: int
) -> None:
    """Also with few classes (8: a low-cardinality label_id): the seek's labelled arms want
    (label_id, path_hash); merged with its other arms' candidates (path_hash IS NULL: both
    columns equal; label_id IS NULL) the index stays label-led (a path_hash-led one also serves
    the seek, reading every label's entries for each label's arcs: 3.5x slower at 12 labels)."""
    db = Path(balanced(tmp_path / "b.db", {f"l{i:02d}": rows for i in range(labels)}))
    spec = QuerySpec(per_label=4, seed=0, cache=False)
    with Catalog(db, log=False) as catalog:
        before = sample_ids(catalog, spec)
    assert "sample_rows" not in _sql(db, spec)  # no index: the window statement
    _log(db, *(QuerySpec(per_label=4, seed=s, cache=False) for s in range(3)))
    with Catalog(db, log=False) as catalog:
        advice = suggest_indexes(catalog, runs=1)
    chosen = [s for s in advice.suggestions if s.columns[:2] == ("label_id", "path_hash")]
    assert len(chosen) == 1, [s.sql for s in advice.suggestions] + [r.reason for r in advice.rejected]
    assert chosen[0].where == "excluded = 0 AND status = 'ok'"
    assert chosen[0].served and chosen[0].served[0].after_ms < chosen[0].served[0].before_ms
    statements: list[str] = []
    with Catalog(db, log=False) as catalog:
        catalog.conn.set_trace_callback(statements.append)
        assert chosen[0].name in apply_advice(catalog, advice).created
        catalog.conn.set_trace_callback(None)
        assert sample_ids(catalog, spec) == before  # the same sample, now read by seeks
    analyze = [i for i, s in enumerate(statements) if s.strip().upper() == "ANALYZE"]
    assert analyze and "analysis_limit" in statements[analyze[0] - 1]  # bounded: moments at 10^8 rows
    assert "sample_rows" in _sql(db, spec)


def _timed(tmp_path: Path) -> Path:
    rows = [Row(f"l{i % 10}", age_hours=1000.0 - i * 0.2) for i in range(4000)]
    return Path(make_catalog(tmp_path / "t.db", rows))


def test_a_narrow_time_window_reads_an_index_and_a_wide_one_walks_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _timed(tmp_path)
    with Catalog(db, log=False) as catalog:
        newest = catalog.conn.execute("SELECT max(created_at) FROM image_metadata").fetchone()[0]
        middle = catalog.conn.execute("SELECT created_at FROM image_metadata WHERE id = 2000").fetchone()[0]
    narrow = QuerySpec(since=newest, limit=50, columns=("id",), cache=False)
    wide = QuerySpec(since=middle, limit=50, columns=("id",), cache=False)
    empty = QuerySpec(since="2999-01-01", limit=50, columns=("id",), cache=False)
    with Catalog(db, log=False) as catalog:
        expected = {s: sample_ids(catalog, s) for s in (narrow, wide, empty)}
    assert all(windows.END not in _sql(db, s) for s in expected)  # no index: as before
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE INDEX t ON image_metadata (created_at) WHERE status = 'ok' AND excluded = 0")
    monkeypatch.setattr(windows, "PROBE", 100)
    with Catalog(db, log=False) as catalog:
        for spec in (narrow, empty):
            e = explain(catalog, spec)
            assert windows.END in e.sql and windows.served(e.plan), e.plan
        assert "+" + windows.SINCE in explain(catalog, wide).sql
        assert {s: sample_ids(catalog, s) for s in expected} == expected


def test_suggest_proposes_an_index_for_an_empty_time_window_polled_often(tmp_path: Path) -> None:
    db = _timed(tmp_path)
    _log(db, QuerySpec(since="2999-01-01", limit=100, cache=False), calls=5)
    with Catalog(db, log=False) as catalog:
        advice = suggest_indexes(catalog, runs=1)
    chosen = [s for s in advice.suggestions if s.columns[0] == "created_at"]
    assert len(chosen) == 1, [s.sql for s in advice.suggestions] + [r.reason for r in advice.rejected]
    with Catalog(db, log=False) as catalog:
        apply_advice(catalog, advice)
        assert windows.END in explain(catalog, QuerySpec(since="2999-01-01", limit=100)).sql


def test_estimate_scales_rows_and_keeps_distinct_columns_distinct() -> None:
    assert estimate("1000 250 1", 40) == "40000 " + str(round(250 * 40 ** (1 - 1 / 250))) + " 1"
    assert estimate("500 1 1 unordered", 10) == "5000 1 1 unordered"
    assert estimate("sz=12", 10) == "sz=12"


def test_a_sampled_copy_plans_with_the_catalogs_statistics(tmp_path: Path) -> None:
    db = Path(balanced(tmp_path / "b.db", {f"l{i:02d}": 200 for i in range(10)}))
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE INDEX by_label ON image_metadata (label_id)")
        conn.execute("ANALYZE")
        full = dict(conn.execute("SELECT idx, stat FROM sqlite_stat1 WHERE tbl = 'image_metadata'").fetchall())
    with Scratch(db, sample_rows=500) as scratch:
        assert scratch.sample == 4
        copied = dict(scratch.admin.execute("SELECT idx, stat FROM sqlite_stat1 WHERE tbl = 'image_metadata'"))
        assert copied["by_label"] == full["by_label"]  # the catalog's own, not the sample's 500 rows
        scratch.create("cand", "CREATE INDEX cand ON image_metadata (label_id, width)")
        rows = int(scratch.admin.execute("SELECT stat FROM sqlite_stat1 WHERE idx = 'cand'").fetchone()[0].split()[0])
        assert rows >= 1900  # a candidate's statistics scaled to the catalog's size


def test_a_sampled_copy_of_a_catalog_never_analyzed_has_no_statistics(tmp_path: Path) -> None:
    db = Path(balanced(tmp_path / "b.db", {"a": 600, "b": 600}))
    with Scratch(db, sample_rows=500) as scratch:
        assert scratch.sample > 1
        has = scratch.admin.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone()
        assert not has or not scratch.admin.execute("SELECT 1 FROM sqlite_stat1").fetchone()


def test_the_hand_made_per_label_index_of_the_docs_counts_as_serving_it(tmp_path: Path) -> None:
    db = Path(balanced(tmp_path / "b.db", {f"l{i:02d}": 150 for i in range(40)}))
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE INDEX idx_per_label ON image_metadata (label_id, path_hash) WHERE status = 'ok' AND excluded = 0"
        )
        conn.execute("ANALYZE")
    _log(db, *(QuerySpec(per_label=4, seed=s, cache=False) for s in range(3)))
    with Catalog(db, log=False) as catalog:
        advice = suggest_indexes(catalog, runs=1)
    assert not [s.sql for s in advice.suggestions if "path_hash" in s.columns]
    assert "idx_per_label" not in {f.name for f in (*advice.unused, *advice.redundant)}


def test_two_status_lists_logged_give_a_partial_index_for_the_one_asked_most(tmp_path: Path) -> None:
    # status = 'corrupt' and status = 'missing' are one fingerprint; status as a key column would
    # also be read for status = 'ok' (most rows), so the most called list gets its partial index.
    statuses = ["corrupt" if i % 50 == 0 else "missing" if i % 40 == 1 else "ok" for i in range(6000)]
    db = Path(make_catalog(tmp_path / "s.db", [Row(f"l{i % 10}", status=s) for i, s in enumerate(statuses)]))
    _log(db, QuerySpec(status="corrupt", cache=False), calls=4)
    _log(db, QuerySpec(status="missing", cache=False), calls=2)
    with Catalog(db, log=False) as catalog:
        advice = suggest_indexes(catalog, runs=1)
    assert not [s for s in advice.suggestions if "status" in s.columns], [s.sql for s in advice.suggestions]
    chosen = [s for s in advice.suggestions if s.where == "excluded = 0 AND status = 'corrupt'"]
    assert len(chosen) == 1, [s.sql for s in advice.suggestions] + [r.reason for r in advice.rejected]
    with Catalog(db, log=False) as catalog:
        apply_advice(catalog, advice)
        assert any(chosen[0].name in line for line in explain(catalog, QuerySpec(status="corrupt")).plan)
