"""features compute keeps its own per-type state: what `mark` records is never overwritten."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlindex import Catalog, InputError, QuerySpec, mark_samples, sample_ids
from dlindex.catalog.sqlite.migrations import APPLICATION_ID, MIGRATIONS
from dlindex.cli import app
from dlindex.features import ComputeOptions, compute_features, import_features, list_feature_types, show_features

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY
from .conftest import compute, rows

pytestmark = ON_BOTH_BACKENDS


def marks(db: Path) -> dict[int, tuple[object, ...]]:
    got = rows(db, "SELECT id, processed, processing_status, error FROM image_metadata ORDER BY id")
    return {int(r[0]): r[1:] for r in got}  # type: ignore[call-overload]


def test_compute_leaves_what_mark_recorded_untouched(scanned_db: Path) -> None:
    with Catalog(scanned_db) as catalog:
        mark_samples(catalog, ["1"], processing_status="failed", error="annotator: blurry")
        mark_samples(catalog, ["2"], processed=True, processing_status="completed")
        mark_samples(catalog, ["3"], processing_status="queued")
        corrupt = sample_ids(catalog, status=["corrupt"])
    before = marks(scanned_db)
    summary = compute(scanned_db, "colorhist", QuerySpec(status=("ok", "corrupt")))
    assert (summary.computed, summary.failed) == (6, 1)
    assert marks(scanned_db) == before  # statuses, flags and error texts: all as the user set them
    assert before[1] == (0, "failed", "annotator: blurry")
    # compute's own state, per type
    assert rows(scanned_db, "SELECT image_id, feature_type, state FROM feature_state") == [
        (corrupt[0], "colorhist", "failed")
    ]
    # a second type, failing everywhere, still does not touch them
    compute(scanned_db, "thumb", QuerySpec(status=("corrupt",)), retry_failed=True)
    assert marks(scanned_db) == before
    with Catalog(scanned_db) as catalog:
        info = {i.name: (i.vectors, i.failed, i.queued) for i in list_feature_types(catalog)}
        shown = show_features(catalog, corrupt[0])
        marked = show_features(catalog, 1)
    assert info == {"colorhist": (6, 1, 0), "thumb": (0, 1, 0)}
    assert set(shown.failures) == {"colorhist", "thumb"} and shown.processing_status is None
    assert marked.processing_status == "failed" and marked.failures == {} and "colorhist" in marked.vectors


def test_retry_failed_and_a_new_vector_clear_compute_state_only(scanned_db: Path, tmp_path: Path) -> None:
    with Catalog(scanned_db) as catalog:
        corrupt = sample_ids(catalog, status=["corrupt"])[0]
        mark_samples(catalog, [str(corrupt)], processing_status="failed", error="user: ignore this one")
    compute(scanned_db, "colorhist", QuerySpec(status=("corrupt",)))
    again = compute(scanned_db, "colorhist", QuerySpec(status=("corrupt",)), retry_failed=True)
    assert again.failed == 1
    assert rows(scanned_db, "SELECT state FROM feature_state") == [("failed",)]
    assert rows(scanned_db, "SELECT processing_status, error FROM image_metadata WHERE id = ?", (corrupt,)) == [
        ("failed", "user: ignore this one")
    ]


def test_interrupted_run_leaves_queued_per_type(scanned_db: Path) -> None:
    calls = {"n": 0}

    def progress(n: int) -> None:
        calls["n"] += n
        raise KeyboardInterrupt

    with Catalog(scanned_db) as catalog, pytest.raises(Exception, match="interrupted"):
        compute_features(catalog, "colorhist", None, ComputeOptions(workers=1, batch_size=1), progress=progress)
    done = rows(scanned_db, "SELECT count(*) FROM image_features")[0][0]
    queued = rows(scanned_db, "SELECT count(*) FROM feature_state WHERE state = 'queued'")[0][0]
    assert done + queued == 6 and queued > 0  # type: ignore[operator]
    assert rows(scanned_db, "SELECT count(*) FROM image_metadata WHERE processing_status IS NOT NULL") == [(0,)]
    resumed = compute(scanned_db, "colorhist")
    assert resumed.computed == queued
    assert rows(scanned_db, "SELECT count(*) FROM feature_state") == [(0,)]


def test_new_content_and_drop_clear_the_state(scanned_db: Path, image_tree: Path) -> None:
    from dlindex import ScanOptions, scan_tree

    compute(scanned_db, "colorhist", QuerySpec(status=("corrupt",)))
    assert rows(scanned_db, "SELECT count(*) FROM feature_state") == [(1,)]
    (image_tree / "dog" / "broken.jpg").write_bytes(b"still not a jpeg, other bytes")
    with Catalog(scanned_db) as catalog:
        scan_tree(catalog, image_tree, ScanOptions(workers=1))
    assert rows(scanned_db, "SELECT count(*) FROM feature_state") == [(0,)]  # new content: try again
    compute(scanned_db, "colorhist", QuerySpec(status=("corrupt",)))
    runner = CliRunner()
    result = runner.invoke(app, ["features", "drop", "--type", "colorhist", "--json", "--db", str(scanned_db)])
    assert json.loads(result.stdout)["failed"] == 1
    assert rows(scanned_db, "SELECT count(*) FROM feature_state") == [(0,)]


def test_failures_command_lists_errors_and_queued(scanned_db: Path) -> None:
    compute(scanned_db, "colorhist", QuerySpec(status=("ok", "corrupt")))
    runner = CliRunner()
    result = runner.invoke(app, ["features", "failures", "--type", "colorhist", "--db", str(scanned_db)])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert row["state"] == "failed" and "UnidentifiedImageError" in row["error"]
    assert row["path"].endswith("dog/broken.jpg") and row["label"] == "dog"
    queued = runner.invoke(
        app, ["features", "failures", "-t", "colorhist", "--state", "queued", "--db", str(scanned_db)]
    )
    assert (queued.exit_code, queued.stdout) == (0, "")
    unknown = runner.invoke(app, ["features", "failures", "--type", "nope", "--db", str(scanned_db)])
    assert unknown.exit_code == 1 and unknown.stderr.startswith("Error: unknown feature type 'nope'")


def test_import_into_a_computed_type_is_refused(scanned_db: Path, tmp_path: Path) -> None:
    compute(scanned_db, "colorhist")
    np.savez(tmp_path / "v.npz", ids=np.array([1]), vectors=np.zeros((1, 96), np.float32))
    with Catalog(scanned_db) as catalog, pytest.raises(InputError, match="is computed by extractor 'colorhist'"):
        import_features(catalog, "colorhist", tmp_path / "v.npz")
    result = CliRunner().invoke(
        app, ["features", "import", "--type", "colorhist", str(tmp_path / "v.npz"), "--db", str(scanned_db)]
    )
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and "type of its own" in result.stderr
    assert rows(
        scanned_db, "SELECT count(*) FROM image_features WHERE vector = ?", (np.zeros(96, np.float32).tobytes(),)
    ) == [(0,)]


@SQLITE_ONLY
def test_migration_moves_failures_and_clears_only_what_compute_wrote(tmp_path: Path) -> None:
    db = tmp_path / "v5.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    at = MIGRATIONS.index(next(m for m in MIGRATIONS if m.__name__ == "m007_feature_state"))
    for migration in MIGRATIONS[:at]:
        migration(conn)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {at}")
    conn.execute("INSERT INTO roots (path) VALUES ('/r')")
    conn.execute("INSERT INTO labels (name) VALUES ('a')")
    samples = [  # (processing_status, error, status)
        ("failed", "OSError: broken data stream", "ok"),  # written by compute: a recorded failure
        ("failed", "user: wrong label", "ok"),  # written by mark
        ("completed", None, "ok"),  # either: kept
        ("queued", None, "ok"),  # either: kept
        ("failed", "UnidentifiedImageError: x", "corrupt"),  # compute on a corrupt row: keep its text
    ]
    for i, (ps, error, status) in enumerate(samples, start=1):
        conn.execute(
            "INSERT INTO image_metadata (root_id, file_path, label_id, processing_status, error, status, xxh3_128) "
            "VALUES (1, ?, 1, ?, ?, ?, 'h')",
            (f"a/{i}.png", ps, error, status),
        )
    conn.execute("INSERT INTO feature_types (name, dim, extractor) VALUES ('f', 1, 'colorhist')")
    conn.execute("INSERT INTO image_features (image_id, feature_type, vector) VALUES (3, 'f', x'0000803f')")
    for image_id, error in ((1, "OSError: broken data stream"), (2, "other error"), (5, "UnidentifiedImageError: x")):
        conn.execute(
            "INSERT INTO feature_failures (image_id, feature_type, error) VALUES (?, 'f', ?)", (image_id, error)
        )
    conn.close()

    with Catalog(db) as catalog:
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert marks(db) == {
        1: (0, None, None),
        2: (0, "failed", "user: wrong label"),
        3: (0, "completed", None),
        4: (0, "queued", None),
        5: (0, None, "UnidentifiedImageError: x"),
    }
    assert rows(db, "SELECT image_id, state, error FROM feature_state ORDER BY image_id") == [
        (1, "failed", "OSError: broken data stream"), (2, "failed", "other error"), (5, "failed", "UnidentifiedImageError: x"),
    ]  # fmt: skip
    assert rows(db, "SELECT name FROM sqlite_master WHERE name = 'feature_failures'") == []
    with sqlite3.connect(db) as plain:  # the new-content trigger now clears feature_state
        plain.execute("PRAGMA foreign_keys = ON")
        plain.execute("UPDATE image_metadata SET xxh3_128 = 'new' WHERE id IN (1, 3)")
    assert rows(db, "SELECT image_id FROM feature_state ORDER BY image_id") == [(2,), (5,)]
    assert rows(db, "SELECT count(*) FROM image_features") == [(0,)]


def test_mark_then_compute_through_the_cli(scanned_db: Path) -> None:
    runner = CliRunner()
    db = ["--db", str(scanned_db)]
    marked = runner.invoke(
        app, ["mark", "--processing-status", "failed", "--error", "labeller: occluded", "-", *db], input="2\n"
    )
    assert marked.exit_code == 0, marked.output
    computed = runner.invoke(
        app, ["features", "compute", "-t", "colorhist", "-w", "1", "--status", "ok", "--status", "corrupt", *db]
    )
    assert computed.exit_code == 0, computed.output
    query = runner.invoke(app, ["query", "--processing-status", "failed", "-c", "id,error", "--format", "jsonl", *db])
    assert [json.loads(line) for line in query.stdout.splitlines()] == [{"id": 2, "error": "labeller: occluded"}]
    failures = runner.invoke(app, ["features", "failures", "-t", "colorhist", "--format", "paths", *db])
    assert failures.stdout.strip().endswith("dog/broken.jpg")
