"""EXIF orientation: stored pixels by default everywhere (scan sizes, filters, loader, thumbnails),
the turned image on request (`exif_orient`), read from the bytes as Pillow's exif_transpose reads it."""

from __future__ import annotations

import base64
import io
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps, PngImagePlugin

from dlindex import Catalog, QuerySpec, ScanOptions, query_rows, scan_tree
from dlindex.loader.decode import ImageSpec, decode_image
from dlindex.orientation import apply_orientation, pillow_orientation, read_orientation, sniff_orientation
from dlindex.quality.thumbnails import make_thumbnail

from .backends import ON_BOTH_BACKENDS, SQLITE_ONLY, raw, schema_before, where
from .conftest import CORPUS

W, H = 40, 30  # stored: landscape; orientations 5-8 show it 30 wide and 40 high


def pixels(width: int = W, height: int = H) -> Image.Image:
    """A picture whose every row and column differ, so any turn or flip shows."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x * y) % 256], axis=2).astype(np.uint8)
    return Image.fromarray(rgb, "RGB")


def save(path: Path, orientation: int | None, fmt: str = "JPEG") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
        exif[0x010F] = "Canon"  # a camera's IFD0 holds more than the orientation
    pixels().save(path, fmt, exif=exif.tobytes(), **({"quality": 95} if fmt == "JPEG" else {}))
    return path


def turned(path: Path) -> np.ndarray:
    return np.asarray(ImageOps.exif_transpose(Image.open(path).convert("RGB")))


def stored(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))  # as torchvision's ImageFolder loads it


@pytest.mark.parametrize("orientation", range(1, 9))
def test_pixels_are_turned_as_exif_transpose_turns_them(tmp_path: Path, orientation: int) -> None:
    for fmt in ("JPEG", "PNG", "WEBP"):  # simplejpeg's path, and Pillow's
        path = save(tmp_path / f"o.{fmt.lower()}", orientation, fmt)
        data = path.read_bytes()
        assert read_orientation(data) == orientation
        want = turned(path)
        assert np.array_equal(apply_orientation(stored(path), orientation), want)
        assert np.array_equal(decode_image(data, ImageSpec(exif_orient=True)), want), fmt
        assert np.array_equal(decode_image(data, ImageSpec()), stored(path)), fmt
        small = decode_image(data, ImageSpec(size=(12, 9), exif_orient=True))  # a reduced decode, then the resize
        assert small.shape[:2] == (12, 9)  # the turned image's size
        like = np.asarray(Image.fromarray(want).resize((9, 12), Image.Resampling.BILINEAR), dtype=np.int16)
        assert np.abs(small.astype(np.int16) - like).mean() < 12, fmt


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus is not present")
def test_the_orientation_read_is_pillows_on_its_own_test_images() -> None:
    checked = turned_ones = 0
    for path in sorted(CORPUS.iterdir()):
        if "orientation" not in path.name or path.suffix == ".png":  # PNG: EXIF after IDAT is not read
            continue
        with Image.open(path) as image:
            image.load()
            want = image.getexif().get(0x0112, 1)  # what exif_transpose applies (TIFF: Pillow did already)
        assert read_orientation(path.read_bytes()) == want, path.name
        checked += 1
        turned_ones += want != 1
    assert checked >= 20 and turned_ones >= 14


@ON_BOTH_BACKENDS
def test_scan_records_stored_sizes_with_the_orientation_and_filters_choose_the_sides(tmp_path: Path) -> None:
    root = tmp_path / "photos"
    save(root / "portrait" / "six.jpg", 6)
    save(root / "portrait" / "eight.png", 8, "PNG")
    save(root / "landscape" / "plain.jpg", None)
    db = where(tmp_path / "c.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    with raw(db) as conn:
        rows = dict(
            (r[0], tuple(r[1:]))
            for r in conn.execute("SELECT file_path, width, height, orientation FROM image_metadata")
        )
    assert rows == {"portrait/six.jpg": (W, H, 6), "portrait/eight.png": (W, H, 8), "landscape/plain.jpg": (W, H, 1)}
    with Catalog(db) as catalog:
        assert [r["file_path"] for r in query_rows(catalog, QuerySpec(min_height=W, columns="file_path"))] == []
        upright = QuerySpec(min_height=W, exif_orient=True, columns="file_path,orientation", order="id")
        assert sorted(r["file_path"] for r in query_rows(catalog, upright)) == [
            "portrait/eight.png",
            "portrait/six.jpg",
        ]


@ON_BOTH_BACKENDS
def test_the_loader_gives_stored_pixels_or_the_turned_image(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from dlindex.torch import DataLoader

    root = tmp_path / "photos"
    files = {"portrait/six.jpg": save(root / "portrait" / "six.jpg", 6),
             "portrait/seven.png": save(root / "portrait" / "seven.png", 7, "PNG"),
             "landscape/plain.jpg": save(root / "landscape" / "plain.jpg", None)}  # fmt: skip
    db = where(tmp_path / "c.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
        paths = {r["id"]: r["file_path"] for r in query_rows(catalog, QuerySpec(columns="id,file_path"))}
    for exif_orient, want in ((False, stored), (True, turned)):
        loader = DataLoader(database_path=db, batch_size=1, num_workers=2, exif_orient=exif_orient)
        for batch in loader:
            path = files[paths[int(batch["id"][0])]]
            assert np.array_equal(batch["image"][0].numpy().transpose(1, 2, 0), want(path)), (path, exif_orient)
    tall = DataLoader(database_path=db, batch_size=2, image_size=(W, H), exif_orient=True, min_height=W)
    assert sorted(paths[int(i)] for b in tall for i in b["id"]) == ["portrait/seven.png", "portrait/six.jpg"]


def test_thumbnails_show_the_stored_pixels(tmp_path: Path) -> None:
    thumb = make_thumbnail(str(save(tmp_path / "six.jpg", 6)), 20)
    assert (thumb.width, thumb.height) == (20, 15)  # as width x height in the catalog, and the loader by default
    assert thumb.uri is not None
    preview = Image.open(io.BytesIO(base64.b64decode(thumb.uri.split(",", 1)[1])))
    assert preview.size == (20, 15)


@ON_BOTH_BACKENDS
@SQLITE_ONLY
def test_rows_scanned_before_the_column_have_no_orientation_until_probed_again(tmp_path: Path) -> None:
    from dlindex.catalog.sqlite.migrations import APPLICATION_ID, MIGRATIONS, m013_orientation

    root = tmp_path / "photos"
    save(root / "p" / "six.jpg", 6)
    db = tmp_path / "c.db"
    before = MIGRATIONS.index(m013_orientation)
    conn = sqlite3.connect(db, isolation_level=None)
    for migration in MIGRATIONS[:before]:
        migration(conn)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {before}")
    conn.close()
    with Catalog(db) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
    with raw(db) as conn:
        assert conn.execute("SELECT orientation FROM image_metadata").fetchone()[0] == 6
        conn.execute("UPDATE image_metadata SET orientation = NULL")  # as the migration leaves old rows
    with Catalog(db) as catalog:
        assert [r["orientation"] for r in query_rows(catalog, QuerySpec(columns="orientation"))] == [None]
        scan_tree(catalog, root, ScanOptions(workers=1, force=True))
        assert [r["orientation"] for r in query_rows(catalog, QuerySpec(columns="orientation"))] == [6]


def test_a_postgresql_catalog_of_the_version_before_gets_the_column(pg_url: str) -> None:
    from dlindex.catalog.sqlite.migrations import LATEST_VERSION, m013_orientation

    psycopg = pytest.importorskip("psycopg")
    Catalog(pg_url, create=True).close()
    schema_before(pg_url, m013_orientation)  # as the version before made it
    Catalog(pg_url).close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM dlindex_schema").fetchone() == (LATEST_VERSION,)
        assert conn.execute("SELECT count(orientation) FROM image_metadata").fetchone() == (0,)


def _png_with_text(texts: list[tuple[str, str]], orientation: int | None) -> bytes:
    info = PngImagePlugin.PngInfo()
    for key, value in texts:
        info.add_text(key, value)
    extra = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        extra["exif"] = exif.tobytes()
    out = io.BytesIO()
    pixels().save(out, "PNG", pnginfo=info, **extra)
    return out.getvalue()


@pytest.mark.parametrize("orientation", [None, 1, 6])
def test_a_png_with_text_is_read_without_pillow_and_as_pillow_reads_it(orientation: int | None) -> None:
    # A text chunk (the software, a comment, a tag a tool writes) sent every such PNG to Pillow:
    # a third of a 50,000-file scan's time went to opening them again (#32).
    data = _png_with_text([("Software", "a camera"), ("Comment", "x" * 200)], orientation)
    found = sniff_orientation(data)
    assert found is not None
    with Image.open(io.BytesIO(data)) as image:
        assert found == pillow_orientation(image) == (orientation or 1)


@pytest.mark.parametrize("key", ["Raw profile type exif", "exif"])
def test_a_png_text_that_may_hold_exif_is_left_to_pillow(key: str) -> None:
    assert sniff_orientation(_png_with_text([(key, "00")], None)) is None


def test_the_scan_does_not_import_numpy() -> None:
    # numpy is ~50 ms and ~12 MiB in every scan process; the scan reads headers only.
    code = "import sys, dlindex.scan.run, dlindex.scan.probe; sys.exit('numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent).returncode == 0
