"""colorthumb: a mean-centred unit-length colour thumbnail, so its cosine is a pixel correlation."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from dlindex.features.extractors import BUILTINS, COLORTHUMB_SIDE, colorthumb, load_extractor


def picture(seed: int, size: tuple[int, int] = (120, 90)) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    return Image.fromarray(small).resize(size, Image.Resampling.BICUBIC)


def reopened(image: Image.Image, fmt: str = "PNG", **options: int) -> Image.Image:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return Image.open(io.BytesIO(out.getvalue()))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.astype(np.float64) @ b.astype(np.float64))


def test_unit_length_and_centred() -> None:
    v = colorthumb(reopened(picture(1)))
    assert v.shape == (3 * COLORTHUMB_SIDE**2,) and v.dtype == np.float32
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5 and abs(float(v.mean())) < 1e-6
    assert load_extractor("colorthumb") is BUILTINS["colorthumb"] and BUILTINS["colorthumb"].dim == v.size


def test_brightness_and_contrast_do_not_move_it() -> None:
    base = np.asarray(picture(2), dtype=np.float64)
    dimmer = Image.fromarray(np.clip(0.6 * base + 40, 0, 255).round().astype(np.uint8))
    assert cosine(colorthumb(reopened(picture(2))), colorthumb(reopened(dimmer))) > 0.999


def test_a_resized_recompressed_copy_is_close_and_another_picture_is_not() -> None:
    original = colorthumb(reopened(picture(3)))
    copy = colorthumb(reopened(picture(3).resize((61, 45), Image.Resampling.BICUBIC), "JPEG", quality=60))
    assert 1 - cosine(original, copy) < 0.01
    assert 1 - cosine(original, colorthumb(reopened(picture(4)))) > 0.1


def test_a_plain_image_is_all_zeros() -> None:
    assert not colorthumb(reopened(Image.new("RGB", (50, 40), (90, 90, 90)))).any()
    assert not colorthumb(reopened(Image.new("LA", (50, 40), (0, 0)))).any()  # transparent: plain white


def test_a_colour_cast_does_not_move_it() -> None:
    """Each channel is centred on its own mean: a white-balance shift is not a new picture."""
    base = np.asarray(picture(5), dtype=np.float64)
    warmer = Image.fromarray(np.clip(base + np.array([30.0, 0.0, -30.0]), 0, 255).round().astype(np.uint8))
    assert cosine(colorthumb(reopened(picture(5))), colorthumb(reopened(warmer))) > 0.995


def shapes(seed: int, size: tuple[int, int] = (160, 120)) -> Image.Image:
    """Sharp-edged shapes on a gradient: what a crop moves most."""
    from PIL import ImageDraw

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size[0])[None, :, None] * np.ones((size[1], 1, 1))
    image = Image.fromarray((rng.integers(0, 256, 3) * ramp + rng.integers(0, 128, 3) * (1 - ramp)).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x, y = int(rng.integers(0, size[0])), int(rng.integers(0, size[1]))
        w, h = int(rng.integers(15, 60)), int(rng.integers(15, 60))
        draw.rectangle([x, y, x + w, y + h], fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    return image


def test_a_cropped_copy_is_within_the_default_threshold() -> None:
    """Cropped by 5% (3% on one side, 2% on the other), downsized, re-encoded: well inside dups'
    default 0.03 (the sharp 12 x 12 thumbnail without the blur put 2 of these 20 past 0.02)."""
    from dlindex.quality.duplicate_groups import DEFAULT_THRESHOLD

    for seed in range(20):
        original = shapes(seed)
        w, h = original.size
        copy = original.crop((w * 3 // 100, h * 3 // 100, w - w // 50, h - h // 50)).resize(
            (w * 2 // 3, h * 2 // 3), Image.Resampling.BICUBIC
        )
        a, b = colorthumb(reopened(original)), colorthumb(reopened(copy, "JPEG", quality=60))
        assert 1 - cosine(a, b) < 0.02, seed
        assert 1 - cosine(a, colorthumb(reopened(shapes(seed + 100)))) > 2 * DEFAULT_THRESHOLD, seed
