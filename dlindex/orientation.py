"""EXIF orientation: read from an image's bytes, and applied to pixels, as Pillow's exif_transpose does.

dlindex works on **stored pixels** by default, as torchvision's ``ImageFolder`` does (Pillow
opens a file without turning it): ``width``/``height``, the size filters, the loader and the
dups report's thumbnails all show the pixels as stored. The catalog keeps each file's
``orientation`` (1-8, 1 meaning upright) so a user can opt in to the turned image
(``DataLoader(exif_orient=True)``, ``QuerySpec(exif_orient=True)``); see docs/concepts.md.

The fast path reads JPEG (the first APP1 Exif segment), PNG (an ``eXIf`` chunk before the
image data) and WebP (no EXIF chunk announced) in microseconds, and answers only where the
answer provably equals Pillow's; anything unusual is Pillow's to read (``pillow_orientation``,
which never decodes pixels).
"""

from __future__ import annotations

import io
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where pixels are turned: a scan only reads headers
    import numpy.typing as npt

UPRIGHT = 1
SWAPS_SIDES = frozenset({5, 6, 7, 8})  # these orientations turn the image by a quarter: width <-> height
_TAG = 0x0112
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def sniff_orientation(data: bytes) -> int | None:
    """The orientation of a JPEG, PNG or WebP from its first bytes; None means ask Pillow."""
    if data[:3] == b"\xff\xd8\xff":
        return _jpeg(data)
    if data[:8] == _PNG_SIGNATURE:
        return _png(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        chunk = data[12:16]
        if chunk in (b"VP8 ", b"VP8L"):
            return UPRIGHT  # a simple WebP has no room for EXIF
        if chunk == b"VP8X" and len(data) >= 21 and not data[20] & 0x08:
            return UPRIGHT  # the EXIF flag is off
    return None


def pillow_orientation(image: Any) -> int:
    """The orientation ``exif_transpose`` would apply to an opened Pillow image, once loaded;
    unloaded, PNG EXIF or XMP after the image data is not read (Pillow would decode the image
    for it)."""
    if image.format == "TIFF":
        return UPRIGHT  # Pillow turns a TIFF itself (its size is already the turned one)
    try:
        if image.format == "PNG" and "exif" not in image.info:
            return UPRIGHT
        value = image.getexif().get(_TAG, UPRIGHT)
    except Exception:  # damaged EXIF: Pillow raises many kinds; exif_transpose would fail alike
        return UPRIGHT
    return value if isinstance(value, int) and 1 <= value <= 8 else UPRIGHT


def read_orientation(data: bytes) -> int:
    """The orientation of the image in ``data`` (1 when it has none or is not an image)."""
    found = sniff_orientation(data)
    if found is not None:
        return found
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return pillow_orientation(image)
    except Exception:  # not an image Pillow opens: the decoder says so, not us
        return UPRIGHT


def apply_orientation(pixels: npt.NDArray[Any], orientation: int) -> npt.NDArray[Any]:
    """``pixels`` (H x W or H x W x C) turned and flipped as ``exif_transpose`` does (a view)."""
    import numpy as np

    if orientation == 2:
        return pixels[:, ::-1]
    if orientation == 3:
        return pixels[::-1, ::-1]
    if orientation == 4:
        return pixels[::-1]
    if orientation == 5:
        return pixels.swapaxes(0, 1)
    if orientation == 6:
        return np.rot90(pixels, -1)
    if orientation == 7:
        return np.rot90(pixels, 2).swapaxes(0, 1)
    if orientation == 8:
        return np.rot90(pixels, 1)
    return pixels


def _jpeg(data: bytes) -> int | None:
    pos, end = 2, len(data)
    found = 0  # the Exif value; 0: no Exif orientation (XMP may then say, as Pillow reads it)
    xmp = False
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xDA:  # start of scan: the header is over
            if not found and xmp:
                return None
            return found or UPRIGHT
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == 0xE1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00" and not found:
            value = _tiff_ifd0(data[pos + 10 : pos + 2 + length])
            if value is None:
                return None
            found = value
        elif marker == 0xE1 and data[pos + 4 : pos + 8] == b"http":  # an XMP packet
            xmp = True
        pos += 2 + length
    return None  # the header runs past what we have


def _png(data: bytes) -> int | None:
    pos = 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        chunk = data[pos + 4 : pos + 8]
        if chunk == b"IDAT":
            return UPRIGHT
        if chunk == b"eXIf":
            body = data[pos + 8 : pos + 8 + length]
            value = _tiff_ifd0(body[6:] if body.startswith(b"Exif\x00\x00") else body)
            return None if value == 0 else value  # 0: none in EXIF, and XMP text may follow
        if (
            chunk in (b"tEXt", b"zTXt", b"iTXt")
            and b"exif" in data[pos + 8 : pos + 8 + min(length, 80)].split(b"\0", 1)[0].lower()
        ):
            return None  # an "exif" or ImageMagick's "Raw profile type exif" text: Pillow's reading
        # Any other text (a comment, the software, a creation time, XMP) says nothing of the
        # orientation unless an eXIf chunk comes too, which this loop still reaches.
        pos += 12 + length
    return None


def _tiff_ifd0(tiff: bytes) -> int | None:
    """The Orientation entry of a TIFF header's first directory (0 when it has none); None for
    anything unusual."""
    if len(tiff) < 8:
        return None
    if tiff[:4] == b"II*\x00":
        order = "<"
    elif tiff[:4] == b"MM\x00*":
        order = ">"
    else:
        return None
    (offset,) = struct.unpack(order + "I", tiff[4:8])
    if offset < 8 or offset + 2 > len(tiff):
        return None
    (count,) = struct.unpack(order + "H", tiff[offset : offset + 2])
    entries = offset + 2
    if entries + 12 * count > len(tiff):
        return None
    for k in range(count):
        at = entries + 12 * k
        tag, kind, n = struct.unpack(order + "HHI", tiff[at : at + 8])
        if tag == _TAG:
            if kind != 3 or n != 1:  # not one SHORT: Pillow's reading of it
                return None
            (value,) = struct.unpack(order + "H", tiff[at + 8 : at + 10])
            return value if 1 <= value <= 8 else UPRIGHT
    return 0
