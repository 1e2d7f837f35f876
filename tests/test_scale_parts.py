"""Static parts (`--part I/N`) of scan and features compute, and `dlindex merge` of part catalogs (#18).

The reference is always the one-machine run on the same input: N parts merged must give the
same catalog (compared row by row by path, without ids and time stamps, which are local).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlindex.catalog.connection import Catalog
from dlindex.catalog.merge import merge_catalogs
from dlindex.cli import app
from dlindex.engines.parts import Part, balanced_parts, parse_part
from dlindex.errors import CatalogError, DlindexError, InputError
from dlindex.features.pipeline import ComputeOptions
from dlindex.scan.listing import WalkOptions, WalkReport
from dlindex.scan.options import ScanOptions
from dlindex.scan.units import part_units
from tests.conftest import compute, make_jpeg, make_png, scan

_SAMPLE = """SELECT r.path, i.file_path, i.file_path_bytes, l.name, i.width, i.height, i.format, i.mode, i.bytes,
    i.mtime_ns, i.xxh3_128, i.status, i.error, i.warning, i.processed, i.processing_status, i.split, i.pixel_limit
    FROM image_metadata i JOIN roots r ON r.id = i.root_id LEFT JOIN labels l ON l.id = i.label_id ORDER BY 1, 2"""
_VECTORS = """SELECT r.path, i.file_path, f.feature_type, f.vector FROM image_features f
    JOIN image_metadata i ON i.id = f.image_id JOIN roots r ON r.id = i.root_id ORDER BY 1, 2, 3"""
_STATES = """SELECT r.path, i.file_path, s.feature_type, s.state, s.error FROM feature_state s
    JOIN image_metadata i ON i.id = s.image_id JOIN roots r ON r.id = i.root_id ORDER BY 1, 2, 3"""


def content(db: Path) -> dict[str, list[Any]]:
    """Everything a catalog says about its samples, keyed by path (ids and time stamps left out)."""
    conn = sqlite3.connect(db)
    try:
        return {
            "samples": conn.execute(_SAMPLE).fetchall(),
            "roots": conn.execute("SELECT path, path_bytes, presplit FROM roots ORDER BY 1").fetchall(),
            "labels": conn.execute("SELECT name FROM labels ORDER BY 1").fetchall(),
            "types": conn.execute("SELECT name, dim, dtype, extractor FROM feature_types ORDER BY 1").fetchall(),
            "vectors": conn.execute(_VECTORS).fetchall(),
            "states": conn.execute(_STATES).fetchall(),
        }
    finally:
        conn.close()


def edit(db: Path, sql: str) -> None:
    """Change a catalog behind dlindex's back, as a damaged or hand-edited part would be."""
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(sql)
    conn.close()


def uneven_tree(root: Path) -> Path:
    """Classes of very different sizes, a nested folder, files directly under ROOT, odd names."""
    sizes = {"big": 90, "mid": 30, "small": 4, "tiny": 1, "caf\u00e9 x": 12}
    for label, n in sizes.items():
        for i in range(n):
            make_png(root / label / f"{i:03d}.png", (8 + i % 5, 8), (i % 255, 3 * i % 255, 7))
    for i in range(25):
        make_jpeg(root / "nested" / "deep" / f"{i:02d}.jpg", (16, 12), (i, 40, 80))
    make_png(root / "loose.png")
    (root / "big" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return root


def scan_in_parts(tmp_path: Path, root: Path, count: int, tag: str = "p", **fields: Any) -> list[Path]:
    parts = []
    for i in range(count):
        part = tmp_path / f"{tag}{i}.db"
        scan(part, root, part=Part(i, count), **fields)
        parts.append(part)
    return parts


@pytest.mark.parametrize("count", [1, 3])
def test_parts_merged_equal_the_one_machine_scan(tmp_path: Path, count: int) -> None:
    root = uneven_tree(tmp_path / "tree")
    scan(tmp_path / "full.db", root)
    parts = scan_in_parts(tmp_path, root, count)
    summary = merge_catalogs(parts, tmp_path / "merged.db")
    assert content(tmp_path / "merged.db") == content(tmp_path / "full.db")
    assert summary.samples_added == len(content(tmp_path / "full.db")["samples"]) > 150
    assert summary.jobs == [f"scan of {root}: {count} part(s)"]
    # every part did some of the work, and no file was scanned twice
    seen = [len(content(p)["samples"]) for p in parts]
    assert sum(seen) == summary.samples_added and all(seen)


def test_presplit_tree_keeps_its_splits(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for split, n in (("train", 20), ("val", 6)):
        for label in ("a", "b"):
            for i in range(n):
                make_png(root / split / label / f"{i}.png", (8, 8), (i, 0, 0))
    scan(tmp_path / "full.db", root)
    merge_catalogs(scan_in_parts(tmp_path, root, 4), tmp_path / "merged.db")
    merged = content(tmp_path / "merged.db")
    assert merged == content(tmp_path / "full.db")
    assert merged["roots"][0][2] == 1  # presplit, as the one-machine scan found


def test_rescan_in_parts_updates_the_catalog_in_place(tmp_path: Path) -> None:
    """Day two: each machine starts from a copy of the catalog; ids, vectors and flags survive."""
    root = uneven_tree(tmp_path / "tree")
    catalog = tmp_path / "catalog.db"
    merge_catalogs(scan_in_parts(tmp_path, root, 3), catalog)
    compute(catalog, "colorhist", extractor="colorhist")
    ids_before = dict(sqlite3.connect(catalog).execute("SELECT file_path, id FROM image_metadata").fetchall())
    (root / "mid" / "003.png").unlink()
    make_png(root / "mid" / "new.png", (9, 9), (1, 2, 3))
    make_png(root / "small" / "000.png", (20, 20), (200, 1, 1))  # new content: its vector goes stale
    reference = tmp_path / "reference.db"
    shutil.copy(catalog, reference)
    scan(reference, root)
    copies = []
    for i in range(3):
        copy = tmp_path / f"day2-{i}.db"
        shutil.copy(catalog, copy)
        scan(copy, root, part=Part(i, 3))
        copies.append(copy)
    summary = merge_catalogs(copies, catalog)
    assert content(catalog) == content(reference)
    assert summary.samples_added == 1 and summary.samples_updated == 2  # new.png; 000.png and the missing 003.png
    ids_after = dict(sqlite3.connect(catalog).execute("SELECT file_path, id FROM image_metadata").fetchall())
    assert all(ids_after[path] == i for path, i in ids_before.items())


@pytest.mark.parametrize("count", [1, 3])
def test_features_parts_merged_equal_one_compute(tmp_path: Path, count: int) -> None:
    root = uneven_tree(tmp_path / "tree")
    catalog = tmp_path / "catalog.db"
    scan(catalog, root)
    reference = tmp_path / "reference.db"
    shutil.copy(catalog, reference)
    compute(reference, "colorhist", extractor="colorhist")
    copies = []
    done = 0
    for i in range(count):
        copy = tmp_path / f"f{i}.db"
        shutil.copy(catalog, copy)
        done += compute(copy, "colorhist", extractor="colorhist", part=Part(i, count)).computed
        copies.append(copy)
    summary = merge_catalogs(copies, catalog)
    assert content(catalog) == content(reference)
    assert summary.vectors_written == done == len(content(reference)["vectors"]) > 150
    assert summary.jobs == [f"features compute of type colorhist: {count} part(s)"]


def test_scan_parts_are_balanced_by_files(tmp_path: Path) -> None:
    """Classes of 900, 300, 40 and 10 files: each of 4 parts within 10% of a quarter."""
    root = tmp_path / "tree"
    for label, n in (("a", 900), ("b", 300), ("c", 40), ("d", 10)):
        folder = root / label
        folder.mkdir(parents=True)
        for i in range(n):
            (folder / f"{i:04d}.png").write_bytes(b"x")
    options = WalkOptions(root=os.fsencode(root))
    plans = [part_units(os.fsencode(root), options, WalkReport(), i, 4) for i in range(4)]
    assert len({plan.digest for plan in plans}) == 1
    assert sum(plan.files for plan in plans) == plans[0].total == 1250
    for plan in plans:
        assert abs(plan.files - 1250 / 4) <= 0.10 * 1250 / 4


def test_balanced_parts_is_deterministic_and_even() -> None:
    weights = [256] * 7 + [100, 3, 1]
    assert balanced_parts(weights, 3) == balanced_parts(list(weights), 3)
    loads = [0, 0, 0]
    for w, p in zip(weights, balanced_parts(weights, 3), strict=True):
        loads[p] += w
    assert max(loads) - min(loads) <= 256


# --- bad input: one line, nothing written ----------------------------------------------------


@pytest.mark.parametrize("text", ["3/3", "1", "a/b", "-1/2", "0/0", "1/2/3", "", " 1 / ", "9999999/2"])
def test_bad_part_is_one_line_and_makes_no_catalog(tmp_path: Path, runner: CliRunner, text: str) -> None:
    root = uneven_tree(tmp_path / "tree")
    result = runner.invoke(app, ["scan", str(root), "--db", str(tmp_path / "c.db"), "--part", text])
    assert result.exit_code != 0
    assert result.output.count("\n") == 1 and "--part" in result.output
    assert not (tmp_path / "c.db").exists()


@given(st.text(max_size=20))
@settings(max_examples=300, deadline=None)
def test_parse_part_fuzz(text: str) -> None:
    try:
        part = parse_part(text)
    except InputError as e:
        assert "\n" not in str(e)
        return
    assert part is not None and 0 <= part.index < part.count <= 100_000


def test_prune_with_part_is_refused(tmp_path: Path, runner: CliRunner) -> None:
    root = uneven_tree(tmp_path / "tree")
    result = runner.invoke(app, ["scan", str(root), "--db", str(tmp_path / "c.db"), "--part", "0/2", "--prune"])
    assert result.exit_code == 1 and "--prune cannot go with --part" in result.output
    assert not (tmp_path / "c.db").exists()


# --- --shard I/N, the old name of --part: still works, says to use --part once -----------------

_OLD_NAME = "warning: --shard I/N is deprecated: write --part I/N (a shard is a file an export writes)\n"


@pytest.mark.parametrize("command", [["scan", "{root}"], ["features", "compute", "--type", "colorhist"]])
def test_shard_still_works_with_one_warning_line(tmp_path: Path, runner: CliRunner, command: list[str]) -> None:
    root = uneven_tree(tmp_path / "tree")
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    if command[0] == "features":
        for db in (old, new):
            scan(db, root)
    args = [a.format(root=root) for a in command]
    result = runner.invoke(app, [*args, "--db", str(old), "--shard", "1/2", "-q"])
    assert result.exit_code == 0, result.output
    assert result.stderr == _OLD_NAME
    result = runner.invoke(app, [*args, "--db", str(new), "--part", "1/2", "-q"])
    assert result.exit_code == 0 and result.stderr == ""
    assert content(old) == content(new)
    assert runner.invoke(app, [*args, "--help"]).output.count("--shard") == 0  # hidden


def test_export_shard_still_works_with_one_warning_line(tmp_path: Path, runner: CliRunner) -> None:
    root = uneven_tree(tmp_path / "tree")
    db = tmp_path / "c.db"
    scan(db, root)
    result = runner.invoke(app, ["export", str(tmp_path / "old"), "--shard", "0/2", "--db", str(db), "-q"])
    assert result.exit_code == 0, result.output
    assert result.stderr == _OLD_NAME
    result = runner.invoke(app, ["export", str(tmp_path / "new"), "--part", "0/2", "--db", str(db), "-q"])
    assert result.exit_code == 0 and result.stderr == ""
    old, new = (json.loads((tmp_path / name / "dlindex-part.json").read_bytes()) for name in ("old", "new"))
    assert old["shard"] == new["shard"] == "0/2" and old["written"] == new["written"]
    both = runner.invoke(app, ["export", str(tmp_path / "x"), "--part", "0/2", "--shard", "0/2", "--db", str(db)])
    assert both.exit_code == 2 and "give --part alone" in both.output


def test_shard_keyword_is_a_deprecated_name_of_part() -> None:
    with pytest.warns(DeprecationWarning, match=r"ScanOptions\(shard=\.\.\.\) is deprecated: write ScanOptions\(part="):
        options = ScanOptions(shard=Part(1, 2))
    assert options == ScanOptions(part=Part(1, 2)) and "shard" not in repr(options)
    with pytest.warns(DeprecationWarning, match=r"ComputeOptions\(shard="):
        assert ComputeOptions(shard=Part(0, 3)).part == Part(0, 3)
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="give part= alone"):
        ScanOptions(part=Part(0, 2), shard=Part(1, 2))


def _same_bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _refused(tmp_path: Path, parts: list[Path], into: Path, error: type[DlindexError], words: str) -> None:
    before = _same_bytes(into)
    existed = into.exists()
    with pytest.raises(error) as raised:
        merge_catalogs(parts, into)
    assert words in str(raised.value) and "\n" not in str(raised.value)
    assert into.exists() == existed and _same_bytes(into) == before


def test_missing_repeated_and_unfinished_parts(tmp_path: Path) -> None:
    root = uneven_tree(tmp_path / "tree")
    p0, p1, p2 = scan_in_parts(tmp_path, root, 3)
    into = tmp_path / "merged.db"
    _refused(tmp_path, [p0, p2], into, InputError, "part(s) 1/3 missing")
    _refused(tmp_path, [p0, p1, p2, p0], into, InputError, "given twice")
    copy = tmp_path / "copy-of-p1.db"
    shutil.copy(p1, copy)
    # a run of the same part at another time, in another file
    edit(copy, "UPDATE shard_runs SET started_at = datetime(started_at, '+1 hour')")
    _refused(tmp_path, [p0, p1, p2, copy], into, InputError, "part 1/3 is in both")
    edit(p2, "UPDATE shard_runs SET state = 'interrupted'")
    _refused(tmp_path, [p0, p1, p2], into, InputError, "part 2/3 in")
    scan(p2, root, part=Part(2, 3))  # finishing it is what the message says to do
    merge_catalogs([p0, p1, p2], into)


def test_parts_of_different_roots_or_cuts(tmp_path: Path) -> None:
    root = uneven_tree(tmp_path / "tree")
    other = uneven_tree(tmp_path / "other")
    a0, _ = scan_in_parts(tmp_path, root, 2, tag="a")
    _, b1 = scan_in_parts(tmp_path, other, 2, tag="b")
    into = tmp_path / "merged.db"
    _refused(tmp_path, [a0, b1], into, InputError, "missing")
    c0, c1, c2 = scan_in_parts(tmp_path, root, 3, tag="c")
    _refused(tmp_path, [a0, c1, c2], into, InputError, "different splits into N")
    for i in range(40):
        make_png(root / "grown" / f"{i}.png")
    d2 = tmp_path / "d2.db"
    scan(d2, root, part=Part(2, 3))  # the tree grew: this part was cut differently
    _refused(tmp_path, [c0, c1, d2], into, InputError, "cut differently")


def test_conflicting_rows_are_refused(tmp_path: Path) -> None:
    root = uneven_tree(tmp_path / "tree")
    (p0,) = scan_in_parts(tmp_path, root, 1)
    twin = tmp_path / "twin.db"
    shutil.copy(p0, twin)
    edit(twin, "UPDATE image_metadata SET width = 999 WHERE file_path = 'mid/002.png'")
    _refused(tmp_path, [p0, twin], tmp_path / "merged.db", InputError, "mid/002.png")


def test_foreign_damaged_and_other_version_parts(tmp_path: Path) -> None:
    root = uneven_tree(tmp_path / "tree")
    p0, p1 = scan_in_parts(tmp_path, root, 2)
    into = tmp_path / "merged.db"
    scan(into, uneven_tree(tmp_path / "elsewhere"))  # an existing catalog must come out unchanged
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    _refused(tmp_path, [p0, garbage], into, CatalogError, "garbage.db")
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    _refused(tmp_path, [p0, foreign], into, CatalogError, "not a dlindex catalog")
    older = tmp_path / "older.db"
    shutil.copy(p1, older)
    edit(older, "PRAGMA user_version = 9")
    _refused(tmp_path, [p0, older], into, CatalogError, "schema version 9")
    _refused(tmp_path, [p0, tmp_path / "absent.db"], into, InputError, "does not exist")
    _refused(tmp_path, [p0, p1], p0, InputError, "is the catalog merged into")


def test_wrong_size_vectors_in_a_part_are_refused(tmp_path: Path) -> None:
    root = uneven_tree(tmp_path / "tree")
    catalog = tmp_path / "catalog.db"
    scan(catalog, root)
    part = tmp_path / "part.db"
    shutil.copy(catalog, part)
    compute(part, "colorhist", extractor="colorhist", part=Part(0, 1))
    edit(part, "UPDATE image_features SET vector = x'00' WHERE rowid = (SELECT min(rowid) FROM image_features)")
    _refused(tmp_path, [part], catalog, InputError, "wrong size")


def test_cli_merge(tmp_path: Path, runner: CliRunner) -> None:
    root = uneven_tree(tmp_path / "tree")
    parts = []
    for i in range(2):
        part = tmp_path / f"p{i}.db"
        result = runner.invoke(app, ["scan", str(root), "--db", str(part), "--part", f"{i}/2", "-q"])
        assert result.exit_code == 0, result.output
        parts.append(str(part))
    result = runner.invoke(app, ["merge", *parts, "--into", str(tmp_path / "m.db")])
    assert result.exit_code == 0, result.output
    assert "merged 2 part(s)" in result.output and f"scan of {root}: 2 part(s)" in result.output
    result = runner.invoke(app, ["merge", parts[0], "--into", str(tmp_path / "m2.db")])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "1/2 missing" in result.output
    assert not (tmp_path / "m2.db").exists()
    with Catalog(tmp_path / "m.db") as catalog:
        assert catalog.conn.execute("SELECT count(*) FROM shard_runs").fetchone()[0] == 2


@pytest.mark.timeout(180)
def test_a_killed_part_is_redone_alone_and_merges_equal(tmp_path: Path) -> None:
    """kill -9 one part mid-scan: merge refuses it as unfinished; its rerun does only the rest."""
    import signal
    import subprocess
    import sys
    import time

    from PIL import Image

    root = tmp_path / "tree"
    image = Image.effect_noise((64, 64), 60).convert("RGB")  # noise: slow enough to verify that the kill lands
    for i in range(7500):
        folder = root / f"class{i % 6}"
        folder.mkdir(parents=True, exist_ok=True)
        image.putpixel((i % 64, (i // 64) % 64), (i % 256, 7, 7))
        image.save(folder / f"{i:05d}.png", compress_level=0)
    p0, _, p2 = scan_in_parts(tmp_path, root, 3)
    p1 = tmp_path / "killed.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlindex", "scan", str(root), "--db", str(p1), "--part", "1/3", "--workers", "1",
         "--verify"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    written = 0
    while not written and time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = sqlite3.connect(f"file:{p1}?mode=ro", uri=True, timeout=5)
            written = conn.execute("SELECT count(*) FROM image_metadata").fetchone()[0]
            conn.close()
        except sqlite3.Error:
            pass
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert written, "the kill should land mid-scan"
    _refused(tmp_path, [p0, p1, p2], tmp_path / "merged.db", InputError, "did not finish (running)")
    redone = scan(p1, root, part=Part(1, 3))
    assert redone.unchanged >= written and redone.new == redone.seen - redone.unchanged
    scan(tmp_path / "full.db", root)
    merge_catalogs([p0, p1, p2], tmp_path / "merged.db")
    assert content(tmp_path / "merged.db") == content(tmp_path / "full.db")


def test_merge_against_the_cut_keeps_what_the_catalog_changed_after_it(tmp_path: Path) -> None:
    """scan --engine ray's parts start as copies of the catalog (the cut): a mark, or a vector
    removed, after the cut must survive the merge, and a part's change to a sample changed
    after the cut loses to the later change (#32)."""
    root = uneven_tree(tmp_path / "tree")
    catalog = tmp_path / "catalog.db"
    scan(catalog, root)
    compute(catalog, "colorhist", extractor="colorhist")
    cut = tmp_path / "cut.db"
    shutil.copy(catalog, cut)
    make_png(root / "mid" / "new.png", (9, 9), (1, 2, 3))
    make_png(root / "small" / "000.png", (20, 20), (200, 1, 1))
    parts = []
    for i in range(2):
        parts.append(tmp_path / f"part-{i}.db")
        shutil.copy(cut, parts[-1])
        scan(parts[-1], root, part=Part(i, 2))
    # meanwhile, in the catalog: every sample marked, the vectors of class "big" removed
    edit(catalog, "UPDATE image_metadata SET processed = 1")
    edit(catalog, "DELETE FROM image_features WHERE image_id IN (SELECT id FROM image_metadata WHERE label_id = "
         "(SELECT id FROM labels WHERE name = 'big'))")  # fmt: skip
    vectors = len(content(catalog)["vectors"])
    summary = merge_catalogs(parts, catalog, cut=cut)
    marked = sqlite3.connect(catalog).execute("SELECT file_path, processed FROM image_metadata").fetchall()
    assert {path for path, flag in marked if not flag} == {os.path.join("mid", "new.png")}  # the part's new row
    assert (summary.samples_added, summary.samples_updated, summary.samples_kept_newer) == (1, 0, 1)
    assert len(content(catalog)["vectors"]) == vectors  # the removed vectors stay removed
    # the sample changed after the cut keeps the catalog's row; a plain rescan then sees the new file
    assert scan(catalog, root).changed == 1
