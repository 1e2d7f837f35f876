"""The feature cache's storage: schema, names, Catalog.features, drop, export, and what scans do to vectors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dlindex import Catalog, InputError, ScanOptions, feature_vectors, scan_tree
from dlindex.features import (
    check_name,
    drop_feature_type,
    export_features,
    get_type,
    import_features,
    list_feature_types,
    load_matrix,
    show_features,
)
from dlindex.features.blobs import write_vectors
from dlindex.features.matrix import matrix_path

from .backends import ON_BOTH_BACKENDS, on_postgresql, raw, where
from .conftest import make_png, rows

pytestmark = ON_BOTH_BACKENDS


_files: list[Path] = []  # the running test's temp folder, for the .npz files it imports


@pytest.fixture(autouse=True)
def _files_folder(tmp_path: Path) -> Iterator[None]:
    _files.append(tmp_path)
    yield
    _files.pop()


def store(db: Path, name: str, vectors: np.ndarray, ids: list[int] | None = None, **options: object) -> None:
    path = _files[-1] / f"{name}.npz"
    np.savez(path, ids=np.asarray(ids or list(range(1, len(vectors) + 1))), vectors=vectors)
    with Catalog(db) as catalog:
        import_features(catalog, name, path, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["colorhist", "resnet50_v2", "_x", "A1"])
def test_valid_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "select", "Order", "naïve", "x" * 65, 'a"b', "a;drop"])
def test_names_that_would_need_quoting_are_rejected(name: str) -> None:
    with pytest.raises(InputError, match="invalid feature type name"):
        check_name(name)


def test_features_returns_vectors_in_the_order_of_ids(cats: Path) -> None:
    vectors = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    store(cats, "v", vectors)
    with Catalog(cats) as catalog:
        got = feature_vectors(catalog, [5, 1, 5, 8], "v")
        assert got.dtype == np.float32 and got.shape == (4, 3)
        assert np.array_equal(got, vectors[[4, 0, 4, 7]])
        assert feature_vectors(catalog, [], "v").shape == (0, 3)
        load_matrix(catalog, "v")  # the memory-mapped path answers the same
        assert np.array_equal(feature_vectors(catalog, [5, 1, 5, 8], "v"), vectors[[4, 0, 4, 7]])


def test_features_float16_round_trip(cats: Path) -> None:
    vectors = np.linspace(-2, 2, 8 * 4, dtype=np.float32).reshape(8, 4)
    store(cats, "half", vectors, dtype="float16")
    assert rows(cats, "SELECT dtype, dim, length(vector) FROM feature_types JOIN image_features "
                      "ON feature_type = name LIMIT 1") == [("float16", 4, 8)]  # fmt: skip
    with Catalog(cats) as catalog:
        got = feature_vectors(catalog, [2, 3], "half")
        assert got.dtype == np.float16 and np.array_equal(got, vectors[[1, 2]].astype(np.float16))


def test_unknown_feature_type_lists_the_known_ones(cats: Path) -> None:
    with Catalog(cats) as catalog, pytest.raises(InputError, match=r"unknown feature type 'nope'.*none yet"):
        feature_vectors(catalog, [1], "nope")
    store(cats, "beta", np.ones((8, 2), np.float32))
    store(cats, "alpha", np.ones((8, 2), np.float32))
    with (
        Catalog(cats) as catalog,
        pytest.raises(InputError, match="unknown feature type 'nope'; known types: alpha, beta"),
    ):
        feature_vectors(catalog, [1], "nope")


def test_features_of_ids_without_vectors_is_an_error(cats: Path) -> None:
    store(cats, "v", np.ones((2, 2), np.float32), ids=[1, 2])
    with Catalog(cats) as catalog, pytest.raises(InputError, match=r"2 id\(s\) have no 'v' vector: 3, 99"):
        feature_vectors(catalog, [1, 3, 99], "v")


def test_a_vector_of_the_wrong_size_is_refused_on_write_and_reported_on_read(cats: Path) -> None:
    store(cats, "v", np.ones((8, 2), np.float32))
    with Catalog(cats) as catalog:
        ftype = get_type(catalog, "v")
        with (
            pytest.raises(InputError, match="vector of sample 1 has 4 bytes; 'v' stores 8"),
            catalog.write_transaction() as conn,
        ):
            write_vectors(conn, ftype, [(1, b"\0" * 4)])
    with raw(cats) as conn:  # another program, bypassing dlindex
        conn.execute("UPDATE image_features SET vector = ? WHERE image_id = 3", (b"\0",))
    with Catalog(cats) as catalog:
        with pytest.raises(InputError, match="'v' vector of sample 3 has 1 bytes, not 8"):
            feature_vectors(catalog, [3], "v")
        with pytest.raises(InputError, match="'v' vector of sample 3 has 1 bytes, not 8"):
            load_matrix(catalog, "v")


def test_list_show_drop(cats: Path) -> None:
    store(cats, "v", np.arange(16, dtype=np.float32).reshape(8, 2))
    with Catalog(cats) as catalog:
        (info,) = list_feature_types(catalog)
        assert (info.name, info.dim, info.dtype, info.extractor, info.vectors, info.failed) == (
            "v",
            2,
            "float32",
            "import",
            8,
            0,
        )
        shown = show_features(catalog, 2)
        assert shown.vectors["v"]["vector"] == [2.0, 3.0] and shown.label == "cat"
        with pytest.raises(InputError, match="no sample with id 99"):
            show_features(catalog, 99)
        load_matrix(catalog, "v")
        assert matrix_path(catalog, "v").exists()
        dropped = drop_feature_type(catalog, "v")
        assert (dropped.vectors, dropped.failed) == (8, 0)
        assert not matrix_path(catalog, "v").exists()
        assert list_feature_types(catalog) == []
    assert rows(cats, "SELECT count(*) FROM image_features") == [(0,)]


def test_export_npz_round_trip(cats: Path, tmp_path: Path) -> None:
    vectors = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    store(cats, "v", vectors)
    with Catalog(cats) as catalog:
        result = export_features(catalog, "v", tmp_path / "out.npz")
        with pytest.raises(InputError, match=r"\.npz"):
            export_features(catalog, "v", tmp_path / "out.bin")
    assert (result.vectors, result.dim) == (8, 5)
    with np.load(tmp_path / "out.npz") as data:
        assert data["ids"].tolist() == list(range(1, 9)) and np.array_equal(data["vectors"], vectors)


def test_matrix_is_rebuilt_after_any_change_to_the_vectors(cats: Path) -> None:
    store(cats, "v", np.zeros((8, 2), np.float32))
    with Catalog(cats) as catalog:
        first = load_matrix(catalog, "v")
        assert load_matrix(catalog, "v") is first  # unchanged: the same mapping
    store(cats, "v", np.ones((1, 2), np.float32), ids=[3])
    with Catalog(cats) as catalog:
        assert load_matrix(catalog, "v").vectors[2].tolist() == [1.0, 1.0]
    with raw(cats) as conn:
        if not on_postgresql():
            conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM image_metadata WHERE id = 4")  # someone else's delete: a trigger notes it
    with Catalog(cats) as catalog:
        assert 4 not in load_matrix(catalog, "v").ids.tolist()


def test_prune_deletes_the_vectors_of_pruned_images(tmp_path: Path) -> None:
    root = tmp_path / "img"
    for i in range(3):
        make_png(root / "a" / f"{i}.png", color=(i * 50, 0, 0))
    db = where(tmp_path / "p.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    store(db, "v", np.ones((3, 2), np.float32), ids=[1, 2, 3])
    (root / "a" / "1.png").unlink()
    with Catalog(db) as catalog:
        summary = scan_tree(catalog, root, ScanOptions(workers=1, prune=True))
    assert summary.pruned == 1
    assert rows(db, "SELECT image_id FROM image_features ORDER BY image_id") == [(1,), (3,)]


def test_new_content_drops_stale_vectors_and_a_touch_keeps_them(tmp_path: Path) -> None:
    root = tmp_path / "img"
    make_png(root / "a" / "0.png", color=(1, 2, 3))
    make_png(root / "a" / "1.png", color=(4, 5, 6))
    db = where(tmp_path / "p.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    store(db, "v", np.ones((2, 2), np.float32), ids=[1, 2])
    make_png(root / "a" / "0.png", (16, 16), color=(9, 9, 9))  # new content
    make_png(root / "a" / "1.png", color=(4, 5, 6))  # same bytes, new mtime
    with Catalog(db) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    assert rows(db, "SELECT image_id FROM image_features") == [(2,)]
