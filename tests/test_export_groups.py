"""``export --group near-dups`` and ``--group-by COLUMN``: groups kept whole, stable, near the fractions."""

from __future__ import annotations

import io
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from dlindex import Catalog, InputError, ScanOptions, scan_tree
from dlindex.cli import app
from dlindex.export import ExportError, load_index, manifest_rows
from dlindex.export.groups import merged_groups, value_point
from dlindex.export.plan import HASH, ID, ROW, split_of
from dlindex.exported.index import listed_shards
from dlindex.query.spec import QuerySpec
from dlindex.scan.labels import _parse

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, columns_added_after, drop_made_after, where
from .conftest import export, exported, rows

pytestmark = ON_BOTH_BACKENDS

PAIRS = 24
SPLIT = "train=0.5,val=0.5"


def picture(seed: int, size: int = 64) -> Image.Image:
    """A picture with structure (random blocks, smoothed by the resize) that dhash can tell apart."""
    rng = random.Random(seed)
    small = Image.new("L", (8, 8))
    small.putdata([rng.randrange(256) for _ in range(64)])
    return small.resize((size, size), Image.Resampling.BILINEAR).convert("RGB")


def pairs_tree(root: Path, start: int, stop: int) -> None:
    """Each picture as a PNG, plus a resized JPEG re-encoding of it: different bytes, one picture."""
    for i in range(start, stop):
        label = ("a", "b")[i % 2]
        (root / label).mkdir(parents=True, exist_ok=True)
        image = picture(i)
        image.save(root / label / f"{i:03d}.png")
        image.resize((48, 48)).save(root / label / f"{i:03d}-small.jpg", quality=80)


def scanned(tmp_path: Path, labels: Path | None = None, pairs: int = PAIRS) -> tuple[Path, Path]:
    root = tmp_path / "pics"
    pairs_tree(root, 0, pairs)
    db = where(tmp_path / "g.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1, labels_file=labels))
    return db, root


def splits(out: Path) -> dict[str, str]:
    """file path (relative) -> split, read from the export."""
    index = load_index(out)
    return {r["path"]: s["split"] for s in listed_shards(index) for r in manifest_rows(out, s["file"])}


def by_picture(found: dict[str, str]) -> dict[str, set[str]]:
    pictures: dict[str, set[str]] = {}
    for path, split in found.items():
        pictures.setdefault(path.split("/")[-1][:3], set()).add(split)
    return pictures


def test_near_duplicates_stay_in_one_split_only_with_group(tmp_path: Path) -> None:
    db, _ = scanned(tmp_path)
    export(db, tmp_path / "plain", split=SPLIT)
    plain = by_picture(splits(tmp_path / "plain"))
    # 24 pairs of different bytes at 50/50: by content hash alone, some pairs split for certain
    assert sum(1 for s in plain.values() if len(s) == 2) > 0
    notes: list[str] = []
    from dlindex.export import ExportOptions, export_catalog

    with Catalog(db) as catalog:
        export_catalog(catalog, tmp_path / "g", ExportOptions(split=SPLIT, group="near-dups"), note=notes.append)
    assert len(notes) == 1 and "dlindex features compute --type dhash --extractor dhash" in notes[0]
    with Catalog(db) as catalog:  # computed once: the next export says nothing
        export_catalog(catalog, tmp_path / "g2", ExportOptions(split=SPLIT, group="near-dups"), note=notes.append)
    assert len(notes) == 1
    grouped = by_picture(splits(tmp_path / "g"))
    assert len(grouped) == PAIRS and all(len(s) == 1 for s in grouped.values())
    group = load_index(tmp_path / "g")["options"]["group"]
    assert group == {"mode": "near-dups", "type": "dhash", "max_distance": 8, "threshold": None, "groups": PAIRS}
    counts = load_index(tmp_path / "g")["counts"]["splits"]
    assert sum(c["samples"] for c in counts.values()) == 2 * PAIRS


def test_an_embedding_group_type_records_the_threshold_it_used(tmp_path: Path) -> None:
    """index.json says what grouped the samples: an embedding's default threshold, not null."""
    from dlindex.export import ExportOptions, export_catalog
    from dlindex.features.pipeline import ComputeOptions, compute_features
    from dlindex.quality.duplicate_groups import DEFAULT_THRESHOLD

    db, _ = scanned(tmp_path)
    with Catalog(db) as catalog:
        compute_features(catalog, "colorthumb", options=ComputeOptions(extractor="colorthumb", workers=1))
        export_catalog(catalog, tmp_path / "g", ExportOptions(split=SPLIT, group="near-dups", group_type="colorthumb"))
        export_catalog(catalog, tmp_path / "t", ExportOptions(split=SPLIT, group="near-dups", group_type="colorthumb",
                                                               group_threshold=0.01))  # fmt: skip
        with pytest.raises(InputError, match="use --threshold"):
            export_catalog(catalog, tmp_path / "x", ExportOptions(split=SPLIT, group="near-dups",
                                                                   group_type="colorthumb", group_max_distance=3))  # fmt: skip
    group = load_index(tmp_path / "g")["options"]["group"]
    assert group == {"mode": "near-dups", "type": "colorthumb", "max_distance": None,
                     "threshold": DEFAULT_THRESHOLD, "groups": PAIRS}  # fmt: skip
    assert load_index(tmp_path / "t")["options"]["group"]["threshold"] == 0.01
    assert all(len(s) == 1 for s in by_picture(splits(tmp_path / "g")).values())


def test_group_export_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    db, _ = scanned(tmp_path, pairs=8)
    for name in ("a", "b"):
        export(db, tmp_path / name, format="jsonl", split=SPLIT, group="near-dups", shuffle=True, seed=3)
    for path in sorted((tmp_path / "a").iterdir()):
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name


def test_groups_are_stable_as_the_catalog_grows(tmp_path: Path) -> None:
    db, root = scanned(tmp_path)
    export(db, tmp_path / "e1", split=SPLIT, group="near-dups")
    before = splits(tmp_path / "e1")
    pairs_tree(root, PAIRS, PAIRS + 12)
    for i in range(0, 6):  # new copies of old pictures join their groups
        picture(i).resize((40, 40)).save(root / ("a", "b")[i % 2] / f"{i:03d}-tiny.jpg", quality=70)
    with Catalog(db) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    export(db, tmp_path / "e2", split=SPLIT, group="near-dups")
    after = splits(tmp_path / "e2")
    assert all(after[path] == split for path, split in before.items())
    assert all(len(s) == 1 for s in by_picture(after).values())


def test_a_singleton_keeps_its_split_without_group(tmp_path: Path) -> None:
    db, _ = scanned(tmp_path, pairs=6)
    extra = tmp_path / "pics" / "a" / "zz-alone.png"
    picture(999).save(extra)
    with Catalog(db) as catalog:
        scan_tree(catalog, tmp_path / "pics", ScanOptions(workers=1))
    export(db, tmp_path / "p", split=SPLIT)
    export(db, tmp_path / "g", split=SPLIT, group="near-dups")
    assert splits(tmp_path / "p")["a/zz-alone.png"] == splits(tmp_path / "g")["a/zz-alone.png"]


def test_group_by_a_labels_column(tmp_path: Path) -> None:
    labels = tmp_path / "labels.csv"
    lines = ["path,video"] + [f"{('a', 'b')[i % 2]}/{i:03d}.png,v{i % 5}" for i in range(PAIRS)]
    labels.write_text("\n".join(lines) + "\n", encoding="utf-8")
    db, _ = scanned(tmp_path, labels)
    stored = rows(db, "SELECT count(*), count(DISTINCT value) FROM sample_attributes")[0]
    assert stored == (PAIRS, 5)
    export(db, tmp_path / "g", split=SPLIT, group_by="video")
    found = splits(tmp_path / "g")
    videos: dict[str, set[str]] = {}
    for i in range(PAIRS):
        videos.setdefault(f"v{i % 5}", set()).add(found[f"{('a', 'b')[i % 2]}/{i:03d}.png"])
    assert all(len(s) == 1 for s in videos.values())
    assert load_index(tmp_path / "g")["options"]["group"] == {"mode": "column", "column": "video", "groups": 5}
    with pytest.raises(ExportError, match=r"^--group-by patient: no sample has that attribute; known: video$"):
        export(db, tmp_path / "bad", split=SPLIT, group_by="patient")
    with pytest.raises(
        ExportError, match=r"^--group-by vidoe: no sample has that attribute \(did you mean 'video'\?\)"
    ):
        export(db, tmp_path / "bad", split=SPLIT, group_by="vidoe")


def test_fractions_stay_close_with_realistic_groups() -> None:
    rng = random.Random(17)
    rows: list[tuple[Any, ...]] = []
    groups: list[list[int]] = []
    next_id = 1
    while next_id <= 4000:
        size = rng.choice((1, 1, 1, 1, 2, 2, 3, 4, 6))  # mostly singletons, some pairs, a few bursts
        members = list(range(next_id, next_id + size))
        next_id += size
        groups.append(members)
        for i in members:
            row: list[Any] = [None] * len(ROW)
            row[ID], row[HASH] = i, f"{rng.getrandbits(128):032x}"
            rows.append(tuple(row))
    hashes = {r[ID]: r for r in rows}
    from dlindex.export.plan import content_point

    points = {i: content_point(hashes[g[0]]) for g in groups for i in g}
    assign = split_of({"train": 0.8, "val": 0.1, "test": 0.1}, points)
    counts = {"train": 0, "val": 0, "test": 0}
    for row in rows:
        counts[assign(row)] += 1
    total = len(rows)
    assert abs(counts["train"] / total - 0.8) < 0.03 and abs(counts["val"] / total - 0.1) < 0.03
    assert abs(counts["test"] / total - 0.1) < 0.03, counts
    assert all(len({assign(hashes[i]) for i in g}) == 1 for g in groups)


def test_merged_groups_and_value_points() -> None:
    assert merged_groups([[1, 5], [5, 9], [2, 3], [7]]) == [[1, 5, 9], [2, 3], [7]]
    assert value_point("clip-1") == value_point("clip-1") != value_point("clip-2")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(group="near-dups"), r"^--group needs fractions to split by"),
        (dict(split="tree", group="near-dups"), r"^--group needs fractions to split by"),
        (dict(split=SPLIT, group="faces"), r"^--group 'faces': choose near-dups"),
        (dict(split=SPLIT, group="near-dups", group_by="video"), r"^give --group near-dups or --group-by"),
        (dict(split=SPLIT, group_by="1bad"), r"^--group-by: column '1bad' is not a name"),
        (dict(split=SPLIT, group_max_distance=3), r"^--group-max-distance tunes --group near-dups"),
        (dict(split=SPLIT, group="near-dups", group_max_distance=99), r"max"),
        (dict(split=SPLIT, group="near-dups", group_type="nosuch"), r"nosuch"),
    ],
)
def test_bad_group_options_are_one_line(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    db, _ = scanned(tmp_path, pairs=2)
    with pytest.raises(InputError, match=message) as caught:
        export(db, tmp_path / "o", **options)
    assert "\n" not in str(caught.value) and not (tmp_path / "o").exists()


def test_cli_group_without_fraction_split_is_a_usage_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    db, _ = scanned(tmp_path, pairs=2)
    result = CliRunner().invoke(app, ["export", str(tmp_path / "o"), "--group", "near-dups", "--db", str(db)])
    assert result.exit_code == 2 and "--split NAME=FRACTION" in result.output
    result = CliRunner().invoke(
        app, ["export", str(tmp_path / "o"), "--split", SPLIT, "--group-by", "nope", "--db", str(db)]
    )
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and "known: none" in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("path,video,video\na.png,1,2\n", "named twice"),
        ("path,vi deo\na.png,1\n", "is not a name"),
        ("path\na.png\n", "needs a header row"),
        ("label,video\ncat,1\n", "needs a header row"),
        ("path,video\na.png\n", "line 2: 1 field"),
        ("path,video\na.png," + "x" * 2000 + "\n", "longer than 1024"),
    ],
)
def test_bad_labels_files_are_one_line(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        _parse(io.StringIO(text), "l.csv")
    assert "\n" not in str(caught.value)


def test_labels_file_keeps_extra_columns() -> None:
    parsed = _parse(io.StringIO("path,label,video,patient\n/a.png,cat,v1,\nb.png,,v2,p7\n"), "l.csv")
    assert parsed.labels == {"a.png": "cat", "b.png": None} and parsed.columns == ("video", "patient")
    assert parsed.attributes == {"a.png": {"video": "v1", "patient": ""}, "b.png": {"video": "v2", "patient": "p7"}}
    assert _parse(io.StringIO("path,video\na.png,v1\n"), "l.csv").labels is None


_CELL = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=150, deadline=None)
@given(header=st.lists(_CELL, min_size=0, max_size=5), cells=st.lists(st.lists(_CELL, max_size=6), max_size=5))
def test_hostile_labels_files_parse_or_fail_in_one_line(header: list[str], cells: list[list[str]]) -> None:
    out = io.StringIO()
    import csv

    writer = csv.writer(out)
    writer.writerow(["path", *header])
    writer.writerows(cells)
    try:
        parsed = _parse(io.StringIO(out.getvalue()), "l.csv")
    except InputError as e:
        assert "\n" not in str(e)
        return
    for column in parsed.columns:
        assert column.isidentifier() and column.isascii() and column not in ("path", "label")
    assert all(set(values) == set(parsed.columns) for values in parsed.attributes.values())


@SQLITE_ONLY  # an old catalog file, migrated
def test_a_version_9_catalog_gains_sample_attributes(tmp_path: Path) -> None:
    from dlindex.catalog.sqlite.migrations import LATEST_VERSION

    db, _ = scanned(tmp_path, pairs=2)
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE sample_attributes")
    conn.execute("DROP TABLE shard_runs")  # schema 11's, made again on the way up
    drop_made_after(conn, 11)
    for table, column in columns_added_after(11):  # schema 12's and later, likewise
        conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 9")
    conn.commit()
    conn.close()
    labels = tmp_path / "l.csv"
    labels.write_text("path,video\na/000.png,v1\n", encoding="utf-8")
    with Catalog(db) as catalog:
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION >= 10
        scan_tree(catalog, tmp_path / "pics", ScanOptions(workers=1, labels_file=labels))
    assert rows(db, "SELECT name, value FROM sample_attributes") == [("video", "v1")]


def test_a_large_group_is_said_and_chains_stay_together(tmp_path: Path) -> None:
    """Connected groups: a chain of near copies (a~b~c, a and c further apart) is one group, so
    no near pair crosses the split; a group over 5% of the samples is named in one line."""
    root = tmp_path / "pics"
    pairs_tree(root, 0, 10)
    base = picture(100, 96)
    for n, size in enumerate((96, 90, 84, 78, 72, 66)):  # one picture at six sizes and crops
        base.crop((n, n, 96 - n, 96 - n)).resize((size, size)).save(root / "a" / f"chain{n}.png")
    db = where(tmp_path / "g.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    from dlindex.export import ExportOptions, export_catalog

    said: list[str] = []
    with Catalog(db) as catalog:
        export_catalog(catalog, tmp_path / "g", ExportOptions(split=SPLIT, group="near-dups"), warn=said.append)
    found = splits(tmp_path / "g")
    assert len({s for p, s in found.items() if "chain" in p}) == 1
    large = [line for line in said if line.startswith("the largest group holds")]
    assert len(large) == 1 and "of 26 samples" in large[0], said


def test_excluded_copies_still_hold_their_group_together(tmp_path: Path) -> None:
    """Groups come from every ok sample, excluded ones too: `mark --exclude` of one copy of
    each pair does not let `--excluded include --group near-dups` split the pairs, nor move
    the kept copy's split."""
    from dlindex.query.mark import mark_samples

    db, root = scanned(tmp_path)
    before = splits(exported(db, tmp_path / "before", split=SPLIT, group="near-dups"))
    small = [str(p) for p in sorted(root.rglob("*-small.jpg"))]
    with Catalog(db) as catalog:
        mark_samples(catalog, small, excluded=True, by="path")
    out = exported(db, tmp_path / "all", split=SPLIT, group="near-dups", query=QuerySpec(excluded=None))
    grouped = by_picture(splits(out))
    assert len(grouped) == PAIRS and all(len(s) == 1 for s in grouped.values())
    assert load_index(out)["options"]["group"]["groups"] == PAIRS
    kept = splits(exported(db, tmp_path / "kept", split=SPLIT, group="near-dups"))
    assert kept == {path: split for path, split in before.items() if "-small" not in path}


def test_hashes_computed_for_grouping_cover_excluded_samples(tmp_path: Path) -> None:
    """An export that computes dhash first computes it for excluded samples too, once."""
    from dlindex.export import ExportOptions, export_catalog
    from dlindex.query.mark import mark_samples

    db, root = scanned(tmp_path)
    with Catalog(db) as catalog:
        mark_samples(catalog, [str(p) for p in sorted(root.rglob("*-small.jpg"))], excluded=True, by="path")
    notes: list[str] = []
    options = ExportOptions(split=SPLIT, group="near-dups", query=QuerySpec(excluded=None))
    for out in ("one", "two"):
        with Catalog(db) as catalog:
            export_catalog(catalog, tmp_path / out, options, note=notes.append)
    assert len(notes) == 1 and f"for {2 * PAIRS} sample(s)" in notes[0]
    grouped = by_picture(splits(tmp_path / "two"))
    assert len(grouped) == PAIRS and all(len(s) == 1 for s in grouped.values())
