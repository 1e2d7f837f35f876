"""One meaning of label_id (the index in a class list), ImageFolder parity, pre-split trees."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlindex import Catalog, DlindexError, ScanOptions, query_rows
from dlindex.catalog.classes import SPLITS, canonical_splits, folder_split
from dlindex.cli import app
from dlindex.export import ExportOptions, export_catalog, load_index, manifest_files, manifest_rows, parse_split
from dlindex.export.plan import tree_split_choice
from dlindex.query.spec import QuerySpec

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, raw, where
from .conftest import make_png, rows, scan

pytestmark = ON_BOTH_BACKENDS

ONE = ScanOptions(workers=1)  # follows links by default, as ImageFolder does
# Code-point order differs from a case-blind or locale order: ImageFolder sorts str.
CLASS_NAMES = ("Zebra", "apple", "b", "Äpfel", "éclair", "日本", "z-last")


def query(db: Path, **spec: Any) -> list[dict[str, Any]]:
    spec.setdefault("columns", ("path", "label", "label_id", "split"))
    with Catalog(db) as catalog:
        return list(query_rows(catalog, QuerySpec(**spec)))


def class_tree(root: Path) -> Path:
    for k, name in enumerate(CLASS_NAMES):
        for i in range(2):
            make_png(root / name / f"{i}.png", color=(k, i, 0))
    make_png(root / "apple" / "nested" / "deep" / "2.png")  # nested: still class apple
    outside = root.parent / "elsewhere" / "linked"
    make_png(outside / "0.png")
    (root / "linked").symlink_to(outside, target_is_directory=True)  # ImageFolder follows it
    make_png(root / "loose.png")  # directly under ROOT: ImageFolder ignores it
    return root


def imagefolder(root: Path, **kwargs: Any) -> Any:
    datasets = pytest.importorskip("torchvision.datasets")
    return datasets.ImageFolder(str(root), **kwargs)


def test_class_to_idx_is_imagefolders_on_a_tree_of_class_folders(tmp_path: Path) -> None:
    root = class_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root)
    folder = imagefolder(root)
    found = query(db)
    mine = {r["label"]: r["label_id"] for r in found if r["label"] is not None}
    assert mine == folder.class_to_idx
    # every sample: ImageFolder's (path, target) pairs are dlindex's (path, label_id) pairs
    real = os.path.realpath(root)
    ours = {(os.path.relpath(r["path"], real), r["label_id"]) for r in found if r["label"] is not None}
    assert ours == {(os.path.relpath(p, str(root)), t) for p, t in folder.samples}


def test_files_directly_under_root_have_no_class_anywhere(tmp_path: Path) -> None:
    root = class_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root)
    loose = [r for r in query(db) if r["path"].endswith("/loose.png")]
    assert loose == [{"path": loose[0]["path"], "label": None, "label_id": None, "split": None}]
    with Catalog(db) as catalog:
        stats = catalog_stats(catalog)
    assert (stats.without_class, stats.classes) == (1, len(CLASS_NAMES) + 1)  # + linked
    out = tmp_path / "out"
    with Catalog(db) as catalog:
        summary = export_catalog(catalog, out, ExportOptions())
    index = load_index(out)
    assert summary.samples == len(query(db)) - 1  # ImageFolder leaves it out too
    assert index["classes"] == imagefolder(root).classes and index["class_list"] == "catalog"


def catalog_stats(catalog: Catalog) -> Any:
    from dlindex.stats import catalog_stats as stats

    return stats(catalog)


def test_documented_differences_from_imagefolder(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_png(root / "cat" / "0.png")
    make_png(root / ".ipynb_checkpoints" / "0.png")  # hidden: skipped (ImageFolder makes it class 0)
    (root / "empty").mkdir()  # no image: not a class (ImageFolder raises, or with allow_empty a class)
    (root / "gifs").mkdir()
    from PIL import Image

    Image.new("RGB", (8, 8)).save(root / "gifs" / "0.gif")  # GIF: a class here, not a file for ImageFolder
    db = where(tmp_path / "c.db")
    scan(db, root)
    with Catalog(db) as catalog:
        from dlindex.catalog.classes import catalog_classes

        assert catalog_classes(catalog) == ("cat", "gifs")
    assert imagefolder(root, allow_empty=True).classes == [".ipynb_checkpoints", "cat", "empty", "gifs"]
    with pytest.raises(FileNotFoundError):
        imagefolder(root)  # so ImageFolder never silently numbers this tree differently


def test_query_label_id_is_the_index_in_index_json_classes_and_the_loader_label(tmp_path: Path) -> None:
    from dlindex.loader import ManifestDataset

    root = class_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root)
    internal = dict(rows(db, "SELECT name, id FROM labels"))
    shown = {r["label"]: r["label_id"] for r in query(db) if r["label"]}
    assert set(shown) == set(internal) and set(shown.values()) == set(range(len(shown)))
    assert 0 not in internal.values()  # the row ids (from 1) are not what is shown
    for labels, classes in (((), "selected"), (("b", "apple", "日本"), "selected"), (("b", "apple"), "catalog")):
        out = tmp_path / f"out-{len(labels)}-{classes}"
        spec = QuerySpec(labels=labels, classes=classes, columns=("id", "label_id"))
        with Catalog(db) as catalog:
            export_catalog(catalog, out, ExportOptions(query=spec))
            by_id = {r["id"]: r["label_id"] for r in query_rows(catalog, spec) if r["label_id"] is not None}
        index = load_index(out)
        assert index["class_list"] == ("labels" if labels and classes == "selected" else "catalog")
        assert index["filters"]["classes"] == classes
        expected = sorted(labels) if index["class_list"] == "labels" else imagefolder(root).classes
        assert index["classes"] == expected
        assert index["labels"] == {str(k): n for k, n in enumerate(expected)}
        written = [row for name in manifest_files(index) for row in manifest_rows(out, name)]
        assert written and all(index["classes"][r["label_id"]] == r["label"] for r in written)
        assert {r["id"]: r["label_id"] for r in written} == by_id
        dataset = ManifestDataset(out, decode=False, catalog=db)
        assert dataset.classes == index["classes"]
        for i in range(len(dataset)):
            label = dataset[i][1]
            meta = dataset.metadata(i)
            assert meta is not None
            assert label == by_id[meta["id"]] == meta["label_id"]
            assert dataset.classes[label] == meta["label"]


def test_cli_query_label_id_and_classes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    root = class_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root)
    runner = CliRunner()
    result = runner.invoke(app, ["query", "--db", str(db), "-c", "label,label_id", "--label", "b", "--label", "apple"])
    assert result.exit_code == 0, result.output
    assert {(r["label"], r["label_id"]) for r in map(json.loads, result.stdout.splitlines())} == {
        ("apple", 0),
        ("b", 1),
    }
    result = runner.invoke(
        app, ["query", "--db", str(db), "-c", "label,label_id", "--label", "b", "--classes", "catalog"]
    )
    assert {r["label_id"] for r in map(json.loads, result.stdout.splitlines())} == {imagefolder(root).class_to_idx["b"]}
    result = runner.invoke(app, ["query", "--db", str(db), "--classes", "mine"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def presplit_tree(root: Path) -> Path:
    for split, classes in (("train", ("cat", "dog", "emu")), ("val", ("cat", "dog"))):
        for name in classes:
            for i in range(2):
                make_png(root / split / name / f"{i}.png", color=(len(name), i, len(split)))
    make_png(root / "train" / "loose.png")  # in a split folder, but no class
    return root


@pytest.mark.parametrize("options", [ONE, ScanOptions(workers=2)], ids=["one-unit", "units-cut-deeper"])
def test_presplit_tree_class_is_the_folder_under_the_split(tmp_path: Path, options: ScanOptions) -> None:
    root = presplit_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root, options)
    found = query(db)
    train = imagefolder(root / "train")
    assert {r["label"]: r["label_id"] for r in found if r["label"]} == train.class_to_idx
    assert {(r["split"], r["label"]) for r in found} == {
        ("train", "cat"),
        ("train", "dog"),
        ("train", "emu"),
        ("train", None),
        ("validation", "cat"),
        ("validation", "dog"),
    }
    # val's numbering is the catalog's (train's), which a lone ImageFolder(val) would not give for a missing class
    val = query(db, split="val")
    assert {r["split"] for r in val} == {"validation"} and len(val) == 4
    assert all(r["label_id"] == train.class_to_idx[r["label"]] for r in val)
    with Catalog(db) as catalog:
        assert catalog_stats(catalog).splits == {"train": 7, "validation": 4}


@pytest.mark.parametrize("workers", [1, 2], ids=["one-worker", "units-cut-deeper"])
def test_presplit_tree_of_links_keeps_splits_classes_and_one_row_per_file(tmp_path: Path, workers: int) -> None:
    # Split folders that are links, class folders that are links, and one folder reached
    # through two links: splits and classes come from the path through the link, each file once.
    store = presplit_tree(tmp_path / "store")
    elsewhere = tmp_path / "elsewhere" / "owl"
    for i in range(2):
        make_png(elsewhere / f"{i}.png", color=(i, 7, 7))
    root = tmp_path / "tree"
    root.mkdir()
    (root / "train").symlink_to(store / "train", target_is_directory=True)
    (root / "val").mkdir()
    for name in ("cat", "dog"):
        (root / "val" / name).symlink_to(store / "val" / name, target_is_directory=True)
    (store / "train" / "owl").symlink_to(elsewhere, target_is_directory=True)
    (root / "val" / "owl2").symlink_to(elsewhere, target_is_directory=True)  # the same files again
    db = where(tmp_path / "c.db")
    first = scan(db, root, ScanOptions(workers=workers))
    found = query(db)
    assert {(r["split"], r["label"]) for r in found} == {
        ("train", "cat"),
        ("train", "dog"),
        ("train", "emu"),
        ("train", "owl"),
        ("train", None),
        ("validation", "cat"),
        ("validation", "dog"),
    }
    paths = [r["path"] for r in found]
    assert len(paths) == len(set(paths)) == 13 and not any("owl2" in p for p in paths)
    assert first.skipped_by_reason.get("duplicate") and first.new == 13
    train = imagefolder(root / "train")
    assert {r["label"]: r["label_id"] for r in found if r["label"]} == train.class_to_idx
    with Catalog(db) as catalog:
        assert catalog.conn.execute("SELECT presplit FROM roots").fetchall() == [(1,)]
    again = scan(db, root, ScanOptions(workers=workers))
    assert (again.unchanged, again.new, again.changed, again.missing, again.relabeled) == (13, 0, 0, 0, 0)


def test_presplit_export_keeps_the_tree_splits(tmp_path: Path) -> None:
    root = presplit_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root)
    with Catalog(db) as catalog:
        summary = export_catalog(catalog, tmp_path / "auto", ExportOptions())  # default: the tree's splits
        assert summary.splits == {"train": 6, "validation": 4}
        export_catalog(catalog, tmp_path / "tree-wds", ExportOptions(format="wds", split="tree", shuffle=True, seed=3))
        only = export_catalog(catalog, tmp_path / "val", ExportOptions(split="val"))
        assert only.splits == {"validation": 4}
        hashed = export_catalog(catalog, tmp_path / "hash", ExportOptions(split="a=0.5,b=0.5"))
        assert sum(hashed.splits.values()) == 10 and set(hashed.splits) <= {"a", "b"}
    index = load_index(tmp_path / "auto")
    assert index["options"]["split"] == "tree" and index["classes"] == ["cat", "dog", "emu"]
    assert index["counts"]["splits"]["validation"]["labels"] == {"cat": 2, "dog": 2}
    assert load_index(tmp_path / "val")["filters"]["split"] == ["validation"]
    for name in manifest_files(index, "validation"):
        assert all("/val/" in "/" + r["path"] for r in manifest_rows(tmp_path / "auto", name))


def test_presplit_detection_can_be_turned_off_and_rescans_relabel(tmp_path: Path) -> None:
    root = presplit_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root, ScanOptions(workers=1, split_folders=False))
    assert {(r["label"], r["split"]) for r in query(db)} == {("train", None), ("val", None)}
    summary = scan(db, root)  # detection on: same files, new labels and splits, nothing re-read
    assert (summary.new, summary.changed, summary.relabeled) == (0, 0, 11)
    assert {r["label"] for r in query(db)} == {"cat", "dog", "emu", None}
    with Catalog(db) as catalog:
        from dlindex.catalog.classes import catalog_classes

        assert catalog_classes(catalog) == ("cat", "dog", "emu")  # "train", "val" have no files left


def test_a_tree_with_one_class_folder_among_split_folders_is_not_presplit(tmp_path: Path) -> None:
    root = presplit_tree(tmp_path / "tree")
    make_png(root / "zebra" / "0.png")
    db = where(tmp_path / "c.db")
    scan(db, root)
    assert {r["label"] for r in query(db)} == {"train", "val", "zebra"}
    assert imagefolder(root).class_to_idx == {"train": 0, "val": 1, "zebra": 2}


def test_export_refuses_to_mix_split_and_unsplit_trees(tmp_path: Path) -> None:
    root = presplit_tree(tmp_path / "tree")
    flat = tmp_path / "flat"
    make_png(flat / "cat" / "0.png")
    db = where(tmp_path / "c.db")
    scan(db, root)
    scan(db, flat)
    with Catalog(db) as catalog:
        with pytest.raises(DlindexError, match="not in a split folder"):
            export_catalog(catalog, tmp_path / "mixed", ExportOptions())
        with pytest.raises(DlindexError, match="not in a split folder"):
            export_catalog(catalog, tmp_path / "mixed", ExportOptions(split="tree"))
        assert export_catalog(catalog, tmp_path / "train", ExportOptions(split="train")).splits == {"train": 6}
        assert export_catalog(catalog, tmp_path / "all", ExportOptions(split="everything=1")).splits == {
            "everything": 11
        }
    assert not (tmp_path / "mixed").exists()


def test_old_catalog_rows_with_the_empty_label_lose_it_on_rescan(tmp_path: Path) -> None:
    root = class_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root)
    with raw(db) as conn:  # what dlindex before this change wrote for files directly under ROOT
        conn.execute("INSERT INTO labels (name) VALUES ('')")
        conn.execute(
            "UPDATE image_metadata SET label_id = (SELECT id FROM labels WHERE name = '') WHERE file_path = 'loose.png'"
        )
    assert [r["label_id"] for r in query(db) if r["label"] == ""] == [0]  # "" shifts every class
    assert scan(db, root).relabeled == 1
    assert not [r for r in query(db) if r["label"] == ""]
    assert {r["label"]: r["label_id"] for r in query(db) if r["label"]} == imagefolder(root).class_to_idx


@SQLITE_ONLY  # an old catalog file, migrated
def test_migration_makes_label_id_nullable_and_adds_split_keeping_everything(tmp_path: Path) -> None:
    from dlindex.catalog.sqlite.migrations import APPLICATION_ID, LATEST_VERSION, MIGRATIONS, m006_classes

    db = tmp_path / "v5.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    before = MIGRATIONS.index(m006_classes)
    for migration in MIGRATIONS[:before]:
        migration(conn)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {before}")
    conn.execute("INSERT INTO roots (path) VALUES ('/r')")
    conn.execute("INSERT INTO labels (name) VALUES ('a')")
    conn.execute("INSERT INTO image_metadata (root_id, file_path, label_id) VALUES (1, 'a/1.png', 1)")
    conn.execute("INSERT INTO feature_types (name, dim, extractor) VALUES ('f', 1, 'x')")
    conn.execute("INSERT INTO image_features (image_id, feature_type, vector) VALUES (1, 'f', x'0000803f')")
    conn.execute("CREATE INDEX user_made ON image_metadata (label_id)")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO image_metadata (root_id, file_path, label_id) VALUES (1, 'x.png', NULL)")
    reader = sqlite3.connect(db, isolation_level=None)  # open before the migration: must see the new schema
    assert reader.execute("SELECT count(*) FROM image_metadata").fetchone() == (1,)
    conn.close()

    with Catalog(db) as catalog:
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
        assert catalog.conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert catalog.conn.execute("SELECT count(*) FROM image_features").fetchone() == (1,)
        assert catalog.conn.execute("SELECT name FROM sqlite_master WHERE name = 'user_made'").fetchone()
        assert catalog.conn.execute("SELECT label_id, split FROM image_metadata").fetchall() == [(1, None)]
    reader.execute(
        "INSERT INTO image_metadata (root_id, file_path, label_id, split) VALUES (1, 'x.png', NULL, 'train')"
    )
    with pytest.raises(sqlite3.IntegrityError):  # the foreign key still holds
        reader.execute("PRAGMA foreign_keys = ON")
        reader.execute("INSERT INTO image_metadata (root_id, file_path, label_id) VALUES (1, 'y.png', 99)")
    reader.close()


# Folder names and the split Hugging Face `imagefolder` infers for a tree holding only that folder.
HF_NAMES = (
    "train", "training", "val", "valid", "validation", "dev", "test", "testing", "eval", "evaluation", "val2017",
    "train_2012", "imagenet-val", "my.test.set", "x_dev_y", "Training", "VAL", "interval", "trainer", "devices",
    "cat", "evaluation-2", "test 1", "retrain",
)  # fmt: skip


def test_split_folders_are_the_ones_hugging_face_datasets_recognises(tmp_path_factory: pytest.TempPathFactory) -> None:
    data_files = pytest.importorskip("datasets.data_files")
    base = tmp_path_factory.mktemp("hf")  # a base path without split keywords in it
    for name in HF_NAMES:
        root = base / f"n{HF_NAMES.index(name)}"
        (root / name / "x").mkdir(parents=True)
        (root / name / "x" / "1.png").write_bytes(b"")
        patterns = data_files.get_data_patterns(str(root))
        hf = None if patterns == {"train": ["**"]} else [str(k) for k in patterns]
        assert ([folder_split(name)] if folder_split(name) else None) == hf, name


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_split_option_text_is_parsed_or_refused(text: str) -> None:
    try:
        tree = tree_split_choice(text)
        if tree is None:
            fractions = parse_split(text)
            assert fractions and abs(sum(fractions.values()) - 1) < 1e-6
        else:
            assert set(tree) <= set(SPLITS)
    except DlindexError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=4))
def test_split_names_are_canonical_or_refused(names: list[str]) -> None:
    with contextlib.suppress(DlindexError):
        assert set(canonical_splits(names)) <= set(SPLITS)
    assert all(folder_split(n) in (None, *SPLITS) for n in names)


def test_cli_split_options(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    root = presplit_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    runner = CliRunner()
    result = runner.invoke(app, ["scan", str(root), "--db", str(db), "--no-split-folders", "-w", "1", "-q"])
    assert result.exit_code == 0, result.output
    assert {
        json.loads(line)["label"] for line in runner.invoke(app, ["query", "--db", str(db)]).stdout.splitlines()
    } == {"train", "val"}
    runner.invoke(app, ["scan", str(root), "--db", str(db), "-w", "1", "-q"])
    result = runner.invoke(app, ["query", "--db", str(db), "--split", "validation", "-c", "split,label"])
    assert {(r["split"], r["label"]) for r in map(json.loads, result.stdout.splitlines())} == {
        ("validation", "cat"),
        ("validation", "dog"),
    }
    result = runner.invoke(app, ["query", "--db", str(db), "--split", "holdout"])
    assert result.exit_code == 1 and result.stderr.startswith("Error: unknown split 'holdout'")
    result = runner.invoke(app, ["export", str(tmp_path / "out"), "--db", str(db), "--split", "val", "-q"])
    assert result.exit_code == 0, result.output
    assert load_index(tmp_path / "out")["classes"] == ["cat", "dog", "emu"]
    result = runner.invoke(app, ["export", str(tmp_path / "bad"), "--db", str(db), "--split", "holdout"])
    assert result.exit_code == 1 and "Error: --split 'holdout'" in result.stderr


def test_labels_no_file_has_leave_the_class_list(tmp_path: Path) -> None:
    import shutil

    from dlindex.catalog.classes import catalog_classes

    root = class_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    csv = tmp_path / "labels.csv"
    csv.write_text("path,label\nb/0.png,special\nb/1.png,special\n")
    scan(db, root, ScanOptions(workers=1, labels_file=csv))
    with Catalog(db) as catalog:
        assert "special" in catalog_classes(catalog) and "b" not in catalog_classes(catalog)
    scan(db, root)  # without the CSV: back to the folder label
    shutil.rmtree(root / "z-last")
    scan(db, root, ScanOptions(workers=1, prune=True))
    with Catalog(db) as catalog:
        assert list(catalog_classes(catalog)) == imagefolder(root).classes
    names = {n for (n,) in rows(db, "SELECT name FROM labels")}
    assert names == set(imagefolder(root).classes)  # the table holds exactly the class list


def test_presplit_flag_follows_the_last_scan(tmp_path: Path) -> None:
    from dlindex.catalog.classes import has_presplit_root

    root = presplit_tree(tmp_path / "tree")
    db = where(tmp_path / "c.db")
    scan(db, root)
    with Catalog(db) as catalog:
        assert has_presplit_root(catalog)
    scan(db, root, ScanOptions(workers=1, split_folders=False))
    with Catalog(db) as catalog:
        assert not has_presplit_root(catalog)
        assert export_catalog(catalog, tmp_path / "one", ExportOptions()).splits == {"train": 11}


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=200) | st.text(max_size=120).map(lambda t: ("path,label\n" + t).encode("utf-8", "surrogatepass"))
)
def test_labels_csv_is_read_or_refused(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    from dlindex.scan.labels import read_labels_file

    path = tmp_path_factory.mktemp("csv") / "labels.csv"
    path.write_bytes(data)
    try:
        parsed = read_labels_file(path)
    except DlindexError:
        return
    labels = parsed.labels or {}
    assert all(isinstance(k, str) and (v is None or (isinstance(v, str) and v)) for k, v in labels.items())
