"""decode_image gives the right uint8 array for every format Pillow writes, close to Pillow's
own decode and resize, and DecodeError (only that) for damaged, oversized or unknown bytes."""

from __future__ import annotations

import io
import json
import sys
import tracemalloc
import zlib
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, features

from dlindex.loader.decode import DecodeError, ImageSpec, decode_image, jpeg_scale, one_core_rate

from .conftest import CORPUS, CORPUS_EXPECTED

SPECS = [ImageSpec(), ImageSpec(mode="L"), ImageSpec((20, 30)), ImageSpec((20, 30), "L"), ImageSpec((9, 11))]
FAST_SCALES = {Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1)}


def _smooth(size: tuple[int, int], seed: int = 0) -> Image.Image:
    """A photo-like RGB image (w x h): low-frequency colour, so reduced decodes are near exact."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    return coarse.resize(size, Image.Resampling.BICUBIC)


def _encode(image: Image.Image, fmt: str, **save: object) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **save)
    return out.getvalue()


def _grey16() -> Image.Image:
    ramp = np.linspace(0, 65535, 48 * 40).reshape(40, 48).astype(np.uint16)
    return Image.fromarray(ramp)  # mode "I;16"


def _samples() -> dict[str, bytes]:
    rgb = _smooth((48, 40))
    found = {
        "jpeg-rgb": _encode(rgb, "JPEG", quality=90),
        "jpeg-grey": _encode(rgb.convert("L"), "JPEG"),
        "jpeg-cmyk": _encode(rgb.convert("CMYK"), "JPEG"),
        "png-rgb": _encode(rgb, "PNG"),
        "png-rgba": _encode(rgb.convert("RGBA"), "PNG"),
        "png-palette": _encode(rgb.convert("P"), "PNG"),
        "png-grey16": _encode(_grey16(), "PNG"),
        "gif": _encode(rgb, "GIF"),
        "bmp": _encode(rgb, "BMP"),
        "tiff": _encode(rgb, "TIFF"),
        "tiff-lab": _encode(rgb.convert("LAB"), "TIFF"),
    }
    if features.check("webp"):
        found["webp"] = _encode(rgb, "WEBP")
    return found


SAMPLES = _samples()


@pytest.mark.parametrize("spec", SPECS, ids=repr)
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_format_gives_a_contiguous_uint8_array_of_the_spec(name: str, spec: ImageSpec) -> None:
    array = decode_image(SAMPLES[name], spec)
    channels = 3 if spec.mode == "RGB" else 1
    assert array.shape == (*(spec.size or (40, 48)), channels)
    assert array.dtype == np.uint8
    assert array.flags.c_contiguous


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_palette_with_transparency_bytes_decodes_to_its_colours_without_a_warning(mode: str) -> None:
    # openclipart's PNGs: a palette whose tRNS chunk Pillow keeps as bytes (and warns about on convert)
    palette = _smooth((48, 40)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    data = _encode(palette, "PNG", transparency=bytes([0, 128] + [255] * 14))
    reference = Image.open(io.BytesIO(data))
    assert isinstance(reference.info["transparency"], bytes)
    expected = np.asarray(reference.convert("RGBA").convert(mode), dtype=np.uint8)
    array = decode_image(data, ImageSpec(mode=mode))
    assert np.array_equal(array.reshape(expected.shape), expected)


def test_sixteen_bit_grey_is_scaled_to_eight_bits_not_clipped() -> None:
    array = decode_image(SAMPLES["png-grey16"], ImageSpec(mode="L"))
    expected = np.round(np.asarray(_grey16(), dtype=np.float64) / 65535 * 255)
    assert np.abs(array[:, :, 0].astype(np.int16) - expected).max() <= 1


@pytest.mark.parametrize(
    ("source", "target"), [((500, 375), (224, 224)), ((1000, 750), (224, 224)), ((1000, 750), (100, 100))]
)
def test_reduced_jpeg_decode_and_resize_are_close_to_pillow_full_decode(
    source: tuple[int, int], target: tuple[int, int]
) -> None:
    data = _encode(_smooth(source, seed=1), "JPEG", quality=90)
    with Image.open(io.BytesIO(data)) as image:
        reference = np.asarray(image.convert("RGB").resize(target, Image.Resampling.BILINEAR), dtype=np.int16)
    array = decode_image(data, ImageSpec((target[1], target[0])))
    assert array.shape == (target[1], target[0], 3)
    assert np.abs(array.astype(np.int16) - reference).mean() < 3


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_torch_and_pillow_resizes_agree_within_one_level(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")  # the torch path is taken only when torch is already imported
    data = _encode(_smooth((300, 200), seed=2).convert(mode), "PNG")
    spec = ImageSpec((150, 97), mode)
    with_torch = decode_image(data, spec)
    with Image.open(io.BytesIO(data)) as image:
        pillow = np.asarray(image.resize((97, 150), Image.Resampling.BILINEAR)).reshape(with_torch.shape)
    assert np.abs(with_torch.astype(np.int16) - pillow).max() <= 1
    monkeypatch.delitem(sys.modules, "torch")  # as in a process that never imported it: Pillow's resize, exactly
    without_torch = decode_image(data, spec)
    assert without_torch.flags.c_contiguous
    assert np.array_equal(without_torch, pillow)


@pytest.mark.parametrize("torch_present", [True, False])
@pytest.mark.parametrize("size", [(150, 97), (300, 200)])  # resized, and already at the size
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_channels_first_is_the_same_pixels_transposed(
    mode: str, size: tuple[int, int], torch_present: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if torch_present:
        pytest.importorskip("torch")
    else:
        monkeypatch.delitem(sys.modules, "torch", raising=False)
    data = _encode(_smooth((300, 200), seed=3).convert(mode), "PNG")
    spec = ImageSpec(size, mode)
    hwc = decode_image(data, spec)
    chw = decode_image(data, spec, channels_first=True)
    assert hwc.flags.c_contiguous
    assert chw.shape == (hwc.shape[2], *hwc.shape[:2])
    assert np.array_equal(chw, hwc.transpose(2, 0, 1))


@pytest.mark.parametrize(
    ("src", "target", "scale"),
    [
        ((375, 500), (224, 224), Fraction(1)),
        ((750, 1000), (224, 224), Fraction(1, 2)),
        ((750, 1000), (100, 100), Fraction(1, 4)),
        ((800, 800), (100, 100), Fraction(1, 8)),
        ((801, 801), (101, 101), Fraction(1, 8)),  # 801/8 rounds up to 101
        ((799, 799), (101, 101), Fraction(1, 4)),
        ((4000, 3000), (1, 1), Fraction(1, 8)),
        ((100, 100), (224, 224), Fraction(1)),  # upscaling: full decode
    ],
)
def test_jpeg_scale_table(src: tuple[int, int], target: tuple[int, int], scale: Fraction) -> None:
    assert jpeg_scale(*src, *target) == scale


def _covers(src: tuple[int, int], target: tuple[int, int], scale: Fraction) -> bool:
    return all(-(-s * scale.numerator // scale.denominator) >= t for s, t in zip(src, target, strict=True))


sides = st.integers(1, 20000)


@given(sides, sides, sides, sides)
def test_jpeg_scale_is_the_smallest_fast_scale_that_covers(src_h: int, src_w: int, h: int, w: int) -> None:
    scale = jpeg_scale(src_h, src_w, h, w)
    assert scale in FAST_SCALES
    if scale != 1:
        assert _covers((src_h, src_w), (h, w), scale)
    if scale != Fraction(1, 8):
        assert not _covers((src_h, src_w), (h, w), scale / 2)


def _huge_jpeg_header(width: int, height: int) -> bytes:
    """A real JPEG's tables with its SOF0 frame size rewritten, and no scan data after."""
    data = bytearray(_encode(Image.new("RGB", (16, 16), (90, 10, 200)), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data[: data.index(b"\xff\xda") + 14])


def _huge_png_header(width: int, height: int) -> bytes:
    """A real PNG with its IHDR size (and CRC) rewritten."""
    data = bytearray(_encode(Image.new("RGB", (16, 16)), "PNG"))
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(data[12:29]).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize(
    "header", [_huge_jpeg_header(60000, 60000), _huge_png_header(100000, 100000)], ids=["jpeg", "png"]
)
def test_header_over_the_pixel_limit_is_refused_before_decoding(header: bytes) -> None:
    with pytest.raises(DecodeError, match="limit"):
        decode_image(header, ImageSpec((32, 32)))


@pytest.mark.filterwarnings("error")  # refused in one DecodeError: no DecompressionBombWarning first
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_pixel_limit_is_read_at_each_call_and_checked_before_allocation(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _encode(_smooth((1000, 750)), fmt)
    tracemalloc.start()
    try:
        decode_image(data, ImageSpec())
        decoded_peak = tracemalloc.get_traced_memory()[1]
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000 * 750 - 1)
        tracemalloc.reset_peak()
        with pytest.raises(DecodeError, match=r"1000x750 pixels is over the pixel limit \(749999\)"):
            decode_image(data, ImageSpec())
        refused_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decoded_peak > 1000 * 750 * 3  # the decoded array is traced, so the check below means something
    assert refused_peak < 256 * 1024


DAMAGED = {
    "empty": b"",
    "garbage": bytes(range(256)) * 4,
    "jpeg-magic-then-garbage": b"\xff\xd8\xff" + b"\x00\x17" * 100,
    "png-magic-then-garbage": b"\x89PNG\r\n\x1a\n" + b"\x07" * 100,
    "jpeg-truncated": SAMPLES["jpeg-rgb"][: len(SAMPLES["jpeg-rgb"]) // 2],
    "jpeg-header-only": _huge_jpeg_header(16, 16),
    "png-truncated": SAMPLES["png-rgb"][: len(SAMPLES["png-rgb"]) // 2],
    "gif-truncated": SAMPLES["gif"][:40],
}


@pytest.mark.parametrize("spec", [ImageSpec(), ImageSpec((8, 8), "L")], ids=repr)
@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damaged_bytes_raise_decode_error(name: str, spec: ImageSpec) -> None:
    with pytest.raises(DecodeError) as raised:
        decode_image(DAMAGED[name], spec)
    assert "\n" not in str(raised.value)


def _decodes_or_refuses(data: bytes, spec: ImageSpec, must_decode: bool = False) -> None:
    try:
        array = decode_image(data, spec)
    except DecodeError:
        if must_decode:
            raise
        return
    assert array.dtype == np.uint8 and array.flags.c_contiguous
    assert array.ndim == 3 and array.shape[2] == (3 if spec.mode == "RGB" else 1)
    if spec.size is not None:
        assert array.shape[:2] == spec.size


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus is not present")
@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("error")  # damage Pillow recovers from: no warning per sample either
def test_every_corpus_file_decodes_or_raises_decode_error() -> None:
    decodable = {name for name, e in json.loads(CORPUS_EXPECTED.read_text()).items() if e["status"] == "ok"}
    files = sorted(p for p in CORPUS.rglob("*") if p.is_file())
    assert decodable and files
    for path in files:
        name, data = path.relative_to(CORPUS).as_posix(), path.read_bytes()
        for spec in (ImageSpec((32, 32)), ImageSpec(), ImageSpec(mode="L")):
            try:
                _decodes_or_refuses(data, spec, must_decode=name in decodable)  # Pillow decodes it: so must we
            except Exception as e:
                raise AssertionError(f"{name} {spec}: {type(e).__name__}: {e}") from e


def _mutated(draw: st.DataObject, original: bytes) -> bytes:
    data = bytearray(original)
    for _ in range(draw.draw(st.integers(1, 4))):
        at = draw.draw(st.integers(0, len(data)))
        how = draw.draw(st.sampled_from(["flip", "insert", "truncate"]))
        if how == "flip" and at < len(data):
            data[at] ^= 1 << draw.draw(st.integers(0, 7))
        elif how == "insert":
            data[at:at] = draw.draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at:]
    return bytes(data)


@pytest.mark.parametrize("name", ["jpeg-rgb", "png-rgb"])
@settings(max_examples=200, deadline=None)
@given(draw=st.data(), spec=st.sampled_from([ImageSpec(), ImageSpec((8, 12)), ImageSpec((5, 5), "L")]))
def test_mutated_bytes_decode_or_raise_decode_error(name: str, draw: st.DataObject, spec: ImageSpec) -> None:
    _decodes_or_refuses(_mutated(draw, SAMPLES[name]), spec)


def test_one_core_rate_is_positive_and_zero_without_samples() -> None:
    samples = [_encode(_smooth((64, 48), seed=s), "JPEG") for s in range(3)] + [b"broken"]
    rate = one_core_rate(samples, ImageSpec((16, 16)), seconds=0.3)
    assert isinstance(rate, float) and rate > 0
    assert one_core_rate([], ImageSpec()) == 0.0


def test_one_core_rate_measures_one_thread_and_restores_torchs_setting() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # what a 2-core machine starts with: the measurement must not use it
    seen: list[int] = []
    try:
        with mock.patch(
            "dlindex.loader.decode.decode_image", side_effect=lambda *_, **__: seen.append(torch.get_num_threads())
        ):
            one_core_rate([b"x"], ImageSpec((16, 16)), seconds=0.01)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
