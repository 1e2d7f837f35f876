"""mark_samples: ids, paths and JSON lines; counts; malformed input; concurrent writers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dlindex import Catalog, InputError, mark_samples

from .backends import ON_BOTH_BACKENDS
from .conftest import make_png, processed_ids, rows
from .synthetic import ROOT, Row, make_catalog

pytestmark = ON_BOTH_BACKENDS


def mark(db: Path, records: list[str], **options: object) -> object:
    with Catalog(db) as catalog:
        return mark_samples(catalog, records, **options)  # type: ignore[arg-type]


def test_mark_ids_counts_matched_updated_unknown(cats: Path) -> None:
    result = mark(cats, ["1\n", " 2 ", "2", "", "99\n", "3"], processed=True)
    assert (result.inputs, result.matched, result.updated, result.unknown) == (5, 3, 3, 1)  # type: ignore[attr-defined]
    assert result.unknown_examples == ("99",)  # type: ignore[attr-defined]
    assert processed_ids(cats) == [1, 2, 3]
    again = mark(cats, ["1", "2"], processed=True)
    assert (again.matched, again.updated) == (2, 0)  # type: ignore[attr-defined]
    undo = mark(cats, ["1", "2"], processed=False)
    assert undo.updated == 2 and processed_ids(cats) == [3]  # type: ignore[attr-defined]


def test_mark_status_and_error(cats: Path) -> None:
    mark(cats, ["5", "6"], processing_status="failed", error="decoder crashed")
    assert rows(cats, "SELECT id, processing_status, error, processed FROM image_metadata WHERE id IN (5, 6, 7) ORDER BY id") == [
        (5, "failed", "decoder crashed", 0), (6, "failed", "decoder crashed", 0), (7, None, None, 0),
    ]  # fmt: skip
    result = mark(cats, ["5"], processing_status="completed", processed=True)
    assert result.updated == 1  # type: ignore[attr-defined]
    assert rows(cats, "SELECT processing_status, processed FROM image_metadata WHERE id = 5") == [("completed", 1)]


def test_mark_updates_updated_at_only_for_changed_rows(cats: Path) -> None:
    conn_rows = "SELECT id, updated_at FROM image_metadata WHERE id IN (1, 2) ORDER BY id"
    with Catalog(cats) as catalog, catalog.write_transaction() as conn:
        conn.execute("UPDATE image_metadata SET updated_at = '2000-01-01 00:00:00', processed = 1 WHERE id = 1")
    mark(cats, ["1", "2"], processed=True)
    (_one, first), (_two, second) = rows(cats, conn_rows)
    assert first == "2000-01-01 00:00:00" and second != "2000-01-01 00:00:00"


def test_mark_by_path_absolute_and_relative(cats: Path) -> None:
    result = mark(
        cats,
        [f"{ROOT}/cat/0001.png\n", "cat/0002.png", "./dog/0001.png", f"{ROOT}/cat/nope.png", "/elsewhere/x.png",
         f"{ROOT}//cat/./0003.png"],
        processed=True, by="path",
    )  # fmt: skip
    assert (result.matched, result.updated, result.unknown) == (4, 4, 2)  # type: ignore[attr-defined]
    assert sorted(result.unknown_examples) == [f"{ROOT}/cat/nope.png", "/elsewhere/x.png"]  # type: ignore[attr-defined]
    assert processed_ids(cats) == [1, 2, 3, 5]


def test_mark_json_lines_with_id_path_or_file_path(cats: Path) -> None:
    lines = [
        json.dumps({"id": 1, "path": "ignored when there is an id"}),
        json.dumps({"path": f"{ROOT}/cat/0002.png", "label": "cat"}),
        json.dumps({"file_path": "dog/0004.png"}),
        "7",
    ]
    result = mark(cats, lines, processed=True)
    assert (result.matched, result.updated, result.unknown) == (4, 4, 0)  # type: ignore[attr-defined]
    assert processed_ids(cats) == [1, 2, 7, 8]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("abc", r"line 3: 'abc' is not a sample id"),
        ("{not json", r"line 3: not valid JSON"),
        ("[1, 2]", r"line 3: '\[1, 2\]' is not a sample id"),
        ('{"id": "4"}', r'line 3: "id" must be a 64-bit integer'),
        ('{"id": true}', r'line 3: "id" must be a 64-bit integer'),
        ('{"name": "x"}', r'line 3: a JSON object needs "id", "path" or "file_path"'),
        ('"5"', r"line 3: .* is not a sample id"),
        ("4.5", r"line 3: '4.5' is not a sample id"),
        ("99999999999999999999", r"line 3: '99999999999999999999' is outside the 64-bit range of sample ids"),
        ('{"id": 99999999999999999999}', r'line 3: "id" must be a 64-bit integer'),
    ],
)
def test_malformed_line_changes_nothing(cats: Path, bad: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        mark(cats, ["1", "2", bad, "4"], processed=True)
    assert processed_ids(cats) == []


def test_mark_needs_something_to_set(cats: Path) -> None:
    with pytest.raises(InputError, match="nothing to set"):
        mark(cats, ["1"])
    with pytest.raises(InputError, match="unknown processing status"):
        mark(cats, ["1"], processing_status="done")
    with pytest.raises(InputError, match="'ok' is a scan status, which only scan sets"):
        mark(cats, ["1"], processing_status="ok")


def test_mark_moves_the_change_counter_and_is_logged(cats: Path) -> None:
    with Catalog(cats) as catalog:
        before = catalog.changes()
        mark_samples(catalog, ["1", "2"], processed=True)
        assert catalog.changes() == before + 1
    logged = rows(cats, "SELECT kind, table_name, calls, rows FROM query_log WHERE sql LIKE 'UPDATE image_metadata%'")
    assert logged == [("write", "image_metadata", 1, 2)]


def test_concurrent_marks_and_scan_lose_nothing(tmp_path: Path) -> None:
    db = make_catalog(tmp_path / "c.db", [Row("a") for _ in range(3000)])
    tree = tmp_path / "tree"
    for i in range(600):
        make_png(tree / f"l{i % 3}" / f"{i:04d}.png", (8, 8))
    scan = subprocess.Popen(
        [sys.executable, "-m", "dlindex", "scan", str(tree), "--db", str(db), "--workers", "1", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    while scan.poll() is None and rows(db, "SELECT count(*) FROM scans") == [(0,)]:
        pass  # mark while the scan writes, not before it starts
    cli_mark = subprocess.Popen(
        [sys.executable, "-m", "dlindex", "mark", "--processing-status", "completed", "--db", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    errors: list[BaseException] = []
    marked: list[int] = []

    def marker(first: int) -> None:
        round_ = 0
        try:
            while round_ < 3 or (scan.poll() is None and round_ < 20):
                batch = list(range(first + round_ * 50, first + round_ * 50 + 50))
                with Catalog(db) as catalog:
                    result = mark_samples(catalog, [str(i) for i in batch], processed=True)
                assert result.updated == 50
                marked.extend(batch)
                round_ += 1
        except BaseException as e:  # collected: a thread's failure must fail the test
            errors.append(e)

    threads = [threading.Thread(target=marker, args=(1,)), threading.Thread(target=marker, args=(1501,))]
    for t in threads:
        t.start()
    _, err = cli_mark.communicate("\n".join(str(i) for i in range(1, 3001)), timeout=120)
    for t in threads:
        t.join(timeout=120)
    _, scan_err = scan.communicate(timeout=120)
    assert errors == []
    assert cli_mark.returncode == 0 and "locked" not in err, err
    assert scan.returncode == 0 and "locked" not in scan_err, scan_err
    assert processed_ids(db) == sorted(marked)
    assert rows(db, "SELECT count(*) FROM image_metadata WHERE processing_status = 'completed'") == [(3000,)]
    assert rows(db, "SELECT count(*) FROM image_metadata WHERE root_id != 1") == [(600,)]


def test_a_mark_larger_than_a_batch_commits_in_batches_with_the_same_counts(cats: Path) -> None:
    records = ["8", "1", "99", "3", "2", "7", "5", "-4", "6"]  # 7 samples, 2 unknown ids, any order
    with Catalog(cats) as catalog:
        before = catalog.changes()
        result = mark_samples(catalog, records, processed=True, batch=3)
        assert catalog.changes() == before + 3  # 9 staged ids in id order: three write transactions
    assert (result.inputs, result.matched, result.updated, result.unknown) == (9, 7, 7, 2)
    assert sorted(result.unknown_examples) == ["-4", "99"]
    assert processed_ids(cats) == [1, 2, 3, 5, 6, 7, 8]
    again = mark(cats, records, processed=True, batch=2)
    assert (again.matched, again.updated, again.unknown) == (7, 0, 2)  # type: ignore[attr-defined]


def test_batched_mark_by_path_counts_a_sample_once(cats: Path) -> None:
    ids = [json.dumps({"id": i}) for i in (1, 2, 77)]
    records = [json.dumps({"path": f"{ROOT}/cat/0001.png"}), "cat/0001.png", ids[0], "dog/0004.png", "cat/nope.png"]
    result = mark(cats, [*records, *ids[1:]], processed=True, by="path", batch=2)
    assert (result.matched, result.updated, result.unknown) == (3, 3, 2)  # type: ignore[attr-defined]
    assert sorted(result.unknown_examples) == ["77", "cat/nope.png"]  # type: ignore[attr-defined]
    assert processed_ids(cats) == [1, 2, 8]


def test_a_batched_mark_stopped_part_way_keeps_its_batches_and_a_rerun_finishes(
    cats: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlindex import Interrupted
    from dlindex.query import mark_apply

    real = mark_apply._update
    calls: list[int] = []

    def stop_at_the_second(*args: object) -> int:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(mark_apply, "_update", stop_at_the_second)
    ids = [str(i) for i in range(1, 9)]
    with pytest.raises(Interrupted, match=r"3 of 8 samples were already committed .* run the same mark again"):
        mark(cats, ids, processed=True, batch=3)
    assert processed_ids(cats) == [1, 2, 3]  # the first batch stays; the second was rolled back
    monkeypatch.setattr(mark_apply, "_update", real)
    result = mark(cats, ids, processed=True, batch=3)
    assert (result.matched, result.updated) == (8, 5)  # type: ignore[attr-defined]
    assert processed_ids(cats) == list(range(1, 9))


def test_a_mark_within_a_batch_is_still_all_or_nothing(cats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlindex.query import mark_apply

    def fail(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(mark_apply, "_update", fail)
    with pytest.raises(KeyboardInterrupt):
        mark(cats, [str(i) for i in range(1, 9)], processed=True, batch=8)
    assert processed_ids(cats) == []


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The staged tables mark looked unknown ids up in, one entry per id-by-id lookup."""
    from dlindex.query import mark_apply

    real = mark_apply._unknown_ids
    tables: list[str] = []

    def counted(tx: object, table: str, done: mark_apply.Applied) -> None:
        tables.append(table)
        real(tx, table, done)

    monkeypatch.setattr(mark_apply, "_unknown_ids", counted)
    return tables


def test_unknown_ids_are_looked_up_only_where_a_write_changed_fewer_rows_than_it_named(
    cats: Path, checked: list[str]
) -> None:
    """Where every staged id changed a row, none is unknown: no second lookup per id (the
    NOT EXISTS check was ~12% of a large mark's CPU); the counts stay the same."""
    result = mark(cats, [str(i) for i in range(1, 7)], processed=True, batch=3)  # two batches, all change
    assert (result.matched, result.updated, result.unknown, checked) == (6, 6, 0, [])  # type: ignore[attr-defined]
    result = mark(cats, ["4", "6", "7", "99"], processed=True, batch=2)  # 4,6 unchanged | 7 changes, 99 unknown
    assert (result.matched, result.updated, result.unknown) == (3, 1, 1)  # type: ignore[attr-defined]
    assert result.unknown_examples == ("99",) and checked == ["mark_batch", "mark_batch"]  # type: ignore[attr-defined]
    checked.clear()
    result = mark(cats, ["1", "2"], processed=False)  # one transaction, both change
    assert (result.matched, result.updated, result.unknown, checked) == (2, 2, 0, [])  # type: ignore[attr-defined]
    result = mark(cats, [json.dumps({"id": 98}), "cat/0003.png", "cat/nope.png"], processed=False, by="path")
    assert (result.matched, result.updated, result.unknown) == (1, 1, 2)  # type: ignore[attr-defined]
    assert result.unknown_examples == ("98", "cat/nope.png") and checked == ["mark_ids"]  # type: ignore[attr-defined]


def test_ids_that_fill_a_range_are_counted_not_looked_up_one_by_one(cats: Path, checked: list[str]) -> None:
    """A batch of contiguous ids of which some already hold the value: the catalog's row count
    in that range shows none is unknown; a range with a gap is still looked up id by id."""
    mark(cats, ["2", "5"], processed=True)
    result = mark(cats, [str(i) for i in range(1, 9)], processed=True, batch=3)  # 1-3 | 4-6 | 7-8, 2 and 5 unchanged
    assert (result.matched, result.updated, result.unknown, checked) == (8, 6, 0, [])  # type: ignore[attr-defined]
    result = mark(cats, ["6", "7", "8", "9", "10"], processed=True)  # one transaction: 9 and 10 name no row
    assert (result.matched, result.updated, result.unknown) == (3, 0, 2)  # type: ignore[attr-defined]
    assert result.unknown_examples == ("9", "10") and checked == ["mark_ids"]  # type: ignore[attr-defined]
