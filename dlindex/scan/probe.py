"""One file in, one record out: stat, content hash, image header and cheap structural checks.

Pure functions with no catalog access, so they run unchanged in worker processes. The
whole file is read once; the xxh3-128 hash, the header sniffer and the truncation checks
all work on those bytes, so a default scan never re-opens or fully decodes a file.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from typing import NamedTuple

import xxhash
from PIL import Image, ImageFile, UnidentifiedImageError

from dlindex.engines.local import CStderrCapture
from dlindex.orientation import UPRIGHT, pillow_orientation, sniff_orientation
from dlindex.scan.listing import special_reason
from dlindex.scan.options import MAX_PIXELS
from dlindex.scan.sniff import Header, check_structure, jpeg_scan_start, sniff

# Files above this are hashed in chunks and checked from their head and tail only.
WHOLE_READ_LIMIT = 16 * 1024 * 1024
_EDGE = 64 * 1024
_CHUNK = 1024 * 1024
_ERROR_CHARS = 500


class ProbeOptions(NamedTuple):
    """How a probe judges files: decode them (--verify), the pixel limit, following links."""

    verify: bool = False
    max_pixels: int = MAX_PIXELS
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
    orientation: int | None = None  # EXIF orientation, 1-8 (dlindex/orientation.py); None: no header
    # The file's identity when read: a same-size, same-mtime replacement changes it.
    inode: int | None = None
    ctime_ns: int | None = None


class Content(NamedTuple):
    """The bytes read from one file, and what its one read learnt: size, mtime, xxh3-128, identity."""

    size: int
    mtime_ns: int
    digest: str
    head: bytes  # the whole file when size <= WHOLE_READ_LIMIT
    tail: bytes
    inode: int
    ctime_ns: int


NOT_CACHED = Probe("", "not-cached")
_INODE_WRAP = 1 << 64


def stored_inode(st_ino: int) -> int:
    """``st_ino`` as the catalog's ``inode`` holds it: a signed 64-bit integer (SQLite INTEGER,
    PostgreSQL BIGINT), so an inode at or above 2**63 (64-bit file ids: NTFS over SMB, btrfs,
    overlayfs xino) is kept as its two's complement. The scan compares inodes in this form."""
    return st_ino - _INODE_WRAP if st_ino >= 1 << 63 else st_ino


_ONE_BYTE = bytearray(1)


def read_content(path: bytes, follow_symlinks: bool = False, only_if_cached: bool = False) -> Content | Probe:
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
            digest = xxhash.xxh3_128_hexdigest(data)
            return Content(len(data), st.st_mtime_ns, digest, data, data, stored_inode(st.st_ino), st.st_ctime_ns)
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


def _read_large(fd: int, st: os.stat_result) -> Content:
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
    return Content(size, st.st_mtime_ns, hasher.hexdigest(), head, last, stored_inode(st.st_ino), st.st_ctime_ns)


def probe_file(path: bytes, key: str, options: ProbeOptions, stderr_capture: CStderrCapture | None = None) -> Probe:
    """Probe one file: never raises for anything the file's content can do."""
    content = read_content(path, options.follow_symlinks)
    if isinstance(content, Probe):
        return content._replace(key=key)
    return inspect_content(path, key, content, options, stderr_capture)


def inspect_content(
    path: bytes,
    key: str,
    content: Content,
    options: ProbeOptions,
    stderr_capture: CStderrCapture | None = None,
) -> Probe:
    """Judge one file from its bytes: header, pixel limits, truncation, with --verify a decode."""
    size, mtime_ns, digest = content.size, content.mtime_ns, content.digest
    inode, ctime_ns = content.inode, content.ctime_ns
    if size == 0:
        return Probe(key, "corrupt", size, mtime_ns, digest, error="empty file", inode=inode, ctime_ns=ctime_ns)
    whole = size <= WHOLE_READ_LIMIT

    def source() -> io.BytesIO | bytes:
        # Small files are already in memory; large ones Pillow reads by path.
        return io.BytesIO(content.head) if whole else path

    header, scan_start = sniff(content.head)
    warning = None
    limit: int | None = None
    used_pillow = header is None
    orientation = sniff_orientation(content.head) if header is not None else None
    if header is not None and orientation is None:
        orientation = _pillow_orientation(source())  # EXIF or XMP the sniffer leaves to Pillow
    if header is None:
        try:
            header, warning, orientation = _pillow_header(source(), options.max_pixels, size)
        except Exception as e:  # Pillow raises many types for hostile files; each is a finding
            limit = options.max_pixels if isinstance(e, Image.DecompressionBombError) else None
            return Probe(
                key, "corrupt", size, mtime_ns, digest, error=_exc_text(e), warning=_take(stderr_capture),
                pixel_limit=limit, inode=inode, ctime_ns=ctime_ns,
            )  # fmt: skip
        if header.format in ("JPEG", "MPO"):
            scan_start = jpeg_scan_start(content.head)
    fmt, width, height, mode = header
    pixels = width * height
    problem: str | None = None
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
        limit, orientation, inode, ctime_ns,
    )  # fmt: skip


# -- Pillow ----------------------------------------------------------------------------


def _pillow_header(fp: io.BytesIO | bytes, max_pixels: int, size: int) -> tuple[Header, str | None, int]:
    """The header, Pillow's warnings, and the EXIF orientation."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _bomb_limit(max_pixels), Image.open(fp) as im:
            header = Header(str(im.format), int(im.width), int(im.height), str(im.mode))
            problem = _raw_tiles_problem(im, size)
            orientation = pillow_orientation(im)
    if problem:
        raise OSError(problem)
    return header, _warning_text(caught), orientation


def _raw_tiles_problem(im: ImageFile.ImageFile, size: int) -> str | None:
    """Uncompressed pixel data must lie inside the file: a free truncation check (BMP, PPM...)."""
    for tile in im.tile:
        if tile.codec_name != "raw":
            continue
        _, y0, _, y1 = tile.extents or (0, 0, im.width, im.height)
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


def _pillow_orientation(fp: io.BytesIO | bytes) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(fp) as im:
                return pillow_orientation(im)
    except Exception:  # the header itself was sniffed fine: no orientation is upright
        return UPRIGHT


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
