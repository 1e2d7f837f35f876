"""One file in, one record out: stat, content hash, image header and cheap structural checks.

Pure functions with no catalog access, so they run unchanged in worker processes. The
whole file is read once; the xxh3-128 hash, the header sniffer and the truncation checks
all work on those bytes, so a default scan never re-opens or fully decodes a file.
"""

from __future__ import annotations

import io
import os
import stat
import struct
import warnings
from typing import NamedTuple

import xxhash
from PIL import Image, UnidentifiedImageError

from dlindex.procs import CStderrCapture
from dlindex.scan.walk import special_reason

# Files above this are hashed in chunks and checked from their head and tail only.
WHOLE_READ_LIMIT = 16 * 1024 * 1024
_EDGE = 64 * 1024
_CHUNK = 1024 * 1024
_ERROR_CHARS = 500


class ProbeOptions(NamedTuple):
    verify: bool = False
    max_pixels: int = 89_478_485  # Pillow's MAX_IMAGE_PIXELS; twice this is a bomb
    follow_symlinks: bool = True  # as scan does; False opens with O_NOFOLLOW


class Probe(NamedTuple):
    """What a worker learnt about one file. ``kind`` is ok | corrupt | skipped | error."""

    key: str
    kind: str
    bytes: int | None = None
    mtime_ns: int | None = None
    xxh3_128: str | None = None
    width: int | None = None
    height: int | None = None
    format: str | None = None
    mode: str | None = None
    error: str | None = None
    warning: str | None = None
    # The --max-pixels this verdict depends on (above twice it: corrupt; with --verify,
    # above it: not decoded); None when the limit played no part.
    pixel_limit: int | None = None


class Header(NamedTuple):
    format: str
    width: int
    height: int
    mode: str


class _Content(NamedTuple):
    size: int
    mtime_ns: int
    digest: str
    head: bytes  # the whole file when size <= WHOLE_READ_LIMIT
    tail: bytes


NOT_CACHED = Probe("", "not-cached")
_ONE_BYTE = bytearray(1)


def read_content(path: bytes, follow_symlinks: bool = False, only_if_cached: bool = False) -> _Content | Probe:
    """Open without blocking (a FIFO must never hang us), refuse non-regular files, hash it all.

    Args:
        only_if_cached: return NOT_CACHED instead of waiting for the disk when the file's
            last byte is not in the page cache (the caller then reads it from a thread).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    key = ""
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return Probe(key, "error", error=_os_error("cannot open", e))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Probe(key, "skipped", error=special_reason(st.st_mode))  # the skip reason
        if only_if_cached and st.st_size and not _in_page_cache(fd, st.st_size):
            return NOT_CACHED
        if st.st_size <= WHOLE_READ_LIMIT:
            data = _read_all(fd, st.st_size)
            return _Content(len(data), st.st_mtime_ns, xxhash.xxh3_128_hexdigest(data), data, data)
        return _read_large(fd, st)
    except OSError as e:
        return Probe(key, "error", error=_os_error("cannot read", e))
    finally:
        os.close(fd)


def _in_page_cache(fd: int, size: int) -> bool:
    try:
        os.preadv(fd, [_ONE_BYTE], size - 1, os.RWF_NOWAIT)
    except BlockingIOError:
        return False
    except (OSError, AttributeError):  # no RWF_NOWAIT here: just read
        return True
    return True


def _read_all(fd: int, size: int) -> bytes:
    data = os.read(fd, size)
    if len(data) == size:
        return data  # a file that grows meanwhile is caught by the next scan's mtime check
    parts = [data]
    while chunk := os.read(fd, _CHUNK):  # short reads, or the file shrank and grew
        parts.append(chunk)
    return b"".join(parts)


def _read_large(fd: int, st: os.stat_result) -> _Content:
    hasher = xxhash.xxh3_128()
    head = b""
    size = 0
    last = b""
    while chunk := os.read(fd, _CHUNK):
        if not head:
            head = chunk[:_EDGE]
        hasher.update(chunk)
        size += len(chunk)
        last = (last + chunk)[-_EDGE:]
    return _Content(size, st.st_mtime_ns, hasher.hexdigest(), head, last)


def probe_file(path: bytes, key: str, options: ProbeOptions, stderr_capture: CStderrCapture | None = None) -> Probe:
    """Probe one file: never raises for anything the file's content can do."""
    content = read_content(path, options.follow_symlinks)
    if isinstance(content, Probe):
        return content._replace(key=key)
    return inspect_content(path, key, content, options, stderr_capture)


def inspect_content(
    path: bytes,
    key: str,
    content: _Content,
    options: ProbeOptions,
    stderr_capture: CStderrCapture | None = None,
) -> Probe:
    size, mtime_ns, digest = content.size, content.mtime_ns, content.digest
    if size == 0:
        return Probe(key, "corrupt", size, mtime_ns, digest, error="empty file")
    whole = size <= WHOLE_READ_LIMIT

    def source() -> io.BytesIO | bytes:
        # Small files are already in memory; large ones Pillow reads by path.
        return io.BytesIO(content.head) if whole else path

    header, scan_start = _sniff(content.head)
    warning = None
    used_pillow = header is None
    if header is None:
        try:
            header, warning = _pillow_header(source(), options.max_pixels, size)
        except Exception as e:  # Pillow raises many types for hostile files; each is a finding
            limit = options.max_pixels if isinstance(e, Image.DecompressionBombError) else None
            return Probe(
                key, "corrupt", size, mtime_ns, digest, error=_exc_text(e), warning=_take(stderr_capture),
                pixel_limit=limit,
            )  # fmt: skip
        if header.format in ("JPEG", "MPO"):
            scan_start = _jpeg_scan_start(content.head)
    fmt, width, height, mode = header
    pixels = width * height
    problem: str | None = None
    limit: int | None = None
    if pixels > 2 * options.max_pixels:
        limit = options.max_pixels
        problem = (
            f"DecompressionBombError: image size ({pixels} pixels) exceeds limit of {2 * options.max_pixels} pixels"
        )
    elif width <= 0 or height <= 0:
        problem = f"invalid image size {width}x{height}"
    else:
        problem = check_structure(fmt, content.head, content.tail, size, scan_start)
        if problem is None and options.verify:
            if pixels > options.max_pixels:
                limit = options.max_pixels
                warning = _join(warning, f"not decoded: {pixels} pixels exceeds --max-pixels {options.max_pixels}")
            else:
                used_pillow = True
                try:
                    warning = _join(warning, _pillow_decode(source()))
                except Exception as e:  # a decoder's complaint is the verdict we asked for
                    problem = _exc_text(e)
    if used_pillow:
        warning = _join(warning, _take(stderr_capture))
    # One construction per file: this runs 50,000 times in a scan of 50,000 files.
    return Probe(
        key, "ok" if problem is None else "corrupt", size, mtime_ns, digest, width, height, fmt, mode, problem, warning,
        limit,
    )  # fmt: skip


# -- header sniffing -------------------------------------------------------------------

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
    return _sniff(data)[0]


def _sniff(data: bytes) -> tuple[Header | None, int | None]:
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


# -- structural checks -----------------------------------------------------------------


def check_structure(fmt: str, head: bytes, tail: bytes, size: int, jpeg_scan_start: int | None) -> str | None:
    """Catch truncation from bytes already read: None when the file ends as its format must."""
    if fmt in ("JPEG", "MPO"):
        eoi = tail.rfind(b"\xff\xd9")
        eoi_at = size - len(tail) + eoi if eoi >= 0 else -1
        if eoi_at < 0 or (jpeg_scan_start is not None and eoi_at < jpeg_scan_start):
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


def _jpeg_scan_start(data: bytes) -> int | None:
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


# -- Pillow ----------------------------------------------------------------------------


def _pillow_header(fp: io.BytesIO | bytes, max_pixels: int, size: int) -> tuple[Header, str | None]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _bomb_limit(max_pixels), Image.open(fp) as im:
            header = Header(str(im.format), int(im.width), int(im.height), str(im.mode))
            problem = _raw_tiles_problem(im, size)
    if problem:
        raise OSError(problem)
    return header, _warning_text(caught)


def _raw_tiles_problem(im: Image.Image, size: int) -> str | None:
    """Uncompressed pixel data must lie inside the file: a free truncation check (BMP, PPM...)."""
    for tile in im.tile:
        if tile.codec_name != "raw":
            continue
        x0, y0, x1, y1 = tile.extents or (0, 0, im.width, im.height)
        stride = tile.args[1] if isinstance(tile.args, tuple) and len(tile.args) > 1 else 0
        needed = tile.offset + (stride * (y1 - y0) if isinstance(stride, int) and stride > 0 else 1)
        # Rows are padded to 4 bytes; writers may omit the last row's padding.
        if needed - 3 > size:
            return f"image file is truncated: pixel data needs {needed} bytes, file has {size}"
    return None


def _pillow_decode(fp: io.BytesIO | bytes) -> str | None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Image.open(fp) as im:
            im.load()
    return _warning_text(caught)


class _bomb_limit:
    """Pillow refuses headers above 2x MAX_IMAGE_PIXELS before allocating anything."""

    def __init__(self, max_pixels: int) -> None:
        self.max_pixels = max_pixels

    def __enter__(self) -> None:
        self.saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = self.max_pixels

    def __exit__(self, *exc: object) -> None:
        Image.MAX_IMAGE_PIXELS = self.saved


def _warning_text(caught: list[warnings.WarningMessage]) -> str | None:
    texts = dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught)
    return "; ".join(texts)[:_ERROR_CHARS] if texts else None


def _exc_text(e: BaseException) -> str:
    if isinstance(e, UnidentifiedImageError):
        return "UnidentifiedImageError: cannot identify image file"
    return f"{type(e).__name__}: {e}"[:_ERROR_CHARS]


def _os_error(what: str, e: OSError) -> str:
    return f"{what}: {e.strerror or e}"


def _join(a: str | None, b: str | None) -> str | None:
    if a and b:
        return f"{a}; {b}"[:_ERROR_CHARS]
    return a or b


def _take(capture: CStderrCapture | None) -> str | None:
    return capture.take() if capture is not None else None
