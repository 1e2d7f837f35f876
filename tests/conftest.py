"""Shared fixtures: small image trees made with Pillow, catalogs, and the CLI runner."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from dlindex import Catalog, ScanOptions, scan_tree

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CORPUS = SHARED / "corpus" / "pillow-tests-images"
CORPUS_EXPECTED = SHARED / "corpus" / "pillow-tests-images.expected.json"


def make_png(path: Path, size: tuple[int, int] = (16, 16), color: tuple[int, int, int] = (0, 0, 0)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def make_jpeg(path: Path, size: tuple[int, int] = (32, 24), color: tuple[int, int, int] = (10, 20, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, "JPEG", quality=90)
    return path


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """Six tiny PNGs in two classes (cat/000.png ... dog/002.png), plus one broken file."""
    root = tmp_path / "images"
    for label, i in itertools.product(("cat", "dog"), range(3)):
        make_png(root / label / f"{i:03d}.png", (16 + i, 16), (40 * i, 0, 0))
    (root / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    return root


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "catalog.db"


@pytest.fixture
def scanned_db(image_tree: Path, db_path: Path) -> Path:
    """A catalog of image_tree, scanned once with one worker."""
    with Catalog(db_path, create=True) as catalog:
        scan_tree(catalog, image_tree, ScanOptions(workers=1))
    return db_path


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(autouse=True)
def _no_dlindex_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("DLINDEX_")]:
        monkeypatch.delenv(name)


def rows(db: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Read the catalog with plain sqlite3, independent of dlindex's own code."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()
