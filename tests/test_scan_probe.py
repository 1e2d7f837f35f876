"""The probe: header sniffing agrees with Pillow, truncation and bombs are caught."""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import pytest
import xxhash
from PIL import Image

from dlindex.scan import probe
from dlindex.scan.probe import ProbeOptions, probe_file
from dlindex.scan.sniff import sniff_header

from .conftest import CORPUS, CORPUS_EXPECTED


def _encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def _pillow_header(data: bytes) -> tuple[str, int, int, str]:
    with Image.open(io.BytesIO(data)) as im:
        return str(im.format), im.width, im.height, im.mode


VARIANTS = [
    ("JPEG", "RGB", {}),
    ("JPEG", "L", {}),
    ("JPEG", "CMYK", {}),
    ("JPEG", "RGB", {"progressive": True}),
    ("JPEG", "RGB", {"exif": Image.Exif()}),
    ("PNG", "RGB", {}),
    ("PNG", "RGBA", {}),
    ("PNG", "L", {}),
    ("PNG", "LA", {}),
    ("PNG", "P", {}),
    ("PNG", "1", {}),
    ("PNG", "I;16", {}),
    ("PNG", "RGB", {"optimize": True}),
    ("WEBP", "RGB", {}),
    ("WEBP", "RGBA", {}),
    ("WEBP", "RGB", {"lossless": True}),
    ("WEBP", "RGBA", {"lossless": True}),
]


@pytest.mark.parametrize(("fmt", "mode", "params"), VARIANTS)
def test_sniffer_agrees_with_pillow(fmt: str, mode: str, params: dict[str, object]) -> None:
    data = _encode(Image.new(mode, (37, 23)), fmt, **params)
    header = sniff_header(data)
    assert header is not None, "the fast path should handle this common case"
    assert tuple(header) == _pillow_header(data)


def test_sniffer_leaves_unknown_formats_to_pillow() -> None:
    assert sniff_header(_encode(Image.new("RGB", (5, 5)), "GIF")) is None
    assert sniff_header(_encode(Image.new("RGB", (5, 5)), "TIFF")) is None
    assert sniff_header(b"garbage") is None


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus is not present")
def test_sniffer_agrees_with_pillow_on_the_corpus() -> None:
    checked = 0
    for path in sorted(CORPUS.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        header = sniff_header(data)
        if header is None:
            continue
        try:
            expected = _pillow_header(data)
        except Exception:
            continue  # a header Pillow refuses: the scan's structural checks decide
        assert tuple(header) == expected, path.name
        checked += 1
    assert checked > 200


def _probe(tmp_path: Path, data: bytes, name: str = "x.jpg", **options: object) -> probe.Probe:
    path = tmp_path / name
    path.write_bytes(data)
    return probe_file(bytes(path), name, ProbeOptions(**options))  # type: ignore[arg-type]


def test_probe_records_size_hash_and_header(tmp_path: Path) -> None:
    data = _encode(Image.new("RGB", (40, 30), (1, 2, 3)), "JPEG")
    result = _probe(tmp_path, data)
    assert result.kind == "ok"
    assert (result.bytes, result.xxh3_128) == (len(data), xxhash.xxh3_128_hexdigest(data))
    assert (result.format, result.width, result.height, result.mode) == ("JPEG", 40, 30, "RGB")
    assert result.mtime_ns == (tmp_path / "x.jpg").stat().st_mtime_ns


def test_truncated_jpeg_is_corrupt_without_decoding(tmp_path: Path) -> None:
    data = _encode(Image.effect_noise((64, 64), 50).convert("RGB"), "JPEG", quality=95)
    result = _probe(tmp_path, data[: len(data) * 2 // 3])
    assert result.kind == "corrupt"
    assert "truncated JPEG" in (result.error or "")


def test_truncated_jpeg_with_exif_thumbnail_is_still_caught(tmp_path: Path) -> None:
    # An EXIF thumbnail carries its own end-of-image marker before the main image data.
    thumb = _encode(Image.new("RGB", (8, 8)), "JPEG")
    app1 = b"Exif\x00\x00" + thumb
    main = _encode(Image.effect_noise((64, 64), 50).convert("RGB"), "JPEG")
    data = main[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + main[2:]
    assert _probe(tmp_path, data).kind == "ok"
    assert _probe(tmp_path, data[: len(data) - 200]).kind == "corrupt"


def test_jpeg_with_trailing_bytes_after_eoi_is_ok(tmp_path: Path) -> None:
    data = _encode(Image.new("RGB", (20, 20)), "JPEG") + b"\x00" * 10 + b"trailer"
    assert _probe(tmp_path, data).kind == "ok"


def test_truncated_png_is_corrupt(tmp_path: Path) -> None:
    data = _encode(Image.effect_noise((64, 64), 50), "PNG")
    result = _probe(tmp_path, data[:-20], "x.png")
    assert result.kind == "corrupt" and "IEND" in (result.error or "")


def test_truncated_webp_is_corrupt(tmp_path: Path) -> None:
    data = _encode(Image.effect_noise((64, 64), 50).convert("RGB"), "WEBP")
    assert _probe(tmp_path, data[:-30], "x.webp").kind == "corrupt"


def test_zero_byte_and_garbage_files_are_corrupt(tmp_path: Path) -> None:
    assert _probe(tmp_path, b"").error == "empty file"
    garbage = _probe(tmp_path, b"\x00\x01 definitely not an image")
    assert garbage.kind == "corrupt" and "UnidentifiedImageError" in (garbage.error or "")


def test_verify_catches_what_structure_cannot(tmp_path: Path) -> None:
    data = bytearray(_encode(Image.effect_noise((64, 64), 50), "PNG"))
    idat = data.find(b"IDAT")
    data[idat + 20 : idat + 60] = b"\x00" * 40  # damage the compressed pixels, keep the ending
    assert _probe(tmp_path, bytes(data), "x.png").kind == "ok"
    assert _probe(tmp_path, bytes(data), "x.png", verify=True).kind == "corrupt"


def _png_with_size(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, body: struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))  # noqa: E731
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 10)) + chunk(b"IEND", b"")
    )


def test_decompression_bomb_header_is_corrupt_and_not_decoded(tmp_path: Path) -> None:
    result = _probe(tmp_path, _png_with_size(100_000, 100_000), "bomb.png", verify=True)
    assert result.kind == "corrupt"
    assert "DecompressionBombError" in (result.error or "")
    assert (result.width, result.height) == (100_000, 100_000)


def test_large_image_below_bomb_limit_is_not_decoded_under_verify(tmp_path: Path) -> None:
    result = _probe(tmp_path, _png_with_size(1000, 1000), "big.png", verify=True, max_pixels=500_000)
    assert result.kind == "ok"
    assert "not decoded" in (result.warning or "")


def test_large_files_are_streamed_with_the_same_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "WHOLE_READ_LIMIT", 1000)
    data = _encode(Image.effect_noise((200, 200), 60).convert("RGB"), "JPEG", quality=95)
    assert len(data) > 1000
    result = _probe(tmp_path, data)
    assert (result.kind, result.xxh3_128) == ("ok", xxhash.xxh3_128_hexdigest(data))
    assert _probe(tmp_path, data[:-500]).kind == "corrupt"


def test_fifo_is_skipped_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    result = probe_file(bytes(fifo), "pipe.jpg", ProbeOptions())
    assert result.kind == "skipped"


def test_corpus_expected_file_is_well_formed() -> None:
    if not CORPUS_EXPECTED.is_file():
        pytest.skip("../shared/corpus is not present")
    expected = json.loads(CORPUS_EXPECTED.read_text())
    assert {v["status"] for v in expected.values()} == {"ok", "corrupt"}
