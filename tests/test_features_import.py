"""features import: .npy + ids, .npz, Parquet, JSONL; every kind of bad input writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dlindex import Catalog, InputError
from dlindex.features import import_features

from .conftest import rows
from .synthetic import ROOT, balanced


@pytest.fixture
def cats(tmp_path: Path) -> Path:
    return balanced(tmp_path / "c.db", {"cat": 4, "dog": 4})  # cat/0001.png is id 1, dog/0001.png id 5


def run(db: Path, file: Path, name: str = "emb", **options: object):  # type: ignore[no-untyped-def]
    with Catalog(db) as catalog:
        return import_features(catalog, name, file, **options)  # type: ignore[arg-type]


def stored(db: Path, name: str = "emb") -> dict[int, list[float]]:
    got = rows(db, "SELECT image_id, vector FROM image_features WHERE feature_type = ? ORDER BY image_id", (name,))
    return {int(i): np.frombuffer(v, "<f4").tolist() for i, v in got}  # type: ignore[arg-type]


def nothing_written(db: Path) -> bool:
    return rows(db, "SELECT count(*) FROM image_features") == [(0,)] and rows(db, "SELECT count(*) FROM feature_types") == [(0,)]


VECTORS = np.arange(12, dtype=np.float32).reshape(4, 3)


def test_npy_with_text_ids_file(cats: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", VECTORS)
    (tmp_path / "ids.txt").write_text("3\n1\n\n8\n2\n")
    summary = run(cats, tmp_path / "v.npy", ids_file=tmp_path / "ids.txt")
    assert (summary.imported, summary.dim, summary.dtype, summary.created) == (4, 3, "float32", True)
    assert stored(cats) == {3: [0, 1, 2], 1: [3, 4, 5], 8: [6, 7, 8], 2: [9, 10, 11]}
    assert rows(cats, "SELECT extractor FROM feature_types") == [("import",)]


def test_npy_with_npy_ids_and_float64_input(cats: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "v.npy", VECTORS.astype(np.float64))
    np.save(tmp_path / "ids.npy", np.array([1, 2, 3, 4], dtype=np.int32))
    run(cats, tmp_path / "v.npy", ids_file=tmp_path / "ids.npy")
    assert stored(cats)[4] == [9, 10, 11]


def test_npz_and_reimport_replaces(cats: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "v.npz", ids=np.array([5, 6, 7, 8]), vectors=VECTORS)
    run(cats, tmp_path / "v.npz")
    np.savez(tmp_path / "w.npz", ids=np.array([5]), vectors=-VECTORS[:1])
    again = run(cats, tmp_path / "w.npz")
    assert again.created is False
    assert stored(cats)[5] == [-0.0, -1.0, -2.0] and len(stored(cats)) == 4


def test_parquet_by_id_and_by_file_path(cats: Path, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2], "vector": [[1.0, 2.0], [3.0, 4.0]]}), tmp_path / "a.parquet")
    run(cats, tmp_path / "a.parquet", name="p")
    fixed = pa.FixedSizeListArray.from_arrays(pa.array([5.0, 6.0, 7.0, 8.0], pa.float32()), 2)
    table = pa.table({"file_path": ["dog/0001.png", f"{ROOT}/dog/0002.png"], "emb": fixed})
    pq.write_table(table, tmp_path / "b.parquet")
    run(cats, tmp_path / "b.parquet", name="p", column="emb")
    assert stored(cats, "p") == {1: [1, 2], 2: [3, 4], 5: [5, 6], 6: [7, 8]}


def test_jsonl_by_id_and_by_file_path(cats: Path, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 1, "vector": [1, 2.5]}\n\n{"id": 4, "vector": [0, -1]}\n')
    run(cats, tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text(json.dumps({"file_path": "cat/0002.png", "vector": [7, 7]}) + "\n")
    run(cats, tmp_path / "b.jsonl")
    assert stored(cats) == {1: [1, 2.5], 2: [7, 7], 4: [0, -1]}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: np.savez(d / "x.npz", ids=[1, 2], vectors=np.array([[1, 2], [3, 4]], dtype=np.int64)), "dtype int64; expected float"),
        (lambda d: np.savez(d / "x.npz", ids=[1, 2], vectors=np.array([[1, np.nan], [3, 4]])), r"row 1 \(id 1\) has NaN or infinite"),
        (lambda d: np.savez(d / "x.npz", ids=[1, 2], vectors=np.array([[1, 2], [np.inf, 4]])), r"row 2 \(id 2\) has NaN"),
        (lambda d: np.savez(d / "x.npz", ids=[1, 2], vectors=np.array([[1, 2], [1e39, 4]])), "infinite values as float32"),
        (lambda d: np.savez(d / "x.npz", ids=[1, 2, 99, 100], vectors=np.ones((4, 2))), r"2 unknown id\(s\): 99, 100; nothing"),
        (lambda d: np.savez(d / "x.npz", ids=[1, 1], vectors=np.ones((2, 2))), "id 1 appears more than once"),
        (lambda d: np.savez(d / "x.npz", ids=[1, 2, 3], vectors=np.ones((2, 2))), "3 ids for 2 vectors"),
        (lambda d: np.savez(d / "x.npz", ids=[1], vectors=np.ones((1, 2, 2))), "must be a 2-D array"),
        (lambda d: np.savez(d / "x.npz", ids=np.zeros(0, np.int64), vectors=np.ones((0, 2))), "holds no vectors"),
        (lambda d: np.savez(d / "x.npz", idz=[1], vectors=np.ones((1, 2))), "arrays named 'ids' and 'vectors'"),
        (lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, 2]}\n{"id": 2, "vector": [1]}\n'), "line 2: 1 values, line 1 has 2"),
        (lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, "a"]}\n'), "must be a list of numbers"),
        (lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, NaN]}\n'), "NaN or infinite"),
        (lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, 2]\n'), "line 1: not valid JSON"),
        (lambda d: (d / "x.jsonl").write_text('{"file_path": "cat/9999.png", "vector": [1, 2]}\n'), r"1 path\(s\) not in the catalog"),
        (lambda d: (d / "x.jsonl").write_text('{"id": 1, "vector": [1, 2]}\n{"file_path": "cat/0001.png", "vector": [1, 2]}\n'), "mixes"),
        (lambda d: (d / "x.csv").write_text("id,vector\n"), "expected one of .npy, .npz, .parquet, .jsonl"),
        (lambda d: np.save(d / "x.npy", np.ones((2, 2))), "give --ids FILE"),
    ],
)
def test_bad_input_is_one_clear_error_and_nothing_is_written(cats: Path, tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    make(tmp_path)
    (file,) = [p for p in tmp_path.iterdir() if p.name.startswith("x.")]
    with pytest.raises(InputError, match=message):
        run(cats, file)
    assert nothing_written(cats)


def test_wrong_dim_or_dtype_for_an_existing_type(cats: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", ids=[1, 2], vectors=np.ones((2, 3), np.float32))
    run(cats, tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", ids=[3, 4], vectors=np.ones((2, 4), np.float32))
    with pytest.raises(InputError, match="vectors have dim 4; feature type 'emb' has dim 3"):
        run(cats, tmp_path / "b.npz")
    with pytest.raises(InputError, match="stores float32, not float16"):
        run(cats, tmp_path / "a.npz", dtype="float16")
    assert sorted(stored(cats)) == [1, 2]


def test_an_invalid_name_or_missing_file(cats: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="invalid feature type name"):
        run(cats, tmp_path / "a.npz", name="drop table")
    with pytest.raises(InputError, match="no such file"):
        run(cats, tmp_path / "missing.npz")
    np.savez(tmp_path / "a.npz", ids=[1], vectors=np.ones((1, 2)))
    with pytest.raises(InputError, match="--ids is for .npy files"):
        run(cats, tmp_path / "a.npz", ids_file=tmp_path / "ids.txt")
