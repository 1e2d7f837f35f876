"""features import refuses damaged, lying and oversized files before loading them."""

from __future__ import annotations

import io
import json
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlindex import Catalog, InputError
from dlindex.cli import app
from dlindex.features import import_features

from .backends import ON_BOTH_BACKENDS
from .conftest import import_file, rows

pytestmark = ON_BOTH_BACKENDS


def refused(db: Path, file: Path, match: str, **options: object) -> None:
    with pytest.raises(InputError, match=match):
        import_file(db, file, **options)
    assert rows(db, "SELECT count(*) FROM feature_types") == [(0,)]


def npy_bytes(descr: str, shape: tuple[int, ...], data: bytes = b"", fortran: bool = False) -> bytes:
    """A .npy whose header says what we like, whatever the data."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def npz_of(members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


IDS = npy_bytes("<i8", (2,), np.array([1, 2], "<i8").tobytes())


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (("<f4", (2, 3), b"\0" * 20), "truncated: its header announces 24 bytes"),  # cut short
        (("<f4", (10**9, 10**9), b"\0" * 24), "truncated|over the import limit"),  # absurd shape, tiny file
        (("<f4", (-2, 3), b"\0" * 24), "invalid shape"),
        (("|O", (2,), b"\0" * 16), "cannot be imported|not a valid .npy header"),
        (("<i4", (2, 3), b"\0" * 24), "expected float16, float32 or float64"),
        (("<f4", (0, 3), b""), "holds no vectors"),
        (("<f4", (2, 0), b""), "holds no vectors"),
        (("<f4", (6,), b"\0" * 24), "2-D array"),
        (("<c8", (2, 3), b"\0" * 48), "expected float16"),
    ],
)
def test_bad_npy_headers(cats: Path, tmp_path: Path, header: tuple[str, tuple[int, ...], bytes], match: str) -> None:
    (tmp_path / "v.npy").write_bytes(npy_bytes(*header))
    (tmp_path / "ids.txt").write_text("1\n2\n")
    refused(cats, tmp_path / "v.npy", match, ids_file=tmp_path / "ids.txt")
    (tmp_path / "v.npz").write_bytes(npz_of({"ids.npy": IDS, "vectors.npy": npy_bytes(*header)}))
    refused(cats, tmp_path / "v.npz", match)


def test_not_npy_at_all(cats: Path, tmp_path: Path) -> None:
    (tmp_path / "v.npy").write_bytes(b"\x93NUMPY\x01\x00\xff\xff{'descr")
    (tmp_path / "ids.txt").write_text("1\n")
    refused(cats, tmp_path / "v.npy", "not a valid .npy header", ids_file=tmp_path / "ids.txt")
    (tmp_path / "e.npy").write_bytes(b"")
    refused(cats, tmp_path / "e.npy", "not a valid .npy header", ids_file=tmp_path / "ids.txt")


def test_fortran_order_npz_member_is_read_right(cats: Path, tmp_path: Path) -> None:
    vectors = np.arange(6, dtype="<f4").reshape(2, 3)
    member = npy_bytes("<f4", (2, 3), np.asfortranarray(vectors).tobytes(order="F"), fortran=True)
    (tmp_path / "v.npz").write_bytes(npz_of({"ids.npy": IDS, "vectors.npy": member}))
    import_file(cats, tmp_path / "v.npz")
    got = rows(cats, "SELECT vector FROM image_features ORDER BY image_id")
    assert [np.frombuffer(v, "<f4").tolist() for (v,) in got] == vectors.tolist()  # type: ignore[arg-type]


def test_decompression_bomb_is_refused_before_inflating(cats: Path, tmp_path: Path) -> None:
    n, dim = 4096, 256  # 4 MiB of zeros, deflated to a few KiB
    big = npy_bytes("<f4", (n, dim), bytes(n * dim * 4))
    (tmp_path / "bomb.npz").write_bytes(npz_of({"ids.npy": IDS, "vectors.npy": big}, zipfile.ZIP_DEFLATED))
    assert (tmp_path / "bomb.npz").stat().st_size < 64 << 10
    refused(
        cats,
        tmp_path / "bomb.npz",
        "inflates to 4,194,432 bytes, over the import limit of 1,048,576",
        max_bytes=1 << 20,
    )
    # A tiny member whose header claims 40 GB is refused on the claim.
    claim = npy_bytes("<f4", (10**7, 1000), b"\0" * 64)
    (tmp_path / "claim.npz").write_bytes(npz_of({"ids.npy": IDS, "vectors.npy": claim}, zipfile.ZIP_DEFLATED))
    refused(cats, tmp_path / "claim.npz", "40,000,000,000 bytes of array data is over the import limit")


def test_zip_entry_that_lies_about_its_size(cats: Path, tmp_path: Path) -> None:
    """The directory says 200 bytes; the data inflates to 4 MiB: zipfile stops at 200 and fails."""
    real = npy_bytes("<f4", (2, 3), np.ones((2, 3), "<f4").tobytes()) + bytes(4 << 20)
    data = bytearray(npz_of({"ids.npy": IDS, "vectors.npy": real}, zipfile.ZIP_DEFLATED))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo("vectors.npy")
    local = info.header_offset
    struct.pack_into("<I", data, local + 22, 200)  # the local header's uncompressed size
    central = data.rfind(b"PK\x01\x02")
    assert data[central + 46 : central + 46 + 11] == b"vectors.npy"
    struct.pack_into("<I", data, central + 24, 200)  # the central directory's
    (tmp_path / "liar.npz").write_bytes(bytes(data))
    refused(cats, tmp_path / "liar.npz", "cannot read|truncated|Bad CRC")


def test_truncated_npz_and_missing_members(cats: Path, tmp_path: Path) -> None:
    whole = npz_of({"ids.npy": IDS, "vectors.npy": npy_bytes("<f4", (2, 3), bytes(24))})
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])
    refused(cats, tmp_path / "cut.npz", "cannot read .*cut.npz")
    (tmp_path / "other.npz").write_bytes(npz_of({"a.npy": IDS}))
    refused(cats, tmp_path / "other.npz", "must hold arrays named 'ids' and 'vectors', not a")


def test_ids_must_be_int64(cats: Path, tmp_path: Path) -> None:
    vectors = npy_bytes("<f4", (1, 3), bytes(12))
    huge = npy_bytes("<u8", (1,), np.array([2**63], "<u8").tobytes())
    (tmp_path / "u.npz").write_bytes(npz_of({"ids.npy": huge, "vectors.npy": vectors}))
    refused(cats, tmp_path / "u.npz", "outside the 64-bit integer range")
    floats = npy_bytes("<f8", (1,), np.array([1.5]).tobytes())
    (tmp_path / "f.npz").write_bytes(npz_of({"ids.npy": floats, "vectors.npy": vectors}))
    refused(cats, tmp_path / "f.npz", "ids must be a 1-D integer array")
    (tmp_path / "v.npy").write_bytes(vectors)
    (tmp_path / "ids.txt").write_text(f"{2**63}\n")
    refused(cats, tmp_path / "v.npy", "outside the 64-bit integer range", ids_file=tmp_path / "ids.txt")
    (tmp_path / "ids.txt").write_text("1\n2\n3\n")
    refused(cats, tmp_path / "v.npy", "more ids than the 1 vectors", ids_file=tmp_path / "ids.txt")


def test_parquet_ids_must_be_integers(cats: Path, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1.0, 2.7], "vector": [[1.0], [2.0]]}), tmp_path / "f.parquet")
    refused(cats, tmp_path / "f.parquet", "column 'id' is double; sample ids must be integers")
    pq.write_table(pa.table({"id": pa.array([2**64 - 1], pa.uint64()), "vector": [[1.0]]}), tmp_path / "u.parquet")
    refused(cats, tmp_path / "u.parquet", "outside the 64-bit integer range")
    pq.write_table(pa.table({"id": pa.array([3], pa.int16()), "vector": [[1.0, 2.0]]}), tmp_path / "ok.parquet")
    assert import_file(cats, tmp_path / "ok.parquet").imported == 1
    pq.write_table(pa.table({"id": [1], "vector": [["a"]]}), tmp_path / "s.parquet")
    refused_other = pytest.raises(InputError, match="holds string; expected float16")
    with refused_other, Catalog(cats) as catalog:
        import_features(catalog, "other", tmp_path / "s.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1" + bytes(100) + b"PAR1")
    with pytest.raises(InputError, match="cannot read"), Catalog(cats) as catalog:
        import_features(catalog, "other", tmp_path / "junk.parquet")


def test_parquet_over_the_cap(cats: Path, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(1, 9)), "vector": [[0.0] * 10_000] * 8}), tmp_path / "p.parquet")
    refused(
        cats,
        tmp_path / "p.parquet",
        "decodes to 640,128 bytes or more, over the import limit of 100,000",
        max_bytes=100_000,
    )


def test_jsonl_bounds(cats: Path, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps({"id": 2**64, "vector": [1.0]}) + "\n")
    refused(cats, tmp_path / "a.jsonl", '"id" must be a 64-bit integer')
    (tmp_path / "b.jsonl").write_text('{"id": 1, "vector": [1' + "0" * 400 + "]}\n")
    refused(cats, tmp_path / "b.jsonl", "too large")
    (tmp_path / "c.jsonl").write_text(
        "".join(json.dumps({"id": i, "vector": [0.5] * 1000}) + "\n" for i in range(1, 9))
    )
    refused(cats, tmp_path / "c.jsonl", "more than the import limit of 20,000 bytes", max_bytes=20_000)
    (tmp_path / "d.jsonl").write_text("[" * 100_000 + "\n")
    refused(cats, tmp_path / "d.jsonl", "not valid JSON")
    (tmp_path / "e.jsonl").write_text(json.dumps({"id": 1, "vector": []}) + "\n")
    refused(cats, tmp_path / "e.jsonl", "holds no vectors")


def test_cli_max_bytes(cats: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "v.npz", ids=np.array([1, 2]), vectors=np.ones((2, 300), np.float32))
    runner = CliRunner()
    small = runner.invoke(
        app, ["features", "import", "-t", "emb", str(tmp_path / "v.npz"), "--max-bytes", "1KiB", "--db", str(cats)]
    )
    assert small.exit_code == 1 and small.stderr.count("\n") == 1, small.output
    assert "over the import limit of 1,024 bytes in all; raise it with --max-bytes" in small.stderr
    bad = runner.invoke(
        app, ["features", "import", "-t", "emb", str(tmp_path / "v.npz"), "--max-bytes", "lots", "--db", str(cats)]
    )
    assert bad.exit_code == 1 and bad.stderr.startswith("Error: size 'lots'")
    ok = runner.invoke(
        app,
        ["features", "import", "-t", "emb", str(tmp_path / "v.npz"), "--max-bytes", "1MB", "--db", str(cats), "--json"],
    )
    assert ok.exit_code == 0 and json.loads(ok.stdout)["imported"] == 2


def test_more_vectors_than_samples_are_refused_before_they_are_inflated(cats: Path, tmp_path: Path) -> None:
    # 100,000 zero vectors deflate to a few KiB; the catalog has 8 samples, so at most 8 can import
    ids = np.arange(1, 100_001, dtype=np.int64)
    np.savez_compressed(tmp_path / "v.npz", ids=ids, vectors=np.zeros((100_000, 64), np.float32))
    (tmp_path / "v.jsonl").write_text("".join(json.dumps({"id": i, "vector": [0.5]}) + "\n" for i in range(1, 10)))
    tracemalloc.start()
    try:
        refused(cats, tmp_path / "v.npz", "'vectors': 100,000 vectors, but the catalog has 8 samples")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak:,} bytes: the 25 MB of vectors were inflated"
    refused(cats, tmp_path / "v.jsonl", "9 vectors, but the catalog has 8 samples")


def test_a_zip_entry_claiming_more_than_its_bytes_can_hold_is_refused(cats: Path, tmp_path: Path) -> None:
    claimed = npy_bytes("<f4", (8, 1_000_000))  # 32 MB announced, none there
    data = bytearray(npz_of({"ids.npy": IDS, "vectors.npy": claimed}))
    entry = data.rindex(b"PK\x01\x02")  # the central directory's entry for vectors.npy
    data[entry + 24 : entry + 28] = (len(claimed) + 32_000_000).to_bytes(4, "little")
    (tmp_path / "v.npz").write_bytes(bytes(data))
    tracemalloc.start()
    try:
        refused(cats, tmp_path / "v.npz", r"its zip entry claims 32,000,\d+ bytes from \d+ compressed")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak:,} bytes"


def test_a_file_path_with_a_lone_surrogate_is_one_error_line(cats: Path, tmp_path: Path) -> None:
    (tmp_path / "v.jsonl").write_text('{"file_path": "\\ud800x.png", "vector": [1.0, 2.0]}\n')
    result = CliRunner().invoke(app, ["features", "import", "-t", "emb", str(tmp_path / "v.jsonl"), "--db", str(cats)])
    assert result.exit_code == 1 and isinstance(result.exception, (SystemExit, type(None))), result.output
    assert result.stderr == (
        f"Error: {tmp_path / 'v.jsonl'}, line 1: \"file_path\" '\\ud800x.png' is no file name (a lone surrogate)\n"
    )
