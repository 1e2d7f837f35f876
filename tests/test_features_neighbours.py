"""nearest: exact k nearest neighbours equal to a brute force; filters, other labels, the matrix file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlindex import Catalog, InputError, QuerySpec
from dlindex.features import import_features, load_matrix, nearest
from dlindex.features.matrix import matrix_path

from .backends import ON_BOTH_BACKENDS, raw
from .conftest import brute_force, catalog_with

pytestmark = ON_BOTH_BACKENDS


def answer(found: list[list[object]]) -> list[list[tuple[int, float]]]:
    return [[(n.id, n.distance) for n in one] for one in found]  # type: ignore[attr-defined]


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize("kind", ["gaussian", "ties", "scaled"])
def test_equals_brute_force(tmp_path: Path, metric: str, kind: str) -> None:
    rng = np.random.default_rng(7)
    if kind == "gaussian":
        vectors = rng.standard_normal((300, 24)).astype(np.float32)
    elif kind == "ties":  # few distinct values: many exactly equal distances and duplicate rows
        vectors = rng.integers(-2, 3, size=(300, 6)).astype(np.float32)
        vectors[::7] = vectors[0]
        vectors[5] = 0  # a zero vector: cosine distance 1 to everything
    else:
        vectors = (rng.standard_normal((300, 24)) * 1e4 + 3e4).astype(np.float32)
    db, labels = catalog_with(tmp_path, vectors)
    queries = [1, 2, 6, 8, 150, 300]
    with Catalog(db) as catalog:
        for k in (1, 10, 299, 500):
            got = answer(nearest(catalog, queries, "v", k=k, metric=metric))
            assert got == [brute_force(vectors, labels, q, k, metric) for q in queries]
        hard = answer(nearest(catalog, queries, "v", k=10, metric=metric, other_labels=True))
        assert hard == [brute_force(vectors, labels, q, 10, metric, other_labels=True) for q in queries]


def test_filters_restrict_the_candidates_and_statuses_default_to_ok(tmp_path: Path) -> None:
    vectors = np.random.default_rng(1).standard_normal((60, 8)).astype(np.float32)
    statuses = ["missing" if i % 10 == 0 else "ok" for i in range(60)]
    db, labels = catalog_with(tmp_path, vectors, statuses)
    ok = {i + 1 for i in range(60) if statuses[i] == "ok"}
    with Catalog(db) as catalog:
        assert answer(nearest(catalog, [1], "v", k=60)) == [brute_force(vectors, labels, 1, 60, "cosine", ok)]
        only_b = {i for i in ok if labels[i - 1] == "b"}
        got = answer(nearest(catalog, [1, 2], "v", k=5, metric="l2", spec=QuerySpec(labels=["b"])))
        assert got == [brute_force(vectors, labels, q, 5, "l2", only_b) for q in (1, 2)]


def test_the_matrix_file_is_reused_and_expires_when_vectors_change(tmp_path: Path) -> None:
    vectors = np.random.default_rng(2).standard_normal((20, 4)).astype(np.float32)
    db, labels = catalog_with(tmp_path, vectors)
    with Catalog(db) as catalog:
        nearest(catalog, [1], "v")
        path = matrix_path(catalog, "v")
        stamp = path.stat().st_mtime_ns
        nearest(catalog, [2], "v")
        assert path.stat().st_mtime_ns == stamp
    vectors[3] = vectors[0] * 2
    np.savez(tmp_path / "w.npz", ids=np.array([4]), vectors=vectors[3:4])
    with Catalog(db) as catalog:
        import_features(catalog, "v", tmp_path / "w.npz")
        assert answer(nearest(catalog, [1], "v", k=3)) == [brute_force(vectors, labels, 1, 3, "cosine")]
        assert answer(nearest(catalog, [1], "v", k=3))[0][0] == (4, 0.0)
        assert path.stat().st_mtime_ns != stamp


def test_a_stale_or_foreign_matrix_file_is_never_used(tmp_path: Path) -> None:
    vectors = np.random.default_rng(3).standard_normal((20, 4)).astype(np.float32)
    db, labels = catalog_with(tmp_path, vectors)
    with Catalog(db) as catalog:
        load_matrix(catalog, "v")
        path = matrix_path(catalog, "v")
    path.write_bytes(path.read_bytes()[:-4])  # truncated
    with Catalog(db) as catalog:
        from dlindex.features import matrix

        matrix._memo.clear()
        assert answer(nearest(catalog, [1], "v", k=19)) == [brute_force(vectors, labels, 1, 19, "cosine")]


def test_errors(tmp_path: Path) -> None:
    vectors = np.ones((5, 2), np.float32)
    db, _ = catalog_with(tmp_path, vectors[:4])
    with raw(db) as conn:
        conn.execute("INSERT INTO image_metadata (id, root_id, file_path, label_id) VALUES (9, 1, 'a/9.png', 1)")
    with Catalog(db) as catalog:
        with pytest.raises(InputError, match="unknown feature type 'w'; known types: v"):
            nearest(catalog, [1], "w")
        with pytest.raises(InputError, match="sample 9 has no 'v' vector"):
            nearest(catalog, [9], "v")
        with pytest.raises(InputError, match="no sample with id 99"):
            nearest(catalog, [99], "v")
        with pytest.raises(InputError, match="unknown metric"):
            nearest(catalog, [1], "v", metric="dot")


@pytest.mark.parametrize("scale", [1e25, 1e-25])
def test_huge_or_tiny_magnitudes_stay_exact(tmp_path: Path, scale: float) -> None:
    rng = np.random.default_rng(5)
    vectors = (rng.standard_normal((50, 6)) * scale).astype(np.float32)
    db, labels = catalog_with(tmp_path, vectors)
    with Catalog(db) as catalog:
        for metric in ("cosine", "l2"):
            got = answer(nearest(catalog, [1, 7], "v", k=5, metric=metric, other_labels=True))
            assert got == [brute_force(vectors, labels, q, 5, metric, other_labels=True) for q in (1, 7)]
