"""A verdict that depends on --max-pixels is reconsidered when the limit changes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from PIL import Image

from dlindex import Catalog

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY
from .conftest import rows, scan

pytestmark = ON_BOTH_BACKENDS


def row(db: Path, path: str) -> tuple[object, ...]:
    return rows(db, "SELECT id, status, error, pixel_limit FROM image_metadata WHERE file_path = ?", (path,))[0]


def big_png(root: Path) -> Path:
    (root / "big").mkdir(parents=True)
    path = root / "big" / "3000.png"
    Image.new("L", (3000, 3000)).save(path)
    Image.new("L", (10, 10)).save(root / "big" / "small.png")
    return root


def test_a_large_image_filed_corrupt_under_a_low_limit_is_probed_again_under_a_higher_one(
    tmp_path: Path, db_path: Path
) -> None:
    root = big_png(tmp_path / "images")
    first = scan(db_path, root, max_pixels=1_000_000)
    row_id, status, error, limit = row(db_path, "big/3000.png")
    assert (status, limit) == ("corrupt", 1_000_000) and "exceeds limit" in str(error)
    assert scan(db_path, root, max_pixels=1_000_000).unchanged == first.seen  # same limit: nothing to do
    again = scan(db_path, root, max_pixels=10_000_000)
    assert (again.changed, again.unchanged) == (1, 1)
    assert row(db_path, "big/3000.png") == (row_id, "ok", None, None)
    lower = scan(db_path, root, max_pixels=1_000_000)  # and back: above twice the new limit
    assert (lower.changed, lower.corrupt) == (1, 1)
    assert row(db_path, "big/3000.png")[:2] == (row_id, "corrupt")


def test_verify_records_the_limit_it_did_not_decode_under(tmp_path: Path, db_path: Path) -> None:
    root = big_png(tmp_path / "images")
    scan(db_path, root, max_pixels=5_000_000, verify=True)
    _, status, _, limit = row(db_path, "big/3000.png")
    assert (status, limit) == ("ok", 5_000_000)
    assert "not decoded" in str(
        rows(db_path, "SELECT warning FROM image_metadata WHERE file_path = 'big/3000.png'")[0][0]
    )
    again = scan(db_path, root, max_pixels=10_000_000, verify=True)
    assert again.changed == 1
    assert rows(db_path, "SELECT warning, pixel_limit FROM image_metadata WHERE file_path = 'big/3000.png'")[0] == (
        None,
        None,
    )


@SQLITE_ONLY
def test_rows_judged_before_the_column_existed_are_probed_once(tmp_path: Path, db_path: Path) -> None:
    from dlindex.catalog.sqlite.migrations import APPLICATION_ID, MIGRATIONS, m008_pixel_limit

    root = big_png(tmp_path / "images")
    before = MIGRATIONS.index(m008_pixel_limit)
    conn = sqlite3.connect(db_path, isolation_level=None)
    for migration in MIGRATIONS[:before]:  # a catalog as the version before had it
        migration(conn)
    conn.execute("INSERT INTO roots (path) VALUES (?)", (str(root.resolve()),))
    conn.execute("INSERT INTO labels (name) VALUES ('big')")
    old_bomb = "DecompressionBombError: Image size (9000000 pixels) exceeds limit of 2000000 pixels, could be ..."
    for path, status, error in (("big/3000.png", "corrupt", old_bomb), ("big/small.png", "ok", None)):
        size, mtime_ns = (root / path).stat().st_size, (root / path).stat().st_mtime_ns
        conn.execute(
            "INSERT INTO image_metadata (root_id, file_path, label_id, bytes, mtime_ns, status, error) "
            "VALUES (1, ?, 1, ?, ?, ?, ?)", (path, size, mtime_ns, status, error),
        )  # fmt: skip
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {before}")
    conn.close()
    with Catalog(db_path) as catalog:
        assert catalog.conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert (row(db_path, "big/3000.png")[3], row(db_path, "big/small.png")[3]) == (0, None)
    again = scan(db_path, root, max_pixels=1_000_000)
    assert (again.changed, again.unchanged) == (1, 1)
    assert row(db_path, "big/3000.png")[1:4:2] == ("corrupt", 1_000_000)
    assert scan(db_path, root, max_pixels=1_000_000).unchanged == 2
