"""What an image looks like, for the built-in extractors: transparency and 16-bit samples.

Pillow's ``convert("RGB")`` and ``convert("L")`` drop alpha as if it were not there, so the
colours hidden under transparent pixels (often leftovers, or noise) would count as much as
the visible ones; and they clip 16-bit samples at 255, so a 16-bit grey image is white.
The built-ins therefore see the image as a viewer shows it:

- ``colorhist`` weighs each pixel by its alpha (a half-transparent pixel counts half; an
  image with no visible pixel at all is the histogram of the background);
- ``thumb`` and ``dhash`` composite the image over an opaque white ``BACKGROUND`` first.

An image has transparency when its mode carries alpha (RGBA, LA, PA, RGBa, La), when it is
a palette image with transparent entries (PNG tRNS, GIF), or when it has a transparent
colour key (``info["transparency"]`` on 1, L, RGB, I;16 and I images). 16-bit samples
(I;16*, and I, read as 0..65535) are scaled to 8 bits. Anything else takes Pillow's own
conversion exactly as before, so opaque RGB images and JPEGs give the same bytes as ever.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

BACKGROUND = (255, 255, 255)  # what a page or a viewer usually shows behind clip-art
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


def weighted_histogram(over: Image.Image, bins: int = 32) -> np.ndarray:
    """Per-channel R, G, B histograms of an RGBA image, each pixel weighed by its alpha; each sums to 1."""
    pixels = np.asarray(over).reshape(-1, 4)
    weights = pixels[:, 3].astype(np.float64)
    total = weights.sum()
    shift = 8 - int(np.log2(bins))
    if total == 0:  # nothing visible: what is seen is the background
        pixels = np.array([[*BACKGROUND, 255]], dtype=np.uint8)
        weights, total = np.ones(1), 1.0
    hist = [np.bincount(pixels[:, c] >> shift, weights=weights, minlength=bins) for c in range(3)]
    return (np.concatenate(hist) / total).astype(np.float32)
