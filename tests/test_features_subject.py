"""dhash and colorthumb describe the subject, not the empty canvas around it (issue #32).

A small sprite on a large transparent canvas (or a white page) is, at 9 x 8 pixels, a dark blob in the
middle of white: every sprite hashed alike, and on Wesnoth's unit sprites one near group held
1,017 sprites of 19 classes. The figures here are random patterns (so any two differ), small
in a large canvas, near its middle: the case that made those groups.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dlindex import Catalog, ScanOptions, query_rows, scan_tree
from dlindex.features import ComputeOptions, compute_features, visible
from dlindex.features.extractors import colorthumb, dhash
from dlindex.features.visible import on_background, subject
from dlindex.quality.duplicate_groups import duplicate_groups

CANVAS = 96


def figure(seed: int, frame: int = 0) -> Image.Image:
    """Figure ``seed`` (a 6 x 8 random pattern, 24 x 32 px, opaque) on a transparent 96 x 96
    canvas; each ``frame`` moves it a few pixels and adds a little noise, as an animation frame would."""
    rng = np.random.default_rng(seed)
    pattern = rng.integers(0, 200, (8, 6, 3), dtype=np.uint8)
    body = np.asarray(Image.fromarray(pattern, "RGB").resize((24, 32), Image.Resampling.NEAREST)).astype(np.int16)
    jitter = np.random.default_rng(1000 * seed + frame)
    body = np.clip(body + jitter.integers(-6, 7, body.shape), 0, 255).astype(np.uint8)
    canvas = Image.new("RGBA", (CANVAS, CANVAS), (0, 0, 0, 0))
    x, y = (int(v) for v in jitter.integers(32, 41, 2))  # near the middle, as a game centres its sprites
    canvas.paste(Image.fromarray(body, "RGB").convert("RGBA"), (x, y))
    return canvas


def bits_apart(a: Image.Image, b: Image.Image) -> int:
    return int((dhash(a) != dhash(b)).sum())


def whole_canvas_dhash(image: Image.Image) -> np.ndarray:
    """dhash as it was: the whole canvas over white."""
    small = np.asarray(on_background(image).convert("L").resize((9, 8), Image.Resampling.BOX), dtype=np.int16)
    return (small[:, 1:] > small[:, :-1]).reshape(-1)


def test_unrelated_small_figures_are_far_apart_and_frames_near() -> None:
    figures = [figure(seed) for seed in range(12)]
    unrelated = [bits_apart(a, b) for i, a in enumerate(figures) for b in figures[i + 1 :]]
    assert min(unrelated) > 8  # the default --max-distance: no unrelated pair is near
    frames = [bits_apart(figure(seed), figure(seed, frame)) for seed in range(12) for frame in (1, 2)]
    assert max(frames) <= 8  # and every frame is near its figure
    # What the fix is for: on the whole canvas, most unrelated figures were within 8 bits.
    old = [whole_canvas_dhash(a) for a in figures]
    near_before = [int((a != b).sum()) <= 8 for i, a in enumerate(old) for b in old[i + 1 :]]
    assert np.mean(near_before) > 0.5


def test_colorthumb_tells_unrelated_figures_apart() -> None:
    vectors = np.stack([colorthumb(figure(seed)) for seed in range(12)]).astype(np.float64)
    cosine = vectors @ vectors.T
    off_diagonal = cosine[~np.eye(12, dtype=bool)]
    assert 1.0 - off_diagonal.max() > 0.03  # the default --threshold
    moved = [1.0 - float(colorthumb(figure(s)) @ colorthumb(figure(s, 1))) for s in range(12)]
    assert max(moved) < 0.03


def test_subject_crops_a_white_page_and_leaves_photos_alone() -> None:
    sprite = figure(3)
    tight = subject(sprite)
    assert tight.size == (24, 32)
    page = on_background(sprite)  # the same drawing, flattened onto an opaque white page
    assert page.mode == "RGB" and subject(page).size == (24, 32)
    assert bits_apart(page, tight) == 0
    photo = Image.fromarray(np.random.default_rng(5).integers(0, 256, (40, 60, 3), dtype=np.uint8), "RGB")
    assert subject(photo) is photo  # no white frame: nothing cropped, the same vectors as ever
    plain = Image.new("RGBA", (20, 20), (0, 0, 0, 0))
    assert subject(plain).size == (20, 20)  # nothing visible: whole (and plain)


def test_dups_groups_each_figure_with_its_own_frames(tmp_path: Path) -> None:
    root = tmp_path / "sprites"
    for seed in range(10):
        folder = root / f"unit{seed}"
        folder.mkdir(parents=True)
        for frame in range(3):
            figure(seed, frame).save(folder / f"f{frame}.png")
    with Catalog(tmp_path / "s.db", create=True) as catalog:
        scan_tree(catalog, root, ScanOptions(workers=1))
        for name in ("dhash", "colorthumb"):
            compute_features(catalog, name, None, ComputeOptions(workers=1))
        labels = {r["id"]: r["label"] for r in query_rows(catalog, columns=["id", "label"])}
        for name, grouping in [(n, g) for n in ("dhash", "colorthumb") for g in ("around-kept", "connected")]:
            groups = duplicate_groups(catalog, feature_type=name, grouping=grouping)
            assert sorted({labels[i] for i in g.ids} == {labels[g.kept]} for g in groups) == [True] * len(groups)
            assert sorted(len(g.ids) for g in groups) == [3] * 10, (name, grouping)


@pytest.mark.parametrize(
    ("backdrop", "edge", "cropped"), [("white", None, True), ("white", "black", False), ("grey", None, False)]
)
def test_only_a_white_frame_is_a_page(backdrop: str, edge: str | None, cropped: bool) -> None:
    """A drawing on white is cropped to the drawing; a frame a quarter of which is dark, or a
    grey one (as often a photo's or a gradient's as a backdrop), leaves the picture whole."""
    image = Image.new("RGB", (30, 30), backdrop)
    image.paste((10, 200, 10), (10, 10, 20, 20))
    if edge is not None:
        image.paste(edge, (0, 29, 30, 30))
    assert (subject(image).size == (10, 10)) is cropped
    assert (subject(image) is image) is not cropped


def test_a_sprite_flattened_onto_white_as_jpeg_stays_near_its_png() -> None:
    """The same sprite with its feet on the canvas's bottom edge, as a transparent PNG and as a
    JPEG on white: the JPEG's frame is white but for the feet, and its ringing stretches no box."""
    apart = []
    for seed in range(12):
        body = figure(seed).crop(figure(seed).getbbox())  # the 24 x 32 figure alone
        sprite = Image.new("RGBA", (160, 160), (0, 0, 0, 0))
        sprite.paste(body, (60, 160 - body.height))  # standing on the bottom edge
        buffer = io.BytesIO()
        on_background(sprite).save(buffer, "JPEG", quality=95)
        with Image.open(io.BytesIO(buffer.getvalue())) as jpeg:
            assert subject(jpeg).size != (160, 160)
            apart.append(bits_apart(sprite, jpeg))
    # random patterns have near-ties that JPEG's colour noise flips (on Wesnoth's sprites: 96% within 8)
    assert sum(d <= 8 for d in apart) >= 10 and np.median(apart) <= 4, apart


@pytest.mark.parametrize("mode", ["RGB", "L", "P"])
@pytest.mark.parametrize("size", [(40, 30), (400, 300)])
def test_the_page_test_reads_the_frame_alike_whatever_the_image_size(
    mode: str, size: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small image's frame is read from the whole image converted once (four crops cost dhash
    # a third of its time on thumbnail-sized files, #32); a large one's from crops. Same verdicts,
    # right at the share that makes a page.
    w, h = size
    frame = 2 * w + 2 * h  # corners count twice
    for dark in (int(frame * 0.05) - 2, int(frame * 0.05) + 2):  # just a page, just not
        pixels = np.full((h, w, 3), 250, np.uint8)
        pixels[1:-1, 1:-1] = 30
        pixels[0, :dark] = 200  # 55 below white on every channel: not the page's white
        image = Image.fromarray(pixels, "RGB").convert(mode)
        want = dark <= frame * 0.05
        assert visible._on_page(image) is want
        monkeypatch.setattr(visible, "_WHOLE_FRAME_PIXELS", 0)
        assert visible._on_page(image) is want
        monkeypatch.undo()
