"""features import: .npy + ids, .npz, Parquet, JSONL; every kind of bad input writes nothing."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlindex import Catalog, CatalogError, InputError

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, on_postgresql
from .conftest import import_file, rows
from .synthetic import ROOT, balanced

pytestmark = ON_BOTH_BACKENDS


def stored(db: Path, name: str = "emb") -> dict[int, list[float]]:
    got = rows(db, "SELECT image_id, vector FROM image_features WHERE feature_type = ? ORDER BY image_id", (name,))
    return {int(i): np.frombuffer(v, "<f4").tolist() for i, v in got}  # type: ignore[arg-type]


def nothing_written(db: Path) -> bool:
    return rows(db, "SELECT count(*) FROM image_features") == [(0,)] and rows(
        db, "SELECT count(*) FROM feature_types"
    ) == [(0,)]


VECTORS = np.arange(12, dtype=np.float32).reshape(4, 3)


def test_npy_with_text_ids_file(cats: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", VECTORS)
    (tmp_path / "ids.txt").write_text("3\n1\n\n8\n2\n")
    summary = import_file(cats, tmp_path / "v.npy", ids_file=tmp_path / "ids.txt")
    assert (summary.imported, summary.dim, summary.dtype, summary.created) == (4, 3, "float32", True)
    assert stored(cats) == {3: [0, 1, 2], 1: [3, 4, 5], 8: [6, 7, 8], 2: [9, 10, 11]}
    assert rows(cats, "SELECT extractor FROM feature_types") == [("import",)]


def test_npy_with_npy_ids_and_float64_input(cats: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", VECTORS.astype(np.float64))
    np.save(tmp_path / "ids.npy", np.array([1, 2, 3, 4], dtype=np.int32))
    import_file(cats, tmp_path / "v.npy", ids_file=tmp_path / "ids.npy")
    assert stored(cats)[4] == [9, 10, 11]


def test_npz_and_reimport_replaces(cats: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "v.npz", ids=np.array([5, 6, 7, 8]), vectors=VECTORS)
    import_file(cats, tmp_path / "v.npz")
    np.savez(tmp_path / "w.npz", ids=np.array([5]), vectors=-VECTORS[:1])
    again = import_file(cats, tmp_path / "w.npz")
    assert again.created is False
    assert stored(cats)[5] == [-0.0, -1.0, -2.0] and len(stored(cats)) == 4


def test_parquet_by_id_and_by_file_path(cats: Path, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2], "vector": [[1.0, 2.0], [3.0, 4.0]]}), tmp_path / "a.parquet")
    import_file(cats, tmp_path / "a.parquet", name="p")
    fixed = pa.FixedSizeListArray.from_arrays(pa.array([5.0, 6.0, 7.0, 8.0], pa.float32()), 2)
    table = pa.table({"file_path": ["dog/0001.png", f"{ROOT}/dog/0002.png"], "emb": fixed})
    pq.write_table(table, tmp_path / "b.parquet")
    import_file(cats, tmp_path / "b.parquet", name="p", column="emb")
    assert stored(cats, "p") == {1: [1, 2], 2: [3, 4], 5: [5, 6], 6: [7, 8]}


def test_jsonl_by_id_and_by_file_path(cats: Path, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 1, "vector": [1, 2.5]}\n\n{"id": 4, "vector": [0, -1]}\n')
    import_file(cats, tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text(json.dumps({"file_path": "cat/0002.png", "vector": [7, 7]}) + "\n")
    import_file(cats, tmp_path / "b.jsonl")
    assert stored(cats) == {1: [1, 2.5], 2: [7, 7], 4: [0, -1]}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda d: np.savez(d / "x.npz", ids=[1, 2], vectors=np.array([[1, 2], [3, 4]], dtype=np.int64)),
            "dtype int64; expected float",
        ),
        (
            lambda d: np.savez(d / "x.npz", ids=[1, 2], vectors=np.array([[1, np.nan], [3, 4]])),
            r"row 1 \(id 1\) has NaN or infinite",
        ),
        (
            lambda d: np.savez(d / "x.npz", ids=[1, 2], vectors=np.array([[1, 2], [np.inf, 4]])),
            r"row 2 \(id 2\) has NaN",
        ),
        (
            lambda d: np.savez(d / "x.npz", ids=[1, 2], vectors=np.array([[1, 2], [1e39, 4]])),
            "infinite values as float32",
        ),
        (
            lambda d: np.savez(d / "x.npz", ids=[1, 2, 99, 100], vectors=np.ones((4, 2))),
            r"2 unknown id\(s\): 99, 100; nothing",
        ),
        (lambda d: np.savez(d / "x.npz", ids=[1, 1], vectors=np.ones((2, 2))), "id 1 appears more than once"),
        (lambda d: np.savez(d / "x.npz", ids=[1, 2, 3], vectors=np.ones((2, 2))), "3 ids for 2 vectors"),
        (lambda d: np.savez(d / "x.npz", ids=[1], vectors=np.ones((1, 2, 2))), "must be a 2-D array"),
        (lambda d: np.savez(d / "x.npz", ids=np.zeros(0, np.int64), vectors=np.ones((0, 2))), "holds no vectors"),
        (lambda d: np.savez(d / "x.npz", idz=[1], vectors=np.ones((1, 2))), "arrays named 'ids' and 'vectors'"),
        (
            lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, 2]}\n{"id": 2, "vector": [1]}\n'),
            "line 2: 1 values, line 1 has 2",
        ),
        (lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, "a"]}\n'), "must be a list of numbers"),
        (lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, NaN]}\n'), "NaN or infinite"),
        (lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, 2]\n'), "line 1: not valid JSON"),
        (
            lambda d: (d / "x.jsonl").write_text('{"file_path": "cat/9999.png", "vector": [1, 2]}\n'),
            r"1 path\(s\) not in the catalog",
        ),
        (
            lambda d: (d / "x.jsonl").write_text(
                '{"id": 1, "vector": [1, 2]}\n{"file_path": "cat/0001.png", "vector": [1, 2]}\n'
            ),
            "mixes",
        ),
        (lambda d: (d / "x.csv").write_text("id,vector\n"), "expected one of .npy, .npz, .parquet, .jsonl"),
        (lambda d: np.save(d / "x.npy", np.ones((2, 2))), "give --ids FILE"),
    ],
)
def test_bad_input_is_one_clear_error_and_nothing_is_written(cats: Path, tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    make(tmp_path)
    (file,) = [p for p in tmp_path.iterdir() if p.name.startswith("x.")]
    with pytest.raises(InputError, match=message):
        import_file(cats, file)
    assert nothing_written(cats)


def test_wrong_dim_or_dtype_for_an_existing_type(cats: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", ids=[1, 2], vectors=np.ones((2, 3), np.float32))
    import_file(cats, tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", ids=[3, 4], vectors=np.ones((2, 4), np.float32))
    with pytest.raises(InputError, match="vectors have dim 4; feature type 'emb' has dim 3"):
        import_file(cats, tmp_path / "b.npz")
    with pytest.raises(InputError, match="stores float32, not float16"):
        import_file(cats, tmp_path / "a.npz", dtype="float16")
    assert sorted(stored(cats)) == [1, 2]


def test_an_invalid_name_or_missing_file(cats: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="invalid feature type name"):
        import_file(cats, tmp_path / "a.npz", name="drop table")
    with pytest.raises(InputError, match="no such file"):
        import_file(cats, tmp_path / "missing.npz")
    np.savez(tmp_path / "a.npz", ids=[1], vectors=np.ones((1, 2)))
    with pytest.raises(InputError, match=r"--ids is for .npy files"):
        import_file(cats, tmp_path / "a.npz", ids_file=tmp_path / "ids.txt")


def journal_mode(db: Path) -> str:
    return str(rows(db, "PRAGMA journal_mode")[0][0])


@pytest.fixture
def bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every import counts as large: the rollback-journal path runs on a small catalog."""
    monkeypatch.setattr("dlindex.features.vector_import._ROLLBACK_MIN_BYTES", 0)


@SQLITE_ONLY  # SQLite's journal modes and file locks
def test_a_large_import_alone_uses_a_rollback_journal_then_wal_again(cats: Path, tmp_path: Path, bulk: None) -> None:
    np.savez(tmp_path / "a.npz", ids=[1, 2, 3, 4], vectors=VECTORS)
    summary = import_file(cats, tmp_path / "a.npz")
    assert summary.journal == "rollback"
    assert stored(cats)[3] == [6.0, 7.0, 8.0]
    assert journal_mode(cats) == "wal"
    assert not Path(f"{cats}-journal").exists()
    assert rows(cats, "PRAGMA integrity_check") == [("ok",)]


@SQLITE_ONLY  # SQLite's journal modes and file locks
def test_a_large_import_keeps_wal_when_another_process_has_the_catalog_open(
    cats: Path, tmp_path: Path, bulk: None
) -> None:
    np.savez(tmp_path / "a.npz", ids=[1, 2, 3, 4], vectors=VECTORS)
    reader = sqlite3.connect(cats)
    try:
        assert reader.execute("SELECT count(*) FROM image_metadata").fetchone() == (8,)
        assert import_file(cats, tmp_path / "a.npz").journal == "wal"
        # The reader was never locked out: it sees the new vectors at once.
        assert reader.execute("SELECT count(*) FROM image_features").fetchone() == (4,)
    finally:
        reader.close()
    assert import_file(cats, tmp_path / "a.npz", concurrent=True).journal == "wal"  # alone, but asked to share


def test_a_small_import_stays_in_wal(cats: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", ids=[1, 2, 3, 4], vectors=VECTORS)
    assert import_file(cats, tmp_path / "a.npz").journal == "wal"


KILLED_IMPORT = """
import os, signal, sys
import dlindex.features.vector_import as importer
from dlindex import Catalog
importer._ROLLBACK_MIN_BYTES = 0
rows = importer._rows
def rows_then_die(*args):
    for n, row in enumerate(rows(*args)):
        if n == 600:  # mid-transaction, after SQLite spilled pages to the file
            os.kill(os.getpid(), signal.SIGKILL)
        yield row
importer._rows = rows_then_die
with Catalog(sys.argv[1]) as catalog:
    catalog.conn.execute("PRAGMA cache_size = 2")  # force spills into the database file
    importer._page_cache = lambda *a: __import__("contextlib").nullcontext()
    importer.import_features(catalog, "emb", sys.argv[2])
"""


@SQLITE_ONLY  # SQLite's journal modes and file locks
def test_kill_9_during_a_rollback_journal_import_loses_nothing(tmp_path: Path) -> None:
    db = balanced(tmp_path / "big.db", {"cat": 500, "dog": 500})
    np.savez(tmp_path / "old.npz", ids=[1, 2], vectors=np.ones((2, 256), np.float32))
    import_file(db, tmp_path / "old.npz", name="old")
    np.savez(tmp_path / "a.npz", ids=np.arange(1, 1001), vectors=np.ones((1000, 256), np.float32))
    done = subprocess.run([sys.executable, "-c", KILLED_IMPORT, str(db), str(tmp_path / "a.npz")], timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert Path(f"{db}-journal").exists()  # a hot journal: the file holds half a transaction
    with Catalog(db) as catalog:  # opening rolls the half-written transaction back
        assert catalog.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert rows(db, "SELECT feature_type, count(*) FROM image_features GROUP BY 1") == [("old", 2)]
    assert rows(db, "SELECT name FROM feature_types") == [("old",)]
    assert rows(db, "SELECT count(*) FROM image_metadata") == [(1000,)]
    assert import_file(db, tmp_path / "a.npz").imported == 1000  # and the next run completes the work


@SQLITE_ONLY  # SQLite's journal modes and file locks
def test_opening_a_catalog_that_stays_locked_is_one_clear_error(cats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    holder = sqlite3.connect(cats, isolation_level=None)
    try:
        holder.execute("PRAGMA journal_mode = DELETE")
        holder.execute("BEGIN EXCLUSIVE")  # as a rollback-journal import does once it spills
        monkeypatch.setattr("dlindex.catalog.sqlite.connect.BUSY_TIMEOUT_S", 0.2)
        with pytest.raises(CatalogError, match=r"stayed locked .* by another process"):
            Catalog(cats)
    finally:
        holder.close()


def test_unknown_ids_in_a_large_import_roll_it_all_back(cats: Path, tmp_path: Path, bulk: None) -> None:
    np.savez(tmp_path / "a.npz", ids=[1, 2, 99, 100], vectors=VECTORS)
    with pytest.raises(InputError, match=r"2 unknown id\(s\): 99, 100; nothing was imported"):
        import_file(cats, tmp_path / "a.npz")
    assert nothing_written(cats)
    if not on_postgresql():
        assert journal_mode(cats) == "wal" and not Path(f"{cats}-journal").exists()
