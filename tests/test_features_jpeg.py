"""colorhist's JPEG path (simplejpeg) gives exactly Pillow's pixels, or steps aside for Pillow."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dlindex import Catalog, QuerySpec, query_rows
from dlindex.features import ComputeOptions, compute_features, jpeg
from dlindex.features.extractors import colorhist, colorhist_file

from .conftest import CORPUS, rows

pytestmark = pytest.mark.skipif(not jpeg.available(), reason="simplejpeg is not installed")


def _noise(size: tuple[int, int], seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    w, h = size
    smooth = Image.fromarray(rng.integers(0, 256, (h // 8 + 2, w // 8 + 2, 3), dtype=np.uint8)).resize(
        size, Image.BICUBIC
    )
    grain = rng.integers(-20, 21, (h, w, 3))
    return Image.fromarray(np.clip(np.asarray(smooth, dtype=np.int16) + grain, 0, 255).astype(np.uint8))


def _jpeg(image: Image.Image, **save: object) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **save)
    return out.getvalue()


def _pillow_rgb(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB").tobytes()


# Sizes that are not multiples of the MCU, every chroma subsampling, progressive, restart markers.
PLAIN = [
    ((97, 61), {"quality": 90}),
    ((640, 427), {"quality": 75, "subsampling": 0}),
    ((333, 250), {"quality": 85, "subsampling": 1}),
    ((251, 509), {"quality": 95, "subsampling": 2, "progressive": True}),
    ((64, 64), {"quality": 60, "optimize": True}),
    ((1, 1), {}),
    ((150, 100), {"quality": 80, "restart_marker_blocks": 4}),
]


@pytest.mark.parametrize(("size", "save"), PLAIN)
def test_plain_jpegs_decode_to_pillows_pixels(size: tuple[int, int], save: dict[str, object]) -> None:
    data = _jpeg(_noise(size, seed=size[0]), **save)
    image = jpeg.decode_rgbx(data)
    assert image is not None and image.size == size
    assert image.convert("RGB").tobytes() == _pillow_rgb(data)


def test_colorhist_file_equals_colorhist_of_the_pillow_image(tmp_path: Path) -> None:
    for i, (size, save) in enumerate(PLAIN):
        path = tmp_path / f"{i}.jpg"
        path.write_bytes(_jpeg(_noise(size, seed=i), **save))
        with Image.open(path) as image:
            assert colorhist_file(os.fsencode(path)).tobytes() == colorhist(image).tobytes()


def _cmyk() -> bytes:
    return _jpeg(_noise((40, 30), 1).convert("CMYK"))


def _gray() -> bytes:
    return _jpeg(_noise((40, 30), 2).convert("L"))


def _truncated() -> bytes:
    data = _jpeg(_noise((200, 150), 3), quality=90)
    return data[: len(data) // 2]


def _png() -> bytes:
    out = io.BytesIO()
    _noise((40, 30), 4).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("make", [_cmyk, _gray, _truncated, _png, lambda: b"", lambda: b"\xff\xd8\xff garbage"])
def test_anything_but_a_clean_plain_jpeg_is_left_to_pillow(make) -> None:  # type: ignore[no-untyped-def]
    assert jpeg.decode_rgbx(make()) is None


def test_over_the_pixel_limit_is_left_to_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _jpeg(_noise((100, 100), 5))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 9_999)
    assert jpeg.decode_rgbx(data) is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert jpeg.decode_rgbx(data) is not None


@pytest.mark.parametrize("make", [_cmyk, _gray, _png])
def test_colorhist_file_falls_back_to_the_same_vector(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "x.jpg"
    path.write_bytes(make())
    with Image.open(path) as image:
        assert colorhist_file(os.fsencode(path)).tobytes() == colorhist(image).tobytes()


def test_truncated_jpeg_fails_as_pillow_fails(tmp_path: Path) -> None:
    path = tmp_path / "cut.jpg"
    path.write_bytes(_truncated())
    with pytest.raises(OSError, match="truncated"):
        colorhist_file(os.fsencode(path))


def test_without_simplejpeg_the_vectors_are_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.jpg"
    path.write_bytes(_jpeg(_noise((120, 90), 6)))
    fast = colorhist_file(os.fsencode(path))
    monkeypatch.setattr(jpeg, "simplejpeg", None)
    assert not jpeg.available() and jpeg.decode_rgbx(path.read_bytes()) is None
    assert colorhist_file(os.fsencode(path)).tobytes() == fast.tobytes()


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus is not present")
def test_corpus_jpegs_same_vector_or_same_failure() -> None:
    """Every JPEG of Pillow's test images, whole and cut short: the fast path either gives
    Pillow's exact vector or leaves the file to Pillow (which then fails as it always did)."""
    checked = fast = 0
    for path in sorted(CORPUS.rglob("*")):
        if not path.is_file() or path.read_bytes()[:3] != b"\xff\xd8\xff":
            continue
        data = path.read_bytes()
        for cut in (len(data), len(data) * 9 // 10, len(data) // 2):
            piece = data[:cut]
            try:
                with Image.open(io.BytesIO(piece)) as image:
                    expected: bytes | str = colorhist(image).tobytes()
            except Exception as e:  # whatever Pillow raises is the expectation
                expected = type(e).__name__
            image = jpeg.decode_rgbx(piece)
            if image is not None:
                fast += 1
                assert colorhist(image).tobytes() == expected, (path.name, cut)
            checked += 1
    assert checked > 100 and fast > 30


def test_a_fifo_in_place_of_an_image_fails_that_sample_without_hanging(scanned_db: Path) -> None:
    with Catalog(scanned_db) as catalog:
        (full,) = [r["path"] for r in query_rows(catalog, columns=["path"], limit=1)]
    os.unlink(full)
    os.mkfifo(full)  # opening it for reading would block until a writer came
    with Catalog(scanned_db) as catalog:
        summary = compute_features(catalog, "colorhist", QuerySpec(), ComputeOptions(workers=1))
    assert (summary.computed, summary.failed) == (5, 1)
    assert "not a regular file" in summary.error_samples[0][1]
    assert rows(scanned_db, "SELECT count(*) FROM feature_state WHERE state = 'failed'") == [(1,)]
