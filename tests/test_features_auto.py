"""features auto: the catalog queues every new or changed ok sample for an automatic type,
whoever writes the row, and `features compute --queued` computes exactly the queue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlindex import Catalog, InputError, ScanOptions, scan_tree
from dlindex.cli import app
from dlindex.features import ComputeOptions, compute_features, compute_queued, list_feature_types, set_auto

from .backends import ON_BOTH_BACKENDS, raw
from .conftest import compute, make_png, rows

pytestmark = ON_BOTH_BACKENDS


def queued(db: Path, name: str) -> list[str]:
    sql = (
        "SELECT m.file_path FROM feature_state s JOIN image_metadata m ON m.id = s.image_id "
        "WHERE s.feature_type = ? AND s.state = 'queued' ORDER BY m.file_path"
    )
    return [str(r[0]) for r in rows(db, sql, (name,))]


def rescan(db: Path, root: Path) -> None:
    with Catalog(db) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))


def test_new_samples_are_queued_and_computed_from_the_queue(scanned_db: Path, image_tree: Path) -> None:
    compute(scanned_db, "dhash")
    with Catalog(scanned_db) as catalog:
        assert set_auto(catalog, "dhash").auto
    make_png(image_tree / "cat" / "new.png", (20, 20), (0, 200, 0))
    make_png(image_tree / "bird" / "one.png", (21, 20), (0, 0, 200))
    (image_tree / "bird" / "bad.png").write_bytes(b"not a png")  # corrupt: never queued
    rescan(scanned_db, image_tree)
    assert queued(scanned_db, "dhash") == ["bird/one.png", "cat/new.png"]
    summary = compute(scanned_db, "dhash", queued=True)
    assert (summary.selected, summary.computed, summary.already_done) == (2, 2, 0)
    assert queued(scanned_db, "dhash") == []
    assert rows(scanned_db, "SELECT count(*) FROM image_features WHERE feature_type = 'dhash'") == [(8,)]
    assert compute(scanned_db, "dhash", queued=True).selected == 0


def test_new_content_is_queued_again_and_its_old_vector_dropped(scanned_db: Path, image_tree: Path) -> None:
    compute(scanned_db, "dhash")
    with Catalog(scanned_db) as catalog:
        set_auto(catalog, "dhash")
    make_png(image_tree / "dog" / "001.png", (30, 30), (250, 250, 0))  # same name, new pixels
    rescan(scanned_db, image_tree)
    assert queued(scanned_db, "dhash") == ["dog/001.png"]
    assert rows(scanned_db, "SELECT count(*) FROM image_features WHERE feature_type = 'dhash'") == [(5,)]
    assert compute(scanned_db, "dhash", queued=True).computed == 1


def test_only_automatic_types_are_queued_and_off_stops_it(scanned_db: Path, image_tree: Path) -> None:
    compute(scanned_db, "dhash")
    compute(scanned_db, "colorhist")
    with Catalog(scanned_db) as catalog:
        set_auto(catalog, "dhash")
    make_png(image_tree / "cat" / "a.png", (20, 20), (0, 90, 0))
    rescan(scanned_db, image_tree)
    assert (queued(scanned_db, "dhash"), queued(scanned_db, "colorhist")) == (["cat/a.png"], [])
    with Catalog(scanned_db) as catalog:
        assert not set_auto(catalog, "dhash", on=False).auto
        assert [t.auto for t in list_feature_types(catalog)] == [False, False]
    make_png(image_tree / "cat" / "b.png", (22, 20), (0, 90, 9))
    rescan(scanned_db, image_tree)
    assert queued(scanned_db, "dhash") == ["cat/a.png"]  # what was queued stays queued
    with Catalog(scanned_db) as catalog:
        assert compute_queued(catalog, ComputeOptions(workers=1)) == []  # no automatic type left


def test_compute_queued_runs_every_automatic_type(scanned_db: Path, image_tree: Path) -> None:
    for name in ("dhash", "thumb"):
        compute(scanned_db, name)
        with Catalog(scanned_db) as catalog:
            set_auto(catalog, name)
    make_png(image_tree / "dog" / "z.png", (20, 20), (9, 9, 9))
    rescan(scanned_db, image_tree)
    with Catalog(scanned_db) as catalog:
        summaries = compute_queued(catalog, ComputeOptions(workers=1))
    assert [(s.feature_type, s.computed) for s in summaries] == [("dhash", 1), ("thumb", 1)]


def test_an_excluded_queued_sample_waits(scanned_db: Path, image_tree: Path) -> None:
    compute(scanned_db, "dhash")
    with Catalog(scanned_db) as catalog:
        set_auto(catalog, "dhash")
    make_png(image_tree / "cat" / "x.png", (20, 20), (1, 2, 3))
    rescan(scanned_db, image_tree)
    with raw(scanned_db) as conn:
        conn.execute("UPDATE image_metadata SET excluded = 1 WHERE file_path = 'cat/x.png'")
    assert compute(scanned_db, "dhash", queued=True).selected == 0
    assert queued(scanned_db, "dhash") == ["cat/x.png"]


def test_bad_uses_are_one_clear_error(scanned_db: Path, tmp_path: Path) -> None:
    from dlindex import QuerySpec

    with Catalog(scanned_db) as catalog:
        with pytest.raises(InputError, match="unknown feature type 'nope'"):
            set_auto(catalog, "nope")
        with pytest.raises(InputError, match="unknown feature type 'nope'"):
            compute_features(catalog, "nope", None, ComputeOptions(queued=True))
    compute(scanned_db, "dhash")
    with Catalog(scanned_db) as catalog, pytest.raises(InputError, match="give no filters"):
        compute_features(catalog, "dhash", QuerySpec(labels=["cat"]), ComputeOptions(queued=True))
    np = pytest.importorskip("numpy")
    vectors = tmp_path / "v.npz"
    np.savez(vectors, ids=np.array([1, 2]), vectors=np.ones((2, 3), dtype=np.float32))
    with Catalog(scanned_db) as catalog:
        from dlindex.features import import_features

        import_features(catalog, "emb", vectors)
        with pytest.raises(InputError, match="was imported"):
            set_auto(catalog, "emb")


def test_cli_auto_and_queued(scanned_db: Path, image_tree: Path, runner: CliRunner) -> None:
    db = ["--db", str(scanned_db)]
    compute(scanned_db, "dhash")
    result = runner.invoke(app, ["features", "auto", "--type", "dhash", *db])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "dhash: automatic: new and changed samples are queued"
    make_png(image_tree / "cat" / "q.png", (20, 20), (5, 50, 5))
    rescan(scanned_db, image_tree)
    listed = runner.invoke(app, ["features", "list", "--format", "jsonl", *db])
    (line,) = [json.loads(x) for x in listed.stdout.splitlines()]
    assert (line["auto"], line["queued"]) == (True, 1)
    ran = runner.invoke(app, ["features", "compute", "--queued", "--json", *db])
    assert ran.exit_code == 0, ran.output
    assert [(s["feature_type"], s["computed"]) for s in json.loads(ran.stdout)] == [("dhash", 1)]
    refused = runner.invoke(app, ["features", "compute", "--queued", "--label", "cat", *db])
    assert refused.exit_code == 2 and "give no filters with it" in refused.stderr
    no_type = runner.invoke(app, ["features", "compute", *db])
    assert no_type.exit_code == 2 and "give --type NAME" in no_type.stderr


def test_a_builtin_type_is_automatic_before_the_first_scan(tmp_path: Path, image_tree: Path) -> None:
    from .backends import where

    db = where(tmp_path / "fresh.db")
    Catalog(db, create=True).close()
    with Catalog(db) as catalog:
        assert set_auto(catalog, "dhash").auto  # no compute first: the built-in's type is made here
    with Catalog(db) as catalog:
        scan_tree(catalog, image_tree, ScanOptions(workers=1))
    assert len(queued(db, "dhash")) == 6  # every ok file of the first scan
    assert compute(db, "dhash", queued=True).computed == 6
