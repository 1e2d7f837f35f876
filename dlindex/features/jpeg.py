"""Exact JPEG decoding straight into one buffer, for built-in extractors that read every pixel.

Pillow's JPEG path parses the header in Python and has libjpeg write each scanline into a
scratch line that is then copied into the image: on the benchmark tree that is ~0.1 ms of
header parsing and ~13% of the decode in ``memmove``. simplejpeg drives the same
libjpeg-turbo through its TurboJPEG API, which writes the rows in place. With the settings
used here (accurate integer IDCT, fancy upsampling, output RGBX) the pixels are the ones
Pillow decodes; tests compare them on every JPEG of the corpus and of generated trees.

Only the plain case takes this path: a YCbCr or RGB JPEG, within Pillow's pixel limit,
decoded without even a recoverable libjpeg warning (``strict``). Anything else (CMYK, YCCK,
grayscale, a truncated or damaged file, simplejpeg not installed) returns None, and the
caller decodes with Pillow as before, so what fails, and with which message, is still
Pillow's decision.
"""

from __future__ import annotations

from PIL import Image

try:
    import simplejpeg
except ImportError:  # no wheel for this platform: Pillow alone still gives the same vectors
    simplejpeg = None

_SOI = b"\xff\xd8\xff"  # what Pillow's JPEG plugin accepts as the start of a JPEG
_PLAIN = ("YCbCr", "RGB")


def available() -> bool:
    return simplejpeg is not None


def may_decode(head: bytes) -> bool:
    """Whether a file that starts with ``head`` (3 bytes are enough) may take this path."""
    return simplejpeg is not None and head.startswith(_SOI)


def decode_rgbx(data: bytes) -> Image.Image | None:
    """The image as an ``RGBX`` PIL image over the decoded buffer, or None: use Pillow."""
    if not may_decode(data):
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        limit = Image.MAX_IMAGE_PIXELS
        if colorspace not in _PLAIN or (limit is not None and width * height > limit):
            return None
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGBX", fastdct=False, fastupsample=False, strict=True)
    except Exception:  # any complaint at all: Pillow decides what this file is
        return None
    return Image.frombuffer("RGBX", (width, height), pixels, "raw", "RGBX", 0, 1)
