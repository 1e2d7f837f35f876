"""dups, leaks and similar in bounded memory (#34): the same answers as the in-memory versions.

Each streamed path runs with blocks of a few rows (monkeypatched), so every block boundary,
page release and pool merge is crossed, and is compared with the code it replaced: exact
groups from every selected id in a set, near groups from float rows packed at once, the
matrix from ``read_all``, neighbours from one product over the whole matrix (a brute force).
"""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from dlindex import Catalog, QuerySpec
from dlindex.errors import DiskFullError
from dlindex.features import load_matrix, nearest
from dlindex.features.blobs import read_all
from dlindex.features.matrix import matrix_path
from dlindex.features.types import find_type
from dlindex.quality import duplicate_groups as groups_module
from dlindex.quality.duplicate_groups import SHARED_CONTENT, duplicate_groups
from dlindex.quality.hashes import load_vectors, pack_bits, plain_hashes
from dlindex.query.rows import sample_ids

from .backends import raw
from .conftest import brute_force, catalog_with
from .synthetic import Row, make_catalog


def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dlindex.quality.hashes._BLOCK_ROWS", 3)
    monkeypatch.setattr("dlindex.quality.hashes._RELEASE_EVERY", 1)
    monkeypatch.setattr("dlindex.quality.hashes._ID_BLOCK", 5)  # the selection matched 5 ids at a time
    monkeypatch.setattr("dlindex.features.blobs.CHUNK", 4)
    monkeypatch.setattr("dlindex.features.neighbours._BLOCK_ELEMENTS", 7)
    monkeypatch.setattr("dlindex.features.neighbours._RESIDENT_BYTES", 0)  # read by blocks, pages dropped
    monkeypatch.setattr("dlindex.features.neighbours._COLUMN_BYTES", 100)
    monkeypatch.setattr("dlindex.features.neighbours._ID_CHUNK", 4)


def bits(value: int) -> npt.NDArray[np.float32]:
    return np.array([(value >> i) & 1 for i in range(64)], dtype=np.float32)


def sprite_hashes(rng: np.random.Generator, n: int) -> list[int]:
    """Low-information hashes, as sprite sheets and icons give: a few values repeated many
    times, most others one or two bits from them, some near the flat image's 0, a few random."""
    common = [int(x) for x in rng.integers(0, 2**63, size=4)]
    out = []
    for i in range(n):
        base = common[i % len(common)]
        kind = i % 5
        if kind == 0:
            out.append(base)
        elif kind in (1, 2):
            out.append(base ^ (1 << int(rng.integers(64))) ^ (1 << int(rng.integers(64))))
        elif kind == 3:
            out.append(1 << int(rng.integers(64)) if i % 2 else 0)
        else:
            out.append(int(rng.integers(0, 2**63)))
    return out


@pytest.fixture
def near_db(tmp_path: Path, catalog_backend: str) -> Path | str:
    """On both backends (the exact groups' statement runs in the server's SQL too)."""
    rng = np.random.default_rng(3)
    n = 120
    statuses = ["missing" if i % 11 == 0 else "ok" for i in range(n)]
    db = make_catalog(tmp_path / "c.db", [Row(("a", "b")[i % 2], status=statuses[i]) for i in range(n)])
    with raw(db) as conn:  # content: a few shared values, for exact groups
        conn.executemany(
            "UPDATE image_metadata SET xxh3_128 = ?, width = ?, bytes = ? WHERE id = ?",
            [(f"c{i % 17}" if i % 3 else f"u{i}", 8 + i % 5, 100 + i % 7, i + 1) for i in range(n)],
        )
    vectors = np.stack([bits(h) for h in sprite_hashes(rng, n)])
    np.savez(tmp_path / "dhash.npz", ids=np.arange(1, n + 1), vectors=vectors)
    from dlindex.features import import_features

    with Catalog(db) as c:
        import_features(c, "dhash", tmp_path / "dhash.npz")
    return db


def old_content_groups(catalog: Catalog, spec: QuerySpec | None) -> list[list[int]]:
    """The exact groups as dups found them before: every selected id in a Python set."""
    selected = set(sample_ids(catalog, replace(spec or QuerySpec(), columns=("id",))))
    found: dict[str, list[int]] = {}
    for image_id, content in catalog.read(SHARED_CONTENT):
        if image_id in selected:
            found.setdefault(content, []).append(int(image_id))
    return [sorted(ids) for ids in found.values() if len(ids) > 1]


def old_load_vectors(catalog: Catalog, feature_type: str, spec: QuerySpec | None = None) -> tuple[Any, Any, bool]:
    """The vectors as dups loaded them before: a float copy of the selected rows, packed at once."""
    matrix = load_matrix(catalog, feature_type)
    selected = np.sort(np.asarray(sample_ids(catalog, replace(spec or QuerySpec(), columns=("id",))), np.int64))
    rows = matrix.rows_of(selected)
    rows = rows[rows >= 0]
    floats = np.asarray(matrix.vectors[rows], dtype=np.float32)
    is_hash = bool(np.isin(matrix.vectors, (0.0, 1.0)).all())
    return matrix.ids[rows].astype(np.int64), pack_bits(floats) if is_hash else floats, is_hash


SPECS = [None, QuerySpec(status=("ok", "missing")), QuerySpec(labels=["b"]), QuerySpec(limit=50),
         QuerySpec(per_label=20, seed=1)]  # fmt: skip


@pytest.mark.filterwarnings("ignore::dlindex.DlindexWarning")
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("feature_type", [None, "dhash"])
@pytest.mark.parametrize("grouping", ["around-kept", "connected"])
def test_groups_equal_the_in_memory_search(
    near_db: Path | str,
    monkeypatch: pytest.MonkeyPatch,
    spec: QuerySpec | None,
    feature_type: str | None,
    grouping: str,
) -> None:
    with Catalog(near_db) as c:
        small_blocks(monkeypatch)
        for keep in ("largest", "first"):
            new = duplicate_groups(c, feature_type=feature_type, keep=keep, grouping=grouping, spec=spec)
            with monkeypatch.context() as m:
                m.setattr(groups_module, "_content_groups", old_content_groups)
                m.setattr(groups_module, "load_vectors", old_load_vectors)
                old = duplicate_groups(c, feature_type=feature_type, keep=keep, grouping=grouping, spec=spec)
            assert new == old
            assert len(new) > 2  # the data makes groups, so equality says something


def test_packed_hashes_equal_the_float_rows_packed(near_db: Path | str, monkeypatch: pytest.MonkeyPatch) -> None:
    with Catalog(near_db) as c:
        small_blocks(monkeypatch)
        ids, hashes, is_hash = load_vectors(c, "dhash", QuerySpec(labels=["a"]))
        old_ids, old_hashes, _ = old_load_vectors(c, "dhash", QuerySpec(labels=["a"]))
        assert is_hash and hashes.dtype == np.uint64
        assert ids.tolist() == old_ids.tolist() and hashes.tolist() == old_hashes.tolist()


def test_plain_hashes_by_popcount_equal_the_bits_counted_one_by_one(
    near_db: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # popcount (1 byte a hash) replaced np.unpackbits (64 bytes a hash: 634 MB at 10^7 hashes)
    rng = np.random.default_rng(3)
    hashes = np.concatenate([rng.integers(0, 2**63, 500, dtype=np.uint64) << np.uint64(1),
                             np.array([0, 1, 2**64 - 1, 0xFF, 0x1FF, 2**63], dtype=np.uint64),
                             np.uint64(1) << rng.integers(0, 64, 50).astype(np.uint64)])  # fmt: skip
    with Catalog(near_db) as c:
        imported = find_type(c, "dhash")
        assert imported is not None  # imported vectors: flat is dhash's 0 only for its own extractor
        monkeypatch.setattr("dlindex.quality.hashes.FLAT_HASH", {imported.extractor: 0})
        for k in (0, 1, 8, 9, 64):
            got = plain_hashes(c, "dhash", hashes, k)
            counted = np.array([bin(int(h)).count("1") <= k for h in hashes])
            assert got.tolist() == counted.tolist()


def test_the_matrix_is_written_a_batch_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vectors = np.random.default_rng(5).standard_normal((23, 5)).astype(np.float32)
    db, _ = catalog_with(tmp_path, vectors)
    small_blocks(monkeypatch)
    with Catalog(db) as c:
        matrix = load_matrix(c, "v")
        c.conn.execute("BEGIN")
        from dlindex.features.types import get_type

        ids, whole = read_all(c, get_type(c, "v"))
        c.conn.execute("COMMIT")
        assert matrix.ids.tolist() == ids.tolist()
        assert np.array_equal(matrix.vectors, whole)
        wide = whole.astype(np.float64)
        assert np.array_equal(matrix.norms, np.sqrt(np.einsum("ij,ij->i", wide, wide)))
        assert matrix_path(c, "v").exists()


@pytest.mark.parametrize("failure", ["full", "interrupt"])
def test_a_full_disk_while_writing_the_matrix_is_one_error_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    vectors = np.random.default_rng(6).standard_normal((30, 4)).astype(np.float32)
    db, _ = catalog_with(tmp_path, vectors)
    small_blocks(monkeypatch)
    calls = [0]
    real = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        calls[0] += 1
        if calls[0] == 5:  # the second batch
            if failure == "full":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise KeyboardInterrupt
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with Catalog(db) as c:
        folder = matrix_path(c, "v").parent
        with pytest.raises(DiskFullError if failure == "full" else KeyboardInterrupt) as raised:
            load_matrix(c, "v")
        if failure == "full":
            assert "\n" not in str(raised.value) and "disk full" in str(raised.value)
        assert list(folder.iterdir()) == []  # no temp file, no half-written matrix


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize("kind", ["gaussian", "ties"])
def test_similar_over_blocks_of_the_matrix_equals_brute_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metric: str, kind: str
) -> None:
    rng = np.random.default_rng(8)
    if kind == "gaussian":
        vectors = rng.standard_normal((90, 6)).astype(np.float32)
    else:  # sprite-like: many identical rows, equal distances everywhere, a zero vector
        vectors = rng.integers(0, 2, size=(90, 64)).astype(np.float32)
        vectors[::4] = vectors[1]
        vectors[7] = 0
    statuses = ["missing" if i % 9 == 0 else "ok" for i in range(90)]
    db, labels = catalog_with(tmp_path, vectors, statuses)
    ok = {i + 1 for i in range(90) if statuses[i] == "ok"}
    small_blocks(monkeypatch)
    queries = [2, 5, 8, 50, 90]
    with Catalog(db) as c:
        for k in (1, 7, 89, 200):
            got = [[(x.id, x.distance) for x in one] for one in nearest(c, queries, "v", k=k, metric=metric)]
            assert got == [brute_force(vectors, labels, q, k, metric, ok) for q in queries]
        hard = nearest(c, queries, "v", k=5, metric=metric, other_labels=True)
        assert [[(x.id, x.distance) for x in one] for one in hard] == [
            brute_force(vectors, labels, q, 5, metric, ok, other_labels=True) for q in queries
        ]


def test_dups_on_a_full_disk_is_one_line_and_exit_4(near_db: Path | str, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from .conftest import invoke

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    result = invoke(CliRunner(), "dups", "--type", "dhash", "--db", str(near_db))
    assert result.exit_code == 4, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "disk full" in lines[0], result.stderr
    with Catalog(near_db) as c:
        assert list(matrix_path(c, "dhash").parent.iterdir()) == []


def test_similar_holds_a_row_mask_not_every_selected_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog of many rows and few vectors: the selection and, with --other-labels, the
    (id, label) pairs are read a chunk at a time onto the matrix's rows, so the peak of the
    search does not grow with the catalog (before: every selected id and every pair at once)."""
    import tracemalloc

    from dlindex.features.matrix import _memo

    n, few = 40_000, 60
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((few, 8)).astype(np.float32)
    labels = [("a", "b", "c")[i % 3] for i in range(n)]
    db = make_catalog(tmp_path / "s.db", [Row(label) for label in labels])
    np.savez(tmp_path / "v.npz", ids=np.arange(1, few + 1), vectors=vectors)
    from dlindex.features import import_features

    with Catalog(db) as c:
        import_features(c, "v", tmp_path / "v.npz")
    monkeypatch.setattr("dlindex.features.neighbours._ID_CHUNK", 1000, raising=False)
    with Catalog(db, log=False) as c:
        load_matrix(c, "v")
        for matrix in _memo.values():
            matrix.masks.clear()
        spec = QuerySpec(labels=("a", "b"), cache=False)  # the query cache keeps <= 100k ids: bounded
        tracemalloc.start()
        try:
            found = nearest(c, [1, 2], "v", k=4, other_labels=True, spec=spec)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    ok = {i + 1 for i in range(few) if labels[i] != "c"}
    assert [[(x.id, x.distance) for x in one] for one in found] == [
        brute_force(vectors, labels[:few], q, 4, "cosine", ok, other_labels=True) for q in (1, 2)
    ]
    assert peak < n * 8, peak  # 8 bytes a catalog row: 320 KB (before: ~780 KB; now ~170 KB)


def test_exact_groups_wait_on_disk_not_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exact groups are sorted in a scratch database and read back a batch at a time, so the
    peak of the search does not grow with the number of groups (before: every group, its
    members and their sizes at once); the order and kept members stay duplicate_groups'."""
    import tracemalloc

    n = 12_000
    db = make_catalog(tmp_path / "x.db", [Row("a") for _ in range(n)])
    with raw(db) as conn:  # 4,000 groups of 2 or 3 copies, sizes so that keep=largest picks the middle
        conn.executemany(
            "UPDATE image_metadata SET xxh3_128 = ?, width = ?, bytes = ? WHERE id = ?",
            [(f"c{(i * 7919) % 4000}" if i % 3 else f"c{i % 4000}", 8 + i % 5, 100, i + 1) for i in range(n)],
        )
    monkeypatch.setattr(groups_module, "_GROUPS_PER_LOOKUP", 50)
    with Catalog(db, log=False) as c:
        whole = duplicate_groups(c, keep="largest")
        seen = [(g.ids, g.kept) for g in groups_module.iter_duplicate_groups(c, keep="largest")]
        tracemalloc.start()
        try:
            streamed = [g.kept for g in groups_module.iter_duplicate_groups(c, keep="largest")]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert seen == [(g.ids, g.kept) for g in whole] and len(whole) > 3000
    assert streamed == [g.kept for g in whole]
    assert peak < 500_000, peak  # the kept ids (~36 B a group) and a batch: ~0.2 MB; before: ~3 MB


def test_a_full_disk_under_the_exact_groups_sort_is_one_line_and_exit_4(
    near_db: Path | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from typer.testing import CliRunner

    from dlindex.quality import scratch

    from .conftest import invoke

    def full(conn: sqlite3.Connection, statement: str, rows: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(scratch, "insert_rows", full)
    monkeypatch.setattr(groups_module, "insert_rows", full)
    result = invoke(CliRunner(), "dups", "--db", str(near_db))
    assert result.exit_code == 4, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "disk full" in lines[0], result.stderr
    assert result.stdout == ""
