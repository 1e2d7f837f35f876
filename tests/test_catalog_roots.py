"""`dlindex roots`: list roots; record that a root's tree moved, without a rescan."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlindex import Catalog, InputError, ScanOptions, scan_tree
from dlindex.catalog.reachable import unreachable_roots
from dlindex.catalog.roots import list_roots, move_root
from dlindex.export import ExportOptions, export_catalog, verify_export

from .backends import ON_BOTH_BACKENDS, where
from .conftest import rows

pytestmark = ON_BOTH_BACKENDS


def test_move_a_root_then_scan_and_export_from_the_new_place(
    scanned_db: Path, image_tree: Path, tmp_path: Path
) -> None:
    ids_before = rows(scanned_db, "SELECT id, file_path FROM image_metadata ORDER BY id")
    new = tmp_path / "moved"
    shutil.copytree(image_tree, new, copy_function=shutil.copy2)  # like rsync -a: sizes and mtimes kept
    shutil.rmtree(image_tree)
    with Catalog(scanned_db) as catalog:
        assert [r.exists for r in list_roots(catalog)] == [False]
        changes = catalog.changes()
        moved = move_root(catalog, image_tree, new)
        assert moved.checked == 6 and moved.new == str(new)
        assert catalog.changes() > changes
        assert [(r.path, r.exists, r.ok) for r in list_roots(catalog)] == [(str(new), True, 6)]
        summary = scan_tree(catalog, new, ScanOptions(workers=1))
        assert (summary.new, summary.changed, summary.missing) == (0, 0, 0)
        # the copy gave every file a new inode and ctime: the move forgot them, so the scan read
        # no file again (it recorded the new identities from lstat)
        assert (summary.reread, summary.unchanged) == (0, summary.seen)
        assert rows(scanned_db, "SELECT count(*) FROM image_metadata WHERE inode IS NULL") == [(0,)]
        export_catalog(catalog, tmp_path / "w", ExportOptions(format="wds"))  # reads every source
        export_catalog(catalog, tmp_path / "j", ExportOptions(format="jsonl"))
    assert rows(scanned_db, "SELECT id, file_path FROM image_metadata ORDER BY id") == ids_before
    assert verify_export(tmp_path / "j").ok


def test_a_folder_without_the_files_is_refused(scanned_db: Path, image_tree: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    shutil.copytree(image_tree, other)
    (other / "cat" / "000.png").write_bytes(b"x")
    with Catalog(scanned_db) as catalog:
        with pytest.raises(InputError, match="is not there"):
            move_root(catalog, image_tree, empty)
        with pytest.raises(InputError, match="not the same tree"):
            move_root(catalog, image_tree, other)
        with pytest.raises(InputError, match="not a folder"):
            move_root(catalog, image_tree, tmp_path / "nowhere")
        with pytest.raises(InputError, match="not a root"):
            move_root(catalog, tmp_path / "elsewhere", other)
        assert [r.path for r in list_roots(catalog)] == [str(image_tree)]
        assert move_root(catalog, "1", empty, check=0).checked == 0  # by id, not checked


def test_another_roots_path_is_refused(tmp_path: Path) -> None:
    from .conftest import make_png

    db = where(tmp_path / "two.db")
    for name in ("one", "two"):
        make_png(tmp_path / name / "x" / "a.png")
        with Catalog(db, create=True) as catalog:
            scan_tree(catalog, tmp_path / name, ScanOptions(workers=1))
    with Catalog(db) as catalog, pytest.raises(InputError, match="already root"):
        move_root(catalog, tmp_path / "one", tmp_path / "two")


def test_a_moved_or_unmounted_root_is_noticed_and_manifests_refuse(
    scanned_db: Path, image_tree: Path, tmp_path: Path
) -> None:
    """stats warns, every manifest format refuses in one line and writes nothing; a packed
    export reads the files and finds none; once the root is back, all is well again."""
    from typer.testing import CliRunner

    from .conftest import invoke

    runner = CliRunner()
    with Catalog(scanned_db) as catalog:
        assert unreachable_roots(catalog.read) == []
    image_tree.rename(tmp_path / "away")
    for emptied in (False, True):  # the folder gone; then an empty folder in its place (a mount point)
        if emptied:
            image_tree.mkdir()
        with Catalog(scanned_db) as catalog:
            (problem,) = unreachable_roots(catalog.read)
        assert problem.startswith(f"root {image_tree.resolve()} ")
        assert ("holds none of 6 catalogued files" if emptied else "is missing (moved or unmounted?)") in problem
        stats = invoke(runner, "stats", "--db", str(scanned_db), "--json")
        assert stats.exit_code == 0 and stats.stderr == f"warning: {problem}\n"
        assert json.loads(stats.stdout)["root_problems"] == [problem]
        for fmt in ("jsonl", "csv", "parquet", "dali"):
            out = tmp_path / f"out-{fmt}"
            refused = invoke(runner, "export", str(out), "--format", fmt, "--db", str(scanned_db))
            assert refused.exit_code == 1 and refused.stderr == f"Error: {problem}; a {fmt} export names the " \
                "files there, so nothing was written\n", refused.output  # fmt: skip
            assert not out.exists()
    image_tree.rmdir()
    (tmp_path / "away").rename(image_tree)
    assert invoke(runner, "stats", "--db", str(scanned_db)).stderr == ""
    assert invoke(runner, "export", str(tmp_path / "out"), "--db", str(scanned_db)).exit_code == 0
