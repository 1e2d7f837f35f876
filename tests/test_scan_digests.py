"""A rescan remembers the folders it found unchanged (dlindex.scan.digests) and answers for them
again only while their catalog rows are the ones it compared: every edit of a row, by dlindex
or by hand, makes the next rescan compare that folder again, and the answers always agree with
the walk (tests/test_scan_quick.Twins rescans copies both ways)."""

from __future__ import annotations

import sqlite3
from contextlib import closing, suppress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlindex.scan import digests, quick

from .conftest import make_png, scan
from .test_scan_quick import Twins

pytestmark = pytest.mark.skipif(quick.gnu_find() is None, reason="GNU find is not installed")

_FOLDERS = ("ant", "bee", "cat", "dog")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    for n, label in enumerate(_FOLDERS):
        for i in range(3):
            make_png(root / label / f"{i}.png", color=(n, i, 0))
    return root


def remembered(db: Path) -> dict[str, int]:
    """start -> files of each unit whose answer is stored."""
    with closing(sqlite3.connect(db)) as conn:
        return dict(conn.execute("SELECT start, files FROM scan_digests WHERE files >= 0").fetchall())


def rescanned(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Twins]:
    db = tmp_path / "catalog.db"
    scan(db, tree)
    twins = Twins(db, tree, tmp_path, monkeypatch)
    twins.rescan()  # compares every folder and remembers it
    return db, twins


def recalled(twins: Twins) -> int:
    last = twins.quick[-1]
    assert last is not None
    return last.recalled


def test_an_unchanged_rescan_answers_from_digests_and_agrees_with_the_walk(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, twins = rescanned(tree, tmp_path, monkeypatch)
    assert recalled(twins) == 0 and len(remembered(db)) == len(_FOLDERS)
    summary = twins.rescan()
    assert recalled(twins) == len(_FOLDERS) and summary["unchanged"] == 12 and twins.counted() == 12

    make_png(tree / "bee" / "new.png")  # a new file: bee is compared (and walked), the rest recalled
    summary = twins.rescan()
    assert summary["new"] == 1 and recalled(twins) == len(_FOLDERS) - 1
    twins.rescan()  # bee's new row was written by the walk: compared once more, then remembered
    assert recalled(twins) == len(_FOLDERS) - 1
    twins.rescan()
    assert recalled(twins) == len(_FOLDERS)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE image_metadata SET processing_status = 'failed', error = 'loader: gone' WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET label_id = (SELECT id FROM labels WHERE name = 'ant') WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET split = 'train' WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET inode = inode + 1 WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET ctime_ns = ctime_ns + 1 WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET mtime_ns = mtime_ns + 1 WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET bytes = bytes + 1 WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET status = 'missing' WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET width = 100000, height = 100000 WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET pixel_limit = 5 WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET file_path = 'bee/9.png' WHERE file_path = 'bee/1.png'",
        "UPDATE image_metadata SET file_path = 'cat/5.png' WHERE file_path = 'bee/1.png'",  # leaves bee, joins cat
        "DELETE FROM image_metadata WHERE file_path = 'bee/1.png'",
        "INSERT INTO image_metadata (root_id, file_path, label_id, status) SELECT root_id, 'bee/ghost.png', label_id, "
        "'ok' FROM image_metadata WHERE file_path = 'bee/1.png'",
        # REPLACE deletes bee/1.png's row without its DELETE trigger: bee is caught by its row count
        "INSERT OR REPLACE INTO image_metadata (id, root_id, file_path, label_id, status) SELECT id, root_id, "
        "'zzz/ghost.png', label_id, 'ok' FROM image_metadata WHERE file_path = 'bee/1.png'",
    ],
)
def test_an_edited_row_makes_its_folder_compared_again(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sql: str
) -> None:
    db, twins = rescanned(tree, tmp_path, monkeypatch)
    with closing(sqlite3.connect(db)) as conn, conn:
        assert conn.execute(sql).rowcount == 1
    answered: list[str] = []
    recall = digests.UnitDigests.recall

    def spy(self: digests.UnitDigests, start: str, *args: Any) -> Any:
        found = recall(self, start, *args)
        if found is not None:
            answered.append(start)
        return found

    monkeypatch.setattr(digests.UnitDigests, "recall", spy)
    twins.rescan()  # the fast and the walked rescan agree
    assert "bee/" not in answered and "" in answered  # ant (the first unit, from '') untouched
    assert ("cat/" in answered) is ("cat/" not in sql) and ("dog/" in answered) is ("zzz" not in sql)


def test_writes_that_do_not_touch_what_a_rescan_reads_keep_the_digests(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, twins = rescanned(tree, tmp_path, monkeypatch)
    with closing(sqlite3.connect(db)) as conn, conn:  # what mark, features and the loader's marks write
        conn.execute("UPDATE image_metadata SET processed = 1, processing_status = 'completed', excluded = 1")
        conn.execute("UPDATE image_metadata SET processing_status = 'queued', updated_at = CURRENT_TIMESTAMP")
    twins.rescan()
    assert recalled(twins) == len(_FOLDERS)


def test_dropped_or_edited_triggers_turn_the_digests_off(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, twins = rescanned(tree, tmp_path, monkeypatch)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DROP TRIGGER scan_digests_deleted")
        conn.execute("DELETE FROM image_metadata WHERE file_path = 'bee/1.png'")  # nothing forgets bee
    summary = twins.rescan()
    assert recalled(twins) == 0 and summary["new"] == 1  # every folder compared: bee/1.png found again


def test_a_write_during_the_comparison_is_not_remembered_over(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "catalog.db"
    scan(db, tree)
    compare = quick._compare

    def racing(segment: bytes, rows: str | None, *args: Any) -> Any:
        found = compare(segment, rows, *args)
        if b"./bee/" in segment:  # another process changes bee's rows right after they were read,
            with closing(sqlite3.connect(db)) as conn, conn:
                conn.execute("UPDATE image_metadata SET bytes = bytes + 1 WHERE file_path = 'bee/1.png'")
            cut = [("", "bee/"), ("bee/", "cat/"), ("cat/", "dog/"), ("dog/", None)]
            with digests.UnitDigests(str(db), 1, cut):  # and another rescan opens bee's row again
                pass
        return found

    monkeypatch.setattr(quick, "_compare", racing)
    scan(db, tree)
    assert sorted(remembered(db)) == ["", "cat/", "dog/"]  # ant's unit starts at '' (the first); not bee
    monkeypatch.setattr(quick, "_compare", compare)
    assert scan(db, tree).changed == 1  # bee compared again, its changed row read again


def test_one_find_or_two_give_the_same_answers(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts: list[int] = []

    class Finds(quick._Finds):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            parts.append(len(self.parts))

    monkeypatch.setattr(quick, "_Finds", Finds)
    monkeypatch.setattr(quick, "_cpus", lambda: 2)
    db = tmp_path / "catalog.db"
    scan(db, tree)
    twins = Twins(db, tree, tmp_path, monkeypatch)
    twins.rescan()  # nothing remembered yet: one find, its lines compared as they come
    make_png(tree / "cat" / "new.png")
    assert twins.rescan()["new"] == 1  # two finds: ant and bee in the pipe, cat and dog in the file
    make_png(tree / "dog" / "0.png", color=(9, 9, 9))
    monkeypatch.setattr(quick, "_cpus", lambda: 1)
    assert twins.rescan()["changed"] == 1  # one CPU: one find
    assert parts == [1, 2, 1] and twins.counted() == 10  # ant, bee, cat: dog walked


def test_a_lost_folder_in_one_find_part_sends_every_unit_to_the_walk(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, twins = rescanned(tree, tmp_path, monkeypatch)  # every folder remembered: two finds next
    wrapper = tmp_path / "find"
    # The second part's find lists cat twice: a folder count that is not find's.
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *./dog*) exec {quick.gnu_find()} ./cat "$@" ;; esac\n'
                       f'exec {quick.gnu_find()} "$@"\n')  # fmt: skip
    wrapper.chmod(0o755)
    monkeypatch.setattr(quick, "gnu_find", lambda: str(wrapper))
    monkeypatch.setattr(quick, "_cpus", lambda: 2)
    twins.rescan()
    assert twins.quick[-1] is None


_EDITS = st.sampled_from(
    [
        "UPDATE image_metadata SET bytes = bytes + 1 WHERE id = :id",
        "UPDATE image_metadata SET mtime_ns = mtime_ns - 7 WHERE id = :id",
        "UPDATE image_metadata SET inode = NULL WHERE id = :id",
        "UPDATE image_metadata SET status = 'missing' WHERE id = :id",
        "UPDATE image_metadata SET status = 'corrupt' WHERE id = :id",
        "UPDATE image_metadata SET processing_status = 'failed', error = 'loader: x' WHERE id = :id",
        "UPDATE image_metadata SET processing_status = 'completed', processed = 1 WHERE id = :id",
        "UPDATE image_metadata SET label_id = 1 WHERE id = :id",
        "UPDATE image_metadata SET file_path = file_path || 'x' WHERE id = :id",
        "DELETE FROM image_metadata WHERE id = :id",
        "INSERT OR REPLACE INTO image_metadata (id, root_id, file_path, label_id, status) "
        "VALUES (:id, 1, 'cat/0.png', 1, 'ok')",
    ]
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(edits=st.lists(st.tuples(_EDITS, st.integers(1, 12)), min_size=1, max_size=3))
def test_any_edits_between_rescans_agree_with_the_walk(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edits: list[tuple[str, int]]
) -> None:
    db, twins = rescanned(tree, tmp_path, monkeypatch)
    with closing(sqlite3.connect(db)) as conn, conn:
        for sql, row in edits:
            with suppress(sqlite3.IntegrityError):  # a path another row holds
                conn.execute(sql, {"id": row})
    twins.rescan()  # agrees with the walk, whatever was remembered
    twins.rescan()


def test_the_digest_covers_every_input_of_the_comparison() -> None:
    inputs = {"start": "a/", "end": None, "label": 1, "split": None, "hidden": False, "suffixes": [b".png"]}
    base = digests.unit_digest(b"lines\0", inputs)
    assert digests.unit_digest(b"lines\0", dict(reversed(inputs.items()))) == base
    assert digests.unit_digest(b"lines!\0", inputs) != base
    for key, value in [("start", "b/"), ("end", "c/"), ("label", 2), ("split", "val"), ("hidden", True)]:
        assert digests.unit_digest(b"lines\0", {**inputs, key: value}) != base


def test_a_recovered_catalog_remembers_nothing(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlindex.catalog.recover import recover_catalog

    db, twins = rescanned(tree, tmp_path, monkeypatch)
    assert remembered(db)
    recovered = tmp_path / "recovered.db"
    report = recover_catalog(db, recovered)
    assert "scan_digests" not in report.rows and not remembered(recovered)
    twins = Twins(recovered, tree, tmp_path, monkeypatch)
    twins.rescan()
    assert recalled(twins) == 0 and twins.counted() == 12
