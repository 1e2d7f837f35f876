"""Image facts straight from a file's bytes, without Pillow: header fields, and truncation.

The sniffers answer JPEG, PNG and WebP headers in microseconds, and only where the answer
provably equals Pillow's; the structural checks look at the bytes already read for the end a
format must have.
"""

from __future__ import annotations

import struct
from typing import NamedTuple


class Header(NamedTuple):
    """An image's format, size and mode, as Pillow reports them."""

    format: str
    width: int
    height: int
    mode: str


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_MODES = {
    (1, 0): "1", (2, 0): "L", (4, 0): "L", (8, 0): "L", (16, 0): "I;16",
    (8, 2): "RGB", (16, 2): "RGB",
    (1, 3): "P", (2, 3): "P", (4, 3): "P", (8, 3): "P",
    (8, 4): "LA", (16, 4): "RGBA", (8, 6): "RGBA", (16, 6): "RGBA",
}  # fmt: skip
_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def sniff_header(data: bytes) -> Header | None:
    """Read format, size and mode of a JPEG, PNG or WebP in ~2 us; None means ask Pillow.

    Answers only where the result provably equals Pillow's; anything unusual falls back.
    """
    return sniff(data)[0]


def sniff(data: bytes) -> tuple[Header | None, int | None]:
    """The header, and for a JPEG where its scan data starts (one pass over the markers)."""
    if data[:3] == b"\xff\xd8\xff":
        return _sniff_jpeg(data)
    if data[:8] == _PNG_SIGNATURE:
        return _sniff_png(data), None
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _sniff_webp(data), None
    return None, None


def _sniff_jpeg(data: bytes) -> tuple[Header | None, int | None]:
    pos, end = 2, len(data)
    found: Header | None = None
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None, None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xDA:  # start of scan: the header is over
            return found, pos
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == 0xE2 and data[pos + 4 : pos + 8] == b"MPF\x00":
            return None, None  # multi-picture: Pillow reports MPO
        if marker in _JPEG_SOF and found is None and pos + 10 <= end:
            height = (data[pos + 5] << 8) | data[pos + 6]
            width = (data[pos + 7] << 8) | data[pos + 8]
            mode = _JPEG_MODES.get(data[pos + 9])
            if mode is None or height == 0:
                return None, None
            found = Header("JPEG", width, height, mode)
        pos += 2 + length
    return None, None


def _sniff_png(data: bytes) -> Header | None:
    if len(data) < 29 or data[12:16] != b"IHDR":
        return None
    width, height, depth, color, compression, filtering, interlace = struct.unpack(">IIBBBBB", data[16:29])
    mode = _PNG_MODES.get((depth, color))
    if mode is None or compression or filtering or interlace > 1:
        return None
    # Pillow inflates compressed text chunks while reading the header (and refuses
    # oversized ones): leave files with such chunks before the image data to it.
    pos = 33
    while pos + 8 <= len(data):
        chunk = data[pos + 4 : pos + 8]
        if chunk == b"IDAT":
            return Header("PNG", width, height, mode)
        length = int.from_bytes(data[pos : pos + 4], "big")
        if chunk in (b"zTXt", b"iTXt"):
            return None
        if chunk == b"iCCP":
            name_end = data.find(b"\x00", pos + 8, pos + 8 + min(length, 80))
            if name_end < 0 or data[name_end + 1 : name_end + 2] != b"\x00" or length > 65536:
                return None  # an unknown compression method or a huge profile: Pillow's call
        pos += 12 + length
    return None


def _sniff_webp(data: bytes) -> Header | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return Header("WEBP", width & 0x3FFF, height & 0x3FFF, "RGB")
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        alpha = bool(bits >> 28 & 1)
        return Header("WEBP", (bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1, "RGBA" if alpha else "RGB")
    if chunk == b"VP8X" and len(data) >= 30:
        flags = data[20]
        if flags & 0x02:
            return None  # animated: Pillow's own rules apply
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return Header("WEBP", width, height, "RGBA" if flags & 0x10 else "RGB")
    return None


# -- truncation -----------------------------------------------------------------


def check_structure(fmt: str, head: bytes, tail: bytes, size: int, scan_start: int | None) -> str | None:
    """Catch truncation from bytes already read: None when the file ends as its format must."""
    if fmt in ("JPEG", "MPO"):
        eoi = tail.rfind(b"\xff\xd9")
        eoi_at = size - len(tail) + eoi if eoi >= 0 else -1
        if eoi_at < 0 or (scan_start is not None and eoi_at < scan_start):
            return "truncated JPEG: no end-of-image marker after the image data"
        return None
    if fmt == "PNG":
        if tail.rfind(b"IEND") < 0:
            return "truncated PNG: no IEND chunk"
        return None
    if fmt == "WEBP" and len(head) >= 8:
        riff_size = int.from_bytes(head[4:8], "little")
        if 8 + riff_size > size:
            return f"truncated WebP: RIFF header says {8 + riff_size} bytes, file has {size}"
    return None


def jpeg_scan_start(data: bytes) -> int | None:
    """Where a JPEG's scan data starts (its start-of-scan marker); None if no marker walk finds it."""
    pos, end = 2, len(data)
    while pos + 4 <= end and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker == 0xDA:
            return pos
        pos += 2 + ((data[pos + 2] << 8) | data[pos + 3])
    return None
