"""What an image looks like, for the built-in extractors: transparency and 16-bit samples.

Pillow's ``convert("RGB")`` and ``convert("L")`` drop alpha as if it were not there, so the
colours hidden under transparent pixels (often leftovers, or noise) would count as much as
the visible ones; and they clip 16-bit samples at 255, so a 16-bit grey image is white.
The built-ins therefore see the image as a viewer shows it:

- ``colorhist`` weighs each pixel by its alpha (a half-transparent pixel counts half; an
  image with no visible pixel at all is the histogram of the background);
- ``thumb`` and ``dhash`` composite the image over an opaque white ``BACKGROUND`` first;
- ``dhash`` and ``colorthumb`` look at the ``subject``: the box of what is drawn, without the
  transparent or white margin around it. A small sprite on a large empty canvas is otherwise a
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
# The subject's box leaves out this share of the visible weight (alpha, or difference from a flat
# frame) on each side: soft fringes and JPEG ringing would otherwise stretch it by a different
# amount in each copy (a sprite flattened onto white and saved as JPEG grew by up to 9 px of 72).
_MARGIN_MASS = 0.002
# An opaque image is on a page when this share of its frame (the outermost pixels) is within
# _PAGE_LEVELS of BACKGROUND: a subject may touch the frame in places (of Wesnoth's sprites
# flattened onto white and saved as JPEG, 99% have over 0.99). Only white: a grey or dark frame
# is as often a photo's or a gradient's, and cropping those moved 7 of 300 planted copies apart.
_PAGE_LEVELS = 16  # JPEG noise on white
_PAGE_SHARE = 0.95
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
    """The image over ``BACKGROUND`` cropped to its subject: the box of what differs from
    ``BACKGROUND``, where that is the backdrop (behind transparency, or a white page: a frame of
    white). Unchanged otherwise (a photo), and whole when nothing stands out (a plain image)."""
    transparent = rgba(image) is not None
    image = on_background(image)
    if not (transparent or _on_page(image)):
        return image
    colour = image.convert("RGB") if image.mode != "RGB" else image
    differs = ImageChops.difference(colour, Image.new("RGB", colour.size, BACKGROUND))
    strongest = ImageChops.lighter(ImageChops.lighter(*differs.split()[:2]), differs.getchannel(2))
    box = _box_of(np.asarray(strongest.point(_STANDS_OUT)))
    return image if box is None else image.crop(box)


def _box_of(weight: npt.NDArray[np.uint8]) -> tuple[int, int, int, int] | None:
    """The box (left, top, right, bottom) that leaves out at most _MARGIN_MASS of ``weight`` on
    each side: stray pixels (JPEG ringing, a faint glow) do not stretch it. None if all zero."""
    cols = weight.sum(axis=0, dtype=np.int64)
    rows = weight.sum(axis=1, dtype=np.int64)
    total = int(cols.sum())
    if total == 0:
        return None
    cut = total * _MARGIN_MASS

    def span(mass: npt.NDArray[np.int64]) -> tuple[int, int]:
        before = np.cumsum(mass)
        after = np.cumsum(mass[::-1])
        return int(np.searchsorted(before, cut, side="right")), mass.size - int(
            np.searchsorted(after, cut, side="right")
        )

    (left, right), (top, bottom) = span(cols), span(rows)
    return (left, top, right, bottom) if left < right and top < bottom else None


def _on_page(image: Image.Image) -> bool:
    """Whether at least _PAGE_SHARE of the one-pixel frame is within _PAGE_LEVELS of BACKGROUND."""
    w, h = image.size
    if w < 3 or h < 3:
        return False
    # BACKGROUND is white: within _PAGE_LEVELS of it on every channel is a darkest channel that high.
    white = (_frame(image).min(axis=1) >= 255 - _PAGE_LEVELS).mean()
    return bool(white >= _PAGE_SHARE)


def _frame(image: Image.Image) -> npt.NDArray[np.uint8]:
    """The outermost rows and columns as RGB pixels, one per row (corners twice). A small image
    is converted whole (one call: most of what dhash costs on a thumbnail-sized file was the four
    crops' calls); a large one crops its frame first, not to convert every pixel."""
    w, h = image.size
    if w * h <= _WHOLE_FRAME_PIXELS:
        a = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
        return np.concatenate((a[0], a[-1], a[:, 0], a[:, -1]))
    boxes = ((0, 0, w, 1), (0, h - 1, w, h), (0, 0, 1, h), (w - 1, 0, w, h))
    return np.concatenate([np.asarray(image.crop(box).convert("RGB")).reshape(-1, 3) for box in boxes])


_WHOLE_FRAME_PIXELS = 256 * 256
_STANDS_OUT = list(range(256))  # differences within _PAGE_LEVELS are the backdrop's noise: no weight
_STANDS_OUT[: _PAGE_LEVELS + 1] = [0] * (_PAGE_LEVELS + 1)


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
