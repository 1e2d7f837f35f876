"""Image bytes to a uint8 H x W x C array at the size training wants, by the fastest exact decoder.

JPEG goes through simplejpeg (libjpeg-turbo's TurboJPEG API, accurate integer IDCT, fancy
upsampling): when the target is at most half the size it asks for a reduced decode (1/2,
1/4 or 1/8: libjpeg-turbo's SIMD scaled IDCTs; 5/8 or 3/4 are slower than a full decode).
Other formats, and JPEGs simplejpeg refuses (CMYK, damaged), go through Pillow, with
``draft`` for JPEG. The resize to the exact size is antialiased bilinear: torch's uint8
kernel when torch is already imported (a loader's workers; 3-4x faster, within one level of
Pillow's), else Pillow's BILINEAR. Both decoders release the GIL (docs/training.md#decoding).
The pixel limit is checked from the header, before any pixel is allocated. Pixels are the
stored ones, as torchvision's ImageFolder sees them; ``ImageSpec.exif_orient`` turns them as
the EXIF orientation says first (dlindex/orientation.py), and ``size`` is then the turned one.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import median
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from dlindex.errors import DlindexError
from dlindex.orientation import SWAPS_SIDES, UPRIGHT, apply_orientation, pillow_orientation, read_orientation

try:
    import simplejpeg
except ImportError:  # no wheel for this platform: Pillow decodes every format
    simplejpeg = None

Pixels = npt.NDArray[np.uint8]
MODES = {"RGB": ("RGB", 3), "L": ("GRAY", 1)}
MAX_SIDE = 1 << 15
_SOI = b"\xff\xd8\xff"
_SIXTEEN_BIT = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


class DecodeError(DlindexError):
    """These bytes are not an image this loader can decode (corrupt, unknown, too large)."""


@dataclass(frozen=True)
class ImageSpec:
    """What a decoded image must be: ``size`` (height, width) or None for its own, ``mode``
    ``"RGB"`` (3 channels) or ``"L"`` (1); ``exif_orient``: turn the image as its EXIF
    orientation says (else the stored pixels)."""

    size: tuple[int, int] | None = None
    mode: str = "RGB"
    exif_orient: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise DlindexError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.size is not None and not all(isinstance(s, int) and 0 < s <= MAX_SIDE for s in self.size):
            raise DlindexError(f"image_size must be two sides of 1 to {MAX_SIDE} pixels, not {self.size!r}")


def jpeg_scale(src_h: int, src_w: int, h: int, w: int) -> Fraction:
    """The smallest of libjpeg's fast scales (1/8, 1/4, 1/2) whose output (each side rounded
    up) still covers h x w; 1 when none does."""
    for k in (8, 4, 2):
        if -(-src_h // k) >= h and -(-src_w // k) >= w:
            return Fraction(1, k)
    return Fraction(1)


def decode_image(data: bytes, spec: ImageSpec, *, channels_first: bool = False) -> Pixels:
    """The image in ``data`` as a C-contiguous uint8 H x W x C array; DecodeError if it is not one.

    ``channels_first``: C x H x W instead, as a model takes it; it may be a strided view (one
    copy into a batch then makes it contiguous). The resize works channels-first, so this
    saves two transposing copies per image (about 0.3 ms at 224 x 224 on one core)."""
    array = None
    if simplejpeg is not None and data[:3] == _SOI:
        turn = read_orientation(data) if spec.exif_orient else UPRIGHT
        array = _jpeg(data, spec, turn)
        if array is not None and turn != UPRIGHT:
            array = np.ascontiguousarray(apply_orientation(array, turn))
    if array is None:
        array = _pillow(data, spec)
    if spec.size is not None and array.shape[:2] != spec.size:
        return _resize(array, spec.size, channels_first)
    return array.transpose(2, 0, 1) if channels_first else array


def _limit() -> int | None:
    return Image.MAX_IMAGE_PIXELS  # read each time: a user may raise it, as for Pillow itself


def _check_pixels(width: int, height: int) -> None:
    limit = _limit()
    if limit is not None and width * height > limit:
        raise DecodeError(f"image of {width}x{height} pixels is over the pixel limit ({limit}); not decoded")


def _jpeg(data: bytes, spec: ImageSpec, turn: int) -> Pixels | None:
    colorspace, channels = MODES[spec.mode]
    try:
        height, width, kind, _ = simplejpeg.decode_jpeg_header(data)
    except Exception:  # not one simplejpeg reads: Pillow decides
        return None
    _check_pixels(width, height)
    if kind in ("CMYK", "YCCK"):
        return None
    want_h = want_w = 0
    if spec.size is not None:
        want = spec.size[::-1] if turn in SWAPS_SIDES else spec.size  # the target, as stored
        scale = jpeg_scale(height, width, *want)  # asked as the exact scaled size: simplejpeg picks it
        want_h, want_w = (
            -(-height * scale.numerator // scale.denominator),
            -(-width * scale.numerator // scale.denominator),
        )
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace=colorspace, fastdct=False, fastupsample=False,
                                        min_height=want_h, min_width=want_w, strict=True)  # fmt: skip
    except Exception:  # damaged (even a recoverable warning): Pillow's verdict and message
        return None
    array: Pixels = np.asarray(pixels, dtype=np.uint8)
    return array.reshape(array.shape[0], array.shape[1], channels)


def _pillow(data: bytes, spec: ImageSpec) -> Pixels:
    """Pillow's decode, without its warnings: an image over the limit is ours to refuse in one
    DecodeError, and damage Pillow recovers from is no news per sample to a training job
    (catch_warnings is process-wide: a loader worker decodes in one thread)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")
        return _pillow_decode(data, spec)


def _pillow_decode(data: bytes, spec: ImageSpec) -> Pixels:
    try:
        with Image.open(io.BytesIO(data)) as opened:
            _check_pixels(*opened.size)
            if spec.size is not None and opened.format == "JPEG":
                turned = spec.exif_orient and pillow_orientation(opened) in SWAPS_SIDES
                # DCT scaling, never below the target (as stored: (width, height) of the turned one)
                opened.draft(spec.mode, spec.size if turned else (spec.size[1], spec.size[0]))
            opened.load()
            turn = pillow_orientation(opened) if spec.exif_orient else UPRIGHT  # loaded: all of the EXIF
            image: Image.Image = opened
            if image.mode in _SIXTEEN_BIT:
                image = _eight_bit(image)
            if image.mode == "LAB":
                image = image.convert("RGB")  # Pillow converts LAB to RGB only (by ImageCms), not to L
            if image.mode != spec.mode:
                image = image.convert(spec.mode)
            array = np.array(image, dtype=np.uint8)  # writable: torch takes it without a copy warning
            if turn != UPRIGHT:
                array = np.ascontiguousarray(apply_orientation(array, turn))
    except DecodeError:
        raise
    except Exception as e:  # Pillow raises many kinds (OSError, SyntaxError, ValueError, struct.error...)
        raise DecodeError(f"cannot decode image: {_one_line(e)}") from None
    return np.ascontiguousarray(array.reshape(array.shape[0], array.shape[1], MODES[spec.mode][1]))


def _eight_bit(image: Image.Image) -> Image.Image:
    """A 16-bit or float grey image scaled to 8 bits (Pillow's convert would clip it)."""
    values = np.asarray(image.convert("F") if image.mode == "F" else image.convert("I"), dtype=np.float64)
    top = 65535.0 if image.mode != "F" else max(float(values.max(initial=1.0)), 1e-12)
    return Image.fromarray(np.clip(values / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")


def _resize(array: Pixels, size: tuple[int, int], channels_first: bool) -> Pixels:
    height, width = size
    torch = _loaded_torch()
    if torch is not None:
        image = torch.from_numpy(array).permute(2, 0, 1)[None]  # a channels-last view: the fast uint8 kernel
        out = torch.nn.functional.interpolate(image, size=size, mode="bilinear", antialias=True, align_corners=False)
        chw: Pixels = out[0].numpy()  # the kernel writes C x H x W, contiguous
        return chw if channels_first else np.ascontiguousarray(chw.transpose(1, 2, 0))
    if array.shape[2] == 1:
        grey = Image.fromarray(array[:, :, 0], "L").resize((width, height), Image.Resampling.BILINEAR)
        hwc = np.asarray(grey, dtype=np.uint8)[:, :, None].copy()
    else:
        hwc = np.asarray(
            Image.fromarray(array, "RGB").resize((width, height), Image.Resampling.BILINEAR), dtype=np.uint8
        )
    return hwc.transpose(2, 0, 1) if channels_first else hwc


def _loaded_torch() -> Any:
    """torch where the process already has it (fully imported), else None: never imported for this."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and hasattr(torch, "nn") else None


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def one_core_rate(
    samples: Sequence[bytes], spec: ImageSpec, seconds: float = 2.0, *, channels_first: bool = True
) -> float:
    """Images a second one thread decodes with ``decode_image`` (median of three rounds);
    channels-first by default, as the loader decodes."""
    if not samples:
        return 0.0
    # torch's resize would spread over every core: pin it to one, as in a DataLoader worker
    torch = _loaded_torch()
    threads = torch.get_num_threads() if torch is not None else 1
    if torch is not None:
        torch.set_num_threads(1)
    try:
        rates = []
        for _ in range(3):
            done, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < seconds / 3 or not done:
                for data in samples:
                    with contextlib.suppress(DecodeError):
                        decode_image(data, spec, channels_first=channels_first)
                    done += 1
            rates.append(done / elapsed)
    finally:
        if torch is not None:
            torch.set_num_threads(threads)
    return float(median(rates))
