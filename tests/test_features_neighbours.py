"""similar: exact k nearest neighbours equal to a brute force; filters, other labels, batch mode, CLI."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlindex import Catalog, InputError, QuerySpec
from dlindex.cli import app
from dlindex.features import import_features, load_matrix, nearest
from dlindex.features.neighbours import matrix_path

from .synthetic import ROOT, Row, make_catalog

LABELS = ("a", "b", "c")


def brute_force(vectors: np.ndarray, labels: list[str], q: int, k: int, metric: str,
                allowed: set[int] | None = None, other_labels: bool = False) -> list[tuple[int, float]]:  # fmt: skip
    """Plain float64 numpy over every row (ids are 1-based row numbers), ties to the lower id."""
    v = vectors.astype(np.float64)
    x = v[q - 1]
    if metric == "l2":
        d = np.sqrt(((v - x) ** 2).sum(axis=1))
    else:
        scale = np.sqrt((v * v).sum(axis=1)) * np.sqrt((x * x).sum())
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(scale > 0, np.clip(1 - (v * x).sum(axis=1) / scale, 0, 2), 1.0)
    ids = [i for i in range(1, len(v) + 1) if i != q and (allowed is None or i in allowed)
           and not (other_labels and labels[i - 1] == labels[q - 1])]  # fmt: skip
    return sorted(((i, float(d[i - 1])) for i in ids), key=lambda t: (t[1], t[0]))[:k]


def catalog_with(tmp_path: Path, vectors: np.ndarray, statuses: list[str] | None = None) -> tuple[Path, list[str]]:
    n = len(vectors)
    labels = [LABELS[i % 3] for i in range(n)]
    status = statuses or ["ok"] * n
    db = make_catalog(tmp_path / "s.db", [Row(labels[i], status=status[i]) for i in range(n)])
    np.savez(tmp_path / "v.npz", ids=np.arange(1, n + 1), vectors=vectors)
    with Catalog(db) as catalog:
        import_features(catalog, "v", tmp_path / "v.npz")
    return db, labels


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
        from dlindex.features import neighbours

        neighbours._memo.clear()
        assert answer(nearest(catalog, [1], "v", k=19)) == [brute_force(vectors, labels, 1, 19, "cosine")]


def test_errors(tmp_path: Path) -> None:
    vectors = np.ones((5, 2), np.float32)
    db, _ = catalog_with(tmp_path, vectors[:4])
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO image_metadata (id, root_id, file_path, label_id) VALUES (9, 1, 'a/9.png', 1)")
    conn.close()
    with Catalog(db) as catalog:
        with pytest.raises(InputError, match="unknown feature type 'w'; known types: v"):
            nearest(catalog, [1], "w")
        with pytest.raises(InputError, match="sample 9 has no 'v' vector"):
            nearest(catalog, [9], "v")
        with pytest.raises(InputError, match="no sample with id 99"):
            nearest(catalog, [99], "v")
        with pytest.raises(InputError, match="unknown metric"):
            nearest(catalog, [1], "v", metric="dot")


@pytest.fixture
def cli_db(tmp_path: Path) -> tuple[Path, np.ndarray, list[str]]:
    vectors = np.random.default_rng(4).standard_normal((30, 5)).astype(np.float32)
    db, labels = catalog_with(tmp_path, vectors)
    return db, vectors, labels


def test_cli_one_sample_by_id_and_by_path(runner: CliRunner, cli_db: tuple[Path, np.ndarray, list[str]]) -> None:
    db, vectors, labels = cli_db
    result = runner.invoke(app, ["similar", "2", "--type", "v", "-k", "3", "--db", str(db)])
    assert result.exit_code == 0 and result.stderr == "", result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["id"], r["distance"]) for r in lines] == brute_force(vectors, labels, 2, 3, "cosine")
    assert list(lines[0]) == ["query", "rank", "id", "distance", "label", "path"]
    assert lines[0]["query"] == 2 and [r["rank"] for r in lines] == [1, 2, 3]
    assert lines[0]["path"] == f"{ROOT}/{lines[0]['label']}/" + lines[0]["path"].rsplit("/", 1)[1]
    by_path = runner.invoke(app, ["similar", "b/0001.png", "--type", "v", "-k", "3", "--db", str(db)])
    by_abs = runner.invoke(app, ["similar", f"{ROOT}/b/0001.png", "--type", "v", "-k", "3", "--db", str(db)])
    assert by_path.stdout == by_abs.stdout == result.stdout  # b/0001.png is sample 2
    paths = runner.invoke(app, ["similar", "2", "--type", "v", "-k", "2", "--other-labels", "--metric", "l2",
                                "--format", "paths", "--db", str(db)])  # fmt: skip
    expected = brute_force(vectors, labels, 2, 2, "l2", other_labels=True)
    assert [p.rsplit("/", 2)[1] for p in paths.stdout.splitlines()] == [labels[i - 1] for i, _ in expected]


def test_cli_batch_mode(runner: CliRunner, cli_db: tuple[Path, np.ndarray, list[str]], tmp_path: Path) -> None:
    db, vectors, labels = cli_db
    (tmp_path / "q.txt").write_text("1\n5\n\n9\n")
    result = runner.invoke(app, ["similar", "--type", "v", "--ids", str(tmp_path / "q.txt"), "-k", "4",
                                 "--format", "jsonl", "--label", "a", "--label", "c", "--db", str(db)])  # fmt: skip
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in result.stdout.splitlines()]
    allowed = {i for i in range(1, 31) if labels[i - 1] in ("a", "c")}
    for q in (1, 5, 9):
        mine = [(r["id"], r["distance"]) for r in got if r["query"] == q]
        assert mine == brute_force(vectors, labels, q, 4, "cosine", allowed)
    stdin = runner.invoke(
        app, ["similar", "--type", "v", "--ids", "-", "-k", "4", "--format", "csv", "--db", str(db)], input="3\n"
    )
    assert stdin.exit_code == 0 and stdin.stdout.splitlines()[0] == "query,rank,id,distance,label,path"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["2", "--type", "nope"], 1, "Error: unknown feature type 'nope'; known types: v"),
        (["999", "--type", "v"], 1, "Error: no sample with id 999"),
        (["x/nothing.png", "--type", "v"], 1, "Error: x/nothing.png is not in the catalog"),
        (["--type", "v"], 2, "give one sample"),
        (["2", "--type", "v", "-k", "0"], 2, "-k"),
        (["2", "--type", "v", "--metric", "dot"], 2, "--metric"),
    ],
)
def test_cli_errors(
    runner: CliRunner, cli_db: tuple[Path, np.ndarray, list[str]], args: list[str], code: int, message: str
) -> None:
    result = runner.invoke(app, ["similar", *args, "--db", str(cli_db[0])])
    assert result.exit_code == code and message in result.stderr, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("scale", [1e25, 1e-25])
def test_huge_or_tiny_magnitudes_stay_exact(tmp_path: Path, scale: float) -> None:
    rng = np.random.default_rng(5)
    vectors = (rng.standard_normal((50, 6)) * scale).astype(np.float32)
    db, labels = catalog_with(tmp_path, vectors)
    with Catalog(db) as catalog:
        for metric in ("cosine", "l2"):
            got = answer(nearest(catalog, [1, 7], "v", k=5, metric=metric, other_labels=True))
            assert got == [brute_force(vectors, labels, q, 5, metric, other_labels=True) for q in (1, 7)]
