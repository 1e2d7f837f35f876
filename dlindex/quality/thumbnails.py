"""Small previews of catalog images as data: URIs, bounded before a byte or pixel is read.

A file is opened without blocking (a FIFO never hangs the report) and must be a regular
file no larger than MAX_SOURCE_BYTES; its header's pixel count must be within Pillow's
``Image.MAX_IMAGE_PIXELS`` before anything is decoded. JPEG is decoded reduced (``draft``:
libjpeg's DCT scaling) to at least twice the preview size. Previews with transparency or a
palette are WebP (lossy, with alpha), the rest JPEG. A preview shows the stored pixels, as the
catalog's width/height and the training loader do by default (the EXIF orientation is not
applied; dlindex/orientation.py). A file that cannot be shown gets the reason instead, never
an exception. Pillow's warnings are the caller's to silence (``catch_warnings`` is
process-wide; ``write_report`` silences them once around all its threads).
"""

from __future__ import annotations

import base64
import io
import os
import stat
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from PIL import Image, UnidentifiedImageError, features

MAX_SOURCE_BYTES = 1 << 30  # a larger "image" is not a picture anyone browses in a report
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_ALPHA = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_HIGH_DEPTH = frozenset({"I", "F", "I;16", "I;16B", "I;16L", "I;16N"})
_WEBP = features.check("webp")  # Pillow wheels have it; a build without it writes PNG


@dataclass(frozen=True)
class Thumbnail:
    """A preview (``uri`` with its pixel size) or, where none could be made, the ``reason``."""

    uri: str | None
    width: int = 0
    height: int = 0
    reason: str | None = None


class _Refused(Exception):
    """A file we decline to decode (too large); its message is the placeholder's reason."""


def make_thumbnail(path: str, px: int) -> Thumbnail:
    """A preview of the image at ``path`` fitting in ``px`` x ``px``, or the reason there is none."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        return Thumbnail(None, reason=f"cannot open: {e.strerror or type(e).__name__}")
    except ValueError:  # a NUL byte, or a surrogate that stands for no byte: no file has this name
        return Thumbnail(None, reason="not a file name this system can open")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Thumbnail(None, reason="not a regular file")
        if info.st_size > MAX_SOURCE_BYTES:
            return Thumbnail(None, reason=f"file of {info.st_size} bytes is over the {MAX_SOURCE_BYTES} byte limit")
        with os.fdopen(os.dup(fd), "rb") as f:
            return _preview(f, px)
    except _Refused as e:
        return Thumbnail(None, reason=str(e))
    except Image.DecompressionBombError:  # Pillow's own check in open(), at twice the limit
        return Thumbnail(None, reason=f"over the pixel limit ({Image.MAX_IMAGE_PIXELS}); not decoded")
    except UnidentifiedImageError:
        return Thumbnail(None, reason="not an image format Pillow knows (corrupt or not an image)")
    except OSError as e:
        if e.errno is not None:  # the system's (EIO, EACCES), not Pillow's "truncated" and the like
            return Thumbnail(None, reason=f"cannot read: {e.strerror or type(e).__name__}")
        return Thumbnail(None, reason=f"cannot decode: {_one_line(e)}")
    except Exception as e:  # Pillow raises many kinds (SyntaxError, ValueError, struct.error...)
        return Thumbnail(None, reason=f"cannot decode: {_one_line(e)}")
    finally:
        os.close(fd)


def _preview(f: BinaryIO, px: int) -> Thumbnail:
    with Image.open(f) as opened:
        width, height = opened.size
        limit = Image.MAX_IMAGE_PIXELS  # read each time: a user may raise it, as for Pillow itself
        if limit is not None and width * height > limit:
            raise _Refused(f"{width}x{height} pixels is over the pixel limit ({limit}); not decoded")
        if opened.format == "JPEG":
            opened.draft(None, (2 * px, 2 * px))  # DCT scaling, never below twice the preview
        lossless = opened.mode in ("P", "1") or _has_alpha(opened)
        image = _displayable(opened)
        image.thumbnail((px, px), Image.Resampling.LANCZOS)
        if image.mode in _HIGH_DEPTH:
            image = _eight_bit(image)
        return _encode(image, lossless)  # inside: an image already small enough is read only here


def _displayable(image: Image.Image) -> Image.Image:
    """The image in a mode a browser shows and ``thumbnail`` resizes smoothly (not P or 1)."""
    mode = image.mode
    if _has_alpha(image):
        return image.convert("RGBA")
    if mode in ("RGB", "L"):
        return image
    if mode in _HIGH_DEPTH:
        return image.convert("F" if mode == "F" else "I")  # 8 bits after the resize, from its own range
    if mode in ("P", "1"):
        return image.convert("RGB" if mode == "P" else "L")
    return image.convert("RGB")  # CMYK, YCbCr, LAB, HSV


def _has_alpha(image: Image.Image) -> bool:
    """Alpha in the mode, a transparent colour key or palette entries (as features.visible sees it)."""
    if image.mode in _ALPHA or "transparency" in image.info:
        return True
    palette = image.palette if image.mode == "P" else None
    return palette is not None and palette.mode == "RGBA"


def _eight_bit(image: Image.Image) -> Image.Image:
    """A high-depth grey preview stretched from its own range to 8 bits (a 12-bit scan is not black)."""
    values = np.nan_to_num(np.asarray(image, dtype=np.float64))
    low, high = float(values.min(initial=0.0)), float(values.max(initial=0.0))
    scaled = (values - low) * (255.0 / (high - low)) if high > low else np.zeros_like(values)
    return Image.fromarray(np.clip(scaled + 0.5, 0, 255).astype(np.uint8), "L")


def _encode(image: Image.Image, lossless: bool) -> Thumbnail:
    buffer = io.BytesIO()
    if lossless and _WEBP:
        # Lossy WebP keeps the alpha at a quarter of PNG's bytes, 5x faster than optimize=True (#32)
        image.save(buffer, "WEBP", quality=80, method=2)
        kind = "webp"
    elif lossless:
        image.save(buffer, "PNG")
        kind = "png"
    else:
        image.save(buffer, "JPEG", quality=82)
        kind = "jpeg"
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return Thumbnail(f"data:image/{kind};base64,{data}", image.width, image.height)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:200]
