"""What an image looks like, for the built-in extractors: transparency and 16-bit samples.

Pillow's ``convert("RGB")`` and ``convert("L")`` drop alpha as if it were not there, so the
colours hidden under transparent pixels (often leftovers, or noise) would count as much as
the visible ones; and they clip 16-bit samples at 255, so a 16-bit grey image is white.
The built-ins therefore see the image as a viewer shows it:

- ``colorhist`` weighs each pixel by its alpha (a half-transparent pixel counts half; an
  image with no visible pixel at all is the histogram of the background);
- ``thumb`` and ``dhash`` composite the image over an opaque white ``BACKGROUND`` first;
- ``dhash`` and ``colorthumb`` look at the ``subject``: the box of what is drawn, without the
  transparent or flat margin around it. A small sprite on a large empty canvas is otherwise a
  blob in the middle of white at 9 x 8 pixels, and every such sprite hashes alike (on Wesnoth's
  5,782 unit sprites, 2 million dhash pairs within 8 bits, 97% of them different units).

An image has transparency when its mode carries alpha (RGBA, LA, PA, RGBa, La), when it is
a palette image with transparent entries (PNG tRNS, GIF), or when it has a transparent
colour key (``info["transparency"]`` on 1, L, RGB, I;16 and I images). 16-bit samples
(I;16*, and I, read as 0..65535) are scaled to 8 bits. Anything else takes Pillow's own
conversion exactly as before, so opaque RGB images and JPEGs give the same bytes as ever.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageChops

BACKGROUND = (255, 255, 255)  # what a page or a viewer usually shows behind clip-art
# A pixel at most this opaque is margin, not subject: soft shadows and antialiasing fringes
# would otherwise stretch the box by a different amount in each resized copy.
_FAINT_ALPHA = 16
# A frame (the outermost pixels) whose colours all lie within this many levels of its corner is a
# flat margin (a page, a plain backdrop, JPEG noise on either); the subject is what differs more.
_FLAT_LEVELS = 16
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_WIDE_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})


def rgba(image: Image.Image) -> Image.Image | None:
    """The image as RGBA when it has transparency or 16-bit samples; None: use Pillow's conversion."""
    mode = image.mode
    if mode in _WIDE_MODES:
        return _wide(image)
    if mode in _ALPHA_MODES or "transparency" in image.info:
        return image.convert("RGBA")
    palette = image.palette if mode == "P" else None
    if palette is not None and palette.mode == "RGBA":
        return image.convert("RGBA")
    return None


def _wide(image: Image.Image) -> Image.Image:
    values = np.asarray(image).astype(np.int64)
    key: Any = image.info.get("transparency")
    alpha = np.full(values.shape, 255, dtype=np.uint8)
    if isinstance(key, int):
        alpha[values == key] = 0
    gray = ((np.clip(values, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)
    return Image.fromarray(np.dstack([gray, gray, gray, alpha]), "RGBA")


def on_background(image: Image.Image) -> Image.Image:
    """The image composited over an opaque ``BACKGROUND``, as RGB (unchanged if it has no alpha)."""
    over = rgba(image)
    if over is None:
        return image
    return Image.alpha_composite(Image.new("RGBA", over.size, (*BACKGROUND, 255)), over).convert("RGB")


def subject(image: Image.Image) -> Image.Image:
    """The image over ``BACKGROUND`` cropped to its subject: the box of its visible pixels, and
    within that the box of what differs from a flat frame. Unchanged when there is no margin
    (a photo's frame is not flat), and whole when nothing stands out (a plain image stays plain)."""
    over = rgba(image)
    if over is not None:
        box = over.getchannel("A").point(_OPAQUE_ENOUGH).getbbox()
        if box is not None:
            over = over.crop(box)
        image = Image.alpha_composite(Image.new("RGBA", over.size, (*BACKGROUND, 255)), over).convert("RGB")
    corner = _flat_frame(image)
    if corner is None:
        return image
    colour = image.convert("RGB") if image.mode != "RGB" else image
    differs = ImageChops.difference(colour, Image.new("RGB", colour.size, corner))
    strongest = ImageChops.lighter(ImageChops.lighter(*differs.split()[:2]), differs.getchannel(2))
    box = strongest.point(_STANDS_OUT).getbbox()
    return image if box is None else image.crop(box)


def _flat_frame(image: Image.Image) -> tuple[int, int, int] | None:
    """The frame's corner colour if every pixel of the one-pixel frame is within _FLAT_LEVELS of it."""
    w, h = image.size
    if w < 3 or h < 3:
        return None
    edges = [image.crop(box).convert("RGB") for box in ((0, 0, w, 1), (0, h - 1, w, h), (0, 0, 1, h), (w - 1, 0, w, h))]
    corner = edges[0].getpixel((0, 0))
    assert isinstance(corner, tuple)
    for edge in edges:
        bands: tuple[tuple[int, int], ...] = edge.getextrema()  # type: ignore[assignment]  # RGB: one per band
        for (low, high), level in zip(bands, corner, strict=True):
            if level - low > _FLAT_LEVELS or high - level > _FLAT_LEVELS:
                return None
    return (int(corner[0]), int(corner[1]), int(corner[2]))


_OPAQUE_ENOUGH = [0] * (_FAINT_ALPHA + 1) + [255] * (255 - _FAINT_ALPHA)
_STANDS_OUT = [0] * (_FLAT_LEVELS + 1) + [255] * (255 - _FLAT_LEVELS)


def weighted_histogram(over: Image.Image, bins: int = 32) -> npt.NDArray[np.float32]:
    """Per-channel R, G, B histograms of an RGBA image, each pixel weighed by its alpha; each sums to 1."""
    alpha = over.getchannel("A")
    levels = np.asarray(alpha.histogram(), dtype=np.int64)
    total = int(levels @ np.arange(256))
    fold = 256 // bins
    if total == 0:  # nothing visible: what is seen is the background
        hist = np.zeros((3, bins), dtype=np.float64)
        hist[range(3), [value // fold for value in BACKGROUND]] = 1.0
        return hist.reshape(-1).astype(np.float32)
    if not levels[1:255].any():  # only fully opaque or fully clear pixels (most clip-art): Pillow, in C
        counts = np.asarray(over.convert("RGB").histogram(mask=alpha), dtype=np.float64)
        hist = counts.reshape(3, bins, fold).sum(axis=2).reshape(-1) * 255.0
    else:
        hist = np.zeros(3 * bins, dtype=np.float64)
        weights = np.arange(256, dtype=np.float64)
        rows = max(1, _STRIP_PIXELS // max(1, over.width))
        for top in range(0, over.height, rows):  # strips: no full-size temporary arrays
            strip = np.asarray(over.crop((0, top, over.width, min(over.height, top + rows)))).reshape(-1, 4)
            for c in range(3):
                # An integer count per (bin, alpha) pair, then the weights on those few counts.
                joint = (strip[:, c] // fold).astype(np.uint16) * 256 + strip[:, 3]
                hist[c * bins : (c + 1) * bins] += np.bincount(joint, minlength=bins * 256).reshape(bins, 256) @ weights
    return (hist / total).astype(np.float32)


_STRIP_PIXELS = 1 << 20
