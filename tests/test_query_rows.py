"""The query library: every filter, balanced sampling, seeded order, columns, cache, bad input."""

from __future__ import annotations

import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from PIL import Image

from dlindex import Catalog, InputError, QuerySpec, mark_samples, query_rows, sample_ids
from dlindex.query.rows import explain, prepare
from dlindex.query.spec import COLUMNS, parse_when

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, Location, on_postgresql, raw, where
from .conftest import rows, scan
from .synthetic import ROOT, Row, balanced, make_catalog

pytestmark = ON_BOTH_BACKENDS

MIXED = [
    Row("cat", processed=1, processing_status="completed", width=64, height=48, age_hours=1),  # 1
    Row("cat", processed=0, processing_status="failed", width=16, height=16, age_hours=30),  # 2
    Row("cat", status="corrupt", age_hours=2),  # 3
    Row("dog", processed=1, processing_status="completed", width=128, height=128, age_hours=200),  # 4
    Row("dog", processed=0, processing_status="queued", width=32, height=64, age_hours=5),  # 5
    Row("dog", status="missing", processed=1, age_hours=500),  # 6
    Row("bird", processed=0, width=256, height=16, age_hours=0.5),  # 7
]


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    return make_catalog(tmp_path / "mixed.db", MIXED)


def ids(db: Path, **options: object) -> list[int]:
    with Catalog(db) as catalog:
        return sample_ids(catalog, **options)


def test_default_is_status_ok_in_id_order(mixed: Path) -> None:
    assert ids(mixed) == [1, 2, 4, 5, 7]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"labels": ["cat"]}, [1, 2]),
        ({"labels": "dog"}, [4, 5]),
        ({"labels": ["cat", "bird"]}, [1, 2, 7]),
        ({"status": "corrupt"}, [3]),
        ({"status": ["corrupt", "missing"]}, [3, 6]),
        ({"status": ()}, [1, 2, 3, 4, 5, 6, 7]),
        ({"processed": True}, [1, 4]),
        ({"processed": False}, [2, 5, 7]),
        ({"processing_status": "failed"}, [2]),
        ({"processing_status": ["queued", "failed"]}, [2, 5]),
        ({"since": "24h"}, [1, 5, 7]),
        ({"since": "90m"}, [1, 7]),
        ({"since": "7d"}, [1, 2, 5, 7]),
        ({"until": "24h"}, [2, 4]),
        ({"since": "48h", "until": "3h"}, [2, 5]),
        ({"min_width": 64}, [1, 4, 7]),
        ({"min_height": 48}, [1, 4, 5]),
        ({"min_width": 32, "min_height": 64}, [4, 5]),
        ({"limit": 2}, [1, 2]),
        ({"limit": 0}, []),
        ({"labels": ["dog"], "processed": False, "processing_status": "queued", "since": "1d"}, [5]),
    ],
)
def test_each_filter(mixed: Path, options: dict[str, object], expected: list[int]) -> None:
    assert ids(mixed, **options) == expected


def test_iso_times_are_utc_unless_they_say_otherwise(mixed: Path) -> None:
    created = {k: str(v) for k, v in rows(mixed, "SELECT id, created_at FROM image_metadata")}
    one_hour_ago = datetime.strptime(created[1], "%Y-%m-%d %H:%M:%S")
    assert ids(mixed, since=one_hour_ago.isoformat(), status=()) == [1, 7]
    assert ids(mixed, since=one_hour_ago.isoformat() + "+02:00", status=()) == [1, 3, 7]
    five_hours_ago = datetime.strptime(created[5], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    assert ids(mixed, since=five_hours_ago, until=created[3].replace(" ", "T") + "Z", status=()) == [5]


def test_parse_when_forms() -> None:
    assert parse_when("2024-05-01") == "2024-05-01 00:00:00"
    assert parse_when("2024-05-01T12:30:05Z") == "2024-05-01 12:30:05"
    assert parse_when("2024-05-01 14:30+02:00") == "2024-05-01 12:30:00"
    assert parse_when(datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02 03:04:05"
    now = datetime.now(UTC).replace(tzinfo=None)
    for text, seconds in (("30m", 1800), ("24h", 86400), ("7d", 604800), ("2w", 1209600), ("45s", 45), ("1.5h", 5400)):
        delta = now - datetime.strptime(parse_when(text), "%Y-%m-%d %H:%M:%S")
        assert abs(delta.total_seconds() - seconds) < 5, text


@pytest.mark.parametrize("bad", ["yesterday", "24", "-3h", "0h", "3 parsecs", ""])
def test_bad_times_are_input_errors(mixed: Path, bad: str) -> None:
    with pytest.raises(InputError, match="--since"):
        ids(mixed, since=bad)


def test_impossible_time_range_is_an_error(mixed: Path) -> None:
    with pytest.raises(InputError, match="empty time range"):
        ids(mixed, since="2024-05-02", until="2024-05-01")
    with pytest.raises(InputError, match="empty time range"):
        ids(mixed, since="1h", until="2h")


def test_unknown_label_suggests_close_names(mixed: Path) -> None:
    with pytest.raises(InputError, match=r"unknown label 'dgo'; did you mean 'dog'"):
        ids(mixed, labels=["cat", "dgo"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"status": "fine"}, "unknown --status 'fine'"),
        ({"processing_status": "done"}, "unknown --processing-status 'done'"),
        ({"status": "failed"}, "'failed' is a processing status, not a scan status: use --processing-status"),
        ({"processing_status": "ok"}, "'ok' is a scan status, not a processing status: use --status ok"),
        ({"order": "shuffled"}, "unknown order"),
        ({"per_label": 0}, "--per-label"),
        ({"limit": -1}, "--limit"),
        ({"min_width": -1}, "--min-width"),
    ],
)
def test_bad_options_are_input_errors(mixed: Path, options: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        ids(mixed, **options)


@pytest.mark.parametrize(("columns", "message"), [("id,nope", "unknown column 'nope'"), ((), "no columns")])
def test_bad_columns_are_input_errors(mixed: Path, columns: object, message: str) -> None:
    with Catalog(mixed) as catalog, pytest.raises(InputError, match=message):
        query_rows(catalog, columns=columns)


def test_errors_are_raised_when_called_not_when_iterated(mixed: Path) -> None:
    with Catalog(mixed) as catalog, pytest.raises(InputError):
        query_rows(catalog, columns="id,bogus")


def test_empty_catalog_gives_an_empty_result(db_path: Path) -> None:
    Catalog(db_path, create=True).close()
    assert ids(db_path) == []
    assert ids(db_path, per_label=3, order="random") == []
    with pytest.raises(InputError, match="unknown label 'cat'"):
        ids(db_path, labels=["cat"])


def test_columns_are_selected_in_order_with_derived_path_and_label(mixed: Path) -> None:
    with Catalog(mixed) as catalog:
        row = next(query_rows(catalog, columns="label,path,id,root,file_path,processed", labels="dog"))
    assert row == {"label": "dog", "path": f"{ROOT}/dog/0001.png", "id": 4, "root": ROOT,
                   "file_path": "dog/0001.png", "processed": 1}  # fmt: skip
    with Catalog(mixed) as catalog:
        full = next(query_rows(catalog, columns=COLUMNS))
    assert list(full) == list(COLUMNS)


def test_default_columns(mixed: Path) -> None:
    with Catalog(mixed) as catalog:
        row = next(query_rows(catalog))
    assert list(row) == [
        "id",
        "path",
        "label",
        "width",
        "height",
        "status",
        "processed",
        "processing_status",
        "created_at",
    ]


def test_select_names_only_the_columns_asked_for(mixed: Path) -> None:
    with Catalog(mixed) as catalog:
        prepared = prepare(catalog, QuerySpec(columns=("id", "width")))
    assert prepared.sql.startswith("SELECT image_metadata.id, image_metadata.width FROM image_metadata")
    assert "*" not in prepared.sql


def test_values_are_bound_never_in_the_sql(mixed: Path) -> None:
    spec = QuerySpec(labels=("cat", "dog"), since="2024-01-01", min_width=17, per_label=3, limit=9, seed=12345)
    with Catalog(mixed) as catalog:
        prepared = prepare(catalog, spec)
    for value in ("cat", "dog", "2024-01-01", "17", "12345"):
        assert value not in prepared.sql
    assert prepared.params["limit"] == 9 and prepared.params["min_width"] == 17


def test_paths_of_non_utf8_names_round_trip_to_the_exact_bytes(tmp_path: Path) -> None:
    db = make_catalog(tmp_path / "c.db", [Row("cat")])
    with raw(db) as conn:
        conn.execute("UPDATE image_metadata SET file_path = ?, file_path_bytes = ? WHERE id = 1",
                     ("cat/caf\\xe9.png", b"cat/caf\xe9.png"))  # fmt: skip
    with Catalog(db) as catalog:
        row = next(query_rows(catalog, columns="path,file_path"))
    assert os.fsencode(row["path"]) == ROOT.encode() + b"/cat/caf\xe9.png"
    assert row["file_path"] == "cat/caf\\xe9.png"


def test_per_label_caps_each_label_and_is_deterministic(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 50, "b": 20, "c": 3})
    first = ids(db, per_label=5, seed=1)
    assert first == ids(db, per_label=5, seed=1)
    assert first == sorted(first)
    with Catalog(db) as catalog:
        labels = Counter(r["label"] for r in query_rows(catalog, per_label=5, seed=1, columns="label"))
    assert labels == {"a": 5, "b": 5, "c": 3}
    assert ids(db, per_label=5, seed=2) != first
    assert ids(db, per_label=100, seed=3) == list(range(1, 74))


def test_per_label_is_spread_over_the_label_not_its_first_rows(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 1000})
    picked = [ids(db, per_label=10, seed=s) for s in range(20)]
    assert all(len(p) == 10 for p in picked)
    everything = [i for p in picked for i in p]
    assert max(everything) > 900 and min(everything) < 100
    assert len(set(everything)) > 150  # different seeds, different samples


def small_tree(root: Path, labels: tuple[str, ...], per_label: int) -> Path:
    for label in labels:
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(per_label):
            Image.new("L", (1, 1), i).save(root / label / f"{i:03d}.png")
    return root


def grow(db: Location, tree: Path, first: str, aside: Path) -> None:
    """Scan ``tree`` into ``db`` as it grew: without folder ``first``, then with it."""
    (tree / first).rename(aside / first)
    scan(db, tree, workers=2)
    (aside / first).rename(tree / first)
    scan(db, tree, workers=2)


def picked(db: Location, **options: object) -> list[str]:
    with Catalog(db) as catalog:
        return [r["file_path"] for r in query_rows(catalog, columns="file_path", **{"seed": 3, **options})]


def same_seeded_selections(one: Location, other: Location) -> None:
    assert dict(rows(one, "SELECT file_path, id FROM image_metadata")) != dict(
        rows(other, "SELECT file_path, id FROM image_metadata")
    )  # the rows got other ids
    sample = picked(one, per_label=5)
    assert len(sample) == 10 and sorted(sample) == sorted(picked(other, per_label=5))
    assert picked(one, order="random") == picked(other, order="random")
    assert picked(one, per_label=5, order="random") == picked(other, per_label=5, order="random")
    assert sorted(sample) != sorted(picked(one, per_label=5, seed=4))


def test_a_seeded_sample_follows_from_the_tree_not_from_the_ids(tmp_path: Path, db_path: Path) -> None:
    """Two catalogs of one tree whose rows got other ids (here: the tree grew folder by folder,
    in another order; the workers' timing does the same) give the same seeded sample and the
    same seeded order, as paths."""
    tree = small_tree(tmp_path / "tree", ("cat", "dog"), 40)
    grow(db_path, tree, "dog", tmp_path)
    grown = where(tmp_path / "grown.db")
    grow(grown, tree, "cat", tmp_path)
    same_seeded_selections(db_path, grown)


@SQLITE_ONLY
def test_a_seeded_sample_is_the_same_on_sqlite_and_postgresql(tmp_path: Path, db_path: Path, pg_url: str) -> None:
    tree = small_tree(tmp_path / "tree", ("cat", "dog"), 40)
    grow(db_path, tree, "dog", tmp_path)
    grow(pg_url, tree, "cat", tmp_path)
    same_seeded_selections(db_path, pg_url)


def test_per_label_with_filters_and_random_order(tmp_path: Path) -> None:
    db = make_catalog(
        tmp_path / "c.db",
        [Row("a", processed=i % 2) for i in range(40)] + [Row("b", processed=i % 2) for i in range(40)],
    )
    with Catalog(db) as catalog:
        got = list(
            query_rows(catalog, per_label=4, processed=True, order="random", seed=9, columns="id,label,processed")
        )
        again = list(
            query_rows(
                catalog, per_label=4, processed=True, order="random", seed=9, columns="id,label,processed", cache=False
            )
        )
    assert got == again
    assert Counter(r["label"] for r in got) == {"a": 4, "b": 4}
    assert all(r["processed"] == 1 for r in got)
    assert [r["id"] for r in got] != sorted(r["id"] for r in got)


def test_random_order_is_a_seeded_permutation(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 200})
    order = ids(db, order="random", seed=4)
    assert sorted(order) == list(range(1, 201))
    assert order != list(range(1, 201))
    assert order == ids(db, order="random", seed=4, cache=False)
    assert order != ids(db, order="random", seed=5)
    assert ids(db, order="random", seed=4, limit=10) == order[:10]


def test_query_is_lazy(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 3000})
    with Catalog(db) as catalog:
        rows_iter = query_rows(catalog, columns="id", cache=False)
        assert next(rows_iter) == {"id": 1}
        rows_iter.close()  # type: ignore[attr-defined]


def test_explain_shows_the_plan(mixed: Path) -> None:
    with Catalog(mixed) as catalog:
        explained = explain(catalog, QuerySpec(processed=True, per_label=2))
    assert explained.sql.startswith("SELECT")
    scan = "Seq Scan on image_metadata" if on_postgresql() else "SCAN image_metadata"  # each planner's words
    assert any(scan in line for line in explained.plan)
    assert explained.params["per_label"] == 2


@pytest.fixture
def always_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Store every result: tiny test catalogs answer faster than the cache's break-even."""
    monkeypatch.setattr("dlindex.query.cache.FETCH_S", 0.0)


def _cached_calls(db: Path) -> int:
    return int(rows(db, "SELECT count(*) FROM query_log WHERE cached = 1")[0][0])


@pytest.mark.usefixtures("always_cache")
def test_repeated_query_is_served_from_the_cache_until_a_write(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 30, "b": 30})
    first = ids(db, per_label=4, seed=3)
    assert _cached_calls(db) == 0
    assert ids(db, per_label=4, seed=3) == first
    assert _cached_calls(db) == 1
    with Catalog(db) as catalog:  # other columns, same selection: still cached
        full = list(query_rows(catalog, per_label=4, seed=3, columns="id,label,path"))
    assert [r["id"] for r in full] == first and _cached_calls(db) == 2
    with Catalog(db) as catalog:
        mark_samples(catalog, [str(first[0])], processed=True)
    assert ids(db, per_label=4, seed=3) == first
    assert _cached_calls(db) == 2  # the write moved the change counter: ran again
    assert ids(db, per_label=4, seed=3, cache=False) == first
    assert _cached_calls(db) == 2


@pytest.mark.usefixtures("always_cache")
def test_cache_sees_changes_to_what_it_selected(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 10})
    assert ids(db, processed=False) == list(range(1, 11))
    with Catalog(db) as catalog:
        mark_samples(catalog, ["3", "4"], processed=True)
    assert ids(db, processed=False) == [1, 2, 5, 6, 7, 8, 9, 10]


def test_a_result_cheaper_to_recompute_than_to_fetch_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = balanced(tmp_path / "b.db", {"a": 50})
    monkeypatch.setattr("dlindex.query.cache.FETCH_S", 1.0)
    assert len(ids(db, per_label=5)) == 5
    assert rows(db, "SELECT count(*) FROM query_cache") == [(0,)]
    monkeypatch.setattr("dlindex.query.cache.FETCH_S", 0.0)
    assert len(ids(db, per_label=5)) == 5
    assert rows(db, "SELECT count(*), max(rows) FROM query_cache") == [(1, 5)]


@pytest.mark.usefixtures("always_cache")
def test_a_half_read_result_is_not_cached(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 1000})
    with Catalog(db) as catalog:
        it = query_rows(catalog, columns="id")
        next(it)
        it.close()  # type: ignore[attr-defined]
    assert rows(db, "SELECT count(*) FROM query_cache") == [(0,)]


def test_change_counter_moves_with_writes_only(tmp_path: Path) -> None:
    db = balanced(tmp_path / "b.db", {"a": 3})
    with Catalog(db) as catalog:
        before = catalog.changes()
        list(query_rows(catalog))
        assert catalog.changes() == before
        with catalog.write_transaction(bookkeeping=True):
            pass
        assert catalog.changes() == before
        with catalog.write_transaction() as conn:
            conn.execute("UPDATE image_metadata SET width = 1 WHERE id = 1")
        assert catalog.changes() == before + 1
