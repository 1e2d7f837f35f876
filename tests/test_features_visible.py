"""colorhist, thumb and dhash see images as a viewer shows them: alpha, colour keys, 16 bits."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from dlindex import Catalog, ScanOptions, query_rows, sample_ids, scan_tree
from dlindex.features import ComputeOptions, compute_features, nearest
from dlindex.features.extractors import colorhist, dhash, thumb
from dlindex.features.visible import BACKGROUND

from .backends import ON_BOTH_BACKENDS, where

pytestmark = ON_BOTH_BACKENDS

SHAPES = {  # class -> (colour, shape)
    "red_disc": ((220, 20, 20), "disc"),
    "blue_column": ((20, 40, 210), "column"),
    "green_bar": ((20, 170, 40), "bar"),
}


def clipart(kind: str, variant: int, size: int = 64) -> Image.Image:
    """One shape on a transparent background (~60% of the pixels) whose hidden RGB is random
    garbage; a few pixels of jitter in position and size, a soft edge."""
    rng = np.random.default_rng(1000 * variant + len(kind))
    colour, shape = SHAPES[kind]
    garbage = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    alpha = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(alpha)
    dx, dy, grow = (int(v) for v in rng.integers(-3, 4, 3))
    if shape == "disc":
        draw.ellipse((10 + dx, 10 + dy, 50 + dx + grow, 50 + dy + grow), fill=255)
    elif shape == "column":
        draw.rectangle((24 + dx, 4 + dy, 40 + dx + grow, 60 + dy + grow), fill=255)
    else:
        draw.rectangle((6 + dx, 22 + dy, 58 + dx + grow, 40 + dy + grow), fill=255)
    a = np.asarray(alpha).copy()
    a[(a == 255) & (rng.random(a.shape) < 0.05)] = 200  # some half-visible pixels
    rgb = np.where(a[..., None] > 0, np.array(colour, dtype=np.uint8), garbage)
    return Image.fromarray(np.dstack([rgb, a]), "RGBA")


def test_the_generated_images_are_mostly_transparent() -> None:
    share = np.mean([(np.asarray(clipart(k, v))[..., 3] == 0).mean() for k in SHAPES for v in range(4)])
    assert 0.5 < share < 0.75


@pytest.mark.parametrize("fn", [colorhist, thumb, dhash])
def test_nearest_neighbours_look_alike(fn) -> None:  # type: ignore[no-untyped-def]
    labels = [k for k in SHAPES for _ in range(5)]
    images = [clipart(k, v) for k in SHAPES for v in range(5)]
    vectors = np.stack([fn(im) for im in images])
    k = 3
    # dhash hashes the subject's box (visible.subject), and the column and the bar are each one
    # flat box of colour in it: plain, told apart by nothing but their aspect, which the hash drops.
    for i, label in enumerate(labels if fn is not dhash else []):
        distance = ((vectors - vectors[i]) ** 2).sum(axis=1)
        distance[i] = np.inf
        closest = np.argsort(distance, kind="stable")[:k]
        assert [labels[j] for j in closest] == [label] * k, (fn.__name__, i)
    # The garbage under the transparent pixels decides nothing: change it, same vector.
    image = clipart("red_disc", 0)
    pixels = np.asarray(image).copy()
    hidden = pixels[..., 3] == 0
    pixels[hidden, :3] = 255 - pixels[hidden, :3]
    assert np.array_equal(fn(Image.fromarray(pixels, "RGBA")), fn(image))


def test_dropping_alpha_would_let_the_hidden_garbage_count() -> None:
    """What the tests above guard against: with alpha dropped, hidden pixels change the vectors."""
    image = clipart("red_disc", 0)
    pixels = np.asarray(image).copy()
    hidden = pixels[..., 3] == 0
    pixels[hidden, :3] = 0
    other = Image.fromarray(pixels, "RGBA")
    for fn in (colorhist, thumb):
        assert not np.allclose(fn(image.convert("RGB")), fn(other.convert("RGB")), atol=0.05)
        assert np.array_equal(fn(image), fn(other))


def test_colorhist_weighs_by_alpha_and_composites_nothing() -> None:
    image = Image.new("RGBA", (10, 10), (0, 0, 255, 0))  # hidden blue
    ImageDraw.Draw(image).rectangle((0, 0, 4, 9), fill=(255, 0, 0, 255))  # half visible red
    hist = colorhist(image).reshape(3, 32)
    assert hist[0, 31] == pytest.approx(1.0) and hist[2, 0] == pytest.approx(1.0)  # only red is seen
    half = Image.new("RGBA", (2, 1), (0, 0, 0, 0))
    half.putpixel((0, 0), (255, 0, 0, 255))
    half.putpixel((1, 0), (0, 255, 0, 85))
    g = colorhist(half).reshape(3, 32)
    assert g[1, 31] == pytest.approx(85 / 340) and g[0, 31] == pytest.approx(255 / 340)
    empty = colorhist(Image.new("RGBA", (4, 4), (0, 0, 0, 0)))  # nothing visible: the background
    assert empty.reshape(3, 32)[:, BACKGROUND[0] >> 3].tolist() == [1.0, 1.0, 1.0]


def test_thumb_and_dhash_composite_on_white() -> None:
    image = Image.new("RGBA", (16, 16), (0, 0, 0, 0))  # transparent black: shows as white
    assert thumb(image).tolist() == [1.0] * 256
    black = Image.new("RGBA", (16, 16), (0, 0, 0, 255))
    assert thumb(black).tolist() == [0.0] * 256


@pytest.mark.parametrize("mode", ["LA", "PA", "P", "L", "RGB", "1", "I;16"])
def test_every_kind_of_transparency_is_seen(tmp_path: Path, mode: str) -> None:
    """A black square on a transparent rest, saved as PNG in each mode that can say so."""
    alpha = np.zeros((16, 16), dtype=bool)
    alpha[4:12, 4:12] = True
    if mode in ("LA", "PA"):
        base = Image.fromarray(np.where(alpha, 0, 77).astype(np.uint8), "L")
        image = Image.merge("LA", (base, Image.fromarray(alpha.astype(np.uint8) * 255)))
        if mode == "PA":  # LA -> PA would drop the alpha: build the palette image, then add alpha
            image = Image.fromarray(np.where(alpha, 0, 1).astype(np.uint8), "P")
            image.putpalette([0, 0, 0, 77, 77, 77] + [0] * 762)
            image = image.convert("PA")
            image.putalpha(Image.fromarray(alpha.astype(np.uint8) * 255))
    elif mode == "P":
        image = Image.fromarray(np.where(alpha, 0, 1).astype(np.uint8), "P")
        image.putpalette([0, 0, 0, 90, 90, 90] + [0] * 762)
        image.info["transparency"] = 1
    elif mode == "I;16":
        image = Image.fromarray(np.where(alpha, 0, 40000).astype(np.uint16))
        image.info["transparency"] = 40000
    else:
        key = {"L": 90, "RGB": (90, 90, 90), "1": 1}[mode]
        fill = {"L": 90, "RGB": (90, 90, 90), "1": 1}[mode]
        image = Image.new(mode, (16, 16), fill)  # type: ignore[arg-type]
        image.paste(0 if mode != "RGB" else (0, 0, 0), (4, 4, 12, 12))
        image.info["transparency"] = key
    if mode == "PA":  # PNG cannot store PA: test it in memory
        got_thumb, got_hist = thumb(image), colorhist(image).reshape(3, 32)
    else:
        image.save(tmp_path / "x.png")
        with Image.open(tmp_path / "x.png") as saved:
            assert saved.mode == mode and ("transparency" in saved.info or mode == "LA")
            got_thumb = thumb(saved)
        with Image.open(tmp_path / "x.png") as saved:
            got_hist = colorhist(saved).reshape(3, 32)
    expected = np.where(alpha, 0.0, 1.0).reshape(-1)
    assert np.allclose(got_thumb, expected, atol=1 / 255), mode
    assert got_hist[:, 0].tolist() == [1.0, 1.0, 1.0], mode  # only the black square is visible


def test_sixteen_bit_grey_is_scaled_not_clipped() -> None:
    image = Image.fromarray(np.full((16, 16), 32768, dtype=np.uint16))
    assert image.mode == "I;16"
    assert thumb(image)[0] == pytest.approx(128 / 255, abs=1 / 255)  # was 1.0: clipped at 255
    assert colorhist(image).reshape(3, 32)[:, 16].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("mode", ["RGB", "L", "P", "CMYK", "YCbCr"])
def test_opaque_images_give_the_vectors_they_always_did(mode: str) -> None:
    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8), "RGB").convert(mode)
    rgb = image.convert("RGB")
    counts = np.asarray(rgb.histogram(), dtype=np.float64).reshape(3, 32, 8).sum(axis=2).reshape(-1) / (20 * 30)
    assert colorhist(image).tobytes() == counts.astype(np.float32).tobytes()
    assert (
        thumb(image).tobytes()
        == (
            np.asarray(image.convert("L").resize((16, 16), Image.Resampling.BOX), dtype=np.float32).reshape(-1) / 255.0
        ).tobytes()
    )


def test_pipeline_neighbours_on_a_transparent_tree(tmp_path: Path) -> None:
    root = tmp_path / "clipart"
    for kind, v in itertools.product(SHAPES, range(4)):
        (root / kind).mkdir(parents=True, exist_ok=True)
        clipart(kind, v).save(root / kind / f"{v}.png")
    db = where(tmp_path / "c.db")
    with Catalog(db, create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
        for name in ("colorhist", "thumb", "dhash"):
            assert compute_features(catalog, name, None, ComputeOptions(workers=1)).computed == 12
        ids = sample_ids(catalog)
        labels = {r["id"]: r["label"] for r in query_rows(catalog, columns=["id", "label"])}
        for name in ("colorhist", "thumb"):
            for answer in nearest(catalog, ids, name, k=3):
                assert {labels[n.id] for n in answer} == {labels[answer[0].query]}, name


@pytest.mark.parametrize("soft", [False, True])
def test_weighted_histogram_matches_its_definition(monkeypatch: pytest.MonkeyPatch, soft: bool) -> None:
    from dlindex.features import visible

    monkeypatch.setattr(visible, "_STRIP_PIXELS", 1000)  # several strips
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (90, 70, 4), dtype=np.uint8)
    if not soft:
        pixels[..., 3] = np.where(pixels[..., 3] > 100, 255, 0)
    w = pixels[..., 3].reshape(-1).astype(np.float64)
    expected = (
        np.concatenate([np.bincount(pixels[..., c].reshape(-1) >> 3, weights=w, minlength=32) for c in range(3)])
        / w.sum()
    )
    got = visible.weighted_histogram(Image.fromarray(pixels, "RGBA"))
    assert np.allclose(got, expected, atol=1e-6)
